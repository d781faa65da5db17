"""Small edges of the command line (issue 49): what a resumed pack reused, a
suggestion for a mistyped format, ``info --at-version`` beside ``fastdata
--version``, CLI spellings in the library's messages, ``pack --help`` in
sections, and the skipped images' reasons in ``info``."""

from __future__ import annotations

import json
import os
import re

import click
import pytest
from click.testing import CliRunner
from conftest import build_tree, uniform_spec

import fastdata
import fastdata.packers.plan
from fastdata.cli import cli_terms, main
from fastdata.errors import FastDataError, UnknownFormatError


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result) -> str:
    """The one ``error:`` line of a failed command (no traceback)."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    return line


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    # 30 images: 8 tar shards of 4 (the last of 2).
    return build_tree(tmp_path_factory.mktemp("edges") / "src",
                      uniform_spec(classes=("cat", "dog", "eel"), per_class=10))


# -- 1. a resumed pack says how much it reused ------------------------------------------


def _killed_after(tree, out, pieces: int) -> None:
    """A pack to ``out`` (pieces of 4 images) SIGKILLed after journaling ``pieces``."""
    from test_pack_resume import _killed_pack

    _killed_pack(tree.root, out, "between-shards", pieces, sharded=out.suffix == ".tar")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["out-%06d.tar", "out.lmdb"])
def test_a_resumed_pack_says_what_it_took_and_what_it_packed(tree, tmp_path, monkeypatch,
                                                             name):
    monkeypatch.setattr(fastdata.packers.plan, "SINGLE_FILE_PIECE_ENTRIES", 4)
    out = tmp_path / name
    _killed_after(tree, out, 3)
    shards = ["--shard-size", "4"] if name.endswith(".tar") else []
    result = invoke("pack", tree.root, out, *shards, "--resume", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["records"] == 30
    assert summary["resumed"] == {"kept_pieces": 3, "kept_records": 12,
                                  "packed_pieces": 5, "packed_records": 18}


@pytest.mark.slow
def test_a_resume_counts_a_damaged_piece_as_packed_now(tree, tmp_path):
    out = tmp_path / "out-%06d.tar"
    _killed_after(tree, out, 4)
    (partial,) = [n for n in os.listdir(tmp_path)
                  if ".partial-" in n and not n.endswith(".records")]
    victim = tmp_path / partial / "piece-000001.tar"
    data = bytearray(victim.read_bytes())
    data[700] ^= 0xFF
    victim.write_bytes(bytes(data))
    result = invoke("pack", tree.root, out, "--shard-size", "4", "--resume")
    assert result.exit_code == 0, result.output
    assert ("resumed: 12 records (3 pieces) taken from the interrupted pack, "
            "18 records (5 pieces) packed now") in result.stdout, result.stdout


def test_a_pack_that_resumes_nothing_says_nothing_of_it(tree, tmp_path):
    result = invoke("pack", tree.root, tmp_path / "out.lmdb", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["resumed"] is None
    result = invoke("pack", tree.root, tmp_path / "again.lmdb")
    assert "resumed" not in result.stdout


# -- 2. a mistyped format gets a suggestion ------------------------------------------------


def test_a_mistyped_format_gets_a_suggestion(tree, tmp_path):
    with pytest.raises(UnknownFormatError) as info:
        fastdata.formats.get_format("lmbd")
    text = str(info.value)
    assert "unknown format 'lmbd'; did you mean 'lmdb'? choose one of: " in text
    assert all(name in text for name in fastdata.formats.FORMATS)
    line = one_error_line(invoke("pack", tree.root, tmp_path / "out.data", "--format", "lmbd"))
    assert "did you mean 'lmdb'?" in line, line
    assert not (tmp_path / "out.data").exists()
    line = one_error_line(invoke("bench", tree.root, "--formats", "tfrecrd", "--no-pack"))
    assert "did you mean 'tfrecord'?" in line, line


def test_a_format_like_no_other_gets_no_suggestion():
    with pytest.raises(UnknownFormatError) as info:
        fastdata.formats.get_format("zip")
    assert "did you mean" not in str(info.value)
    assert "choose one of: " in str(info.value)


# -- 3. info --at-version and fastdata --version ---------------------------------------------


@pytest.fixture
def appended(tree, tmp_path):
    """A dataset of two versions: the pack (30 records) and an append (2 more)."""
    out = tmp_path / "d.lmdb"
    assert invoke("pack", tree.root, out).exit_code == 0
    more = build_tree(tmp_path / "more", ["cat/new1.png", "dog/new2.png"])
    result = invoke("pack", more.root, out, "--append")
    assert result.exit_code == 0, result.output
    return out


def _records_line(output: str) -> str:
    return next(ln for ln in output.splitlines() if ln.split()[:1] == ["records"])


def test_how_click_places_the_two_version_options(appended):
    """Before the command, --version is fastdata's own; after it, a dataset's
    version (as before: scripts that give info --version N keep working)."""
    result = invoke("--version", "info", appended)
    assert result.exit_code == 0 and result.stdout.startswith("fastdata, version")
    result = invoke("info", appended, "--version", "1")
    assert result.exit_code == 0, result.output
    assert _records_line(result.stdout).split()[-1] == "30"
    assert _records_line(invoke("info", appended).stdout).split()[-1] == "32"


def test_info_at_version_shows_an_earlier_version(appended):
    result = invoke("info", appended, "--at-version", "1")
    assert result.exit_code == 0, result.output
    assert _records_line(result.stdout).split()[-1] == "30"
    assert invoke("info", "--at-version", "2", appended).exit_code == 0


@pytest.mark.parametrize("args", [["info", "--version"], ["info", "PATH", "--version"]])
def test_info_version_without_a_number_says_which_version_is_which(args):
    result = invoke(*args)
    assert result.exit_code == 2
    assert "fastdata --version" in result.output and "--at-version N" in result.output, \
        result.output


def test_info_help_tells_the_two_versions_apart():
    text = " ".join(invoke("info", "--help").stdout.split())
    assert "--at-version, --version N" in text
    assert "fastdata --version" in text


# -- 4. CLI spellings in the library's messages ----------------------------------------------


def test_dedup_flip_without_near_speaks_cli(tmp_path, tree):
    out = tmp_path / "d.lmdb"
    fastdata.pack(tree.root, out, progress=False)
    line = one_error_line(invoke("dedup", out, "--flip"))
    assert "--flip" in line and "--near" in line, line
    assert "=" not in line and "(CLI:" not in line, line
    line = one_error_line(invoke("dedup", out, "--threshold", "3", "--flip"))
    assert "--threshold and --flip apply" in line, line
    with pytest.raises(FastDataError) as info:
        fastdata.dedup(out, flip=True)
    assert "flip= applies" in str(info.value) and "near=True (CLI: --near)" in str(info.value)


@pytest.mark.parametrize("api,cli", [
    ("pass overwrite=True (CLI: --overwrite) to replace it", "pass --overwrite to replace it"),
    ("pass skip_existing=True (CLI: --skip-existing) to pass over them",
     "pass --skip-existing to pass over them"),
    ("append again, with --skip-existing (skip_existing=True) to pass over them",
     "append again, with --skip-existing to pass over them"),
    ("pass allow_outside=True (CLI: --allow-outside) to follow links",
     "pass --allow-outside to follow links"),
    ("scheduler= takes a Dask scheduler's address", "--scheduler takes a Dask scheduler's address"),
    ("stratify applies to a fraction: give fraction= too",
     "stratify applies to a fraction: give --fraction too"),
])
def test_library_spellings_become_flags(api, cli):
    assert cli_terms(api) == cli


def test_an_existing_view_is_refused_in_cli_words(tmp_path, tree):
    out = tmp_path / "d.lmdb"
    fastdata.pack(tree.root, out, progress=False)
    view = tmp_path / "v.fastdata.json"
    assert invoke("subset", out, view, "--classes", "cat").exit_code == 0
    line = one_error_line(invoke("subset", out, view, "--classes", "dog"))
    assert "pass --overwrite to replace it" in line, line


# -- 5. pack --help in sections ---------------------------------------------------------------

_SECTIONS = ("Input", "Output and format", "Preprocessing", "Checks", "Resume and append",
             "Performance", "Cluster", "Other options")


@pytest.mark.parametrize("command", ["pack", "convert"])
def test_pack_help_lists_every_option_once_in_sections(command):
    text = invoke(command, "--help").stdout
    headings = re.findall(r"^(\S[^\n]*):$", text, flags=re.M)
    assert "Options" not in headings
    assert len([h for h in headings if h in _SECTIONS]) >= 5, headings
    cmd = main.commands[command]
    for param in cmd.get_params(click.Context(cmd, info_name=command)):
        if isinstance(param, click.Option) and not param.hidden:
            rows = re.findall(rf"^  (?:\S+, )*{re.escape(param.opts[0])}(?![\w-])", text,
                              flags=re.M)
            assert len(rows) == 1, (param.opts[0], text)


def test_pack_help_sections_hold_their_options():
    text = invoke("pack", "--help").stdout
    sections = dict(re.findall(r"^(\S[^\n]*):\n((?:(?:  |\n(?=  )).*\n?)*)", text, flags=re.M))
    assert "--resize" in sections["Preprocessing"] and "--encoding" in sections["Preprocessing"]
    assert "--resume" in sections["Resume and append"]
    assert "--append" in sections["Resume and append"]
    assert "--strict" in sections["Checks"] and "--max-pixels" in sections["Checks"]
    assert "--scheduler" in sections["Cluster"]
    assert "--extensions" in sections["Input"]
    # the formats' writer options sit with the format
    assert "--source-extensions" in sections["Output and format"]


# -- 6. info shows why images were skipped ----------------------------------------------------


@pytest.fixture
def bad_pack(tmp_path):
    tree = build_tree(tmp_path / "src", ["a/ok1.png", "a/ok2.png", "c/ok3.png"])
    (tree.root / "b").mkdir()
    (tree.root / "b" / "zero.jpg").write_bytes(b"")
    (tree.root / "b" / "text.jpg").write_bytes(b"hello, I am not a JPEG at all\n" * 4)
    return tree


@pytest.mark.parametrize("name,report", [("out.lmdb", "out.lmdb.report.json"),
                                         ("out.tar", "out.tar.report.json")])
def test_info_shows_the_skipped_images_and_their_reasons(bad_pack, tmp_path, name, report):
    out = tmp_path / name
    assert invoke("pack", bad_pack.root, out).exit_code == 0
    assert (tmp_path / report).is_file()
    text = invoke("info", out).stdout
    assert "b/text.jpg: not a recognised image format" in text, text
    assert "b/zero.jpg: empty file" in text, text
    assert report in text
    os.remove(tmp_path / report)
    text = invoke("info", out).stdout
    assert "b/zero.jpg" not in text
    assert report in text and "not found" in text, text


def test_info_of_a_pack_without_skips_names_no_report(tree, tmp_path):
    out = tmp_path / "d.lmdb"
    fastdata.pack(tree.root, out, progress=False)
    assert "report" not in invoke("info", out).stdout


def test_pack_warnings_speak_cli_too(capsys):
    from fastdata.cli.packing import echo_warning

    echo_warning("workers= applies to a local pack: on a cluster each Dask worker thread "
                 "prepares one piece at a time")
    assert capsys.readouterr().err.startswith("warning: --workers applies to a local pack")

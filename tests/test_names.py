"""Output and sidecar names: datasets of two formats with one prefix never share a
file; datasets packed with the earlier sidecar names (``PREFIX.fastdata.json``)
still open, verify and can be overwritten; an OUTPUT extension that contradicts
the format asked for is refused before anything is written.

``tests/legacy_names/`` holds two datasets packed by fastdata before the
sidecars were named after the output's extension (the golden source, 12
records): ``tar/old-%06d.tar`` (three shards) and ``tfrecord/old.tfrecord``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import Interrupt, build_tree, list_partials, uniform_spec
from test_publish import pack, records, sharded_files

import fastdata
from fastdata.cli import main
from fastdata.errors import OutputExistsError, UnknownFormatError

HERE = Path(__file__).parent
LEGACY = HERE / "legacy_names"
GOLDEN_SRC = HERE / "golden" / "src"

#: (fixture folder, its output name as packed, pack options it was packed with)
LEGACY_CASES = [("tar", "old-%06d.tar", {"shard_size": 5}), ("tfrecord", "old.tfrecord", {})]
LEGACY_IDS = [c[0] for c in LEGACY_CASES]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_error_line(result, *needles) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def golden_records(tmp_path_factory):
    """The records of the golden source as a current pack stores them (the
    legacy fixtures hold the same)."""
    out = tmp_path_factory.mktemp("golden") / "ref.tar"
    return records(pack(GOLDEN_SRC, out).output)


def legacy_copy(tmp_path, fmt: str) -> Path:
    """A writable copy of a legacy fixture; returns its folder."""
    folder = tmp_path / f"legacy-{fmt}"
    shutil.copytree(LEGACY / fmt, folder)
    return folder


# -- two formats, one prefix -----------------------------------------------------------


@pytest.mark.parametrize("first,second", [
    ("real.tfrecord", "real.tar"), ("real.tar", "real.tfrecord"),
    ("out-%06d.tar", "out.tfrecord"),
])
def test_two_formats_with_one_prefix_both_pack_and_open_their_own_records(
        tmp_path, first, second):
    """The reported case: ``pack photos real.tfrecord`` then ``pack photos real.tar``
    in one folder. Both pack, and each opens (by shard name and by manifest) with
    its own format and records, and verifies."""
    a = build_tree(tmp_path / "a", uniform_spec(("cat", "dog"), 3), seed=1)
    b = build_tree(tmp_path / "b", uniform_spec(("eel", "fox", "gnu"), 2), seed=2)
    out = tmp_path / "out"
    shard = ["--shard-size", "2"] if "%" in first else []
    for tree, name, extra in ((a, first, shard), (b, second, [])):
        result = invoke("pack", tree.root, out / name, "--no-progress", "--workers", "1",
                        *extra)
        assert result.exit_code == 0, result.output
    for tree, name in ((a, first), (b, second)):
        fmt = "tar" if name.endswith(".tar") else "tfrecord"
        stem = name.replace("-%06d", "")
        manifest = out / f"{stem}.fastdata.json"
        for path in (out / name, manifest):
            ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
            assert ds.manifest.format == fmt
            assert ds.keys == tree.keys and ds.classes == tree.classes
            assert [ds[i] for i in range(len(ds))] == list(zip(tree.payloads, tree.labels))
            ds.reader.close()
        result = invoke("verify", out / name)
        assert result.exit_code == 0, result.output
    manifests = sorted(n for n in os.listdir(out) if n.endswith(".fastdata.json"))
    assert len(manifests) == 2
    assert set(os.listdir(out)) == set().union(*(sharded_files(out / m) for m in manifests))


def test_sidecars_are_named_after_the_output_with_its_extension(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 3))
    summary = pack(tree.root, tmp_path / "o" / "out-%06d.tar", shard_size=2)
    assert summary.output == str(tmp_path / "o" / "out.tar.fastdata.json")
    assert sorted(os.listdir(tmp_path / "o")) == [
        "_info.json", "out-000000.tar", "out-000001.tar", "out-000002.tar",
        "out.tar.fastdata.index-crc.npy", "out.tar.fastdata.index.npy", "out.tar.fastdata.json",
        "out.tar.fastdata.keys-pieces.npy", "out.tar.fastdata.keys.json"]
    assert summary.files == [str(tmp_path / "o" / n) for n in (
        "out-000000.tar", "out-000001.tar", "out-000002.tar", "out.tar.fastdata.index.npy",
        "out.tar.fastdata.index-crc.npy", "out.tar.fastdata.keys.json",
        "out.tar.fastdata.keys-pieces.npy", "_info.json", "out.tar.fastdata.json")]


# -- datasets of the earlier naming ------------------------------------------------------


@pytest.mark.parametrize("fmt,name,options", LEGACY_CASES, ids=LEGACY_IDS)
def test_legacy_named_dataset_opens_by_manifest_shard_and_pattern(
        tmp_path, golden_records, fmt, name, options):
    folder = legacy_copy(tmp_path, fmt)
    targets = [folder / "old.fastdata.json", folder / name]  # the manifest, the output name
    if fmt == "tar":
        targets.append(folder / "old-{000000..000002}.tar")
    for target in targets:
        assert records(target) == golden_records, target
        assert fastdata.open_dataset(target).manifest.format == fmt
    for target in (folder / "old.fastdata.json", folder / name):
        for command in ("info", "verify"):
            result = invoke(command, target)
            assert result.exit_code == 0, (command, target, result.output)
    iterable = fastdata.ShardedIterableDataset(folder / "old.fastdata.json",
                                               decode=fastdata.Decode(output="bytes"))
    assert sorted(iterable) == sorted((d, label) for _, d, label in golden_records)


def test_legacy_manifest_of_another_format_is_not_taken_for_ours(tmp_path, golden_records):
    """An earlier-naming TFRecord dataset ``old.fastdata.json`` beside a new tar
    pack ``old.tar``: the tar packs without --overwrite, both open with their own
    records, and an overwrite of the tar leaves the TFRecord alone."""
    folder = legacy_copy(tmp_path, "tfrecord")
    legacy_files = set(os.listdir(folder))
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 3))
    pack(tree.root, folder / "old.tar")
    pack(tree.root, folder / "old.tar", overwrite=True)
    assert [r[0] for r in records(folder / "old.tar")] == tree.keys
    assert records(folder / "old.tfrecord") == golden_records
    assert records(folder / "old.fastdata.json") == golden_records
    assert legacy_files <= set(os.listdir(folder))


@pytest.mark.parametrize("fmt,name,options", LEGACY_CASES, ids=LEGACY_IDS)
def test_legacy_named_dataset_is_refused_without_overwrite(tmp_path, fmt, name, options):
    folder = legacy_copy(tmp_path, fmt)
    before = sorted(os.listdir(folder))
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 3))
    with pytest.raises(OutputExistsError, match="overwrite=True") as info:
        pack(tree.root, folder / name, **options)
    assert info.value.path == str(folder / "old.fastdata.json")
    assert sorted(os.listdir(folder)) == before


@pytest.mark.parametrize("fmt,new_name,options", [
    ("tar", "old-%06d.tar", {"shard_size": 5}),  # as it was packed: the same shard names
    ("tar", "old-%06d.tar", {"shard_size": 2}),  # more shards than before
    ("tar", "old.tar", {}),  # one file: the old numbered shards go
    ("tfrecord", "old.tfrecord", {}),
    ("tfrecord", "old.tfrecord", {"shard_size": 2}),
])
def test_overwrite_replaces_a_legacy_named_dataset_with_current_names(
        tmp_path, fmt, new_name, options):
    """``--overwrite`` of an earlier-naming dataset: the new dataset under the current
    names, and nothing of the old one left (manifest, index, keys, report, shards)."""
    folder = legacy_copy(tmp_path, fmt)
    (folder / "old.report.json").write_text('{"skipped": []}', encoding="utf-8")
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b", "c"), 3))
    shard_size = ["--shard-size", options["shard_size"]] if options else []
    result = invoke("pack", tree.root, folder / new_name, "--overwrite", "--no-progress",
                    "--json", *shard_size)
    assert result.exit_code == 0, result.output
    output = json.loads(result.stdout)["output"]
    assert output == str(folder / (new_name.replace("-%06d", "") + ".fastdata.json"))
    assert set(os.listdir(folder)) == sharded_files(output)
    assert [r[0] for r in records(folder / new_name)] == tree.keys
    assert invoke("verify", folder / new_name).exit_code == 0


@pytest.mark.parametrize("call", ["replace", "link", "remove"])
@pytest.mark.parametrize("fmt,name,options", LEGACY_CASES, ids=LEGACY_IDS)
def test_interrupted_overwrite_of_a_legacy_dataset_keeps_a_whole_one(
        tmp_path, monkeypatch, golden_records, fmt, name, options, call):
    """Interrupted at every rename, link and removal, the output (its shard name)
    reads as the old dataset or the new one (until the switch the old manifest
    reads whole too), and the next overwrite leaves only the new one."""
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b", "c"), 4))
    new_records = records(pack(tree.root, tmp_path / "reference" / name, **options).output)
    for n in range(1, 100):
        folder = tmp_path / f"round-{n}"
        shutil.copytree(LEGACY / fmt, folder)
        with monkeypatch.context() as m:
            patch = Interrupt(m, call, n)
            try:
                summary = pack(tree.root, folder / name, overwrite=True, **options)
                finished = True
            except KeyboardInterrupt:
                finished = False
        got = records(folder / name)
        assert got in (golden_records, new_records), (call, n)
        if got == golden_records:  # not switched: the old manifest names the old dataset
            assert records(folder / "old.fastdata.json") == golden_records, (call, n)
        assert not list_partials(folder), (call, n)
        if finished:
            assert records(folder / name) == new_records
            assert patch.calls < n
            assert set(os.listdir(folder)) == sharded_files(summary.output)
            break
        summary = pack(tree.root, folder / name, overwrite=True, **options)
        assert records(folder / name) == new_records
        assert set(os.listdir(folder)) == sharded_files(summary.output), (call, n)
    else:
        pytest.fail("the pack never finished")


# -- an OUTPUT extension against --format ----------------------------------------------------


@pytest.mark.parametrize("output,fmt,needles", [
    ("x.lmdb", "tar", ["the extension .lmdb means the lmdb format", "--format tar",
                       "drop --format tar", "ending in .tar"]),
    ("x.tar", "tfrecord", ["the extension .tar means the tar format",
                           "ending in .tfrecord or .tfrecords"]),
    ("x.h5", "lmdb", ["the extension .h5 means the hdf5 format", "ending in .lmdb"]),
    ("x.tfrecords", "hdf5", ["means the tfrecord format", "ending in .h5 or .hdf5"]),
    ("x.tar.fastdata.json", "tfrecord", ["the extension .tar means the tar format"]),
    ("x.fastdata.json", "lmdb", ["manifest of a sharded dataset", "ending in .lmdb"]),
])
def test_cli_refuses_an_extension_that_contradicts_format(tmp_path, output, fmt, needles):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 2))
    out = tmp_path / "out"
    out.mkdir()
    result = invoke("pack", tree.root, out / output, "--format", fmt, "--no-progress")
    assert_one_error_line(result, str(out / output), *needles)
    assert os.listdir(out) == []


def test_python_refuses_an_extension_that_contradicts_format(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 2))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnknownFormatError, match=r"format=tar was given: drop format=tar to "
                       r"pack lmdb, or give an output name ending in \.tar") as info:
        pack(tree.root, out / "x.lmdb", format="tar")
    assert info.value.path == str(out / "x.lmdb")
    assert os.listdir(out) == []


@pytest.mark.parametrize("output,fmt", [("x.tar", "tar"), ("X.TFRECORD", "tfrecord"),
                                        ("x.hdf5", "HDF5")])
def test_format_that_agrees_with_the_extension_is_accepted(tmp_path, output, fmt):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 2))
    summary = pack(tree.root, tmp_path / "out" / output, format=fmt)
    assert summary.format == fmt.lower()
    assert len(fastdata.open_dataset(tmp_path / "out" / output)) == 4


@pytest.mark.parametrize("fmt,written", [
    ("lmdb", ["x"]), ("hdf5", ["x"]),
    ("tar", ["x.tar", "x.tar.fastdata.index.npy", "x.tar.fastdata.index-crc.npy",
             "x.tar.fastdata.keys.json", "x.tar.fastdata.keys-pieces.npy", "_info.json",
             "x.tar.fastdata.json"]),
    ("tfrecord", ["x.tfrecord", "x.tfrecord.idx", "x.tfrecord.fastdata.index.npy",
                  "x.tfrecord.fastdata.index-crc.npy", "x.tfrecord.fastdata.keys.json",
                  "x.tfrecord.fastdata.keys-pieces.npy", "x.tfrecord.fastdata.json"]),
])
def test_output_without_extension_takes_the_format_and_names_what_it_wrote(
        tmp_path, fmt, written):
    """LMDB and HDF5 write OUTPUT itself; tar and TFRecord add their extension. The
    summary (and ``--json``'s ``files``) name what was written."""
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 2))
    out = tmp_path / "out"
    result = invoke("pack", tree.root, out / "x", "--format", fmt, "--no-progress", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["files"] == [str(out / n) for n in written]
    assert sorted(os.listdir(out)) == sorted(written)
    opened = out / ("x" if fmt in ("lmdb", "hdf5") else written[0])
    assert len(fastdata.open_dataset(opened)) == 4
    human = invoke("pack", tree.root, out / "x", "--format", fmt, "--no-progress",
                   "--overwrite")
    assert human.exit_code == 0, human.output
    if fmt in ("tar", "tfrecord"):
        assert f"wrote {len(written)} files in {out}: {', '.join(written)}" in human.stdout
    else:
        assert "wrote" not in human.stdout and f"into {out / 'x'} ({fmt})" in human.stdout

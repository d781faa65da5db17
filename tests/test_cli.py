"""The ``fastdata`` command line (pack, info, verify), through click's CliRunner and,
for signal handling, a real subprocess."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import (
    DEFAULT_CLASSES,
    TESTS_DIR,
    build_tree,
    list_partials,
    make_image_bytes,
)
from PIL import Image

import fastdata
from fastdata import Decode
from fastdata.cli import main
from fastdata.errors import FastDataError

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
REPO = str(Path(TESTS_DIR).parent)


def invoke(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def assert_clean_error(result, *needles):
    """Exit != 0, one line on stderr starting with "error:", no traceback."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), result.stderr
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _jpeg(size=(40, 40), name="j") -> bytes:
    return make_image_bytes(".jpg", size=size, name=name)


def decode_only_damaged_image() -> tuple[str, bytes]:
    """(extension, bytes) of an image whose header and end marker are intact but
    whose compressed data is damaged: Pillow opens it and only a full decode fails."""
    good = _jpeg(name="mid")
    sos, eoi = good.rfind(b"\xff\xda"), good.rfind(b"\xff\xd9")
    mid = (sos + eoi) // 2
    candidates = [
        (".jpg", good[:mid] + b"\xff\xc0\x00\x11" + good[mid + 4:]),  # a second SOF marker
        (".jpg", good[:mid] + b"\xff\xd8" + good[mid + 2:]),          # a stray SOI marker
    ]
    png = make_image_bytes(".png", size=(40, 40), name="mid-png")
    i = png.find(b"IDAT")
    length = int.from_bytes(png[i - 4:i], "big")
    at = i + 4 + length // 2
    candidates.append((".png", png[:at] + bytes(range(16)) + png[at + 16:]))
    for ext, data in candidates:
        with Image.open(io.BytesIO(data)) as img:  # the header is fine
            img.size
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.load()
        except Exception:
            return ext, data
    pytest.fail("could not construct an image that only a full decode rejects")


@pytest.fixture
def bad_tree(tmp_path):
    """Three good images and bad ones: a truncated JPEG, an empty file and text named .jpg."""
    tree = build_tree(tmp_path / "src", ["a/ok1.png", "a/ok2.jpg", "c/ok3.bmp"])
    b = tree.root / "b"
    b.mkdir()
    jpeg = _jpeg(name="trunc")
    (b / "trunc.jpg").write_bytes(jpeg[:-10])  # cut before its end-of-image marker
    (b / "zero.jpg").write_bytes(b"")
    (b / "text.jpg").write_bytes(b"hello, I am not a JPEG at all\n" * 4)
    expected = {
        "b/text.jpg": "not a recognised image format",
        "b/trunc.jpg": "truncated",
        "b/zero.jpg": "empty file",
    }
    return tree, expected


# -- pack ---------------------------------------------------------------------------


def test_pack_success_output(image_tree, tmp_path):
    out = tmp_path / "out.lmdb"
    result = invoke("pack", image_tree.root, out)
    assert result.exit_code == 0, result.output
    n = len(image_tree.samples)
    assert f"packed {n} images in {len(DEFAULT_CLASSES)} classes" in result.stdout
    assert str(out) in result.stdout
    assert "ignored 8" in result.stdout
    assert "extensions not packed: .db 1, .gif 1, .txt 1" in result.stdout
    # The empty class is a warning on stderr, not an error.
    assert "warning:" in result.stderr and "z_empty" in result.stderr
    assert "Traceback" not in result.output
    ds = fastdata.open_dataset(out, decode=Decode(output="bytes"))
    assert [ds[i] for i in range(len(ds))] == [(s.data, s.label) for s in image_tree.samples]
    assert list_partials(tmp_path) == []


def test_pack_json_summary(image_tree, tmp_path):
    out = tmp_path / "out.lmdb"
    result = invoke("pack", image_tree.root, out, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    for name in ("output", "format", "records", "classes", "bytes_in", "bytes_out", "seconds",
                 "skipped", "ignored", "warnings", "report", "encodings"):
        assert name in summary, name
    assert summary["output"] == str(out)
    assert summary["format"] == "lmdb"
    assert summary["records"] == len(image_tree.samples)
    assert summary["classes"] == len(DEFAULT_CLASSES)
    assert summary["bytes_in"] == sum(len(s.data) for s in image_tree.samples)
    assert summary["bytes_out"] > 0
    assert summary["seconds"] >= 0
    assert summary["skipped"] == []
    assert summary["ignored"] == 8
    assert summary["ignored_extensions"] == {"db": 1, "gif": 1, "txt": 1}
    assert any("z_empty" in w for w in summary["warnings"])
    assert sum(summary["encodings"].values()) == len(image_tree.samples)
    assert set(summary["encodings"]) == {"jpeg", "png", "bmp", "webp", "tiff", "ppm", "pgm"}
    # Warnings go to the report too.
    assert summary["report"] == f"{out}.report.json"
    report = json.loads(Path(summary["report"]).read_text())
    assert report["warnings"] == summary["warnings"] and report["skipped"] == []
    assert "warning:" in result.stderr


def test_bad_images_are_skipped_and_reported(bad_tree, tmp_path):
    tree, expected = bad_tree
    out = tmp_path / "out.lmdb"
    result = invoke("pack", tree.root, out, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["records"] == 3
    skipped = {s["key"]: s["reason"] for s in summary["skipped"]}
    assert set(skipped) == set(expected)
    for key, needle in expected.items():
        assert needle in skipped[key], (key, skipped[key])
    report = json.loads(Path(summary["report"]).read_text())
    assert report["skipped"] == summary["skipped"]
    assert report["output"] == out.name  # the report travels: no machine's folders
    ds = fastdata.open_dataset(out, decode=Decode(output="bytes"))
    assert ds.keys == ["a/ok1.png", "a/ok2.jpg", "c/ok3.bmp"]
    assert ds.classes == ["a", "b", "c"]
    assert fastdata.formats.read_manifest(out).source["skipped"] == len(expected)

    # The human summary lists them as well.
    out2 = tmp_path / "human.lmdb"
    human = invoke("pack", tree.root, out2)
    assert human.exit_code == 0, human.output
    assert f"skipped {len(expected)} bad image(s)" in human.stdout
    for key in expected:
        assert key in human.stdout
    assert f"{out2}.report.json" in human.stdout


def test_renamed_tar_keys_in_summary_json_and_report(tmp_path):
    dotted = [f"b/v{i}.final.png" for i in range(6)]
    build_tree(tmp_path / "src", ["a/china.jpg", "a/china.bmp", "a/x.y.png", *dotted])
    out = tmp_path / "out.tar"
    human = invoke("pack", tmp_path / "src", out)
    assert human.exit_code == 0, human.output
    assert "renamed 8 tar member key(s)" in human.stdout
    assert "    a/china.jpg -> a/china_1\n" in human.stdout
    assert "    a/x.y.png -> a/x_y\n" in human.stdout
    assert "... and 3 more" in human.stdout  # the first five, then a count
    assert f"report: {tmp_path / 'out.tar.report.json'}" in human.stdout

    result = invoke("pack", tmp_path / "src", out, "--overwrite", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    pairs = [(r["key"], r["stored_as"]) for r in summary["renamed"]]
    assert pairs == [("a/china.jpg", "a/china_1"), ("a/x.y.png", "a/x_y"),
                     *[(k, k[:-4].replace(".", "_")) for k in dotted]]
    assert {r["file"] for r in summary["renamed"]} == {"out.tar"}
    assert all(r["reason"] for r in summary["renamed"])
    report = json.loads((tmp_path / "out.tar.report.json").read_text())
    assert report["renamed"] == summary["renamed"]
    ds = fastdata.open_dataset(tmp_path / "out.tar")
    assert ds.keys == ["a/china.bmp", "a/china.jpg", "a/x.y.png", *dotted]  # unchanged


def test_extensions_flag(tmp_path):
    build_tree(tmp_path / "src", ["a/x.png", "a/y.gif", "b/z.jpg"])
    default = invoke("pack", tmp_path / "src", tmp_path / "d.lmdb")
    assert default.exit_code == 0, default.output
    assert "packed 2 images" in default.stdout
    assert "extensions not packed: .gif 1 (--extensions +EXT packs them too)" in default.stdout
    result = invoke("pack", tmp_path / "src", tmp_path / "g.lmdb", "--extensions", "+gif",
                    "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["records"] == 3 and summary["ignored_extensions"] == {}
    m = fastdata.formats.read_manifest(tmp_path / "g.lmdb")
    assert fastdata.open_dataset(tmp_path / "g.lmdb").keys == ["a/x.png", "a/y.gif", "b/z.jpg"]
    tv = ["jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"]
    assert m.source["extensions"] == m.pack_options["extensions"] == [*tv, "gif"]
    only = invoke("pack", tmp_path / "src", tmp_path / "o.lmdb", "--extensions", "GIF,.Png")
    assert only.exit_code == 0, only.output
    assert fastdata.open_dataset(tmp_path / "o.lmdb").keys == ["a/x.png", "a/y.gif"]
    assert_clean_error(invoke("pack", tmp_path / "src", tmp_path / "e.lmdb", "--extensions",
                              "gif,,png"), "--extensions has an unusable entry ''")
    assert not (tmp_path / "e.lmdb").exists()
    assert_clean_error(invoke("pack", tmp_path / "src", tmp_path / "n.lmdb", "--extensions",
                              "txt"), "no image files", "txt")
    help_text = invoke("pack", "--help").stdout
    assert "--extensions" in help_text and "+gif" in help_text


def _without_read_override() -> None:
    """In a child about to exec: give up CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
    (from the bounding set, so exec does not give them back), with which root
    reads any file; as root the child then meets file modes as any user does."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _cli_child(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "fastdata.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env,
                          preexec_fn=_without_read_override if IS_ROOT else None)


def test_unreadable_file_is_skipped(tmp_path):
    tree = build_tree(tmp_path / "src", ["a/ok.png", "b/ok.png"])
    noperm = tree.root / "a" / "noperm.png"
    noperm.write_bytes(make_image_bytes(".png", name="noperm"))
    noperm.chmod(0)
    try:
        probe = subprocess.run([sys.executable, "-c", f"open({str(noperm)!r}, 'rb')"],
                               capture_output=True, text=True,
                               preexec_fn=_without_read_override if IS_ROOT else None)
        assert "PermissionError" in probe.stderr, "the child can still read a chmod 000 file"
        out = tmp_path / "out.lmdb"
        result = _cli_child("pack", tree.root, out, "--json", "--no-progress")
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["records"] == 2
        assert [s["key"] for s in summary["skipped"]] == ["a/noperm.png"]
        assert "cannot read" in summary["skipped"][0]["reason"]
        report = json.loads(Path(f"{out}.report.json").read_text())
        assert report["skipped"] == summary["skipped"]
        strict = _cli_child("pack", tree.root, tmp_path / "strict.lmdb", "--strict",
                            "--no-progress")
        assert strict.returncode == 1, strict.stderr
        lines = strict.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and "a/noperm.png" in lines[0]
        assert "Traceback" not in strict.stderr
    finally:
        noperm.chmod(0o644)


def test_dangling_symlink_is_skipped(tmp_path):
    # The same "cannot read" path as an unreadable file, and it works as root too.
    tree = build_tree(tmp_path / "src", ["a/ok.png", "b/ok.png"])
    os.symlink(tmp_path / "gone.png", tree.root / "a" / "dangling.png")
    out = tmp_path / "out.lmdb"
    result = invoke("pack", tree.root, out, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["records"] == 2
    assert [s["key"] for s in summary["skipped"]] == ["a/dangling.png"]
    assert "cannot read" in summary["skipped"][0]["reason"]


def test_strict_stops_at_first_bad_image(bad_tree, tmp_path):
    tree, _ = bad_tree
    out = tmp_path / "out.lmdb"
    result = invoke("pack", tree.root, out, "--strict")
    assert_clean_error(result, "b/text.jpg", str(tree.root / "b" / "text.jpg"), "--strict")
    assert not out.exists()
    assert not Path(f"{out}.report.json").exists()
    assert list_partials(tmp_path) == []


@pytest.mark.parametrize("extra", [[], ["--verify-decode"], ["--resize", "8"]],
                         ids=["header-check", "verify-decode", "preprocess"])
def test_skip_reasons_are_words_not_python_reprs(tmp_path, extra):
    tree = build_tree(tmp_path / "src", ["a/ok.png", "b/ok.jpg"])
    (tree.root / "a" / "junk.webp").write_bytes(b"RIFF\0\0\0\0WEBPjunk, not an image")
    (tree.root / "a" / "junk.tif").write_bytes(b"II*\0" + bytes(range(40)))
    (tree.root / "b" / "page.jpg").write_bytes(b"<!DOCTYPE html><html>saved page</html>")
    (tree.root / "b" / "bin.png").write_bytes(bytes(range(200, 256)))
    ext, damaged = decode_only_damaged_image()
    (tree.root / "b" / f"mid{ext}").write_bytes(damaged)
    result = invoke("pack", tree.root, tmp_path / "out.lmdb", "--json", *extra)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    reasons = {s["key"]: s["reason"] for s in summary["skipped"]}
    assert reasons["a/junk.webp"] == "webp image has an unreadable header: not an image " \
                                     "Pillow can identify"
    assert reasons["b/page.jpg"] == ('not a recognised image format (it starts with '
                                     '"<!DOCTYPE html><...")')
    assert reasons["b/bin.png"] == ("not a recognised image format (it starts with bytes "
                                    "c8 c9 ca cb cc cd ce cf d0 d1 d2 d3 d4 d5 d6 d7...)")
    if "--verify-decode" in extra:  # a full decode finds the damage inside the data
        encoding = {".jpg": "jpeg", ".png": "png"}[ext]
        assert reasons[f"b/mid{ext}"].startswith(f"{encoding} image cannot be decoded: ")
    for key, reason in reasons.items():
        # No "<_io.BytesIO object at 0x7f...>", no b'...' bytes literal.
        assert not re.search(r" at 0x[0-9a-f]+|<_io|\bb'|\bb\"", reason), (key, reason)
    report = json.loads(Path(summary["report"]).read_text())
    assert {s["key"]: s["reason"] for s in report["skipped"]} == reasons


def test_verify_decode_catches_damage_the_cheap_check_misses(tmp_path):
    ext, damaged = decode_only_damaged_image()
    tree = build_tree(tmp_path / "src", ["a/ok.png", "b/ok.jpg"])
    (tree.root / "a" / f"mid{ext}").write_bytes(damaged)
    key = f"a/mid{ext}"

    cheap = invoke("pack", tree.root, tmp_path / "cheap.lmdb", "--json")
    assert cheap.exit_code == 0, cheap.output
    cheap_summary = json.loads(cheap.stdout)
    assert cheap_summary["records"] == 3 and cheap_summary["skipped"] == []

    full = invoke("pack", tree.root, tmp_path / "full.lmdb", "--json", "--verify-decode")
    assert full.exit_code == 0, full.output
    summary = json.loads(full.stdout)
    assert summary["records"] == 2
    assert [s["key"] for s in summary["skipped"]] == [key]
    assert "cannot be decoded" in summary["skipped"][0]["reason"]
    options = fastdata.formats.read_manifest(tmp_path / "full.lmdb").pack_options
    assert options["verify_decode"] is True

    strict = invoke("pack", tree.root, tmp_path / "strict.lmdb", "--verify-decode", "--strict")
    assert_clean_error(strict, key)


def test_every_image_of_a_class_skipped_warns(tmp_path):
    tree = build_tree(tmp_path / "src", ["a/ok.png"])
    (tree.root / "b").mkdir()
    (tree.root / "b" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)
    result = invoke("pack", tree.root, tmp_path / "out.lmdb", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["records"] == 1 and summary["classes"] == 2
    assert any("'b'" in w and "skipped" in w for w in summary["warnings"])
    assert "warning:" in result.stderr


def test_all_images_bad_is_an_error(tmp_path):
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a" / "zero.png").write_bytes(b"")
    out = tmp_path / "out.lmdb"
    assert_clean_error(invoke("pack", root, out), "a/zero.png")
    assert not out.exists() and list_partials(tmp_path) == []


@pytest.mark.parametrize("case", ["missing", "file", "no-classes", "no-images", "bad-ext",
                                  "bad-format", "inside-source"])
def test_pack_errors(tmp_path, case):
    src = tmp_path / "src"
    out = tmp_path / "out.lmdb"
    needle = ""
    if case == "missing":
        needle = "does not exist"
    elif case == "file":
        src = tmp_path / "file.png"
        src.write_bytes(make_image_bytes(".png"))
        needle = "not a folder"
    elif case == "no-classes":
        src.mkdir()
        (src / "loose.png").write_bytes(make_image_bytes(".png"))
        needle = "no class folders"
    elif case == "no-images":
        build_tree(src, ["a/", "b/readme.txt"])
        needle = "no image files"
    elif case == "bad-ext":
        build_tree(src, ["a/x.png"])
        out = tmp_path / "out.xyz"
        needle = "extension"
    elif case == "bad-format":
        build_tree(src, ["a/x.png"])
        result = invoke("pack", src, out, "--format", "zip")
        assert_clean_error(result, "zip")
        assert not out.exists()
        return
    elif case == "inside-source":
        build_tree(src, ["a/x.png"])
        out = src / "out.lmdb"
        needle = "inside the source"
    result = invoke("pack", src, out)
    assert_clean_error(result, needle)
    assert not out.exists()
    assert list_partials(out.parent) == []


def test_existing_output_needs_overwrite(image_tree, tmp_path):
    out = tmp_path / "out.lmdb"
    assert invoke("pack", image_tree.root, out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    other = build_tree(tmp_path / "other", ["x/1.png", "y/2.png"])

    refused = invoke("pack", other.root, out)
    assert_clean_error(refused, "already exists", "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert len(fastdata.formats.read_manifest(out).classes) == len(DEFAULT_CLASSES)

    replaced = invoke("pack", other.root, out, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    m = fastdata.formats.read_manifest(out)
    assert m.classes == ["x", "y"] and m.count == 2
    assert list_partials(tmp_path) == []


def test_existing_file_output_needs_overwrite(image_tree, tmp_path):
    out = tmp_path / "out.lmdb"
    out.write_text("precious")
    assert_clean_error(invoke("pack", image_tree.root, out), "already exists")
    assert out.read_text() == "precious"
    assert invoke("pack", image_tree.root, out, "--overwrite").exit_code == 0
    assert fastdata.formats.read_manifest(out).count == len(image_tree.samples)


def test_overwrite_does_not_leave_a_stale_report(bad_tree, tmp_path):
    tree, _ = bad_tree
    out = tmp_path / "out.lmdb"
    assert invoke("pack", tree.root, out).exit_code == 0
    report = Path(f"{out}.report.json")
    assert report.exists()
    clean = build_tree(tmp_path / "clean", ["a/x.png", "b/y.png"])
    result = invoke("pack", clean.root, out, "--overwrite", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["report"] is None
    assert not report.exists() or json.loads(report.read_text())["skipped"] == []


def test_format_option_with_odd_extension(image_tree, tmp_path):
    out = tmp_path / "train.data"
    result = invoke("pack", image_tree.root, out, "--format", "lmdb", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["format"] == "lmdb"
    assert fastdata.formats.read_manifest(out).format == "lmdb"
    ds = fastdata.open_dataset(out, decode=Decode(output="bytes"))
    assert [ds[i] for i in range(len(ds))] == [(s.data, s.label) for s in image_tree.samples]
    info = invoke("info", out)
    assert info.exit_code == 0, info.output
    assert invoke("verify", out).exit_code == 0
    # Upper-case format names are accepted too.
    assert invoke("pack", image_tree.root, tmp_path / "b.bin", "--format", "LMDB").exit_code == 0


# -- info and verify ------------------------------------------------------------------


@pytest.fixture
def packed_cli(image_tree, tmp_path):
    out = tmp_path / "ds.lmdb"
    result = invoke("pack", image_tree.root, out)
    assert result.exit_code == 0, result.output
    return image_tree, out


def test_info_human(packed_cli):
    tree, out = packed_cli
    result = invoke("info", out)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert str(out) in text
    assert "lmdb" in text and "manifest v1" in text
    assert re.search(rf"records\s+{len(tree.samples)}\b", text), text
    for name, count in zip(tree.classes, tree.class_counts):
        assert f"{name} ({count})" in text
    assert "crc32" in text and "data.mdb" in text


# What a Python repr would show in the human form: None/True/False, quotes, braces.
_PYTHON_REPR = re.compile(r"\b(None|True|False)\b|[{}\[\]'\"]")


@pytest.mark.parametrize("storage", ["keep", "raw"])
@pytest.mark.parametrize("fmt", sorted(fastdata.formats.FORMATS))
def test_info_human_has_no_python_reprs(image_tree, tmp_path, fmt, storage):
    from fastdata.packers.pack import PackOptions
    from fastdata.packers.preprocess import Preprocess

    out = tmp_path / f"ds{fastdata.formats.get_format(fmt).extensions[0]}"
    pre = Preprocess(resize=(8, 6), encoding="raw") if storage == "raw" else Preprocess()
    fastdata.pack(image_tree.root, out, options=PackOptions(format=fmt, preprocess=pre),
                  progress=False)
    result = invoke("info", out)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert not _PYTHON_REPR.search(text), text
    formats = fastdata.formats.read_manifest(out).encoding["formats"]
    counts = ", ".join(f"{k} {v}" for k, v in formats.items())
    assert re.search(rf"^  encoding +{storage} \({re.escape(counts)}\)", text, re.M), text
    assert re.search(rf"^  options +format={fmt}, strict=false, verify_decode=false", text,
                     re.M), text
    resize = "8x6" if storage == "raw" else "none"
    assert re.search(rf"^ +preprocess: resize={resize}, center_crop=false, max_size=none, "
                     rf"encoding={storage}, quality=90$", text, re.M), text
    if storage == "raw":
        assert "shape 8x6x3" in text


def test_info_human_on_shards_of_another_tool(tmp_path):
    path = tmp_path / "theirs.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(3):
            for name, data in ((f"s{i}.png", make_image_bytes(".png", name=str(i))),
                               (f"s{i}.cls", str(i % 2).encode())):
                member = tarfile.TarInfo(name)
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    result = invoke("info", path)
    assert result.exit_code == 0, result.output
    assert not _PYTHON_REPR.search(result.stdout), result.stdout
    assert "no fastdata manifest" in result.stdout and "checksums  none stored" in result.stdout


def test_info_json(packed_cli):
    tree, out = packed_cli
    result = invoke("info", out, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kind"] == "fastdata-manifest"
    assert data["format"] == "lmdb" and data["count"] == len(tree.samples)
    assert data["classes"] == tree.classes and data["class_counts"] == tree.class_counts
    assert data == fastdata.formats.read_manifest(out).to_dict()


def test_info_on_non_dataset(tmp_path):
    assert_clean_error(invoke("info", tmp_path / "nope.lmdb"), "nope.lmdb")
    assert_clean_error(invoke("info", tmp_path / "nope.zzz"))
    folder = tmp_path / "folder"
    folder.mkdir()
    assert_clean_error(invoke("info", folder), str(folder))


def test_verify_ok(packed_cli):
    tree, out = packed_cli
    result = invoke("verify", out)
    assert result.exit_code == 0, result.output
    assert f"{len(tree.samples)} records checked, 0 damaged" in result.stdout
    decoded = invoke("verify", out, "--decode", "--json")
    assert decoded.exit_code == 0, decoded.output
    data = json.loads(decoded.stdout)
    assert data["ok"] is True and data["decoded"] is True
    assert data["checked"] == data["count"] == len(tree.samples)


def test_verify_damaged(packed_cli):
    import lmdb

    tree, out = packed_cli
    bad = 5
    value = bytearray(tree.samples[bad].data)
    value[len(value) // 2] ^= 0x0F
    env = lmdb.open(str(out), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(f"{bad:010d}".encode(), bytes(value))
    env.close()
    result = invoke("verify", out)
    assert result.exit_code == 1, result.output
    assert "1 damaged" in result.stdout
    assert f"  record {bad} ({tree.samples[bad].key}) fails its CRC32 check" in result.stdout
    assert result.stdout.count(f"record {bad}") == 1, result.stdout
    as_json = invoke("verify", out, "--json")
    assert as_json.exit_code == 1
    data = json.loads(as_json.stdout)
    assert data["ok"] is False
    assert [(p["index"], p["key"]) for p in data["problems"]] == [(bad, tree.samples[bad].key)]


def test_verify_truncated(packed_cli):
    _, out = packed_cli
    data = out / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    result = invoke("verify", out)
    assert_clean_error(result, "truncated")
    assert result.exit_code == 1


# -- help and version -------------------------------------------------------------------


def test_help_for_every_command():
    result = invoke("--help")
    assert result.exit_code == 0 and "Usage" in result.stdout
    assert invoke("-h").exit_code == 0
    for name in ("pack", "info", "verify"):
        assert name in main.commands
    for name in main.commands:
        sub = invoke(name, "--help")
        assert sub.exit_code == 0, (name, sub.output)
        assert "Usage" in sub.stdout and name in sub.stdout


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert fastdata.__version__ in result.stdout


def test_no_command_shows_usage():
    result = invoke()
    assert "Usage" in result.output
    assert "Traceback" not in result.output


# -- interruption -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_tree(tmp_path_factory):
    """400 PNGs that each take a few ms to decode: ``pack --verify-decode`` runs
    for seconds, long enough to be interrupted."""
    root = tmp_path_factory.mktemp("slow") / "src"
    y, x = np.mgrid[0:1024, 0:1024]
    pixels = np.stack([(x // 2) % 256, (y // 3) % 256, ((x + y) // 4) % 256], -1)
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buf, "PNG")
    data = buf.getvalue()
    for c in range(4):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(100):
            (root / f"c{c}" / f"{i:04d}.png").write_bytes(data)
    return root


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # in case the test runner ignores SIGINT


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_pack_keeps_its_state_for_resume(slow_tree, tmp_path, sig):
    workdir = tmp_path / "work"
    workdir.mkdir()
    out = workdir / "out.lmdb"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastdata.cli", "pack", str(slow_tree), str(out),
         "--verify-decode", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    try:
        # Wait until the pack is writing (its temporary output and its resume plan
        # exist), then stop it there, so that however fast the machine, the signal
        # arrives mid-pack.
        plan = workdir / ".out.lmdb.pack-state" / "plan.json"
        deadline = time.monotonic() + 60
        while not (list_partials(workdir) and plan.exists()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "pack never started writing"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGSTOP)
        assert proc.poll() is None, "pack finished before it could be interrupted"
        proc.send_signal(sig)               # pending until it runs again
        os.kill(proc.pid, signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, stderr)
    assert "interrupted" in stderr and "--resume" in stderr
    assert "Traceback" not in stderr
    assert stdout == ""
    assert not out.exists()
    assert not Path(f"{out}.report.json").exists()
    result = invoke("pack", slow_tree, out, "--verify-decode", "--resume")
    assert result.exit_code == 0, result.output
    assert len(fastdata.open_dataset(out)) == 400
    assert os.listdir(workdir) == ["out.lmdb"]


def test_library_errors_speak_api_terms_and_the_cli_flags(image_tree, tmp_path):
    from fastdata.cli import cli_terms
    from fastdata.errors import OutputExistsError
    from fastdata.packers.pack import PackOptions
    from fastdata.packers.preprocess import Preprocess

    out = tmp_path / "out.h5"
    fastdata.pack(image_tree.root, out, progress=False)
    with pytest.raises(OutputExistsError) as info:
        fastdata.pack(image_tree.root, out, progress=False)
    assert "overwrite=True" in str(info.value) and "--" not in info.value.message
    with pytest.raises(FastDataError, match="workers=0") as info:
        fastdata.pack(image_tree.root, tmp_path / "b.h5", options=PackOptions(workers=0),
                      progress=False)
    with pytest.raises(FastDataError, match=r"center_crop=True needs resize="):
        Preprocess(center_crop=True)
    assert cli_terms("pass overwrite=True to replace it") == "pass --overwrite to replace it"
    assert cli_terms("workers=0 is not allowed") == "--workers 0 is not allowed"
    assert cli_terms("center_crop=True needs resize= (the size)") == \
        "--center-crop needs --resize (the size)"
    assert cli_terms("shard_size= applies to sharded formats") == \
        "--shard-size applies to sharded formats"
    assert cli_terms("DataLoader workers and the resize step") == \
        "DataLoader workers and the resize step"
    result = invoke("pack", image_tree.root, tmp_path / "c.h5", "--workers", "0")
    assert_clean_error(result, "--workers 0")
    result = invoke("pack", image_tree.root, tmp_path / "d.h5", "--shard-size", "5")
    assert_clean_error(result, "--shard-size applies to sharded formats (tfrecord, tar)")


@pytest.mark.parametrize("url", ["http://h/x.h5", "https://h/x.tar", "ftp://h/x.lmdb"])
def test_urls_that_cannot_be_written_are_refused_not_written_as_folders(
        image_tree, tmp_path, url, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    message = "URLs are not supported" if url.startswith("ftp") else "read only"
    result = invoke("pack", image_tree.root, url)
    assert_clean_error(result, message)
    assert os.listdir(cwd) == [], "nothing may be written for a URL"
    with pytest.raises(FastDataError, match=message):
        fastdata.pack(image_tree.root, url, progress=False)
    assert os.listdir(cwd) == []


def test_unsupported_url_schemes_are_refused_for_reading(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FastDataError, match="URLs are not supported"):
        fastdata.open_dataset("ftp://host/x.tar")
    assert_clean_error(invoke("info", "ftp://host/x.lmdb"), "URLs are not supported")
    assert os.listdir(tmp_path) == []


def test_verify_decode_accepts_healthy_raw_records(image_tree, tmp_path):
    out = tmp_path / "raw.lmdb"
    assert invoke("pack", image_tree.root, out, "--resize", "8x8", "--encoding", "raw"
                  ).exit_code == 0
    result = invoke("verify", out, "--decode")
    assert result.exit_code == 0, result.output
    assert f"{len(image_tree.samples)} records checked, 0 damaged (decoded)" in result.output


def test_max_pixels_flag_skips_images_over_the_limit(tmp_path):
    tree = build_tree(tmp_path / "src", ["a/big.png", "a/small.png", "b/x.png"],
                      size=(20, 20))
    out = tmp_path / "out.lmdb"
    result = invoke("pack", tree.root, out, "--max-pixels", "100", "--json")
    assert result.exit_code == 1, result.output  # every image is 400 px: none left
    assert_clean_error(result, "none of the 3 image files")
    result = invoke("pack", tree.root, out, "--max-pixels", "400")
    assert result.exit_code == 0, result.output
    result = invoke("pack", tree.root, tmp_path / "strict.lmdb", "--max-pixels", "399",
                    "--strict")
    # The limit and the way past it in the command line's own terms.
    assert_clean_error(result, "above the limit of 399 (--max-pixels 399)",
                       "pass a larger --max-pixels N, or --max-pixels 0 for no limit")
    assert "max_pixels=" not in result.stderr


def test_the_command_list_gives_whole_sentences():
    """``fastdata --help`` (and the CLI reference built from it) lists each
    command with a sentence of its own, not the start of its help cut off."""
    out = invoke("--help").output
    listed = out.split("Commands:", 1)[1].strip().splitlines()
    assert len(listed) == len(main.commands)
    for line in listed:
        assert line.rstrip().endswith(".") and "..." not in line, line


def test_info_of_one_shard_says_which_lines_are_the_whole_sets(image_tree, tmp_path):
    out = tmp_path / "d.tar"
    fastdata.pack(image_tree.root, out, options=fastdata.PackOptions(shard_size=4),
                  progress=False)
    result = invoke("info", tmp_path / "d-000001.tar")
    assert result.exit_code == 0, result.output
    lines = {ln.split()[0]: ln for ln in result.output.splitlines()[1:] if ln.strip()}
    assert lines["records"].split()[-1] == "4"
    for field in ("encoding", "source"):
        assert lines[field].endswith("(all of d.tar.fastdata.json)"), lines[field]


def test_opening_a_folder_says_what_to_do(image_tree, tmp_path):
    with pytest.raises(fastdata.UnknownFormatError, match=r"pack it first \(fastdata pack"):
        fastdata.open_dataset(image_tree.root)
    packed = tmp_path / "out"
    packed.mkdir()
    fastdata.pack(image_tree.root, packed / "d.tar", progress=False)
    with pytest.raises(fastdata.UnknownFormatError,
                       match=r"it holds d\.tar\.fastdata\.json: open that"):
        fastdata.open_dataset(packed)

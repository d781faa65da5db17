"""``pack --verify-decode`` and ``verify --decode`` find JPEG damage that libjpeg
only warns about ("Corrupt JPEG data: ..."), which every plain decode passes
over, and report no damage in intact JPEGs of any kind."""

from __future__ import annotations

import io
import json

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import build_tree
from PIL import Image

import fastdata
from fastdata.cli import main
from fastdata.demo import synthesize
from fastdata.decoding.decode import decode_rgb

FORMATS = (".lmdb", ".h5", ".tfrecord", ".tar")

#: What is written over 2,000 bytes in the middle of the scan data, and the
#: start of the warning libjpeg gives for it.
DAMAGE = {
    "pattern": ((bytes(range(256)) * 8)[:2000], "Corrupt JPEG data: "),
    "eoi": (b"\xff\xd9" * 1000, "Corrupt JPEG data: premature end of data segment"),
}


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _jpeg(img: Image.Image, **options) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **options)
    return buf.getvalue()


def _noisy(size: int = 256, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def damaged_jpeg(kind: str) -> bytes:
    """A 256x256 q90 JPEG with 2,000 bytes of its scan data overwritten; header
    and end-of-image marker intact."""
    good = _jpeg(_noisy(), quality=90)
    sos, eoi = good.rfind(b"\xff\xda"), good.rfind(b"\xff\xd9")
    mid = (sos + eoi) // 2
    pattern = DAMAGE[kind][0]
    assert len(pattern) == 2000 and eoi - sos > 4 * len(pattern)
    return good[:mid - 1000] + pattern + good[mid + 1000:]


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_plain_decoders_accept_the_damaged_jpeg(kind):
    """The reason for the strict check: every plain decode "succeeds"."""
    data = damaged_jpeg(kind)
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        assert img.size == (256, 256)
    assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR).shape == (256, 256, 3)
    assert decode_rgb(data).shape == (256, 256, 3)  # the normal read path, unchanged


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_pack_verify_decode_skips_damaged_jpeg(tmp_path, kind):
    tree = build_tree(tmp_path / "src", ["a/ok.jpg", "a/ok.png", "b/ok.jpg"])
    (tree.root / "b" / "bad.jpg").write_bytes(damaged_jpeg(kind))
    warning = DAMAGE[kind][1]

    plain = invoke("pack", tree.root, tmp_path / "plain.lmdb", "--json", "--no-progress")
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["skipped"] == []  # the header check cannot see it

    full = invoke("pack", tree.root, tmp_path / "full.lmdb", "--json", "--verify-decode",
                  "--no-progress")
    assert full.exit_code == 0, full.output
    summary = json.loads(full.stdout)
    assert summary["records"] == 3
    [skipped] = summary["skipped"]
    assert skipped["key"] == "b/bad.jpg"
    assert "jpeg data is damaged" in skipped["reason"] and warning in skipped["reason"]
    report = json.loads((tmp_path / "full.lmdb.report.json").read_text())
    assert report["skipped"] == summary["skipped"]

    strict = invoke("pack", tree.root, tmp_path / "strict.lmdb", "--verify-decode", "--strict",
                    "--no-progress")
    assert strict.exit_code == 1, strict.output
    [line] = strict.stderr.strip().splitlines()
    assert line.startswith("error:") and "b/bad.jpg" in line and warning in line
    assert not (tmp_path / "strict.lmdb").exists()


@pytest.mark.parametrize("ext", FORMATS)
def test_verify_decode_reports_damaged_jpeg(tmp_path, ext):
    tree = build_tree(tmp_path / "src", ["a/ok.jpg", "a/ok.png", "b/ok.jpg"])
    (tree.root / "b" / "bad.jpg").write_bytes(damaged_jpeg("pattern"))
    out = tmp_path / f"out{ext}"
    assert invoke("pack", tree.root, out, "--no-progress").exit_code == 0
    bad = fastdata.open_dataset(out).keys.index("b/bad.jpg")

    assert invoke("verify", out).exit_code == 0  # the stored bytes are as packed
    result = invoke("verify", out, "--decode", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["damaged"] == 1 and report["checked"] == 4
    [problem] = report["problems"]
    assert (problem["index"], problem["key"]) == (bad, "b/bad.jpg")
    assert "Corrupt JPEG data: " in problem["reason"]
    text = invoke("verify", out, "--decode")
    assert text.exit_code == 1 and "4 records checked, 1 damaged (decoded)" in text.output
    assert f"record {bad} (b/bad.jpg): jpeg data is damaged" in text.output


def _jpeg_kinds(root) -> None:
    """Gray, CMYK, progressive, optimised, 4:2:0, restart markers, EXIF, an
    unknown JFIF revision (a libjpeg warning that is not damage)."""
    img = _noisy(96, seed=1)
    kinds = {
        "gray.jpg": _jpeg(img.convert("L"), quality=90),
        "cmyk.jpg": _jpeg(img.convert("CMYK"), quality=90),
        "progressive.jpg": _jpeg(img, quality=90, progressive=True),
        "progressive_gray.jpg": _jpeg(img.convert("L"), progressive=True),
        "progressive_cmyk.jpg": _jpeg(img.convert("CMYK"), progressive=True),
        "optimized.jpg": _jpeg(img, quality=95, optimize=True),
        "subsampled.jpg": _jpeg(img, quality=75, subsampling=2),
        "restarts.jpg": _jpeg(img, quality=90, restart_marker_blocks=1),
        "exif.jpg": _jpeg(img, quality=90, exif=Image.Exif().tobytes()),
    }
    jfif = bytearray(_jpeg(img, quality=90))
    at = jfif.find(b"JFIF\x00")
    jfif[at + 5] = 2  # "Warning: unknown JFIF revision number 2.01"
    kinds["jfif2.jpg"] = bytes(jfif)
    (root / "kinds").mkdir(parents=True)
    for name, data in kinds.items():
        (root / "kinds" / name).write_bytes(data)


def test_no_false_positives_on_intact_jpegs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for kind, n in (("photos", 12), ("tiny", 8)):  # every kind the demo generator makes
        synthesize(tmp_path / kind, kind=kind, n=n, classes=2, progress=False)
        for folder in (tmp_path / kind).iterdir():
            folder.rename(src / f"{kind}_{folder.name}")
    _jpeg_kinds(src)
    count = sum(1 for p in src.rglob("*") if p.is_file())
    out = tmp_path / "all.lmdb"

    result = invoke("pack", src, out, "--verify-decode", "--strict", "--json", "--no-progress")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records"] == count
    verified = invoke("verify", out, "--decode")
    assert verified.exit_code == 0, verified.output
    assert f"{count} records checked, 0 damaged (decoded)" in verified.output

"""Tests for fastdata.demo, the demo-data generator."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image, JpegImagePlugin

from fastdata.cli import main
from fastdata.demo import SynthSummary, synthesize
from fastdata.demo.photos import photo_encoding, photo_size
from fastdata.errors import FastDataError, SourceError


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in _files(root)}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> tuple[Path, SynthSummary]:
    root = tmp_path_factory.mktemp("synth") / "photos"
    return root, synthesize(root, kind="photos", n=12, classes=5, seed=3, progress=False)


def test_photos_tree_layout(photos):
    root, summary = photos
    classes = sorted(p.name for p in root.iterdir())
    assert classes == [f"class_{c:03d}" for c in range(5)]
    # 12 over 5 classes: 2 each, the remainder of 2 to the first classes.
    assert [len(list((root / c).iterdir())) for c in classes] == [3, 3, 2, 2, 2]
    files = _files(root)
    assert len(files) == 12
    assert all(p.suffix == ".jpg" for p in files)
    assert sorted(p.name for p in files) == [f"img_{i:06d}.jpg" for i in range(12)]
    # No temporary folders left beside the output.
    assert [p.name for p in root.parent.iterdir()] == ["photos"]


def test_photos_decode_with_expected_sizes(photos):
    root, summary = photos
    widths, heights, total = [], [], 0
    for path in _files(root):
        data = path.read_bytes()
        total += len(data)
        with Image.open(io.BytesIO(data)) as im:
            assert im.format == "JPEG"
            im = im.convert("RGB")
            im.load()
        w, h = im.size
        assert 300 <= w <= 640 and 300 <= h <= 640
        widths.append(w)
        heights.append(h)
        # Photo-like, not flat: there is real variation in the pixels.
        assert im.getextrema()[1][1] - im.getextrema()[1][0] > 40
    assert summary.images == 12 and summary.classes == 5 and summary.kind == "photos"
    assert summary.bytes == total
    assert summary.mean_bytes == pytest.approx(total / 12)
    assert summary.mean_width == pytest.approx(sum(widths) / 12)
    assert summary.mean_height == pytest.approx(sum(heights) / 12)
    assert summary.root == str(root.absolute())
    assert summary.seconds > 0
    assert summary.to_dict()["images"] == 12


def test_photos_are_imagenet_like_jpegs(photos):
    root, summary = photos
    pixels = 0
    for path in _files(root):
        with Image.open(path) as im:
            # Baseline JPEG, 4:4:4 / 4:2:2 / 4:2:0 chroma, as in ImageNet.
            assert not im.info.get("progressive")
            assert JpegImagePlugin.get_sampling(im) in (0, 1, 2)
            pixels += im.size[0] * im.size[1]
            y = np.asarray(im.convert("L"), np.float32)
        # Photo-like, not white noise: neighbouring pixels are strongly
        # correlated (white noise ~0, real photos ~0.9) ...
        assert np.corrcoef(y[:, :-1].ravel(), y[:, 1:].ravel())[0, 1] > 0.6
        # ... yet full of fine detail, not smooth gradients (~0.5).
        assert np.abs(np.diff(y, axis=1)).mean() > 4.0
    # Compressed size like ImageNet train JPEGs (about 0.6-0.8 bytes/pixel).
    assert 0.4 <= summary.bytes / pixels <= 0.9


def test_photo_size_and_encoding_mix():
    rng = np.random.default_rng(0)
    sizes = np.array([photo_size(rng) for _ in range(4000)])
    assert sizes.min() >= 300 and sizes.max() <= 640
    mean_w, mean_h = sizes.mean(axis=0)
    assert 440 <= mean_w <= 500 and 350 <= mean_h <= 400
    enc = [photo_encoding(rng) for _ in range(4000)]
    quality = np.array([q for q, _ in enc])
    subsampling = [s for _, s in enc]
    assert quality.min() >= 75 and quality.max() <= 95
    # Skewed towards ImageNet's light compression: ~70% at 88-95 ...
    assert 0.65 <= (quality >= 88).mean() <= 0.75
    # ... and mostly without chroma subsampling.
    assert set(subsampling) == {"4:4:4", "4:2:2", "4:2:0"}
    assert 0.6 <= subsampling.count("4:4:4") / len(enc) <= 0.8


def test_tiny_pngs(tmp_path):
    root = tmp_path / "tiny"
    summary = synthesize(root, kind="tiny", n=25, progress=False)
    assert summary.classes == 10 and summary.images == 25
    assert (summary.mean_width, summary.mean_height) == (32, 32)
    files = _files(root)
    assert len(files) == 25 and len({p.parent.name for p in files}) == 10
    for path in files:
        assert path.suffix == ".png"
        with Image.open(path) as im:
            assert im.format == "PNG" and im.mode == "RGB" and im.size == (32, 32)


def test_default_counts(tmp_path):
    summary = synthesize(tmp_path / "t", kind="tiny", progress=False)
    assert (summary.images, summary.classes) == (2048, 10)
    assert len(_files(tmp_path / "t")) == 2048


def test_deterministic(photos, tmp_path):
    root, _ = photos
    again = tmp_path / "again"
    synthesize(again, kind="photos", n=12, classes=5, seed=3, progress=False)
    assert _tree_bytes(again) == _tree_bytes(root)

    other = tmp_path / "other"
    synthesize(other, kind="photos", n=12, classes=5, seed=4, progress=False)
    a, b = _tree_bytes(root), _tree_bytes(other)
    assert a.keys() == b.keys()
    assert all(a[k] != b[k] for k in a)


def test_tiny_deterministic(tmp_path):
    synthesize(tmp_path / "a", kind="tiny", n=20, seed=1, progress=False)
    synthesize(tmp_path / "b", kind="tiny", n=20, seed=1, progress=False)
    synthesize(tmp_path / "c", kind="tiny", n=20, seed=2, progress=False)
    assert _tree_bytes(tmp_path / "a") == _tree_bytes(tmp_path / "b")
    assert _tree_bytes(tmp_path / "a") != _tree_bytes(tmp_path / "c")


def test_non_empty_root_needs_overwrite(tmp_path):
    root = tmp_path / "out"
    root.mkdir()
    (root / "stale.txt").write_text("old")
    with pytest.raises(SourceError, match="--overwrite"):
        synthesize(root, kind="tiny", n=4, classes=2, progress=False)
    assert (root / "stale.txt").exists()

    synthesize(root, kind="tiny", n=4, classes=2, progress=False, overwrite=True)
    assert not (root / "stale.txt").exists()
    assert len(_files(root)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_empty_root_is_fine(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    assert synthesize(root, kind="tiny", n=3, classes=1, progress=False).images == 3


def test_root_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(SourceError):
        synthesize(path, kind="tiny", n=3, classes=1, progress=False, overwrite=True)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"kind": "video"}, ValueError, "unknown synthetic kind"),
        ({"n": 0}, ValueError, "n must be at least 1, got 0"),
        ({"n": -5}, ValueError, "n must be at least 1"),
        ({"n": 3, "classes": 0}, ValueError, "classes must be at least 1"),
        ({"n": 3, "classes": 4}, ValueError, "must not exceed"),
        ({"seed": -1}, ValueError, "seed must be non-negative"),
        ({"n": 2.5}, TypeError, "n must be an integer"),
        ({"n": True}, TypeError, "n must be an integer"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, error, message):
    # A bad argument is the caller's mistake, not a bad source: a plain
    # ValueError/TypeError, never a FastDataError, and nothing is written.
    root = tmp_path / "bad"
    with pytest.raises(error, match=message) as info:
        synthesize(root, progress=False, **kwargs)
    assert not isinstance(info.value, FastDataError)
    assert not root.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["-n", "0"], ["--kind", "tiny", "-n", "3", "--classes", "5"]])
def test_cli_bad_count_is_a_one_line_error(tmp_path, args):
    root = tmp_path / "out"
    result = CliRunner().invoke(main, ["synth", str(root), "--no-progress", *args])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    assert not root.exists()


def test_summary_says_what_was_written_for_both_kinds(photos, tmp_path):
    _, summary = photos
    assert summary.describe() == "12 photo-like JPEGs in 5 classes"
    one = synthesize(tmp_path / "one", kind="tiny", n=1, classes=1, progress=False)
    assert one.describe() == "1 32x32 PNG in 1 class"


@pytest.mark.parametrize("kind, what", [("tiny", "6 32x32 PNGs in 3 classes"),
                                        ("photos", "3 photo-like JPEGs in 3 classes")])
def test_cli_summary_line_reads_as_words(tmp_path, kind, what):
    root = tmp_path / "out"
    result = CliRunner().invoke(main, ["synth", str(root), "--kind", kind, "-n",
                                       str(int(what.split()[0])), "--classes", "3",
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {what} to {root} ("), result.output

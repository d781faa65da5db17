"""Pack-time preprocessing and parallel packing, in every registered format."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata.errors import FastDataError
from fastdata.formats import FORMATS
from fastdata.packers.pack import PackOptions
from fastdata.packers.preprocess import Preprocess, parse_resize

FORMAT_NAMES = sorted(FORMATS)


def _tree(root, sizes=((40, 60), (50, 30), (64, 64)), per_class=4, classes=2, fmt="JPEG"):
    rng = np.random.default_rng(7)
    for c in range(classes):
        d = os.path.join(root, f"c{c}")
        os.makedirs(d)
        for i in range(per_class):
            h, w = sizes[(c + i) % len(sizes)]
            y, x = np.mgrid[0:h, 0:w]
            px = np.stack([(x * 4 + c * 40) % 256, (y * 3) % 256,
                           rng.integers(0, 255, (h, w))], -1).astype(np.uint8)
            ext = "jpg" if fmt == "JPEG" else "png"
            Image.fromarray(px).save(os.path.join(d, f"{i}.{ext}"), fmt)
    return root


def _out(tmp_path, fmt, name="out"):
    return str(tmp_path / f"{name}{FORMATS[fmt].extensions[0]}")


def _pack(src, out, **opts):
    opts.setdefault("workers", 1)
    return fastdata.pack(src, out, options=PackOptions(**opts), progress=False)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_resize_center_crop_raw_round_trip(tmp_path, fmt):
    src = _tree(str(tmp_path / "src"))
    summary = _pack(src, _out(tmp_path, fmt),
                    preprocess=Preprocess(resize=24, center_crop=True, encoding="raw"))
    ds = fastdata.open_dataset(summary.output)
    assert ds.manifest.encoding["storage"] == "raw"
    assert ds.manifest.encoding["shape"] == [24, 24, 3]
    reference = fastdata.open_dataset(
        _pack(src, _out(tmp_path, fmt, "ref"),
              preprocess=Preprocess(resize=24, center_crop=True, encoding="png")).output)
    for i in range(len(ds)):
        image, label = ds[i]
        assert tuple(image.shape) == (3, 24, 24)
        ref_image, ref_label = reference[i]
        # raw and PNG both store the exact preprocessed pixels.
        assert label == ref_label and bool((image == ref_image).all())
    batch = ds.__getitems__([3, 0, 5])
    assert [b[1] for b in batch] == [ds[3][1], ds[0][1], ds[5][1]]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_resize_shorter_side_keeps_aspect_and_encoding(tmp_path, fmt):
    src = _tree(str(tmp_path / "src"))
    summary = _pack(src, _out(tmp_path, fmt), preprocess=Preprocess(resize=20))
    ds = fastdata.open_dataset(summary.output, output="numpy")
    for i in range(len(ds)):
        image, _ = ds[i]
        with Image.open(os.path.join(src, ds.keys[i])) as original:
            w, h = original.size
        # The short side becomes 20; the long one keeps the source's aspect ratio.
        expected = (20, round(w * 20 / h)) if h <= w else (round(h * 20 / w), 20)
        got = image.shape[:2]
        assert min(got) == 20 and abs(got[0] - expected[0]) <= 1 \
            and abs(got[1] - expected[1]) <= 1, (ds.keys[i], (h, w), got, expected)
    assert set(ds.manifest.encoding["formats"]) == {"jpeg"}
    raw_bytes = fastdata.open_dataset(summary.output, output="bytes")[0][0]
    assert raw_bytes[:3] == b"\xff\xd8\xff"


def test_resize_hxw_stretches_and_max_size_caps(tmp_path):
    src = _tree(str(tmp_path / "src"))
    ds = fastdata.open_dataset(_pack(src, _out(tmp_path, "lmdb", "a"),
                                     preprocess=Preprocess(resize=(10, 30))).output)
    assert all(tuple(ds[i][0].shape) == (3, 10, 30) for i in range(len(ds)))
    ds = fastdata.open_dataset(_pack(src, _out(tmp_path, "lmdb", "b"),
                                     preprocess=Preprocess(max_size=32)).output)
    assert all(max(ds[i][0].shape[1:]) <= 32 for i in range(len(ds)))


def test_encoding_png_is_lossless_and_jpeg_quality_applies(tmp_path):
    src = _tree(str(tmp_path / "src"), fmt="PNG")
    png = fastdata.open_dataset(_pack(src, _out(tmp_path, "lmdb", "png"),
                                      preprocess=Preprocess(encoding="png")).output)
    original = fastdata.open_dataset(_pack(src, _out(tmp_path, "lmdb", "keep")).output)
    for i in range(len(png)):
        assert bool((png[i][0] == original[i][0]).all())
    small = _pack(src, _out(tmp_path, "lmdb", "q20"),
                  preprocess=Preprocess(encoding="jpeg", quality=20))
    big = _pack(src, _out(tmp_path, "lmdb", "q95"),
                preprocess=Preprocess(encoding="jpeg", quality=95))
    assert fastdata.formats.read_manifest(small.output).bytes["payload"] < \
        fastdata.formats.read_manifest(big.output).bytes["payload"]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_two_workers_give_identical_output(tmp_path, fmt):
    src = _tree(str(tmp_path / "src"), per_class=20)
    pre = Preprocess(resize=16, encoding="jpeg")
    one = _pack(src, _out(tmp_path, fmt, "one"), workers=1, preprocess=pre)
    two = _pack(src, _out(tmp_path, fmt, "two"), workers=2, preprocess=pre)
    m1, m2 = fastdata.formats.read_manifest(one.output), fastdata.formats.read_manifest(two.output)
    assert m1.checksums["payload_sha256"] == m2.checksums["payload_sha256"]
    r1, r2 = fastdata.formats.open_reader(one.output), fastdata.formats.open_reader(two.output)
    assert r1.read_many(range(len(r1))) == r2.read_many(range(len(r2)))
    assert r1.labels.tolist() == r2.labels.tolist() and r1.keys == r2.keys


def test_raw_without_fixed_size_needs_one_image_size(tmp_path):
    src = _tree(str(tmp_path / "src"))
    with pytest.raises(FastDataError, match="raw storage needs one image size"):
        _pack(src, _out(tmp_path, "lmdb"), preprocess=Preprocess(encoding="raw"))
    same = _tree(str(tmp_path / "same"), sizes=((8, 8),))
    summary = _pack(same, _out(tmp_path, "lmdb", "same"), preprocess=Preprocess(encoding="raw"))
    assert fastdata.formats.read_manifest(summary.output).encoding["shape"] == [8, 8, 3]


def test_option_errors_are_one_line(tmp_path):
    with pytest.raises(FastDataError, match="center_crop=True needs resize="):
        Preprocess(center_crop=True)
    with pytest.raises(FastDataError, match="unknown encoding"):
        Preprocess(encoding="gif")
    with pytest.raises(FastDataError, match="quality"):
        Preprocess(encoding="jpeg", quality=0)
    with pytest.raises(FastDataError, match="cannot be read"):
        parse_resize("big")
    assert parse_resize("224x160") == (224, 160) and parse_resize("256") == 256


def test_cli_pack_with_preprocessing(tmp_path):
    from click.testing import CliRunner

    from fastdata.cli import main

    src = _tree(str(tmp_path / "src"))
    out = str(tmp_path / "out.lmdb")
    result = CliRunner().invoke(main, ["pack", src, out, "--resize", "16", "--center-crop",
                                       "--encoding", "raw", "--workers", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert fastdata.formats.read_manifest(out).encoding["shape"] == [16, 16, 3]
    bad = CliRunner().invoke(main, ["pack", src, str(tmp_path / "x.lmdb"), "--encoding", "raw"])
    assert bad.exit_code == 1 and "raw storage needs one image size" in bad.output
    assert "Traceback" not in bad.output


def test_getitems_equals_per_item_with_size(tmp_path):
    src = _tree(str(tmp_path / "src"))
    ds = fastdata.open_dataset(_pack(src, _out(tmp_path, "lmdb")).output, size=(12, 12),
                               decode_threads=2)
    batch = ds.__getitems__(list(range(len(ds))))
    for i, (image, label) in enumerate(batch):
        single, single_label = ds[i]
        assert tuple(image.shape) == (3, 12, 12) and bool((image == single).all())
        assert label == single_label


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_streaming_dataset_reads_raw_and_resizes(tmp_path, fmt):
    src = _tree(str(tmp_path / "src"))
    summary = _pack(src, _out(tmp_path, fmt),
                    preprocess=Preprocess(resize=(10, 12), encoding="raw"), shard_size=3)
    stream = fastdata.ShardedIterableDataset(summary.output)
    mapped = fastdata.open_dataset(summary.output)
    got = list(stream)
    assert len(got) == len(mapped)
    for (image, label), i in zip(got, range(len(mapped))):
        assert tuple(image.shape) == (3, 10, 12) and label == mapped[i][1]
        assert bool((image == mapped[i][0]).all())
    small = fastdata.ShardedIterableDataset(summary.output, size=(5, 6))
    assert tuple(next(iter(small))[0].shape) == (3, 5, 6)


def test_pack_workers_start_after_the_parent_used_opencv_threads(tmp_path):
    # OpenCV's thread pool does not survive fork: a worker that reconfigured it
    # waited forever for threads that exist only in the parent.
    from conftest import build_tree, run_python

    tree = build_tree(tmp_path / "src", [f"c{i % 2}/{i:03d}.png" for i in range(64)])
    code = """
        import sys
        import numpy as np, cv2, fastdata
        from fastdata.packers.preprocess import Preprocess
        cv2.resize(np.zeros((2000, 2000, 3), np.uint8), (1000, 1000))  # starts OpenCV's pool
        options = fastdata.PackOptions(workers=2, preprocess=Preprocess(resize=8))
        print(fastdata.pack(sys.argv[1], sys.argv[2], options=options, progress=False).records)
        """
    proc = run_python(code, str(tree.root), str(tmp_path / "out.lmdb"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "64"

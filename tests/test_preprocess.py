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
    ds = fastdata.open_dataset(summary.output, decode=fastdata.Decode(output="numpy"))
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
    raw_bytes = fastdata.open_dataset(summary.output, decode=fastdata.Decode(output="bytes"))[0][0]
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
    from worker_pids import PreparedIn, assert_other_processes, assert_this_process

    src = _tree(str(tmp_path / "src"), per_class=20)
    logs = {n: str(tmp_path / f"prepared-{n}.pids") for n in (1, 2)}
    # Preprocess(resize=16, encoding="jpeg"), recording the process preparing each image.
    one = _pack(src, _out(tmp_path, fmt, "one"), workers=1,
                preprocess=PreparedIn(resize=16, encoding="jpeg", log=logs[1]))
    two = _pack(src, _out(tmp_path, fmt, "two"), workers=2,
                preprocess=PreparedIn(resize=16, encoding="jpeg", log=logs[2], meet=2))
    assert_this_process(logs[1])            # one worker: the images prepared here
    assert_other_processes(logs[2], count=2)  # two: by two worker processes, none here
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
    ds = fastdata.open_dataset(_pack(src, _out(tmp_path, "lmdb")).output,
                               decode=fastdata.Decode(size=(12, 12)), decode_threads=2)
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
    small = fastdata.ShardedIterableDataset(summary.output, decode=fastdata.Decode(size=(5, 6)))
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


# -- the stored pixels of --center-crop and --max-size against an independent resize --------
#
# Preprocess documents its resampling (_resize_quality): OpenCV, area averaging
# when the image shrinks, bicubic when it grows. The references below are made
# here from that rule with cv2.resize, from sizes worked out by hand from the
# documented geometry, and stored as PNG (lossless): the same library and filter
# give the same bytes, so pixels are compared exactly.

_QUADRANTS = ((220, 30, 30), (30, 200, 40), (40, 60, 230), (240, 220, 20))  # TL TR BL BR


def _quadrants(h, w):
    """An image whose four quadrants (split at h/2, w/2) have four colours."""
    px = np.empty((h, w, 3), np.uint8)
    tl, tr, bl, br = _QUADRANTS
    px[:h // 2, :w // 2], px[:h // 2, w // 2:] = tl, tr
    px[h // 2:, :w // 2], px[h // 2:, w // 2:] = bl, br
    return px


def _noise(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


#: name -> source pixels: two quadrant images whose sizes put the quadrants'
#: meeting point at the centre of every crop below, and noise of odd sizes and
#: aspect ratios (one smaller than the targets, so that it is enlarged).
_SOURCES = {
    "quad/wide.png": _quadrants(60, 120),
    "quad/tall.png": _quadrants(120, 60),
    "noise/odd.png": _noise(47, 83, 1),
    "noise/tall.png": _noise(95, 37, 2),
    "noise/small.png": _noise(13, 17, 3),
    "noise/square.png": _noise(33, 33, 4),
}

#: Preprocess(resize=..., center_crop=True): the image scaled by
#: max(th / h, tw / w) to cover the target, each side rounded to the nearest
#: pixel (no case here is near a half), then the centre cut out (offsets
#: floor((scaled - target) / 2)). name -> (scaled (h, w), crop offset (top, left)).
_CROPS = {
    20: {"quad/wide.png": ((20, 40), (0, 10)),        # 60x120 * 1/3
         "quad/tall.png": ((40, 20), (10, 0)),
         "noise/odd.png": ((20, 35), (0, 7)),          # 83 * 20/47 = 35.32
         "noise/tall.png": ((51, 20), (15, 0)),        # 95 * 20/37 = 51.35
         "noise/small.png": ((20, 26), (0, 3)),        # 17 * 20/13 = 26.15, enlarged
         "noise/square.png": ((20, 20), (0, 0))},
    (16, 24): {"quad/wide.png": ((16, 32), (0, 4)),   # 60x120 * 16/60
               "quad/tall.png": ((48, 24), (16, 0)),  # 120x60 * 24/60
               "noise/odd.png": ((16, 28), (0, 2)),    # 83 * 16/47 = 28.26
               "noise/tall.png": ((62, 24), (23, 0)),  # 95 * 24/37 = 61.62
               "noise/small.png": ((18, 24), (1, 0)),  # 13 * 24/17 = 18.35, enlarged
               "noise/square.png": ((24, 24), (4, 0))},  # 33 * 24/33
}

#: Preprocess(max_size=40): the longer side scaled to 40, the other rounded;
#: an image already within 40 is stored as it is.
_CAPPED = {"quad/wide.png": (20, 40), "quad/tall.png": (40, 20),
           "noise/odd.png": (23, 40),                  # 47 * 40/83 = 22.65
           "noise/tall.png": (40, 16),                 # 37 * 40/95 = 15.58
           "noise/small.png": (13, 17), "noise/square.png": (33, 33)}


def _reference_resize(px, hw):
    import cv2

    h, w = hw
    if (h, w) == px.shape[:2]:
        return px
    shrink = h * w < px.shape[0] * px.shape[1]
    return cv2.resize(px, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_CUBIC)


@pytest.fixture(scope="module")
def shaped_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("shaped") / "src"
    for name, px in _SOURCES.items():
        os.makedirs(root / os.path.dirname(name), exist_ok=True)
        Image.fromarray(px).save(root / name)
    return str(root)


def _stored_pixels(tmp_path, src, preprocess):
    summary = _pack(src, _out(tmp_path, "lmdb"), preprocess=preprocess)
    ds = fastdata.open_dataset(summary.output, decode=fastdata.Decode(output="numpy"))
    assert sorted(ds.keys) == sorted(_SOURCES)
    return {key: ds[i][0] for i, key in enumerate(ds.keys)}


def _assert_quadrants(image, centre):
    """The four colours, each filling its quadrant around ``centre`` (y, x) exactly."""
    cy, cx = centre
    tl, tr, bl, br = _QUADRANTS
    for region, colour in ((image[:cy, :cx], tl), (image[:cy, cx:], tr),
                           (image[cy:, :cx], bl), (image[cy:, cx:], br)):
        assert region.size and bool((region == np.array(colour, np.uint8)).all()), \
            (colour, np.unique(region.reshape(-1, 3), axis=0))


@pytest.mark.parametrize("target", [20, (16, 24)], ids=["short-side", "hxw"])
def test_center_crop_stores_the_centre_of_the_covering_resize(tmp_path, shaped_tree, target):
    th, tw = (target, target) if isinstance(target, int) else target
    stored = _stored_pixels(tmp_path, shaped_tree,
                            Preprocess(resize=target, center_crop=True, encoding="png"))
    for name, ((sh, sw), (top, left)) in _CROPS[target].items():
        image = stored[name]
        assert image.shape == (th, tw, 3), (name, image.shape)
        expected = _reference_resize(_SOURCES[name], (sh, sw))[top:top + th, left:left + tw]
        assert np.array_equal(image, expected), \
            (name, int(np.abs(image.astype(int) - expected).max()))
    # Geometry: the quadrants meet at the centre of the crop, so the crop is the
    # middle of the scaled image (a crop from a corner or an edge would show one
    # or two colours, or move the meeting point).
    for name in ("quad/wide.png", "quad/tall.png"):
        _assert_quadrants(stored[name], (th // 2, tw // 2))


def test_max_size_shrinks_the_longer_side_and_keeps_smaller_images(tmp_path, shaped_tree):
    stored = _stored_pixels(tmp_path, shaped_tree, Preprocess(max_size=40, encoding="png"))
    for name, hw in _CAPPED.items():
        image = stored[name]
        assert image.shape == (*hw, 3), (name, image.shape)
        expected = _reference_resize(_SOURCES[name], hw)
        assert np.array_equal(image, expected), \
            (name, int(np.abs(image.astype(int) - expected).max()))
    # Nothing cut away: the whole image, its quadrants scaled in place.
    _assert_quadrants(stored["quad/wide.png"], (10, 20))
    _assert_quadrants(stored["quad/tall.png"], (20, 10))
    # Never enlarged: the images within 40 are their source pixels.
    for name in ("noise/small.png", "noise/square.png"):
        assert np.array_equal(stored[name], _SOURCES[name])

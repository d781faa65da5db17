"""RandomResizedCrop's fused path: JPEG crops decoded on their own through
TurboJPEG 3 (``fastdata.decoding.turbojpeg``) give the pixels of a full decode
then crop (exactly at full DCT scale, within resampling at reduced scales),
with the same boxes and flips, the same fallbacks, pixel limit and errors, in
any DataLoader worker."""

from __future__ import annotations

import io
import os
import struct
import tarfile
import warnings

import numpy as np
import optional
import pytest
from conftest import pixel_digest, run_python
from PIL import Image, ImageDraw, ImageFilter
from torch.utils.data import DataLoader, default_collate
from worker_pids import CollatedIn, assert_workers_did_it

import fastdata
from fastdata import Decode, Order
from fastdata.errors import DecodeError
from fastdata.decoding import turbojpeg
from fastdata.decoding.decode import DecoderChain

optional.skip_if_missing("turbojpeg")

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SEED = 7
#: Output sizes large next to a 400x300 photo's crops: always full DCT scale.
FULL_SCALE = (160, 160)
#: Small output sizes: most crops of a 400x300 photo decode at 1/8, 1/4 or 1/2.
REDUCED = (20, 24)
CHAIN = DecoderChain()
#: PIL's JPEG ``subsampling`` values.
SUBSAMPLING = {"444": 0, "422": 1, "420": 2}


# -- images ------------------------------------------------------------------------


def photo(width: int = 400, height: int = 300, seed: int = 0, noise: float = 6.0
          ) -> Image.Image:
    """Photo-like RGB content: gradients, blurred discs, sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width * 200 + 30, y / height * 180 + 40,
                     (x + y) / (width + height) * 150 + 60], -1)
    img = Image.fromarray(base.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        cx, cy, r = (int(v) for v in (rng.integers(0, width), rng.integers(0, height),
                                      rng.integers(10, 60)))
        draw.ellipse([cx - r, cy - r, cx + r, cy + r],
                     fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    img = img.filter(ImageFilter.GaussianBlur(3))
    pixels = np.asarray(img).astype(np.float32) + rng.normal(0, noise, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def jpeg(img: Image.Image, quality: int = 90, **options) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, **options)
    return buf.getvalue()


def photo_jpeg(kind: str, seed: int = 0, noise: float = 6.0, size=(400, 300)) -> bytes:
    """A photo JPEG: "444", "422", "420" chroma subsampling, or "gray"."""
    img = photo(*size, seed=seed, noise=noise)
    if kind == "gray":
        return jpeg(img.convert("L"))
    return jpeg(img, subsampling=SUBSAMPLING[kind])


def cmyk_jpeg(seed: int = 0) -> bytes:
    return jpeg(photo(seed=seed).convert("CMYK"))


def png(seed: int = 0) -> bytes:
    buf = io.BytesIO()
    photo(seed=seed).save(buf, "PNG")
    return buf.getvalue()


def with_declared_size(data: bytes, width: int, height: int) -> bytes:
    """``data`` (a baseline JPEG) with its frame header declaring another size."""
    data = bytearray(data)
    sof = data.find(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def foreign_tar(path, images: list[bytes]):
    """A webdataset-style tar of ``images`` (any bytes), written by tarfile."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i, data in enumerate(images):
            for ext, body in (("jpg", data), ("cls", b"%d" % (i % 2))):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return path


def mean_diff(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def unfused(crop: fastdata.RandomResizedCrop) -> fastdata.RandomResizedCrop:
    return fastdata.RandomResizedCrop(crop.size, crop.scale, crop.ratio, crop.hflip,
                                      fused=False)


def full_decode(data: bytes, gray: bool = False) -> np.ndarray:
    import simplejpeg

    return simplejpeg.decode_jpeg(data, colorspace="GRAY" if gray else "RGB")


# -- pixels at full and reduced DCT scales ---------------------------------------------


@pytest.mark.parametrize("kind", ["444", "422", "420", "gray"])
def test_full_scale_crops_equal_a_full_decode_then_crop(kind):
    data = photo_jpeg(kind, seed=1)
    crop = fastdata.RandomResizedCrop(FULL_SCALE)
    for index in range(24):
        _, _, w, h, _ = crop.box(400, 300, SEED, 0, index)
        assert crop.eighths(w, h) == 8
        fused = crop.decode(data, CHAIN, SEED, 0, index)
        whole = unfused(crop).decode(data, CHAIN, SEED, 0, index)
        assert fused.shape == whole.shape == (160, 160, 3)
        assert mean_diff(fused, whole) <= 3.0
        # Both are libjpeg-turbo: the same pixels, edges of the box included.
        assert np.array_equal(fused, whole), (kind, index)


def smooth_photo_jpeg(seed: int) -> bytes:
    """Gradients and blurred shapes, no noise: smooth photographic content."""
    img = photo(seed=seed, noise=0.0).filter(ImageFilter.GaussianBlur(4))
    return jpeg(img, subsampling=SUBSAMPLING["420"])


def antialiased(full: np.ndarray, box, flip: bool, size) -> np.ndarray:
    """The exact box of a full decode, flipped, resized by Pillow (antialiased)."""
    left, top, w, h = box
    img = Image.fromarray(full).resize((size[1], size[0]), Image.BILINEAR,
                                       box=(left, top, left + w, top + h))
    return np.asarray(img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else img)


@pytest.mark.parametrize("seed", [0, 1])
def test_reduced_scale_crops_stay_close_to_a_full_decode_then_resize(seed):
    from fastdata.decoding.decode import resize

    data = smooth_photo_jpeg(seed)
    full = full_decode(data)
    for crop in (fastdata.RandomResizedCrop(REDUCED), fastdata.RandomResizedCrop(48)):
        scales = []
        for index in range(30):
            left, top, w, h, flip = crop.box(400, 300, SEED, 0, index)
            scales.append(crop.eighths(w, h))
            fused = crop.decode(data, CHAIN, SEED, 0, index)
            assert fused.shape == (*crop.size, 3)
            want = antialiased(full, (left, top, w, h), flip, crop.size)
            assert mean_diff(fused, want) <= 3.0, (crop.size, index, scales[-1])
            if crop.size == (48, 48):  # shrinks up to 8x: our resize antialiases as well
                region = full[top:top + h, left:left + w]
                ours = resize(np.ascontiguousarray(region[:, ::-1] if flip else region),
                              crop.size)
                assert mean_diff(fused, ours) <= 3.0, (crop.size, index, scales[-1])
        # The scaled path was taken, at every reduced scale.
        assert set(scales) >= ({1, 2} if crop.size == REDUCED else {2, 4}), scales


# -- flips -----------------------------------------------------------------------------


def _bilinear_only(crop, box) -> bool:
    """Whether the resize after decoding ``box`` is one bilinear step (no
    pyrDown halving, which is not mirror-symmetric)."""
    from fastdata.decoding.decode import LINEAR_MAX_SHRINK

    w, h = box[2], box[3]
    eighths = crop.eighths(w, h)
    return max(w * eighths / 8 / crop.size[1], h * eighths / 8 / crop.size[0]) \
        <= LINEAR_MAX_SHRINK


def test_a_flip_mirrors_the_same_box():
    data = photo_jpeg("420", seed=2)
    scales = set()
    for size in (FULL_SCALE, (48, 48)):
        never = fastdata.RandomResizedCrop(size, hflip=0.0)
        always = fastdata.RandomResizedCrop(size, hflip=1.0)
        for index in range(16):
            # The box draws come before the flip draw: the same box either way.
            box = never.box(400, 300, SEED, 0, index)[:4]
            assert box == always.box(400, 300, SEED, 0, index)[:4]
            if not _bilinear_only(never, box):
                continue
            scales.add(never.eighths(*box[2:]))
            straight = never.decode(data, CHAIN, SEED, 0, index)
            flipped = always.decode(data, CHAIN, SEED, 0, index)
            assert mean_diff(flipped, straight[:, ::-1]) <= 0.5, (size, index)
            assert not np.array_equal(flipped, straight)
    assert scales >= {2, 4, 8}, scales


def test_half_the_crops_are_flipped():
    data = photo_jpeg("444", seed=3)
    half = fastdata.RandomResizedCrop(FULL_SCALE, hflip=0.5)
    never = fastdata.RandomResizedCrop(FULL_SCALE, hflip=0.0)
    flips = []
    for index in range(60):
        got = half.decode(data, CHAIN, SEED, 0, index)
        straight = never.decode(data, CHAIN, SEED, 0, index)
        flip = half.box(400, 300, SEED, 0, index)[4]
        assert np.array_equal(got, straight[:, ::-1] if flip else straight) or \
            mean_diff(got, straight[:, ::-1]) <= 0.5
        if not flip:
            assert np.array_equal(got, straight)
        flips.append(flip)
    assert 0.3 < np.mean(flips) < 0.7, np.mean(flips)


# -- decode_region ---------------------------------------------------------------------


BOXES = [
    (0, 0, 400, 300),  # the whole image
    (5, 7, 1, 30),  # one pixel wide, left not on an iMCU boundary
    (5, 7, 2, 30),
    (16, 3, 100, 50),  # left on an iMCU boundary past the first
    (17, 3, 101, 50),
    (33, 250, 367, 50),  # the right and bottom edges
    (399, 0, 1, 300),  # the last column
    (0, 299, 400, 1),  # the last row
    (131, 97, 61, 43),
]


@pytest.mark.parametrize("kind", ["420", "444", "422", "gray"])
def test_decode_region_is_the_slice_of_a_full_decode(kind):
    data = photo_jpeg(kind, seed=4)
    info = turbojpeg.read_header(data)
    assert (info.width, info.height) == (400, 300) and info.region_decodable
    assert info.gray == (kind == "gray")
    full = full_decode(data, gray=kind == "gray")
    for left, top, w, h in BOXES:
        got = turbojpeg.decode_region(data, info, (left, top, w, h), 8, gray=kind == "gray")
        want = full[top:top + h, left:left + w]
        assert got.shape == want.shape and np.array_equal(got, want), (kind, left, top, w, h)


@pytest.mark.parametrize("kind", ["420", "444"])
def test_decode_region_at_a_scale_is_the_slice_of_the_scaled_image(kind):
    data = photo_jpeg(kind, seed=5, size=(401, 299))
    info = turbojpeg.read_header(data)
    rng = np.random.default_rng(0)
    for eighths in (1, 2, 4):
        whole = turbojpeg.decode_region(data, info, (0, 0, 401, 299), eighths)
        assert whole.shape == (turbojpeg.scaled(299, eighths), turbojpeg.scaled(401, eighths), 3)
        for _ in range(40):
            left, top = int(rng.integers(0, 401)), int(rng.integers(0, 299))
            w, h = int(rng.integers(1, 402 - left)), int(rng.integers(1, 300 - top))
            got = turbojpeg.decode_region(data, info, (left, top, w, h), eighths)
            x0, y0 = left * eighths // 8, top * eighths // 8
            x1 = min(whole.shape[1], turbojpeg.scaled(left + w, eighths))
            y1 = min(whole.shape[0], turbojpeg.scaled(top + h, eighths))
            assert np.array_equal(got, whole[y0:y1, x0:x1]), (eighths, left, top, w, h)


# -- fallbacks -------------------------------------------------------------------------


def test_cmyk_and_png_take_the_full_decode():
    cmyk = cmyk_jpeg(seed=6)
    assert not turbojpeg.read_header(cmyk).region_decodable
    for data in (cmyk, png(seed=6)):
        for crop in (fastdata.RandomResizedCrop(FULL_SCALE), fastdata.RandomResizedCrop(REDUCED)):
            for index in range(6):
                got = crop.decode(data, CHAIN, SEED, 0, index)
                want = unfused(crop).decode(data, CHAIN, SEED, 0, index)
                assert got.shape == (*crop.size, 3)
                assert np.array_equal(got, want)


@pytest.fixture(scope="module")
def photo_pack(tmp_path_factory):
    """An LMDB pack of 12 photo JPEGs (all subsamplings), stored as they are."""
    base = tmp_path_factory.mktemp("fused")
    kinds = ("420", "444", "422", "gray")
    for k in range(12):
        folder = base / "src" / f"c{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:02d}.jpg").write_bytes(photo_jpeg(kinds[k % 4], seed=10 + k))
    return fastdata.pack(base / "src", base / "photos.lmdb", progress=False).output


def _numpy_images(path, **decode) -> list[np.ndarray]:
    ds = fastdata.open_dataset(path, decode=Decode(output="numpy", **decode),
                               order=Order(seed=SEED))
    return [ds[i][0] for i in range(len(ds))]


def test_an_explicit_decoder_takes_the_full_decode(photo_pack):
    # Reduced scales: the fused pixels differ from a full decode's, so equal
    # pixels show which path ran.
    crop = fastdata.RandomResizedCrop(REDUCED)
    fused = _numpy_images(photo_pack, crop=crop)
    whole = _numpy_images(photo_pack, crop=unfused(crop))
    assert any(not np.array_equal(a, b) for a, b in zip(fused, whole))
    pil = _numpy_images(photo_pack, crop=crop, decoder="pil")
    pil_whole = _numpy_images(photo_pack, crop=unfused(crop), decoder="pil")
    for a, b in zip(pil, pil_whole):
        assert np.array_equal(a, b)


def test_corrupt_jpegs_are_skipped_as_without_fusing(tmp_path):
    good = [photo_jpeg("420", seed=20 + k) for k in range(4)]
    garbled = bytearray(good[1])
    sos = garbled.find(b"\xff\xda")
    garbled[sos + 40:] = b"\xff\xd9"  # scan data cut short: an unfinished image
    header_only = good[2][:good[2].find(b"\xff\xda")]
    corrupt = [good[0], bytes(garbled), header_only, b"\xff\xd8\xff\xe0junk", good[3]]
    shard = foreign_tar(tmp_path / "mixed.tar", corrupt)
    results = {}
    for fused in (True, False):
        crop = fastdata.RandomResizedCrop(FULL_SCALE, fused=fused)
        ds = fastdata.open_dataset(shard, decode=Decode(crop=crop, output="numpy"),
                                   order=Order(seed=SEED), on_error="skip")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            batch = ds.__getitems__(list(range(len(ds))))
        results[fused] = ([pixel_digest(image) for image, _ in batch], ds.skipped)
        raising = fastdata.open_dataset(shard, decode=Decode(crop=crop, output="numpy"),
                                        order=Order(seed=SEED))
        outcome = []
        for i in range(len(raising)):
            try:
                outcome.append(raising[i][0].shape)
            except DecodeError:
                outcome.append("error")
        results[fused, "raise"] = outcome
    assert results[True] == results[False]
    assert results[True, "raise"] == results[False, "raise"]
    assert results[True][1] >= 2  # the header-only and junk records at least
    assert results[True, "raise"][0] == results[True, "raise"][4] == (160, 160, 3)


def test_a_refused_header_leaves_later_decodes_working():
    good = photo_jpeg("420", seed=21)
    cut = good[:good.find(b"\xff\xda")]  # the header cut off before the scan
    crop = fastdata.RandomResizedCrop(REDUCED)
    before = crop.decode(good, CHAIN, SEED, 0, 0)
    for bad in (cut, b"\xff\xd8\xff\xe0junk"):
        with pytest.raises(turbojpeg.TurboJPEGError, match="cannot read the header"):
            turbojpeg.read_header(bad)
        info = turbojpeg.read_header(good)
        assert (info.width, info.height) == (400, 300)
        assert turbojpeg.decode_region(good, info, (8, 8, 100, 80), 4).shape == (40, 50, 3)
        # Still fused: a reduced scale gives other pixels than a full decode.
        assert np.array_equal(crop.decode(good, CHAIN, SEED, 0, 0), before)
    assert not np.array_equal(before, unfused(crop).decode(good, CHAIN, SEED, 0, 0))


# -- channels and pixel limit ----------------------------------------------------------


def test_keep_gray_gives_one_channel_through_the_fused_path():
    data = photo_jpeg("gray", seed=8)
    gray_chain = DecoderChain(keep_gray=True)
    for size in (FULL_SCALE, REDUCED):
        crop = fastdata.RandomResizedCrop(size)
        for index in range(6):
            one = crop.decode(data, gray_chain, SEED, 0, index)
            three = crop.decode(data, CHAIN, SEED, 0, index)
            assert one.shape == (*size, 1) and three.shape == (*size, 3)
            assert np.array_equal(three, np.repeat(one, 3, axis=2))
            if size == FULL_SCALE:
                assert np.array_equal(one, unfused(crop).decode(data, gray_chain, SEED, 0, index))
    rgb = photo_jpeg("420", seed=8)
    assert fastdata.RandomResizedCrop(REDUCED).decode(rgb, gray_chain, SEED, 0, 0).shape == \
        (*REDUCED, 3)


def test_max_pixels_refuses_declared_sizes_as_without_fusing():
    data = photo_jpeg("420", seed=9)  # 400 x 300 = 120,000 pixels
    bomb = with_declared_size(data, 60000, 60000)
    for fused in (True, False):
        crop = fastdata.RandomResizedCrop(REDUCED, fused=fused)
        with pytest.raises(DecodeError, match="60000x60000") as info:
            crop.decode(bomb, CHAIN, SEED, 0, 0)
        assert "max_pixels" in str(info.value)
        assert crop.decode(data, DecoderChain(max_pixels=120_000), SEED, 0, 0).shape == \
            (*REDUCED, 3)
        with pytest.raises(DecodeError, match="above the limit of 119,999"):
            crop.decode(data, DecoderChain(max_pixels=119_999), SEED, 0, 0)


def test_a_dataset_refuses_images_over_max_pixels_on_the_fused_path(tmp_path):
    data = photo_jpeg("444", seed=9)
    shard = foreign_tar(tmp_path / "two.tar", [data, with_declared_size(data, 60000, 60000)])
    crop = fastdata.RandomResizedCrop(REDUCED)
    ds = fastdata.open_dataset(shard, decode=Decode(crop=crop), order=Order(seed=SEED))
    assert tuple(ds[0][0].shape) == (3, *REDUCED)
    with pytest.raises(DecodeError, match="60000x60000"):
        ds[1]
    small = fastdata.open_dataset(shard, decode=Decode(crop=crop, max_pixels=1000),
                                  order=Order(seed=SEED))
    with pytest.raises(DecodeError, match="max_pixels"):
        small[0]


# -- workers ---------------------------------------------------------------------------


def _digests(ds, workers: int, log) -> list[str]:
    """``log``: a file to record the process collating each batch in."""
    loader = DataLoader(ds, batch_size=4, num_workers=workers, timeout=60 if workers else 0,
                        collate_fn=CollatedIn(log, default_collate))
    return [pixel_digest(image.permute(1, 2, 0).numpy()) for images, _ in loader
            for image in images]


def test_fused_crops_do_not_depend_on_workers(photo_pack, tmp_path):
    crop = fastdata.RandomResizedCrop(REDUCED)
    ds = fastdata.open_dataset(photo_pack, decode=Decode(crop=crop), order=Order(seed=SEED))
    ds.set_epoch(1)
    expected = [pixel_digest(ds[i][0].permute(1, 2, 0).numpy()) for i in range(len(ds))]
    whole = fastdata.open_dataset(photo_pack, decode=Decode(crop=unfused(crop)),
                                  order=Order(seed=SEED))
    whole.set_epoch(1)
    # Reduced DCT scales resample differently from a full decode: the pixels
    # show that the fused path ran.
    assert expected != [pixel_digest(whole[i][0].permute(1, 2, 0).numpy())
                        for i in range(len(whole))]
    for workers in (0, 1, 2):
        again = fastdata.open_dataset(photo_pack, decode=Decode(crop=crop),
                                      order=Order(seed=SEED))
        again.set_epoch(1)
        log = tmp_path / f"collated-{workers}.pids"
        assert _digests(again, workers, log) == expected, workers
        assert_workers_did_it(log, workers)


# -- finding the library ---------------------------------------------------------------


def test_a_missing_env_library_falls_back_to_the_wheel(tmp_path):
    missing = tmp_path / "nowhere" / "libturbojpeg.so"
    out = run_python("""
        from fastdata.decoding import turbojpeg
        print(turbojpeg.available())
        print(turbojpeg.library_path())
    """, env=dict(os.environ, FASTDATA_TURBOJPEG=str(missing),
                  PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(
                      os.path.abspath(fastdata.__file__))), os.environ.get("PYTHONPATH", "")])))
    assert out.returncode == 0, out.stderr
    found, path = out.stdout.split("\n")[:2]
    assert found == "True"
    assert path != str(missing) and os.path.isfile(path), path

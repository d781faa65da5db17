"""JPEGs with a restart marker after every MCU (``fastdata.decoding.jpeg_restarts``):
their layout is found (or refused), indexed, and cut into smaller JPEGs whose
pixels equal a whole-image decode's; RandomResizedCrop decodes only the cut;
``fastdata pack --jpeg-restarts`` stores such JPEGs."""

from __future__ import annotations

import io

import numpy as np
import optional
import pytest
import simplejpeg
from click.testing import CliRunner
from conftest import build_tree, uniform_spec
from PIL import Image
from torch.utils.data import DataLoader, default_collate
from worker_pids import CollatedIn, assert_workers_did_it

import fastdata
from fastdata import Decode, Order
from fastdata.cli import main
from fastdata.demo.palette import class_palette, image_rng
from fastdata.demo.photos import photo_image
from fastdata.decoding import fused_crop, turbojpeg
from fastdata.decoding.decode import DecoderChain
from fastdata.decoding.jpeg_restarts import add_index, cut, restart_layout
from fastdata.decoding.random_crop import UNFUSED_LIBRARY
from fastdata.packers.preprocess import Preprocess

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

CHAIN = DecoderChain()
KINDS = ("4:2:0", "4:2:2", "4:4:4", "gray")
#: (mcu_w, mcu_h) of each kind.
MCU = {"4:2:0": (16, 16), "4:2:2": (16, 8), "4:4:4": (8, 8), "gray": (8, 8)}
needs_turbojpeg = optional.skip_unless("turbojpeg")


# -- images ------------------------------------------------------------------------


def pixels(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients with noise: every MCU has AC coefficients and its own colours."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width * 200 + 20, y / height * 180 + 30,
                     128 + 60 * np.sin(x / 7.0) * np.cos(y / 5.0)], -1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def encode(array: np.ndarray, kind: str = "4:2:0", quality: int = 90, **options) -> bytes:
    img = Image.fromarray(array, "RGB")
    buf = io.BytesIO()
    if kind == "gray":
        img.convert("L").save(buf, "JPEG", quality=quality, **options)
    else:
        img.save(buf, "JPEG", quality=quality, subsampling=kind, **options)
    return buf.getvalue()


def restart_jpeg(width: int, height: int, kind: str = "4:2:0", seed: int = 0) -> bytes:
    return encode(pixels(width, height, seed), kind, restart_marker_blocks=1)


def decode(data: bytes, gray: bool = False) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, colorspace="GRAY" if gray else "RGB")


def marker_numbers(data: bytes) -> list[int]:
    """The n of every RSTn marker in the entropy-coded data, in order."""
    scan = data.find(b"\xff\xda")
    scan += 2 + int.from_bytes(data[scan + 2:scan + 4], "big")
    entropy = np.frombuffer(data, dtype=np.uint8, offset=scan)
    ff = np.flatnonzero(entropy[:-1] == 0xFF)
    following = entropy[ff + 1]
    return (following[(following >= 0xD0) & (following <= 0xD7)] - 0xD0).tolist()


# -- restart_layout ------------------------------------------------------------------


def test_jpegs_without_a_restart_marker_after_every_mcu_have_no_layout():
    array = pixels(101, 77)
    good = restart_jpeg(101, 77)
    assert restart_layout(good) is not None
    png = io.BytesIO()
    Image.fromarray(array).save(png, "PNG")
    tampered = bytearray(good)
    scan = restart_layout(good).scan
    rst3 = good.index(b"\xff\xd3", scan)
    tampered[rst3 + 1] = 0xD5  # RST3 renumbered RST5: the markers no longer count up
    refused = {
        "plain": encode(array),
        "progressive": encode(array, progressive=True, restart_marker_blocks=1),
        "png": png.getvalue(),
        "truncated": good[:len(good) // 2],
        "one MCU row": encode(array, restart_marker_rows=1),
        "renumbered": bytes(tampered),
        "empty": b"",
        "SOI only": b"\xff\xd8",
    }
    for name, data in refused.items():
        assert restart_layout(data) is None, name
    assert restart_layout(bytearray(good)) is not None  # any bytes-like


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [(101, 77), (16, 16), (5, 3), (64, 48)])
def test_the_layout_says_the_size_and_mcu_grid(kind, size):
    width, height = size
    data = restart_jpeg(width, height, kind)
    layout = restart_layout(data)
    mcu_w, mcu_h = MCU[kind]
    assert (layout.width, layout.height) == (width, height)
    assert layout.components == (1 if kind == "gray" else 3)
    assert (layout.mcu_w, layout.mcu_h) == (mcu_w, mcu_h)
    assert (layout.cols, layout.rows) == (-(-width // mcu_w), -(-height // mcu_h))
    count = layout.cols * layout.rows
    assert len(layout.starts) == len(layout.ends) == count
    assert layout.starts[0] == layout.scan and layout.index is None
    assert (layout.ends >= layout.starts).all()
    # Every MCU but the last ends at its RST marker, the last at EOI.
    assert [data[e:e + 2] for e in layout.ends[:-1].tolist()] == \
        [bytes((0xFF, 0xD0 + (i & 7))) for i in range(count - 1)]
    assert data[layout.ends[-1]:layout.ends[-1] + 2] == b"\xff\xd9"
    assert (layout.starts[1:] == layout.ends[:-1] + 2).all()


# -- add_index -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_index_gives_the_scanned_layout_and_changes_no_pixel(kind):
    data = restart_jpeg(101, 77, kind, seed=1)
    scanned = restart_layout(data)
    indexed = add_index(data)
    assert len(indexed) > len(data)
    layout = restart_layout(indexed)
    assert layout.index is not None
    start, end = layout.index
    assert indexed[start:start + 2] == b"\xff\xef" and indexed[start + 4:start + 12] == b"FDMCUIDX"
    assert end == start + 2 + int.from_bytes(indexed[start + 2:start + 4], "big")
    shift = end - start
    assert np.array_equal(layout.starts, scanned.starts + shift)
    assert np.array_equal(layout.ends, scanned.ends + shift)
    assert (layout.cols, layout.rows, layout.mcu_w, layout.mcu_h) == \
        (scanned.cols, scanned.rows, scanned.mcu_w, scanned.mcu_h)
    assert add_index(indexed) == indexed  # idempotent
    gray = kind == "gray"
    assert np.array_equal(decode(indexed, gray), decode(data, gray))
    with Image.open(io.BytesIO(indexed)) as a, Image.open(io.BytesIO(data)) as b:
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_an_index_that_misses_the_markers_is_ignored():
    data = restart_jpeg(101, 77, seed=2)
    scanned = restart_layout(data)
    indexed = bytearray(add_index(data))
    start, end = restart_layout(bytes(indexed)).index
    lengths = start + 4 + len(b"FDMCUIDX\x01") + 4
    indexed[lengths:lengths + 4] = b"\x07\x00\x09\x00"  # the first two MCUs' lengths
    layout = restart_layout(bytes(indexed))
    assert layout is not None and layout.index is None  # read by scanning instead
    shift = end - start
    assert np.array_equal(layout.starts, scanned.starts + shift)
    assert np.array_equal(layout.ends, scanned.ends + shift)
    # An index for another number of MCUs is ignored too.
    indexed[lengths - 4:lengths] = (5).to_bytes(4, "little")
    assert restart_layout(bytes(indexed)).index is None
    # A cut of it still decodes: its header keeps the (ignored) segment.
    part, (x, y, _, _) = cut(bytes(indexed), layout, (30, 20, 40, 30))
    assert np.array_equal(decode(part)[20 - y:50 - y, 30 - x:70 - x], decode(data)[20:50, 30:70])


def test_add_index_refuses_a_jpeg_without_restart_markers():
    with pytest.raises(ValueError, match="restart marker after every MCU"):
        add_index(encode(pixels(40, 30)))


# -- cut -----------------------------------------------------------------------------


def random_boxes(width: int, height: int, rng: np.random.Generator, n: int):
    """Random boxes, plus the whole image, its corners and boxes on its right and bottom edges."""
    boxes = [(0, 0, width, height), (width - 1, height - 1, 1, 1), (0, 0, 1, 1),
             (width // 2, 0, width - width // 2, height),
             (0, height // 2, width, height - height // 2)]
    for _ in range(n):
        w, h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
        left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
        boxes.append((left, top, w, h))
    return boxes


@pytest.mark.parametrize("indexed", [False, True], ids=["scanned", "indexed"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [(203, 157), (16, 16), (8, 8), (5, 3)])
def test_a_cut_decodes_to_the_whole_image_pixels_of_its_box(kind, size, indexed):
    width, height = size
    data = restart_jpeg(width, height, kind, seed=3)
    if indexed:
        data = add_index(data)
    layout = restart_layout(data)
    gray = kind == "gray"
    whole = decode(data, gray)
    rng = np.random.default_rng([width, height, len(kind), indexed])
    for box in random_boxes(width, height, rng, 25):
        left, top, w, h = box
        part, (x, y, cw, ch) = cut(data, layout, box)
        assert 0 <= x <= left and 0 <= y <= top and x + cw >= left + w and y + ch >= top + h
        decoded = decode(part, gray)
        assert decoded.shape[:2] == (ch, cw), box
        assert np.array_equal(decoded[top - y:top - y + h, left - x:left - x + w],
                              whole[top:top + h, left:left + w]), box
        assert marker_numbers(part) == [i & 7 for i in range(len(marker_numbers(part)))]
        cut_layout = restart_layout(part)
        assert cut_layout is not None and cut_layout.index is None  # the whole's index dropped
        assert len(marker_numbers(part)) == cut_layout.cols * cut_layout.rows - 1
    # Pillow reads a cut too.
    part, (x, y, cw, ch) = cut(data, layout, (width // 3, height // 3, width // 3 + 1,
                                              height // 3 + 1))
    with Image.open(io.BytesIO(part)) as img:
        assert img.size == (cw, ch)
        img.load()


@needs_turbojpeg
@pytest.mark.parametrize("eighths", [1, 2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_a_cut_at_a_dct_scale_decodes_as_a_region_of_the_whole_image(kind, eighths):
    data = add_index(restart_jpeg(403, 301, kind, seed=4))
    layout = restart_layout(data)
    info = turbojpeg.read_header(data)
    gray = kind == "gray"
    rng = np.random.default_rng([eighths, len(kind)])
    for box in random_boxes(403, 301, rng, 12):
        left, top, w, h = box
        part, (x, y, _, _) = cut(data, layout, box, eighths)
        region = turbojpeg.decode_region(part, turbojpeg.read_header(part),
                                         (left - x, top - y, w, h), eighths, gray=gray)
        expected = turbojpeg.decode_region(data, info, box, eighths, gray=gray)
        assert np.array_equal(region, expected), box


# -- RandomResizedCrop ---------------------------------------------------------------


def demo_photos(count: int = 4) -> list[tuple[bytes, bytes]]:
    """(plain, restart) JPEGs of demo photos (ImageNet-like sizes and subsamplings)."""
    out = []
    for i in range(count):
        array, (quality, subsampling) = photo_image(image_rng(11, "photos", i),
                                                    class_palette(11, "photos", i % 3))
        plain = encode(array, subsampling, quality)
        out.append((plain, add_index(encode(array, subsampling, quality,
                                            restart_marker_blocks=1))))
    return out


@pytest.fixture(scope="module")
def photos():
    return demo_photos()


def mean_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


@pytest.mark.parametrize("size", [224, 64])
def test_crops_of_restart_jpegs_equal_a_whole_decode_then_crop(photos, size):
    crop = fastdata.RandomResizedCrop(size)
    scales = set()
    for plain, data in photos:
        assert fused_crop.path(data) == fused_crop.FUSED_CUT
        assert fused_crop.path(plain) == fused_crop.FUSED_REGION
        assert crop.unfused_reason(data, CHAIN) is None
        whole = decode(data)
        layout = restart_layout(data)
        for index in range(24):
            _, _, w, h, _ = crop.box(layout.width, layout.height, 5, 1, index)
            eighths = crop.eighths(w, h) if turbojpeg.available() else 8
            scales.add(eighths)
            got = crop.decode(data, CHAIN, 5, 1, index)
            expected = crop.apply(whole, 5, 1, index)
            assert got.shape == expected.shape == (size, size, 3)
            if eighths == 8:
                assert np.array_equal(got, expected), index
            else:
                # A reduced DCT scale then a resize is not a full decode then
                # a resize (demo photos are textured: about 4-9 levels apart);
                # it is what the region decode of the same coefficients gives.
                assert mean_diff(got, expected) <= 12, (index, eighths)
            if turbojpeg.available():  # same coefficients, without restart markers
                assert np.array_equal(got, crop.decode(plain, CHAIN, 5, 1, index)), index
    assert 8 in scales


def test_without_turbojpeg_restart_jpegs_still_decode_only_the_cut(photos, monkeypatch):
    monkeypatch.setattr(turbojpeg, "available", lambda: False)
    crop = fastdata.RandomResizedCrop(64)
    for plain, data in photos:
        assert crop.unfused_reason(plain, CHAIN) == UNFUSED_LIBRARY
        assert crop.unfused_reason(data, CHAIN) is None
        whole = decode(data)
        for index in range(6):
            # Full DCT scale only (no TurboJPEG): the exact pixels.
            assert np.array_equal(crop.decode(data, CHAIN, 2, 0, index),
                                  crop.apply(whole, 2, 0, index)), index
    # A cut that cannot decode returns None without TurboJPEG too.
    plain, data = photos[0]
    assert fused_crop.decode(crop, plain, CHAIN, 2, 0, 0) is None


def damaged(data: bytes) -> bytes:
    """``data`` with every MCU's bytes replaced by noise (no 0xFF): the
    markers and the layout intact, the entropy-coded data not decodable."""
    layout = restart_layout(data)
    out = bytearray(data)
    rng = np.random.default_rng(0)
    for start, end in zip(layout.starts.tolist(), layout.ends.tolist()):
        out[start:end] = rng.integers(0, 0xFF, end - start, dtype=np.uint8).tobytes()
    return bytes(out)


@pytest.mark.parametrize("turbo", [True, False], ids=["turbojpeg", "no-turbojpeg"])
def test_damaged_entropy_data_falls_back_to_the_whole_image_decode(photos, monkeypatch, turbo):
    if turbo and not turbojpeg.available():
        pytest.skip("no TurboJPEG 3")
    if not turbo:
        monkeypatch.setattr(turbojpeg, "available", lambda: False)
    bad = damaged(photos[1][1])
    assert restart_layout(bad) is not None and fused_crop.path(bad) == fused_crop.FUSED_CUT
    for size in (224, 24):
        crop = fastdata.RandomResizedCrop(size)
        for index in range(4):
            # The cut's decoder reports the corrupt data: no pixels from it ...
            assert fused_crop.decode(crop, bad, CHAIN, 0, 0, index) is None
            # ... and the whole-image decode decides (here Pillow, after
            # simplejpeg refuses, decodes it leniently).
            assert np.array_equal(crop.decode(bad, CHAIN, 0, 0, index),
                                  crop.apply(CHAIN(bad), 0, 0, index)), (size, index)


# -- packing -------------------------------------------------------------------------


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def jpeg_tree(tmp_path_factory):
    """12 JPEGs of 96x80 (several MCUs; every 64x64 crop of them decodes at full scale)."""
    root = tmp_path_factory.mktemp("rst") / "src"
    return build_tree(root, uniform_spec(per_class=4, exts=(".jpg",)), size=(96, 80))


@pytest.fixture(scope="module")
def restart_packs(jpeg_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("rst-packs")
    paths = {"lmdb": out / "rst.lmdb", "tar": out / "rst.tar"}
    for name, path in paths.items():
        extra = ["--shard-size", "5"] if name == "tar" else []
        result = invoke("pack", jpeg_tree.root, path, "--encoding", "jpeg", "--jpeg-restarts",
                        "--no-progress", *extra)
        assert result.exit_code == 0, result.output
    return paths


def stored(path) -> list[bytes]:
    ds = fastdata.open_dataset(path)
    return [bytes(ds.reader.read(i)) for i in range(len(ds))]


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_pack_jpeg_restarts_stores_indexed_restart_jpegs(restart_packs, jpeg_tree, fmt):
    path = restart_packs[fmt]
    records = stored(path)
    assert len(records) == len(jpeg_tree)
    for data in records:
        layout = restart_layout(data)
        assert layout is not None and layout.index is not None
        assert (layout.width, layout.height) == (96, 80)
    pre = fastdata.formats.read_manifest(path).pack_options["preprocess"]
    assert pre["restarts"] is True and pre["encoding"] == "jpeg"


def test_a_pack_without_the_flag_records_no_restarts(jpeg_tree, tmp_path):
    path = tmp_path / "plain.lmdb"
    result = invoke("pack", jpeg_tree.root, path, "--encoding", "jpeg", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "restarts" not in fastdata.formats.read_manifest(path).pack_options["preprocess"]
    assert all(restart_layout(data) is None for data in stored(path))


def assert_one_error_line(result, needle: str) -> None:
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert needle in lines[0], lines[0]


def test_png_encoding_refuses_restarts(jpeg_tree, tmp_path):
    result = invoke("pack", jpeg_tree.root, tmp_path / "p.lmdb", "--encoding", "png",
                    "--jpeg-restarts")
    assert_one_error_line(result, "restart markers are a JPEG feature")
    assert not (tmp_path / "p.lmdb").exists()


@pytest.mark.skipif(turbojpeg.restarts_supported(),
                    reason="this libjpeg-turbo adds restart markers losslessly")
def test_lossless_restarts_need_libjpeg_turbo_3_1(jpeg_tree, tmp_path):
    result = invoke("pack", jpeg_tree.root, tmp_path / "k.lmdb", "--jpeg-restarts")
    assert_one_error_line(result, "libjpeg-turbo 3.1 or later")


@pytest.mark.skipif(not turbojpeg.restarts_supported(),
                    reason="needs libjpeg-turbo 3.1+ for lossless restart markers")
def test_lossless_restarts_keep_the_source_pixels(jpeg_tree, tmp_path):
    path = tmp_path / "k.lmdb"
    result = invoke("pack", jpeg_tree.root, path, "--jpeg-restarts", "--no-progress")
    assert result.exit_code == 0, result.output
    ds = fastdata.open_dataset(path)
    by_key = {s.key: s.data for s in jpeg_tree.samples}
    for i, key in enumerate(ds.keys):
        data = bytes(ds.reader.read(i))
        assert restart_layout(data).index is not None
        assert np.array_equal(decode(data), decode(by_key[key])), key


def test_re_encoding_preprocess_writes_restarts_without_libjpeg_turbo_3_1():
    source = encode(pixels(120, 90, seed=5))
    for pre in (Preprocess(resize=64, restarts=True),
                Preprocess(encoding="jpeg", quality=80, restarts=True)):
        assert not pre.lossless_restarts and pre.to_dict()["restarts"] is True
        payload, encoding, width, height = pre.apply(source, "jpeg")
        layout = restart_layout(payload)
        assert encoding == "jpeg" and layout.index is not None
        assert (layout.width, layout.height, layout.mcu_w) == (width, height, 16)  # 4:2:0
    assert "restarts" not in Preprocess(encoding="jpeg").to_dict()


def crops(path, fused: bool, workers: int, log=None) -> list[np.ndarray]:
    """``log``: a file to record the process collating each batch in."""
    crop = fastdata.RandomResizedCrop(64, fused=fused)
    ds = fastdata.open_dataset(path, decode=Decode(crop=crop), order=Order(seed=9))
    ds.set_epoch(2)
    loader = DataLoader(ds, batch_size=4, num_workers=workers, timeout=60 if workers else 0,
                        collate_fn=CollatedIn(log, default_collate))
    return [image.numpy() for images, _ in loader for image in images]


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_packed_restart_crops_equal_unfused_crops_with_any_workers(restart_packs, fmt,
                                                                    tmp_path):
    path = restart_packs[fmt]
    # 96x80 images and 64x64 crops: every crop decodes at full DCT scale, exactly.
    crop = fastdata.RandomResizedCrop(64)
    assert crop.eighths(96, 80) == 8
    expected = crops(path, fused=False, workers=0)
    assert len(expected) == 12
    for workers in (0, 2):
        log = tmp_path / f"collated-{workers}.pids"
        got = crops(path, fused=True, workers=workers, log=log)
        assert_workers_did_it(log, workers)
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert np.array_equal(a, b)
    other_epoch = fastdata.open_dataset(path, decode=Decode(crop=crop), order=Order(seed=9))
    other_epoch.set_epoch(3)
    assert any(not np.array_equal(other_epoch[i][0].numpy(), expected[i]) for i in range(12))



def test_cut_of_more_mcus_than_an_index_holds():
    # 2,100 x 2,100 gray: 69,169 MCUs of 8x8, too many for an index segment,
    # and a cut of them all renumbers more markers than the cached table holds.
    rng = np.random.default_rng(7)
    pixels = np.asarray(Image.fromarray(rng.integers(0, 255, (60, 60), dtype=np.uint8))
                        .resize((2100, 2100), Image.BILINEAR))
    buf = io.BytesIO()
    Image.fromarray(pixels, "L").save(buf, "JPEG", quality=80, restart_marker_blocks=1)
    data = add_index(buf.getvalue())
    layout = restart_layout(data)
    assert layout is not None and layout.index is None and len(layout.starts) == 263 * 263
    part, (x, y, w, h) = cut(data, layout, (0, 0, 2100, 2100))
    assert (x, y, w, h) == (0, 0, 2100, 2100)
    assert np.array_equal(simplejpeg.decode_jpeg(bytes(part), colorspace="GRAY"),
                          simplejpeg.decode_jpeg(data, colorspace="GRAY"))

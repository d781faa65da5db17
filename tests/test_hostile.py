"""Hostile and damaged input: declared sizes never exhaust memory, errors are one
line naming the file, and a damaged HDF5 heap never hangs.

Anything that could allocate gigabytes or spin runs in a child process under
an address-space limit (``RLIMIT_AS``, set after the imports, so the limit is
what the hostile file may take on top of them) and a timeout, so a regression
fails the test instead of eating the machine.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import TESTS_DIR, build_tree, make_image_bytes, uniform_spec
from PIL import Image

import fastdata
from fastdata.errors import (
    BadImageError,
    CorruptDataError,
    DecodeError,
    FastDataError,
    ManifestError,
    SourceError,
)
from fastdata.decoding.decode import DecoderChain, available_decoders
from fastdata.packers.pack import PackOptions
from fastdata.records import Manifest

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                                reason="the memory bound reads /proc/self/status (Linux)")

REPO = str(Path(TESTS_DIR).parent)
#: What a hostile file may take beyond the imports.
MEMORY_MB = 500
#: A child still running after this many seconds is a hang (a guard, not a speed figure).
HANG_SECONDS = 120

_CHILD = """
import resource, sys, time
{imports}

def _vm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

_limit = _vm_bytes() + {memory_mb} * 2**20
resource.setrlimit(resource.RLIMIT_AS, (_limit, _limit))
_start = time.perf_counter()
try:
{body}
    print("RESULT ok -")
except BaseException as exc:
    print("RESULT", type(exc).__name__, str(exc).replace(chr(10), " "))
print("SECONDS", time.perf_counter() - _start)
print("MAXRSS_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def run_bounded(body: str, *args: str, imports: str = "import fastdata",
                memory_mb: int = MEMORY_MB, timeout: float = HANG_SECONDS
                ) -> tuple[str, str, float]:
    """Run ``body`` in a child under the memory limit: (exception name or "ok",
    its message, seconds the body took). A child still running after ``timeout``
    seconds is killed and fails the test as a hang."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    code = _CHILD.format(imports=imports, memory_mb=memory_mb, body=indented)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang: the child was still running after {timeout:.0f} s")
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines()
             if line.split(" ", 1)[0] in ("RESULT", "SECONDS")}
    assert "RESULT" in lines, f"child died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    kind, _, message = lines["RESULT"].partition(" ")
    return kind, message, float(lines.get("SECONDS", "nan"))


def assert_refused(result, kind: str, *words: str) -> None:
    got, message, seconds = result
    assert got == kind, f"expected {kind}, got {got}: {message}"
    for word in words:
        assert word in message, message


# -- hostile images ------------------------------------------------------------------------


def bomb_jpeg(height: int = 60000, width: int = 60000) -> bytes:
    """A tiny JPEG whose frame header declares ``width`` x ``height``."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (120, 30, 200)).save(buf, "JPEG", quality=50)
    data = bytearray(buf.getvalue())
    sof = data.find(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def bomb_png(side: int = 30000) -> bytes:
    """A complete, valid PNG of side x side black 1-bit pixels: ~110 KB on disk,
    2.7 GB as RGB."""
    row = bytes(1 + (side + 7) // 8)  # filter byte 0, then the packed bits
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row * 1000) for _ in range(side // 1000)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1-bit grayscale
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat)
            + _png_chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def png_bomb(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "bomb.png"
    path.write_bytes(bomb_png())
    return path


def test_image_size_reads_headers_only():
    from fastdata.image_header import image_size

    assert image_size(bomb_jpeg()) == (60000, 60000)
    assert len(bomb_jpeg()) < 1000
    for ext in (".jpg", ".png", ".bmp", ".webp", ".ppm", ".pgm", ".gif", ".tif"):
        assert image_size(make_image_bytes(ext, size=(37, 23))) == (23, 37), ext


@pytest.mark.parametrize("decoder", ["auto", *available_decoders()])
def test_jpeg_bomb_refused_by_every_decoder(decoder, tmp_path):
    path = tmp_path / "bomb.jpg"
    path.write_bytes(bomb_jpeg())
    result = run_bounded(
        "DecoderChain(sys.argv[2])(open(sys.argv[1], 'rb').read())", str(path), decoder,
        imports="from fastdata.decoding.decode import DecoderChain")
    assert_refused(result, "DecodeError", "60000x60000", "max_pixels")


@pytest.mark.parametrize("decoder", ["auto", "pil", "opencv"])
def test_png_bomb_refused_by_every_decoder(decoder, png_bomb):
    assert png_bomb.stat().st_size < 1 << 20
    result = run_bounded(
        "DecoderChain(sys.argv[2])(open(sys.argv[1], 'rb').read())", str(png_bomb), decoder,
        imports="from fastdata.decoding.decode import DecoderChain")
    assert_refused(result, "DecodeError", "30000x30000", "max_pixels")


def test_pil_output_and_decode_rgb_check_pixels_too(tmp_path):
    path = tmp_path / "bomb.jpg"
    path.write_bytes(bomb_jpeg())
    for call in ("decode_pil(data)", "decode_rgb(data)"):
        result = run_bounded(f"data = open(sys.argv[1], 'rb').read()\n{call}", str(path),
                             imports="from fastdata.decoding.decode import decode_rgb\n"
                                     "from fastdata.decoding.decoders import decode_pil")
        assert_refused(result, "DecodeError", "max_pixels")


def test_max_pixels_option(tmp_path):
    from fastdata.image_header import DEFAULT_MAX_PIXELS

    data = make_image_bytes(".png", size=(40, 30))
    assert DecoderChain(max_pixels=None)(data).shape[:2] == (30, 40)
    assert DecoderChain(max_pixels=1200)(data).shape[:2] == (30, 40)
    with pytest.raises(DecodeError, match="40x30 = 1,200 pixels, above the limit of 1,199"
                       ) as info:
        DecoderChain(max_pixels=1199)(data)
    message = str(info.value)
    assert "(max_pixels=1199)" in message and "max_pixels=None for no limit" in message
    assert DecoderChain().max_pixels == DEFAULT_MAX_PIXELS == 2 * Image.MAX_IMAGE_PIXELS
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="max_pixels"):
            DecoderChain(max_pixels=bad)


def _foreign_tar(path: Path, images: list[bytes], labels: list[bytes] | None = None) -> Path:
    """A webdataset-style tar written by Python's tarfile."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i, data in enumerate(images):
            for ext, body in (("jpg", data), ("cls", labels[i] if labels else b"%d" % i)):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return path


def test_dataset_refuses_a_bomb_in_a_foreign_tar(tmp_path):
    good = make_image_bytes(".jpg", size=(16, 16))
    shard = _foreign_tar(tmp_path / "theirs.tar", [good, bomb_jpeg(), good])
    body = """
ds = fastdata.open_dataset(sys.argv[1])
assert ds[0][0].shape == (3, 16, 16)
try:
    ds[1]
    raise SystemExit("the bomb was decoded")
except fastdata.errors.DecodeError as exc:
    assert "60000x60000" in str(exc) and "0001" in str(exc), exc
skip = fastdata.open_dataset(sys.argv[1], on_error="skip")
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    batch = skip.__getitems__([0, 1, 2])
assert len(batch) == 2 and skip.skipped == 1, (len(batch), skip.skipped)
stream = fastdata.ShardedIterableDataset(sys.argv[1], on_error="skip",
                                         decode=fastdata.Decode(max_pixels=10**6))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    assert len(list(stream)) == 2 and stream.skipped == 1
small = fastdata.open_dataset(sys.argv[1], decode=fastdata.Decode(max_pixels=100))
try:
    small[0]
    raise SystemExit("Decode(max_pixels=100) let a 16x16 image through")
except fastdata.errors.DecodeError:
    pass
"""
    kind, message, _ = run_bounded(body, str(shard), imports="import fastdata, torch")
    assert kind == "ok", message


def test_pack_skips_images_over_the_pixel_limit(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 3, exts=(".png",)),
                      size=(20, 10))
    (tree.root / "a" / "bomb.jpg").write_bytes(bomb_jpeg())
    summary = fastdata.pack(tree.root, tmp_path / "out.lmdb", progress=False)
    assert summary.records == 6
    [skip] = summary.skipped
    assert skip.key == "a/bomb.jpg"
    assert "60000x60000" in skip.reason and "max_pixels" in skip.reason
    report = json.loads(Path(summary.report).read_text())
    assert report["skipped"][0]["key"] == "a/bomb.jpg"

    exact = fastdata.pack(tree.root, tmp_path / "exact.lmdb", progress=False,
                          options=PackOptions(max_pixels=200))
    assert exact.records == 6 and [s.key for s in exact.skipped] == ["a/bomb.jpg"]
    with pytest.raises(SourceError, match="none of the 7 .* above the limit of 199"):
        fastdata.pack(tree.root, tmp_path / "none.lmdb", progress=False,
                      options=PackOptions(max_pixels=199))
    with pytest.raises(BadImageError, match="60000x60000") as info:
        fastdata.pack(tree.root, tmp_path / "strict.h5", progress=False,
                      options=PackOptions(strict=True))
    assert info.value.key == "a/bomb.jpg"
    with pytest.raises(FastDataError, match="max_pixels"):
        fastdata.pack(tree.root, tmp_path / "bad.h5", progress=False,
                      options=PackOptions(max_pixels=0))


def test_pack_max_pixels_none_lifts_the_limit(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a",), 2, exts=(".png",)), size=(20, 10))
    summary = fastdata.pack(tree.root, tmp_path / "all.h5", progress=False,
                            options=PackOptions(max_pixels=None))
    assert summary.records == 2 and not summary.skipped


# -- hostile sizes in containers ------------------------------------------------------------

GIB2 = 2 << 30


def sparse_tar(path: Path, member: str) -> Path:
    """A tar of a few KB on disk whose ``member`` ("image" or "label") declares 2 GiB,
    held by the file as a hole."""
    png = make_image_bytes(".png", size=(8, 8))
    with open(path, "wb") as f:
        def add(name: str, size: int, data: bytes | None) -> None:
            info = tarfile.TarInfo(name)
            info.size = size
            f.write(info.tobuf(format=tarfile.USTAR_FORMAT))
            if data is None:
                f.seek(size + (-size % 512), os.SEEK_CUR)
            else:
                f.write(data + bytes(-len(data) % 512))
        if member == "image":
            add("s0.png", GIB2, None)
            add("s0.cls", 1, b"0")
        else:
            add("s0.png", len(png), png)
            add("s0.cls", GIB2, None)
        f.write(bytes(1024))
    if path.stat().st_blocks * 512 > 1 << 20:
        pytest.skip("this file system does not keep sparse files sparse")
    return path


@pytest.mark.parametrize("member", ["image", "label"])
def test_sparse_tar_member_refused_unread(member, tmp_path):
    path = sparse_tar(tmp_path / f"{member}.tar", member)
    body = """
from fastdata.formats.tar.reader import TarReader
r = TarReader(sys.argv[1])
r.read(0)
"""
    assert_refused(run_bounded(body, str(path)), "CorruptDataError", "2,147,483,648 bytes",
                   "sparse", str(path))


def test_oversized_label_member_refused(tmp_path):
    big = b"7" + b" " * (100 << 10)  # a plain file, no hole: refused by size alone
    shard = _foreign_tar(tmp_path / "big.tar", [make_image_bytes(".jpg")], [big])
    with pytest.raises(CorruptDataError, match="too large for a label"):
        fastdata.open_dataset(shard)


def _tfrecord_frame(payload_len: int) -> bytes:
    import crc32c

    from fastdata.formats.tfrecord.schema import mask_crc

    length = struct.pack("<Q", payload_len)
    return length + struct.pack("<I", mask_crc(crc32c.crc32c(length)))


def test_tfrecord_length_past_the_file(tmp_path, image_tree):
    out = tmp_path / "t.tfrecord"
    fastdata.pack(image_tree.root, out, progress=False)
    shard = tmp_path / "t.tfrecord"
    data = bytearray(shard.read_bytes())
    data[:12] = _tfrecord_frame(1 << 40)  # record 0 claims 1 TiB, length CRC valid
    shard.write_bytes(bytes(data))
    for target in (str(out.with_name("t.tfrecord.fastdata.json")), str(shard)):
        body = """
from fastdata.formats.tfrecord.reader import TFRecordReader
r = TFRecordReader([sys.argv[1]] if sys.argv[1].endswith(".tfrecord") else sys.argv[1])
r.read(0)
"""
        assert_refused(run_bounded(body, target), "CorruptDataError", str(shard))


def test_sparse_tfrecord_record_refused_unread(tmp_path):
    path = tmp_path / "sparse.tfrecord"
    with open(path, "wb") as f:
        f.write(_tfrecord_frame(GIB2))
        f.seek(GIB2 + 4, os.SEEK_CUR)  # the data and its CRC: a hole
        f.truncate()
    if path.stat().st_blocks * 512 > 1 << 20:
        pytest.skip("this file system does not keep sparse files sparse")
    body = """
from fastdata.formats.tfrecord.reader import TFRecordReader
TFRecordReader([sys.argv[1]])
"""
    assert_refused(run_bounded(body, str(path)), "CorruptDataError", "sparse", str(path))


@pytest.fixture
def tar_dataset(tmp_path, image_tree) -> Path:
    out = tmp_path / "packed" / "out.tar"
    fastdata.pack(image_tree.root, out, progress=False)
    return out.with_name("out.tar.fastdata.json")


def _edit_index(manifest: Path, field: str, row: int, value: int) -> Path:
    """Write a hostile index row and record the new file's SHA-256 in the manifest,
    as a crafted dataset would: the row checks, not the checksum, must refuse it."""
    import hashlib
    import json

    path = manifest.with_name("out.tar.fastdata.index.npy")
    index = np.load(path)
    index[field][row] = value
    np.save(path, index)
    data = json.loads(manifest.read_text(encoding="utf-8"))
    sums = data["checksums"].get("metadata_sha256", {})
    pieces = data["extra"].get("index_pieces")
    if pieces:  # and the checksum of each piece of rows
        from fastdata.formats.sharded.index_rows import piece_checksums

        crcs = path.with_name(pieces["file"])
        np.save(crcs, piece_checksums(index, pieces["rows"]))
        sums[crcs.name] = hashlib.sha256(crcs.read_bytes()).hexdigest()
    if path.name in sums:
        sums[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("field, value, words", [
    ("size", 2**40, ["row 3", "past the end of shard 0"]),
    ("offset", 2**63, ["row 3", "past the end of shard 0"]),
    ("shard", 10**9, ["row 3", "names shard 1000000000", "1 shard(s)"]),
])
def test_index_row_out_of_range(tar_dataset, field, value, words):
    index_path = _edit_index(tar_dataset, field, 3, value)
    body = """
from fastdata.formats.tar.reader import TarReader
from fastdata.ops.verify import verify_dataset
try:
    r = TarReader(sys.argv[1])
    r.read(3)
finally:
    verify_dataset(sys.argv[1], progress=False)
"""
    assert_refused(run_bounded(body, str(tar_dataset)), "CorruptDataError", str(index_path),
                   *words)


def _patch_npy_header(path: Path, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` inside a .npy header, keeping its length."""
    data = path.read_bytes()
    length = int.from_bytes(data[8:10], "little")
    header = data[10:10 + length]
    assert old in header, header
    patched = header.replace(old, new).rstrip(b"\n ")
    patched = patched.ljust(length - 1) + b"\n" if len(patched) < length else patched[:length]
    path.write_bytes(data[:10] + patched + data[10 + length:])


@pytest.mark.parametrize("old, new", [
    (b"{'descr'", b"{{'descr"),                      # tokenize.TokenError
    (b"'shape': (", b"'shape': (99999999999999999999999"),  # OverflowError
    (b"'<u8'", b"'<\xf18'"),                          # SyntaxError / UnicodeDecodeError
    (b"('shard', '<u4')", b"()"),                    # ValueError
    (b"'shape': (", b"'shape': (1099511627776"),      # 2**40 rows: a 32 TiB allocation
    (b"'fortran_order'", b"'fortran_order"),           # ValueError: cannot parse
], ids=["token", "overflow", "syntax", "descr", "huge-shape", "unparsable"])
def test_damaged_index_header(tar_dataset, old, new):
    index_path = tar_dataset.with_name("out.tar.fastdata.index.npy")
    _patch_npy_header(index_path, old, new)
    body = """
from fastdata.formats.tar.reader import TarReader
TarReader(sys.argv[1])
"""
    assert_refused(run_bounded(body, str(tar_dataset)), "CorruptDataError", str(index_path),
                   "dataset index")


# -- one-line errors, never tracebacks --------------------------------------------------------

FORMATS = (".lmdb", ".h5", ".tfrecord", ".tar")


def _cli(*args: str, timeout: float = HANG_SECONDS) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        return subprocess.run([sys.executable, "-m", "fastdata.cli", *args],
                              capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang: fastdata {' '.join(args)} was still running after {timeout:.0f} s")


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("ext", FORMATS)
def test_non_utf8_file_name_is_skipped_and_reported(ext, tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 2, exts=(".png",)))
    bad = os.fsencode(tree.root) + b"/a/bad\xff.png"
    with open(bad, "wb") as f:
        f.write(make_image_bytes(".png", size=(8, 8)))
    summary = fastdata.pack(tree.root, tmp_path / f"out{ext}", progress=False)
    assert summary.records == 4
    [skip] = summary.skipped
    assert skip.key == "a/bad\\xff.png" and "not valid UTF-8" in skip.reason
    report = json.loads(Path(summary.report).read_text(encoding="utf-8"))
    assert report["skipped"] == [{"key": "a/bad\\xff.png", "reason": skip.reason}]
    ds = fastdata.open_dataset(summary.output if ext in (".lmdb", ".h5")
                               else tmp_path / f"out{ext}.fastdata.json")
    assert len(ds) == 4 and all("bad" not in k for k in ds.keys)
    with pytest.raises(BadImageError, match="not valid UTF-8"):
        fastdata.pack(tree.root, tmp_path / f"strict{ext}", progress=False,
                      options=PackOptions(strict=True))


def test_non_utf8_file_name_cli(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a",), 2, exts=(".png",)))
    with open(os.fsencode(tree.root) + b"/a/\xfe\xff.png", "wb") as f:
        f.write(make_image_bytes(".png", size=(8, 8)))
    proc = _cli("pack", str(tree.root), str(tmp_path / "out.tar"), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "a/\\xfe\\xff.png: file name is not valid UTF-8" in proc.stdout


@pytest.mark.parametrize("field, value, words", [
    ("count", 200.0, ["'count'", "integer >= 0", "200.0"]),
    ("count", -1, ["'count'"]),
    ("count", True, ["'count'"]),
    ("classes", 5, ["'classes'", "list"]),
    ("classes", [1, 2], ["'classes'", "strings"]),
    ("class_counts", [1], ["classes", "class counts"]),
    ("shards", "x", ["'shards'", "list"]),
    ("shards", [{"path": 3, "count": 1}], ["'shards[0].path'"]),
    ("shards", [{"path": "out.tar", "count": "3"}], ["'shards[0].count'"]),
    ("format", 7, ["'format'", "string"]),
    ("encoding", [], ["'encoding'", "JSON object"]),
    ("bytes", {"payload": -1}, ["'bytes.payload'"]),
    ("extra", None, ["'extra'"]),
    ("version", "1", ["version"]),
])
def test_manifest_with_wrong_types(tar_dataset, field, value, words):
    data = json.loads(tar_dataset.read_text())
    data[field] = value
    tar_dataset.write_text(json.dumps(data))
    with pytest.raises(ManifestError) as info:
        fastdata.open_dataset(tar_dataset)
    assert info.value.path == str(tar_dataset)
    assert "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value)
    for command in ("info", "verify"):
        assert_one_line_error(_cli(command, str(tar_dataset)), str(tar_dataset))


def test_manifest_checks_accept_every_format(tmp_path, image_tree):
    for ext in FORMATS:
        name = ext[1:]
        summary = fastdata.pack(image_tree.root, tmp_path / f"{name}{ext}", progress=False)
        text = fastdata.open_dataset(summary.output).manifest.to_json()
        assert Manifest.from_json(text).count == len(image_tree.samples)


def test_label_out_of_int64_in_a_foreign_tar(tmp_path):
    shard = _foreign_tar(tmp_path / "labels.tar", [make_image_bytes(".jpg")] * 2,
                         [b"1", b"99999999999999999999999"])
    with pytest.raises(CorruptDataError, match="fits 64 bits") as info:
        fastdata.open_dataset(shard)
    assert info.value.path == str(shard) and info.value.key == "0001"
    assert_one_line_error(_cli("verify", str(shard)), "0001.cls")


def _damage_h5(path: Path, target: str, nbytes: int = 8) -> int:
    """Zero ``nbytes`` at the object header of dataset ``target``, or at the local
    heap signature ("heap")."""
    if target == "heap":
        offset = path.read_bytes().find(b"HEAP")
    else:
        with h5py.File(path, "r") as f:
            offset = h5py.h5o.get_info(f[target].id).addr
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(nbytes))
    return offset


@pytest.mark.parametrize("target", ["heap", "offsets", "labels", "manifest", "payload"])
def test_damaged_hdf5_object_headers(target, packed):
    out = packed(".h5")
    _damage_h5(out, target)  # h5py: RuntimeError (local heap) or KeyError (object header)
    with pytest.raises(CorruptDataError, match="damaged") as info:
        fastdata.open_dataset(out)
    assert info.value.path == str(out) and "\n" not in str(info.value)
    assert_one_line_error(_cli("verify", str(out)), str(out))


def test_damaged_hdf5_keys_header(packed):
    out = packed(".h5")
    _damage_h5(out, "keys")
    reader = fastdata.formats.open_reader(out)  # the keys are read on first use
    with pytest.raises(CorruptDataError, match="keys") as info:
        _ = reader.keys
    assert info.value.path == str(out)
    reader.close()


def _lmdb_lose_a_page(path: Path) -> None:
    """Point one child of the main B-tree's root page at a page past the end
    (lmdb then raises PageNotFoundError on the walk, without aborting)."""
    data = bytearray((path / "data.mdb").read_bytes())
    page = 4096

    def meta(n: int) -> tuple[int, int]:  # (txnid, main root) of meta page n
        base = n * page + 16
        return (struct.unpack_from("<Q", data, base + 128)[0],
                struct.unpack_from("<Q", data, base + 112)[0])

    root = max(meta(0), meta(1))[1] * page
    assert struct.unpack_from("<H", data, root + 10)[0] & 1, "the root is no branch page"
    children = (struct.unpack_from("<H", data, root + 12)[0] - 16) // 2
    node = struct.unpack_from("<H", data, root + 16 + 2 * (children // 2))[0]
    struct.pack_into("<HH", data, root + node, 0xFFFF, 0x00FF)
    (path / "data.mdb").write_bytes(bytes(data))


def test_lmdb_errors_from_the_walk_are_reported(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 150, exts=(".png",)),
                      size=(4, 4))
    out = tmp_path / "big.lmdb"
    fastdata.pack(tree.root, out, progress=False)
    _lmdb_lose_a_page(out)
    from fastdata.ops.verify import verify_dataset

    result = verify_dataset(out, progress=False)
    assert result.problems and "MDB_PAGE_NOTFOUND" in result.problems[-1]["reason"]
    proc = _cli("verify", str(out))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "damaged" in proc.stdout


def test_lmdb_damaged_keys_are_one_error(packed):
    import lmdb

    out = packed(".lmdb")
    env = lmdb.open(str(out), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"__keys__", b'["a", "\xff')
    env.close()
    # The keys' checksum or their parser refuses them: one error either way.
    with pytest.raises(CorruptDataError, match=r"keys cannot be read|keys .* fail the SHA-256"):
        _ = fastdata.open_dataset(out).keys


# -- a damaged HDF5 header never hangs ----------------------------------------------------------


def _zero_first_heap_objects(path: Path) -> int:
    """64 zero bytes over the first objects of the first global heap collection
    (the schema attribute's, which the keys share): HDF5 loops forever on it."""
    offset = path.read_bytes().find(b"GCOL") + 16
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(64))
    return offset


@pytest.mark.parametrize("chunked", [False, True], ids=["contiguous", "chunked"])
def test_damaged_hdf5_heap_never_hangs(packed, chunked):
    options = {"writer_options": {"chunk_bytes": 1024, "flush_bytes": 4096}} if chunked else {}
    out = packed(".h5", **options)
    _zero_first_heap_objects(out)
    body = """
import fastdata
fastdata.open_dataset(sys.argv[1])
"""
    kind, message, _ = run_bounded(body, str(out), imports="import fastdata, torch")
    assert kind == "CorruptDataError", message
    assert str(out) in message and "global heap" in message
    assert_one_line_error(_cli("verify", str(out)), str(out), "global heap")
    assert_one_line_error(_cli("info", str(out)), str(out))


def test_heap_check_finds_a_damaged_keys_collection(packed):
    out = packed(".h5")
    reader = fastdata.formats.open_reader(out)  # attribute checked and read
    _zero_first_heap_objects(out)
    body = """
from fastdata.formats.hdf5.reader import HDF5Reader
import h5py
from fastdata.formats.hdf5.heap import check_vlen_dataset
with h5py.File(sys.argv[1], "r") as f:
    check_vlen_dataset(f, f["keys"], sys.argv[1], "keys")
"""
    kind, message, _ = run_bounded(body, str(out))
    assert kind == "CorruptDataError" and "dataset 'keys'" in message, message
    with pytest.raises(CorruptDataError, match="global heap"):
        _ = reader.keys
    reader.close()


def _collection(objects: list[tuple[int, bytes]], size: int = 4096) -> bytes:
    """A global heap collection: (index, data) objects, then one free-space object."""
    body = b""
    for idx, data in objects:
        padded = data + bytes(-len(data) % 8)
        body += struct.pack("<HHIQ", idx, 1, 0, len(data)) + padded
    free = size - 16 - len(body)
    body += struct.pack("<HHIQ", 0, 0, 0, free) + bytes(free - 16)
    return b"GCOL\x01\0\0\0" + struct.pack("<Q", size) + body


def test_heap_walk_finds_what_makes_hdf5_loop():
    from fastdata.formats.hdf5.heap import walk_collections

    good = _collection([(1, b"fastdata-hdf5-1"), (2, b"a/0.png")])
    zeroed = bytearray(good)
    zeroed[48:112] = bytes(64)  # object 2's header: index 0, size 0
    past = bytearray(good)
    past[56:64] = struct.pack("<Q", 5000)  # object 2 runs past its collection
    buf = np.frombuffer(bytes(good + zeroed + past), dtype=np.uint8)
    starts = np.array([0, 4096, 8192])
    coll, idx, size, bad = walk_collections(buf, starts, np.full(3, 4096))
    assert bad.tolist() == [-1, 48, 48]
    assert sorted(zip(coll.tolist(), idx.tolist(), size.tolist())) == [
        (0, 1, 15), (0, 2, 7), (1, 1, 15), (2, 1, 15)]

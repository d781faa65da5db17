"""LMDB and HDF5 columns checked by piece: labels, CRC32s and (HDF5) offsets.

A dataset of key schema / schema 1.1 stores a CRC-32 per piece of 128
values of each column; a read checks the pieces it touches, never a whole
column on open. These tests pin that: a flipped byte in one piece is found
when a record of that piece is read, and named (file, column, records); a
record of another piece still reads; ``verify`` checks every piece; and a
file of the version before (columns checked whole by their SHA-256 on open)
still opens and is checked whole.
"""

from __future__ import annotations

import hashlib
import json
import zlib

import lmdb
import numpy as np
import pytest
from conftest import lmdb_get, lmdb_put

import fastdata
from fastdata import Decode
from fastdata.errors import CorruptDataError, ManifestError
from fastdata.formats.column import PieceColumn
from fastdata.ops.verify import verify_dataset
from fastdata.packers.source import SourceEntry

#: Records packed: 20 pieces of 128 values (the last one short).
COUNT = 2500
ROWS = 128
#: Each format's columns checked by piece, as stored (name, bytes per value).
COLUMNS = {"lmdb": [("__labels__", 8), ("__crc32__", 4)],
           "hdf5": [("labels", 8), ("crc32", 4), ("offsets", 8)]}
EXTENSIONS = {"lmdb": ".lmdb", "hdf5": ".h5"}


class Tiny:
    """``COUNT`` records of 1x1 raw pixels in 10 classes, with metadata on
    every 7th (a fastdata Source)."""

    def __init__(self) -> None:
        self.classes = [f"c{k}" for k in range(10)]

    def __len__(self) -> int:
        return COUNT

    def __iter__(self):
        for i in range(COUNT):
            yield SourceEntry(key=f"k{i:05d}", label=i % 10, data=bytes((i & 255, i >> 8, 7)),
                              raw_shape=(1, 1, 3),
                              metadata={"i": i} if i % 7 == 0 else None)

    def describe(self) -> dict:
        return {"root": None, "files": COUNT, "kind": "tests/test_column_pieces.py"}

    def warnings(self) -> list[str]:
        return []


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """A fresh pack of each format, copied per test by ``pack``."""
    base = tmp_path_factory.mktemp("pieces")
    return {fmt: fastdata.pack(Tiny(), base / f"tiny{ext}", progress=False).output
            for fmt, ext in EXTENSIONS.items()}


@pytest.fixture
def pack(packs, tmp_path):
    import shutil

    def copy(fmt: str):
        out = tmp_path / f"tiny{EXTENSIONS[fmt]}"
        if fmt == "lmdb":
            shutil.copytree(packs[fmt], out, ignore=shutil.ignore_patterns("lock.mdb"))
        else:
            shutil.copy(packs[fmt], out)
        return out

    return copy


def flip(path, fmt: str, column: str, value: int, itemsize: int, *, whole=False) -> None:
    """Flip one bit of the stored ``value``-th value of ``column``, as damage
    would: in LMDB in the key of its piece (``whole``: of the whole value)."""
    if fmt == "lmdb":
        key, at = column.encode(), value * itemsize
        if not whole and not column.endswith("_pieces__"):
            key, at = b"%s/%010d" % (key, value // ROWS), value % ROWS * itemsize
        raw = bytearray(lmdb_get(path, key))
        raw[at] ^= 0x04
        lmdb_put(path, {key: bytes(raw)})
        return
    import h5py

    with h5py.File(path, "r") as f:
        at = f[column].id.get_offset() + value * itemsize
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x04]))


@pytest.mark.parametrize("fmt,column,itemsize",
                         [(f, c, s) for f, cols in COLUMNS.items() for c, s in cols])
def test_a_damaged_piece_is_found_when_read_and_named(pack, fmt, column, itemsize):
    path = pack(fmt)
    flip(path, fmt, column, 1500, itemsize)  # piece 11: records 1408..1535
    ds = fastdata.open_dataset(path, decode=Decode(output="bytes"))  # opens: nothing read
    assert ds[10][1] == 0 and ds[2100][1] == 0  # pieces 0 and 16 read
    with pytest.raises(CorruptDataError) as info:
        ds.__getitems__([3, 1500])
    error = info.value
    assert error.path == str(path)
    assert "records 1408..1535 (piece 11)" in str(error) and column in str(error)
    assert "fail their CRC-32" in str(error) and "re-pack it" in str(error)
    assert ds[1400][1] == 0 and ds[1536][1] == 6  # the pieces around it still read
    ds.reader.close()


@pytest.mark.parametrize("fmt", sorted(COLUMNS))
def test_a_read_checks_only_the_pieces_it_touches(pack, fmt):
    reader = fastdata.formats.open_reader(pack(fmt))
    columns = [reader.labels, reader._stored_crcs()]
    assert all(isinstance(c, PieceColumn) for c in columns)
    assert [c.pieces_kept() for c in columns] == [[], []]  # nothing read on open
    reader.read_many([1500, 1501])
    assert reader.labels[[2400, 1500, -1]].tolist() == [0, 0, 9]
    assert columns[0].pieces_kept() == [11, 18, 19]  # read_many read no label
    assert columns[1].pieces_kept() == [11]
    assert np.flatnonzero(columns[0]._checked).tolist() == [11, 18, 19]
    assert [len(c) for c in columns] == [COUNT, COUNT]
    assert np.asarray(reader.labels).tolist() == [i % 10 for i in range(COUNT)]
    assert reader.labels[5:300:7].tolist() == [i % 10 for i in range(5, 300, 7)]
    reader.close()


@pytest.mark.parametrize("fmt,column,itemsize",
                         [(f, c, s) for f, cols in COLUMNS.items() for c, s in cols])
def test_verify_checks_every_piece(pack, fmt, column, itemsize):
    path = pack(fmt)
    assert verify_dataset(path, progress=False).ok
    flip(path, fmt, column, COUNT - 1, itemsize)  # the last piece
    result = verify_dataset(path, progress=False)
    assert not result.ok
    reasons = [p["reason"] for p in result.problems]
    assert any("records 2432..2" in r and "(piece 19)" in r and column in r for r in reasons), \
        reasons


def test_verify_checks_the_whole_lmdb_values_older_readers_read(pack):
    path = pack("lmdb")
    flip(path, "lmdb", "__labels__", 5, 8, whole=True)
    with fastdata.formats.open_reader(path) as reader:  # reads use the pieces
        assert reader.labels[5] == 5
    result = verify_dataset(path, progress=False)
    assert not result.ok
    assert any("__labels__" in p["reason"] and "SHA-256" in p["reason"]
               for p in result.problems), result.problems


@pytest.mark.parametrize("fmt", sorted(COLUMNS))
def test_damaged_metadata_columns_are_found_by_piece(pack, fmt):
    path = pack(fmt)
    column = "__metadata_crc32__" if fmt == "lmdb" else "metadata_crc32"
    flip(path, fmt, column, 1400, 4)  # piece 10
    reader = fastdata.formats.open_reader(path)
    assert reader.metadata_many([0, 7, 2402]) == [{"i": 0}, {"i": 7}, {}]
    with pytest.raises(CorruptDataError, match=r"records 1280\.\.1407 \(piece 10\)"):
        reader.metadata(1400)
    reader.close()
    assert not verify_dataset(path, progress=False).ok


@pytest.mark.parametrize("fmt", sorted(COLUMNS))
def test_damaged_piece_checksums_fail_on_open(pack, fmt):
    path = pack(fmt)
    flip(path, fmt, "__labels_pieces__" if fmt == "lmdb" else "labels_pieces", 1, 4)
    with pytest.raises(CorruptDataError, match="piece checksums.*SHA-256") as info:
        fastdata.formats.open_reader(path)
    assert info.value.path == str(path)


# -- a file of the version before: its columns checked whole on open -------------------


def as_version_one(path, fmt: str):
    """A copy of the pack at ``path`` as fastdata wrote it before piece checksums:
    written anew with plain lmdb / h5py, without the pieces and their manifest
    entries, its schema version 1."""
    def old_manifest(text) -> bytes:
        manifest = json.loads(text)
        extra = manifest["extra"]
        extra.pop("column_pieces")
        sums = manifest["checksums"]["metadata_sha256"]
        for name in [n for n in sums if n.endswith(("_pieces__", "_pieces"))]:
            del sums[name]
        if fmt == "lmdb":
            extra["key_schema"] = "fastdata-lmdb-1"
        else:
            extra["schema"] = "fastdata-hdf5-1"
        return json.dumps(manifest).encode()

    old = path.with_name(f"old{EXTENSIONS[fmt]}")
    if fmt == "lmdb":
        src = lmdb.open(str(path), subdir=True, readonly=True, lock=False)
        dst = lmdb.open(str(old), subdir=True, map_size=1 << 26)
        with src.begin() as read, dst.begin(write=True) as write:
            for key, value in read.cursor():
                key = bytes(key)
                if not key.endswith(b"_pieces__") and b"__/" not in key:
                    write.put(key, old_manifest(value) if key == b"__manifest__" else value)
        src.close()
        dst.close()
        return old
    import h5py

    with h5py.File(path, "r") as f, h5py.File(old, "w") as g:
        g.attrs["fastdata_schema"] = "fastdata-hdf5-1"
        for name in f:
            if name.endswith("_pieces"):
                continue
            if name == "manifest":
                text = old_manifest(f[name][()].decode().rstrip())
                g.create_dataset(name, data=text)
            else:
                f.copy(f[name], g, name=name)
    return old


@pytest.mark.parametrize("fmt", sorted(COLUMNS))
def test_a_file_of_the_version_before_opens_and_is_checked_whole(pack, fmt):
    old = as_version_one(pack(fmt), fmt)
    ds = fastdata.open_dataset(old, decode=Decode(output="bytes"))
    assert not isinstance(ds.reader.labels, PieceColumn)  # read whole on open
    assert [ds[i][1] for i in (0, 1500, COUNT - 1)] == [0, 0, (COUNT - 1) % 10]
    assert ds.reader.metadata(1400) == {"i": 1400}
    ds.reader.close()
    assert verify_dataset(old, progress=False).ok
    column, itemsize = COLUMNS[fmt][0]
    flip(old, fmt, column, 1500, itemsize, whole=True)
    with pytest.raises(CorruptDataError, match="SHA-256") as info:
        fastdata.open_dataset(old)
    assert info.value.path == str(old) and "labels" in str(info.value)


def test_a_newer_major_version_is_refused_a_newer_minor_read(pack):
    path = pack("lmdb")
    manifest = json.loads(lmdb_get(path, b"__manifest__"))
    manifest["extra"]["key_schema"] = "fastdata-lmdb-2.0"
    lmdb_put(path, {b"__manifest__": json.dumps(manifest).encode()})
    with pytest.raises(ManifestError, match="newer"):
        fastdata.formats.open_reader(path)
    import h5py

    path = pack("hdf5")
    with h5py.File(path, "r+") as f:
        f.attrs["fastdata_schema"] = "fastdata-hdf5-1.7"
    with fastdata.formats.open_reader(path) as reader:
        assert reader.read(3) == bytes((3, 0, 7))


def test_the_lmdb_pieces_and_their_checksums(pack):
    path = pack("lmdb")
    labels = lmdb_get(path, b"__labels__")
    sums = np.frombuffer(lmdb_get(path, b"__labels_pieces__"), dtype="<u4")
    step = ROWS * 8
    pieces = [labels[k:k + step] for k in range(0, len(labels), step)]
    assert [lmdb_get(path, b"__labels__/%010d" % p) for p in range(len(pieces))] == pieces
    assert sums.tolist() == [zlib.crc32(piece) for piece in pieces]
    manifest = json.loads(lmdb_get(path, b"__manifest__"))
    digests = manifest["checksums"]["metadata_sha256"]
    assert digests["__labels_pieces__"] == hashlib.sha256(sums.tobytes()).hexdigest()
    assert digests["__labels__"] == hashlib.sha256(labels).hexdigest()  # for readers of 1

"""A join's *stores*: the values its pieces keep, a row per table row (or
per record, for the dataset's keys), read back by position a chunk at a
time (no torch; see fastdata.ops.join_pieces, which writes them, and
fastdata.ops.join_match, which reads them).

A store is two plain files, ``PREFIX.fix`` (a :data:`STORE` row each: the
value's tag, a number, where its bytes are) and ``PREFIX.blob`` (the bytes:
text, a vector's elements, JSON). A value keeps what the column files need
to hold the bytes an in-memory join stores, and what
:class:`fastdata.ops.join_columns.Aggregate` needs to give its column the
same kind.

What grows: on disk, 25 bytes a row and the values' own bytes; in memory,
the rows asked for at once (a chunk) and their bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Callable

import numpy as np

from fastdata.dataset.tables import EXACT_FLOAT

#: A store's row: the value's tag, its number (an int, or a float's bits),
#: and where its bytes start in the blob and how many there are.
STORE = np.dtype([("tag", "u1"), ("num", "<i8"), ("start", "<i8"), ("size", "<i8")])
#: Tags: what a value was. ``BIG`` marks an int (or a vector of int64) that
#: float64 does not hold exactly; ``ARRAY + code`` a vector of ``ARRAYS[code]``.
NONE, STR, BOOL, F32, INT, FLOAT, JSON, ARRAY, BIG = 0, 1, 2, 3, 4, 5, 6, 8, 0x80
ARRAYS = (np.dtype("<i8"), np.dtype("<f8"), np.dtype("<f4"), np.dtype("bool"))
_ARRAY_CODES = {dtype: code for code, dtype in enumerate(ARRAYS)}
#: A label cell's tag when it is no class name (refused if its row matches).
NOT_A_NAME = 2
#: Rows of a store written at a time (a piece's batch).
FLUSH_ROWS = 4096


def _bits(x: float) -> int:
    """A float's 64 bits as an int (how a store row keeps it)."""
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _float(bits) -> float:
    """The float whose 64 bits ``bits`` are."""
    return struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def encode(value) -> tuple[int, int, bytes]:
    """A table value as a store row: (tag, number, bytes)."""
    if value is None:
        return NONE, 0, b""
    if isinstance(value, str):
        return STR, 0, value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bool, np.bool_)):
        return BOOL, int(bool(value)), b""
    if isinstance(value, np.float32):
        return F32, _bits(float(value)), b""
    if isinstance(value, int):
        return INT | (0 if -EXACT_FLOAT <= value <= EXACT_FLOAT else BIG), value, b""
    if isinstance(value, float):
        return FLOAT, _bits(value), b""
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.size and \
            value.dtype in _ARRAY_CODES:
        code = _ARRAY_CODES[value.dtype]
        big = BIG if code == 0 and not np.abs(value).max() <= EXACT_FLOAT else 0
        return (ARRAY + code) | big, 0, np.ascontiguousarray(value, ARRAYS[code]).tobytes()
    return JSON, 0, json_bytes(value)


def json_bytes(value) -> bytes:
    """A value as the JSON text a column of kind ``json`` holds (arrays and
    numpy scalars as plain lists and numbers)."""
    return json.dumps(_listed(value), ensure_ascii=False, default=_listed).encode(
        "utf-8", "surrogatepass")


def _listed(value):
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


def value_of(tag: int, num: int, blob: bytes):
    """The value a store row holds, as :func:`fastdata.dataset.columns` writes it."""
    base = tag & ~BIG
    if base == NONE:
        return None
    if base == STR:
        return blob.decode("utf-8", "surrogatepass")
    if base == BOOL:
        return bool(num)
    if base in (F32, FLOAT):
        return _float(num)
    if base == INT:
        return int(num)
    if base >= ARRAY:
        return np.frombuffer(blob, ARRAYS[base - ARRAY]).tolist()
    return json.loads(blob.decode("utf-8", "surrogatepass"))


def json_text(tag: int, num: int, blob: bytes) -> bytes:
    """A JSON column's bytes for a store row (empty for a missing value)."""
    base = tag & ~BIG
    if base == NONE:
        return b""
    return blob if base == JSON else json_bytes(value_of(tag, num, blob))

class StoreWriter:
    """A store written a batch of rows at a time, renamed into place by
    :meth:`close` (a rerun of the piece writes the same files)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._temp = f".tmp-{os.getpid()}"
        # Kept open while the piece reads its rows: closed by close().
        self._fix = open(prefix + ".fix" + self._temp, "wb")  # noqa: SIM115
        self._blob = open(prefix + ".blob" + self._temp, "wb")  # noqa: SIM115
        self.offset = self.count = 0

    def add(self, tags, nums, blobs: list[bytes]) -> None:
        """Rows: their tags, numbers and bytes (sequences of one length)."""
        rows = np.zeros(len(blobs), STORE)
        rows["tag"], rows["num"] = tags, nums
        sizes = np.fromiter(map(len, blobs), np.int64, len(blobs))
        rows["size"] = sizes
        rows["start"] = self.offset + np.cumsum(sizes) - sizes
        self._fix.write(rows.tobytes())
        self._blob.write(b"".join(blobs))
        self.offset += int(sizes.sum())
        self.count += len(blobs)

    def pad(self, count: int) -> None:
        """``count`` rows without a value (a column first seen later)."""
        for at in range(0, count, FLUSH_ROWS):
            self._fix.write(np.zeros(min(FLUSH_ROWS, count - at), STORE).tobytes())
        self.count += count

    def close(self) -> int:
        """Put the files in place; returns the rows."""
        for f, suffix in ((self._fix, ".fix"), (self._blob, ".blob")):
            f.close()  # renamed whole, as a sorted run is (fastdata.jobs.sorted_runs)
            os.replace(self.prefix + suffix + self._temp, self.prefix + suffix)
        return self.count


def encode_many(values: list) -> tuple[list[int], np.ndarray, list[bytes]]:
    """:func:`encode` of each value, as tags, numbers and bytes: text, ints
    and floats on a short path."""
    tags, nums, blobs = [], [], []
    floats, at = [], []
    for k, v in enumerate(values):
        kind = type(v)
        if kind is str:
            tag, num, blob = STR, 0, v.encode("utf-8", "surrogatepass")
        elif kind is float:
            tag, num, blob = FLOAT, 0, b""
            floats.append(v)
            at.append(k)
        elif kind is int:
            tag, num, blob = INT | (0 if -EXACT_FLOAT <= v <= EXACT_FLOAT else BIG), v, b""
        else:
            tag, num, blob = encode(v)
        tags.append(tag)
        nums.append(num)
        blobs.append(blob)
    numbers = np.array(nums, np.int64)
    if floats:
        numbers[at] = np.array(floats, np.float64).view(np.int64)
    return tags, numbers, blobs


@contextlib.contextmanager
def _window(path: str, dtype: np.dtype, lo: int, hi: int, dense: bool):
    """Elements ``lo``..``hi`` of a raw file of ``dtype``, and the index of
    the first: one read of the span where what is wanted of it is
    ``dense``, else a memory map of the file, closed again afterwards (its
    pages leave this process's resident set)."""
    if dense:
        yield np.fromfile(path, dtype, count=hi - lo, offset=lo * dtype.itemsize), lo
        return
    mapped = np.memmap(path, dtype, mode="r")
    try:
        yield mapped, 0
    finally:
        mapped._mmap.close()
        del mapped


def _read_rows(path: str, at: np.ndarray) -> np.ndarray:
    """Rows ``at`` (ascending) of the ``.fix`` file ``path``."""
    lo, hi = int(at[0]), int(at[-1]) + 1
    with _window(path, STORE, lo, hi, hi - lo <= 4 * len(at) + 4096) as (data, base):
        return np.array(data[at - base])


def _read_blobs(path: str, rows: np.ndarray) -> list[bytes]:
    """The bytes of store ``rows`` (ascending starts) from the blob ``path``."""
    starts, sizes = rows["start"], rows["size"]
    lo, hi = int(starts[0]), int((starts + sizes).max())
    dense = hi - lo <= 4 * int(sizes.sum()) + 65536
    with _window(path, np.dtype(np.uint8), lo, hi, dense) as (data, base):
        return [data[s:s + z].tobytes() for s, z in zip((starts - base).tolist(),
                                                         sizes.tolist())]


def gather(where: np.ndarray, prefix_of: Callable[[int], str | None], locate,
           *, blobs: bool) -> tuple[np.ndarray, list[bytes] | None]:
    """Store rows at positions ``where`` (any order), and their bytes with
    ``blobs``. ``locate(where)`` gives each position's piece and row in it;
    ``prefix_of(piece)`` the piece's store (None: it has none, every value
    missing)."""
    rows = np.zeros(len(where), STORE)
    found: list[bytes] | None = [b""] * len(where) if blobs else None
    if not len(where):
        return rows, found
    pieces, local = locate(where)
    order = np.lexsort((local, pieces))
    cuts = np.flatnonzero(np.diff(pieces[order])) + 1
    for segment in np.split(order, cuts):
        prefix = prefix_of(int(pieces[segment[0]]))
        if prefix is None:
            continue
        got = _read_rows(prefix + ".fix", local[segment])
        rows[segment] = got
        if blobs and got["size"].any():
            for at, data in zip(segment.tolist(), _read_blobs(prefix + ".blob", got)):
                found[at] = data
    return rows, found

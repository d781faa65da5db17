"""A dataset index that is never whole in memory (no torch).

The index file (``NAME.fastdata.index.npy``) is memory-mapped after its
header is checked (:mod:`~fastdata.formats.sharded.index_file`), and its rows
are read for the records asked for. The rows come in pieces of
:data:`PIECE_ROWS`; a piece is checked the first time one of its rows is used:
its CRC-32 against the manifest's ``extra.index_pieces`` (written by the
pack), every row inside its shard file, every label a class index. So an open
costs the header and the shards' sizes, and a process pays for the pieces its
records lie in, shared with the other processes through the page cache.

What grows with the dataset: the checked-piece flags (one byte per piece of
8,192 rows) and the pieces' CRC-32s from the manifest (4 bytes per piece as
an array, about 10 bytes each in the manifest's JSON).
"""

from __future__ import annotations

import zlib

import numpy as np

from fastdata.errors import CorruptDataError
from fastdata.formats.integrity import check_label_range
from fastdata.formats.sharded.index_file import ADVICE, check_rows, open_rows
from fastdata.formats.sharded.layout import INDEX_DTYPE

#: Rows per checked piece (256 KiB of rows).
PIECE_ROWS = 8192


def piece_checksums(index: np.ndarray) -> dict:
    """``extra.index_pieces`` of a manifest: the CRC-32 of every piece of the
    index rows as stored (``INDEX_DTYPE``)."""
    raw = np.ascontiguousarray(index, dtype=INDEX_DTYPE)
    return {"rows": PIECE_ROWS,
            "crc32": [zlib.crc32(raw[k:k + PIECE_ROWS].tobytes())
                      for k in range(0, len(raw), PIECE_ROWS)]}


class IndexRows:
    """The rows of a dataset index (``INDEX_DTYPE``), each piece checked on first use.

    Args:
        rows: the rows (a memory map of the file, or an array).
        shard_sizes: every shard's size in bytes (rows must lie inside).
        path: the index file, named by errors.
        classes: the number of classes (labels are checked against it).
        pieces: the manifest's ``extra.index_pieces`` (None: no CRC-32s;
            the caller checked the file whole).
        checked: every row is known good already (an index built by a scan).
        same_shards_as: the dataset index, when these rows are its metadata
            index's: a row must name the shard the dataset index's row does.
    """

    def __init__(self, rows: np.ndarray, *, shard_sizes: list[int], path: str, classes: int,
                 pieces: dict | None = None, checked: bool = False,
                 same_shards_as: IndexRows | None = None) -> None:
        self._rows = rows
        self._same_shards_as = same_shards_as
        self.shard_sizes = shard_sizes
        self.path = path
        self.classes = classes
        self._crcs = None
        self.piece_rows = PIECE_ROWS
        if pieces is not None:
            self._crcs, self.piece_rows = _pieces(pieces, len(rows), path)
        self._checked = np.full(-(-len(rows) // self.piece_rows), checked, dtype=bool)

    @classmethod
    def open(cls, local: str, count: int, *, path: str | None = None, **options) -> IndexRows:
        """The index file ``local`` (``count`` rows), memory-mapped; errors name
        ``path`` (the dataset's name of it: a URL's local copy is ``local``).

        Raises:
            CorruptDataError: the file is missing, or its header is damaged
                or does not describe ``count`` rows.
        """
        return cls(open_rows(local, count), path=path or local, **options)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, where):
        """Rows at an int, a slice or an integer array (a copy); a field name
        gives that column (:class:`Column`)."""
        if isinstance(where, str):
            return Column(self, where)
        if isinstance(where, slice):
            lo, hi, step = where.indices(len(self._rows))
            self._check_range(lo, hi)
            return np.array(self._rows[lo:hi:step])
        at = np.asarray(where, dtype=np.int64)
        if at.size:
            at = np.where(at < 0, at + len(self._rows), at)
            self._check_pieces(np.unique(at // self.piece_rows))
        return self._rows[at]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def unchecked(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo..hi`` as stored, not checked: for ``verify``, which
        reports a damaged piece once and compares the rows with other files."""
        return np.array(self._rows[lo:hi])

    def check_all(self) -> None:
        """Check every piece not checked yet."""
        self._check_range(0, len(self._rows))

    def _check_range(self, lo: int, hi: int) -> None:
        if hi > lo:
            self._check_pieces(np.arange(lo // self.piece_rows, (hi - 1) // self.piece_rows + 1))

    def _check_pieces(self, pieces: np.ndarray) -> None:
        for piece in pieces[~self._checked[pieces]].tolist():
            first = piece * self.piece_rows
            rows = np.array(self._rows[first:first + self.piece_rows])
            if self._crcs is not None:
                actual = zlib.crc32(rows.tobytes())
                if actual != int(self._crcs[piece]):
                    raise CorruptDataError(
                        f"rows {first}..{first + len(rows) - 1} of the dataset index fail "
                        f"their CRC-32 (the manifest records {int(self._crcs[piece]):08x}, "
                        f"the file gives {actual:08x}): the index is damaged or was changed "
                        f"after packing; {ADVICE}", path=self.path, record=first)
            check_rows(rows, self.shard_sizes, self.path, first=first)
            check_label_range(rows["label"], self.classes, path=self.path, first=first)
            if self._same_shards_as is not None:
                theirs = self._same_shards_as[first:first + len(rows)]["shard"]
                if not np.array_equal(rows["shard"], theirs):
                    raise CorruptDataError("the metadata index puts records in other shards "
                                           "than the dataset index; re-pack it",
                                           path=self.path)
            self._checked[piece] = True


def _pieces(pieces, rows: int, path: str) -> tuple[np.ndarray, int]:
    """The CRC-32s and rows per piece of a manifest's ``extra.index_pieces``.

    Raises:
        CorruptDataError: they do not describe ``rows`` rows.
    """
    size = pieces.get("rows") if isinstance(pieces, dict) else None
    crcs = pieces.get("crc32") if isinstance(pieces, dict) else None
    if type(size) is not int or size < 1 or not isinstance(crcs, list) \
            or len(crcs) != -(-rows // size) or not all(type(c) is int for c in crcs):
        raise CorruptDataError(f"the manifest's extra.index_pieces does not describe pieces "
                               f"of the index's {rows} rows (rows per piece, and a CRC-32 "
                               f"per piece); {ADVICE}", path=path)
    return np.asarray(crcs, dtype=np.int64), size


class Column:
    """One field of an :class:`IndexRows` (``"label"``, ``"crc32"``, ...),
    indexed like an array; its rows checked as the index's are."""

    def __init__(self, index: IndexRows, name: str) -> None:
        self.index, self.name = index, name
        self.dtype = INDEX_DTYPE[name]
        self.shape = (len(index),)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, where):
        if np.ndim(where) == 0 and not isinstance(where, slice):
            return self.index[np.asarray([where])][self.name][0]
        return self.index[where][self.name]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.index[:][self.name]
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    def astype(self, dtype, copy: bool = True) -> np.ndarray:
        return np.asarray(self).astype(dtype)


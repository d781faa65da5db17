"""A dataset index that is never whole in memory (no torch).

The index file (``NAME.fastdata.index.npy``) is read a piece at a time:
:data:`PIECE_ROWS` rows (4 KiB, a page) with one ``pread`` when a record of the
piece is first asked for, checked (its CRC-32 against the pack's
``NAME.fastdata.index-crc.npy``, which the manifest's ``extra.index_pieces``
names; every row inside its shard file; every label a class index), and kept
in a bounded cache (:data:`PIECES_KEPT`, least recently used out). No file
stays open between reads (a memory map would hold a descriptor per index).
So an open costs the header, the checksums and the shards' sizes, and a
process pays for the pieces its records lie in. At a URL the pieces come
through the machine's ranged copy (:mod:`fastdata.formats.ranged_copy`):
the missing pieces of a batch fetched at once, each block once per machine.

What grows with the dataset, per process: the pieces' CRC-32s (4 bytes per
128 records: 31 MB at 10^9). The cache is at most 8 MiB.
"""

from __future__ import annotations

import hashlib
import os
import threading
import zlib
from collections import OrderedDict

import numpy as np

from fastdata.errors import CorruptDataError
from fastdata.formats.column import LazyColumn
from fastdata.formats.integrity import check_label_range
from fastdata.formats.sharded.index_file import (
    ADVICE,
    PIECE_DTYPE,
    check_rows,
    file_error,
    rows_start,
)
from fastdata.formats.sharded.layout import INDEX_DTYPE

#: Rows per checked piece (4 KiB of rows: one page).
PIECE_ROWS = 128


def piece_checksums(index: np.ndarray, rows: int | None = None) -> np.ndarray:
    """The CRC-32 of every piece of ``rows`` (default :data:`PIECE_ROWS`)
    rows of an index as stored (``INDEX_DTYPE``): the ``-crc.npy`` file."""
    rows = PIECE_ROWS if rows is None else rows
    raw = np.ascontiguousarray(index, dtype=INDEX_DTYPE)
    return np.fromiter((zlib.crc32(raw[k:k + rows].tobytes()) for k in range(0, len(raw), rows)),
                       dtype=PIECE_DTYPE, count=-(-len(raw) // rows))


#: Pieces kept in memory per index (8 MiB of rows).
PIECES_KEPT = 2048


def pieces_identity(crcs: np.ndarray, rows: int) -> str:
    """What names an index by its content: a digest of its pieces' CRC-32s
    and rows per piece (with its size, the bytes it must hold)."""
    digest = hashlib.blake2b(np.ascontiguousarray(crcs, dtype=PIECE_DTYPE).tobytes(),
                             digest_size=16)
    return f"pieces {rows} {digest.hexdigest()}"


class IndexRows:
    """The rows of a dataset index (``INDEX_DTYPE``), each piece checked when read.

    Args:
        rows: the rows in memory (an index built by a scan, one shard's
            rows), or None to read them from ``local``.
        shard_sizes: every shard's size in bytes (rows must lie inside).
        path: the index file as the dataset names it (errors name it).
        classes: the number of classes (labels are checked against it).
        pieces: the CRC-32 of every piece and the rows of a piece (None:
            none; the caller checked the file whole).
        checked: every row in ``rows`` is known good already.
        same_shards_as: the dataset index, when these rows are its metadata
            index's: a row must name the shard the dataset index's row does.
        local, start, count: the file holding the rows (at a URL, the
            machine's ranged copy of it), where its rows begin, and how many
            it holds.
    """

    def __init__(self, rows: np.ndarray | None, *, shard_sizes, path: str,
                 classes: int, pieces: tuple[np.ndarray, int] | None = None,
                 checked: bool = False, same_shards_as: IndexRows | None = None,
                 local=None, start: int = 0, count: int | None = None) -> None:
        self._rows = rows
        self._local, self._start = local, start
        self._count = len(rows) if rows is not None else int(count)
        self._checked_all = checked
        self._same_shards_as = same_shards_as
        # An array once: each piece's check looks its rows' shards up in it.
        self.shard_sizes = np.asarray(shard_sizes, dtype=np.uint64)
        self.path = path
        self.classes = classes
        self._crcs = None
        self.piece_rows = PIECE_ROWS
        if pieces is not None:
            self._crcs, self.piece_rows = pieces
        self._kept: OrderedDict[int, int] = OrderedDict()  # piece -> its slot in _buffer
        pieces_in_all = -(-self._count // self.piece_rows)
        self._room = min(PIECES_KEPT, pieces_in_all)  # the buffer's slots
        # Every piece fits the buffer: none is ever evicted, so kept ones are read
        # without the lock.
        self._all_fit = pieces_in_all <= PIECES_KEPT
        self._buffer: np.ndarray | None = None  # slots of PIECE_ROWS rows, made on first use
        self.columns: dict[str, np.ndarray] = {}  # each field of the buffer, as a view
        # When every piece fits, piece p lives in slot p: the buffer read flat is
        # the index itself, and a batch of rows is one gather once its pieces are in.
        self._loaded = np.zeros(pieces_in_all if self._all_fit else 0, dtype=bool)
        self._flat: np.ndarray | None = None
        self._lock = threading.RLock()

    @classmethod
    def open(cls, local, count: int, *, path: str | None = None, **options) -> IndexRows:
        """The index file ``local`` (``count`` rows), read a piece at a time:
        a local path, or at a URL the machine's
        :class:`~fastdata.formats.ranged_copy.RangedCopy` of it
        (:func:`~fastdata.formats.sharded.index_file.index_source`); errors
        name ``path`` (the dataset's name of it).

        At a URL the copy is keyed by a digest of the pieces' checksums
        (``options["pieces"]``): the index they describe, whatever the URL
        held before (one hash over 4 bytes per piece, once per open).

        Raises:
            CorruptDataError: the file is missing, or its header is damaged
                or does not describe ``count`` rows.
        """
        pieces = options.get("pieces")
        if not isinstance(local, str) and pieces is not None:
            local = local.keyed(pieces_identity(*pieces))
        start = rows_start(local, count)
        return cls(None, local=local, start=start, count=count, path=path or local, **options)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_kept=OrderedDict(), _buffer=None, columns={}, _lock=None, _flat=None,
                     _loaded=np.zeros_like(self._loaded))
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.RLock())

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, where):
        """Rows at an int, a slice or an integer array (a copy); a field name
        gives that column (:class:`Column`)."""
        if isinstance(where, str):
            return Column(self, where)
        if isinstance(where, slice):
            lo, hi, step = where.indices(self._count)
            return self._range(lo, hi)[::step] if hi > lo else np.zeros(0, INDEX_DTYPE)
        if isinstance(where, (int, np.integer)):
            return self.row(int(where))
        at = self._positions(where)
        if self._all_fit:  # never evicted: kept pieces are read without the lock
            return self._flat_rows(at)
        piece, within = np.divmod(at.reshape(-1), self.piece_rows)
        pieces = piece.tolist()
        if len(set(pieces)) > self._room:  # more pieces than the cache holds: a part at a time
            step = max(1, self._room)
            return np.concatenate([self[at.reshape(-1)[k:k + step]]
                                   for k in range(0, at.size, step)]).reshape(at.shape)
        with self._lock:
            slots = self._slots(pieces)  # first: it makes the buffer
            return self._buffer[slots, within].reshape(at.shape)

    def _positions(self, where) -> np.ndarray:
        """Integer positions ``where`` as an int64 array, negative ones counted
        from the end.

        Raises:
            IndexError: one lies outside the rows.
        """
        at = np.asarray(where, dtype=np.int64)
        if at.size and (int(at.min()) < -self._count or int(at.max()) >= self._count):
            raise IndexError(f"a record of {where!r} is outside the index's {self._count} rows")
        return at % max(1, self._count)

    def _flat_rows(self, at: np.ndarray, name: str | None = None) -> np.ndarray:
        """Rows (or field ``name``) at ``at`` (in range), every piece fitting:
        one gather once the pieces are in."""
        pieces = at // self.piece_rows
        if not self._loaded[pieces].all():
            with self._lock:
                # Not np.unique: its first call imports numpy.ma, which fails
                # with no descriptor left (that error must name the limit).
                self._slots(sorted(set(pieces.reshape(-1).tolist())))
        if self._flat is None:  # nothing asked for yet
            return np.zeros(at.shape, INDEX_DTYPE if name is None else INDEX_DTYPE[name])
        flat = self._flat if name is None else self.columns[name]
        return flat[at]

    def row(self, i: int):
        """Row ``i`` (a numpy structured scalar)."""
        if not -self._count <= i < self._count:
            raise IndexError(f"record {i} is outside the index's {self._count} rows")
        i %= self._count
        piece, within = divmod(i, self.piece_rows)
        if self._all_fit and self._loaded[piece]:  # never evicted: no lock
            return self._flat[i]
        with self._lock:
            slot = self._kept.get(piece)
            if slot is None:
                slot = int(self._slots([piece])[0])
            else:
                self._kept.move_to_end(piece)
            return self._buffer[slot, within]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def unchecked(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo..hi`` as stored, not checked: for ``verify``, which
        reports a damaged piece once and compares the rows with other files."""
        if self._rows is not None:
            return np.array(self._rows[lo:hi])
        return self._read(lo, hi)

    def check_all(self) -> None:
        """Check every piece (without keeping them); at a URL a piece that
        fails is fetched again once, as when it is read."""
        step = self.piece_rows * 1024
        for lo in range(0, self._count, step):
            rows = self.unchecked(lo, min(self._count, lo + step))
            for k in range(0, len(rows), self.piece_rows):
                self._checked(lo // self.piece_rows + k // self.piece_rows,
                              rows[k:k + self.piece_rows])

    def _range(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo..hi`` (contiguous), their pieces checked."""
        first, last = lo // self.piece_rows, (hi - 1) // self.piece_rows
        with self._lock:
            missing = [p for p in range(first, last + 1) if p not in self._kept]
        if len(missing) > 2:  # read the span at once, then check it piece by piece
            base = first * self.piece_rows
            rows = self.unchecked(base, min(self._count, (last + 1) * self.piece_rows))
            for p in range(first, last + 1):
                k = (p - first) * self.piece_rows
                rows[k:k + self.piece_rows] = self._checked(p, rows[k:k + self.piece_rows])
            return rows[lo - base:hi - base]
        parts = [self._piece(p) for p in range(first, last + 1)]
        rows = np.concatenate(parts)
        return rows[lo - first * self.piece_rows:hi - first * self.piece_rows]

    def _piece(self, p: int) -> np.ndarray:
        """Piece ``p``'s rows (a copy), checked."""
        with self._lock:
            slot = self._slots([p])[0]
            rows = min(self.piece_rows, self._count - p * self.piece_rows)
            return self._buffer[slot, :rows].copy()

    def _slots(self, pieces: list[int]) -> np.ndarray:
        """The buffer slots of ``pieces`` (one per entry), each read and checked
        into a slot when missing; the least recently used give theirs up.
        Called under the lock."""
        kept = self._kept
        unique = list(dict.fromkeys(pieces))
        missing = [p for p in unique if p not in kept]
        for p in unique:  # first: a piece a missing one evicts is never one of these
            if p in kept:
                kept.move_to_end(p)
        for p, stored in zip(missing, self._stored_pieces(missing)):
            if self._buffer is None:
                self._buffer = np.zeros((max(1, self._room), self.piece_rows),
                                        dtype=INDEX_DTYPE)
                if self._all_fit:  # slot p holds piece p: read flat, it is the index
                    self._flat = self._buffer.reshape(-1)
                    self.columns = {name: self._flat[name] for name in INDEX_DTYPE.names}
            rows = self._checked(p, stored)
            if self._all_fit:
                slot = p
            elif len(kept) < len(self._buffer):
                slot = len(kept)
            else:
                _, slot = kept.popitem(last=False)
            self._buffer[slot, :len(rows)] = rows
            kept[p] = slot
            if self._all_fit:
                self._loaded[p] = True  # after the rows: lock-free readers test it first
        return np.fromiter((kept[p] for p in pieces), dtype=np.int64, count=len(pieces))

    @property
    def _ranged(self):
        """The machine's ranged copy of an index at a URL, else None."""
        return None if self._local is None or isinstance(self._local, str) else self._local

    def _stored_pieces(self, pieces: list[int]) -> list[np.ndarray]:
        """Each piece's rows as stored, not checked; at a URL all of them with
        one read of the machine's copy (its missing blocks fetched at once)."""
        bounds = [(p * self.piece_rows, min(self._count, (p + 1) * self.piece_rows))
                  for p in pieces]
        if self._ranged is None:
            return [self.unchecked(lo, hi) for lo, hi in bounds]
        size = INDEX_DTYPE.itemsize
        raws = self._ranged.read([(self._start + lo * size, (hi - lo) * size)
                                  for lo, hi in bounds])
        return [np.frombuffer(raw, dtype=INDEX_DTYPE).copy() for raw in raws]

    def _read(self, lo: int, hi: int, *, fresh: bool = False) -> np.ndarray:
        size = INDEX_DTYPE.itemsize
        if self._ranged is not None:  # at a URL: through the machine's ranged copy
            raw = self._ranged.read([(self._start + lo * size, (hi - lo) * size)],
                                    fresh=fresh)[0]
            return np.frombuffer(raw, dtype=INDEX_DTYPE).copy()
        try:
            fd = os.open(self._local, os.O_RDONLY)
            try:
                raw = os.pread(fd, (hi - lo) * size, self._start + lo * size)
            finally:
                os.close(fd)
        except OSError as exc:
            raise file_error(exc, self.path, doing="read", what=f"rows {lo}..{hi - 1} of the "
                             f"dataset index") from None
        if len(raw) != (hi - lo) * size:
            raise CorruptDataError(f"the dataset index ends before row {hi - 1}; {ADVICE}",
                                   path=self.path, record=lo)
        return np.frombuffer(raw, dtype=INDEX_DTYPE).copy()

    def _checked(self, p: int, rows: np.ndarray) -> np.ndarray:
        """Piece ``p``'s ``rows`` once checked. At a URL the machine's copy may
        be what is damaged: the piece is fetched again once, then refused."""
        try:
            self._check(p, rows)
            return rows
        except CorruptDataError:
            if self._ranged is None:
                raise
        first = p * self.piece_rows
        rows = self._read(first, first + len(rows), fresh=True)
        self._check(p, rows)
        return rows

    def _check(self, piece: int, rows: np.ndarray) -> None:
        if self._checked_all:
            return
        first = piece * self.piece_rows
        if self._crcs is not None:
            actual = zlib.crc32(rows.tobytes())
            if actual != int(self._crcs[piece]):
                raise CorruptDataError(
                    f"rows {first}..{first + len(rows) - 1} of the dataset index fail "
                    f"their CRC-32 (the checksums file records {int(self._crcs[piece]):08x}, "
                    f"the index gives {actual:08x}): the index is damaged or was changed "
                    f"after packing; {ADVICE}", path=self.path, record=first)
        check_rows(rows, self.shard_sizes, self.path, first=first)
        check_label_range(rows["label"], self.classes, path=self.path, first=first)
        if self._same_shards_as is not None:
            theirs = self._same_shards_as[first:first + len(rows)]["shard"]
            if not np.array_equal(rows["shard"], theirs):
                raise CorruptDataError("the metadata index puts records in other shards "
                                       "than the dataset index; re-pack it", path=self.path)

    def pieces_kept(self) -> list[int]:
        """The pieces in memory now, least recently used first."""
        with self._lock:
            return list(self._kept)


class Column(LazyColumn):
    """One field of an :class:`IndexRows` (``"label"``, ``"crc32"``, ...),
    indexed like an array; its rows checked as the index's are."""

    def __init__(self, index: IndexRows, name: str) -> None:
        self.index, self.name = index, name
        self.dtype = INDEX_DTYPE[name]
        self.shape = (len(index),)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, where):
        index = self.index
        if isinstance(where, (int, np.integer)):
            # A CRC check asks per record: a loaded piece is read without the lock.
            if index._all_fit and 0 <= where < index._count and \
                    index._loaded[where // index.piece_rows]:
                return index.columns[self.name][where]
            return index.row(int(where))[self.name]
        if index._all_fit and not isinstance(where, slice):
            return index._flat_rows(index._positions(where), self.name)
        return index[where][self.name]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.index[:][self.name]
        return out if dtype is None else out.astype(dtype)


"""A per-record column read on demand, indexed like a numpy array (no torch).

Readers hand out labels and CRCs as columns that need not sit in memory
whole: an index read a piece at a time, an LMDB or HDF5 column checked a
piece at a time (:class:`PieceColumn`), a view's selection of its parent's,
the parts of a version one after another. Each is indexed by an int, a
slice or an integer array; :class:`LazyColumn` gives the rest of what numpy
and the callers use from a ``__getitem__``.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections import OrderedDict

import numpy as np

from fastdata.errors import CorruptDataError


class LazyColumn:
    """The array-like surface of a column whose subclass defines
    ``__getitem__`` (int, slice or integer array), ``dtype`` and ``shape``."""

    dtype = np.dtype(np.int64)
    shape: tuple[int, ...] = (0,)

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self):
        return iter(np.asarray(self))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.asarray(self[:])
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    def astype(self, dtype, copy: bool = True) -> np.ndarray:
        return np.asarray(self).astype(dtype)


def positions(where, n: int) -> np.ndarray:
    """An int array, slice or list of positions as int64 in ``0..n``
    (negative ones counted from the end)."""
    if isinstance(where, slice):
        return np.arange(*where.indices(n))
    at = np.asarray(where, dtype=np.int64)
    return np.where(at < 0, at + n, at)


#: Pieces of a column kept in memory per process, least recently used out.
PIECES_KEPT = 2048


class PieceColumn(LazyColumn):
    """A per-record column stored in a file (LMDB values, an HDF5 dataset)
    and read a piece of ``rows`` values at a time, each piece checked against
    its CRC-32 the first time this process reads it.

    A piece is checked against its CRC-32 and by ``check`` (labels inside the
    classes, offsets in order); a flag per piece remembers that it passed.
    At most :data:`PIECES_KEPT` pieces stay in memory, so a process holds the
    checksums, the flags and the pieces its reads used last.

    Args:
        store: ``store.read(name, pieces)`` gives the stored values of each
            of ``pieces`` (piece numbers), as arrays of ``stored``, unchecked;
            ``store.sha256(name)`` (``verify``) the SHA-256 of the whole
            column as stored (None: missing).
        name: the column's name in the file (errors name it).
        count: its values.
        stored: its type as stored (little-endian).
        sums: the CRC-32 of every piece's bytes as stored (checked already).
        rows: values per piece.
        path: the file errors name.
        what: the column for a message ("the labels (dataset 'labels')").
        check: ``check(first, values)`` raises CorruptDataError for a piece's
            values (from value ``first`` on) that cannot be right.
    """

    def __init__(self, store, name: str, *, count: int, stored, sums: np.ndarray, rows: int,
                 path: str, what: str, check=None) -> None:
        self._store, self.name, self.path, self.what = store, name, path, what
        self.stored = np.dtype(stored)
        self.dtype = self.stored.newbyteorder("=")
        self.shape = (int(count),)
        self.rows = int(rows)
        self._sums = sums
        self._check = check
        self._checked = np.zeros(len(sums), dtype=bool)
        self._kept: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock, self._pid = threading.Lock(), os.getpid()

    def __getstate__(self) -> dict:
        # Checked in this process only: another one checks again what it reads.
        return {**self.__dict__, "_checked": np.zeros_like(self._checked),
                "_kept": OrderedDict(), "_lock": None, "_pid": None}

    def _guard(self) -> threading.Lock:
        """The lock of this process: one inherited across fork may have been
        held by another thread of the parent at that moment."""
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
        return self._lock

    def __getitem__(self, where):
        n = self.shape[0]
        if isinstance(where, (int, np.integer)):
            i = int(where)
            if not -n <= i < n:
                raise IndexError(f"index {i} is outside the {n} values of {self.what}")
            p, within = divmod(i % n, self.rows)
            return self._pieces([p])[p][within]
        at = positions(where, n)
        if at.size and (int(at.min()) < 0 or int(at.max()) >= n):
            raise IndexError(f"an index of {where!r} is outside the {n} values of {self.what}")
        if at.size == 0:
            return np.zeros(at.shape, self.dtype)
        flat = at.reshape(-1)
        piece = flat // self.rows
        # Not np.unique: its first call imports numpy.ma (see IndexRows).
        wanted = sorted(set(piece.tolist()))
        found = self._pieces(wanted)
        table = np.zeros((len(wanted), self.rows), dtype=self.dtype)
        for k, p in enumerate(wanted):
            table[k, :len(found[p])] = found[p]
        rank = np.searchsorted(np.asarray(wanted, dtype=np.int64), piece)
        return table[rank, flat - piece * self.rows].reshape(at.shape)

    def _pieces(self, wanted: list[int]) -> dict[int, np.ndarray]:
        """The values of each piece in ``wanted`` (checked), from memory or
        read together; the ones read are kept, the least used let go."""
        with self._guard():
            found = {}
            for p in wanted:
                values = self._kept.get(p)
                if values is not None:
                    self._kept.move_to_end(p)
                    found[p] = values
        missing = [p for p in wanted if p not in found]
        if missing:
            for p, values in zip(missing, self._store.read(self.name, missing)):
                if not self._checked[p]:
                    self._check_piece(p, values)
                found[p] = values.astype(self.dtype)
            with self._guard():
                for p in missing:
                    self._kept[p] = found[p]
                while len(self._kept) > PIECES_KEPT:
                    self._kept.popitem(last=False)
        return found

    def _check_piece(self, p: int, part: np.ndarray) -> None:
        first = p * self.rows
        expected = min(self.rows, self.shape[0] - first)
        actual = zlib.crc32(part) if len(part) == expected else None
        if actual != int(self._sums[p]):
            got = f"{actual:08x}" if actual is not None else \
                f"{len(part)} of its {expected} values"
            raise CorruptDataError(
                f"the values of records {first}..{first + expected - 1} (piece {p}) in "
                f"{self.what} fail their CRC-32 (its piece checksums record "
                f"{int(self._sums[p]):08x}, the stored values give {got}): the file is "
                f"damaged or was changed after packing; re-pack it or restore the file",
                path=self.path, key=self.name)
        if self._check is not None:
            self._check(first, part)
        self._checked[p] = True

    def pieces_kept(self) -> list[int]:
        """The pieces in memory now, least recently used first."""
        with self._guard():
            return list(self._kept)

    def damaged(self, shown: int = 5) -> list[CorruptDataError]:
        """Check every piece (``verify``), without keeping them; the errors of
        the first ``shown`` damaged pieces, and one counting the rest."""
        errors: list[CorruptDataError] = []
        more = 0
        step = 1024  # pieces read at a time
        for lo in range(0, len(self._sums), step):
            batch = list(range(lo, min(len(self._sums), lo + step)))
            for p, values in zip(batch, self._store.read(self.name, batch)):
                try:
                    self._check_piece(p, values)
                except CorruptDataError as exc:
                    if len(errors) < shown:
                        errors.append(exc)
                    else:
                        more += 1
        if more:
            errors.append(CorruptDataError(f"{more} more pieces of {self.what} are damaged",
                                           path=self.path, key=self.name))
        return errors

    def blocks(self, step: int = 1 << 20):
        """The values in order, ``step`` at a time (each block checked)."""
        for lo in range(0, self.shape[0], step):
            yield self[lo:lo + step]

    def check_sha256(self, manifest) -> None:
        """Check the whole column as stored against the SHA-256 the manifest
        records for it, if any (``verify``; reads check pieces).

        Raises:
            CorruptDataError: it fails, or is missing.
        """
        from fastdata.formats.integrity import check_digest, expected_sha256

        expected = expected_sha256(manifest, self.name, path=self.path)
        if expected is not None:
            check_digest(expected, self._store.sha256(self.name), path=self.path,
                         what=self.what)


def column_problems(columns: list[PieceColumn], manifest, labels: PieceColumn | None = None
                    ) -> list[dict]:
    """``verify``'s problems with ``columns``: every piece checked, each
    column against its SHA-256, and ``labels`` (one of them) against the
    manifest's class counts; as ``Reader.check_layout`` gives them."""
    from fastdata.formats.integrity import check_class_counts

    problems = []
    for column in columns:
        errors = column.damaged()
        if not errors:
            try:
                column.check_sha256(manifest)
            except CorruptDataError as exc:
                errors = [exc]
        problems += [{"index": None, "path": e.path, "reason": e.message} for e in errors]
    classes = len(manifest.classes) if isinstance(manifest.classes, list) else 0
    if labels is not None and classes and not problems:
        counts = np.zeros(classes, dtype=np.int64)
        for block in labels.blocks():
            counts += np.bincount(block, minlength=classes)
        try:
            check_class_counts(counts, manifest, path=labels.path)
        except CorruptDataError as exc:
            problems.append({"index": None, "path": exc.path, "reason": exc.message})
    return problems

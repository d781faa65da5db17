"""The label and CRC32 columns of an LMDB dataset, a piece at a time (no torch).

From key schema 1.1 each column is also stored in pieces, one key per piece
of 128 values (``__labels__/0000000000`` ...), beside the whole value that
plain ``lmdb`` users and older readers read. A batch gets the pieces it
touches: a get of a whole column value makes LMDB touch every page of it
(measured: 0.75 ms and all 16 MB of the labels of 2x10^6 records, per get),
a piece is one small value. Each piece read is checked against its CRC-32
(:class:`fastdata.formats.column.PieceColumn`).
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager

import numpy as np

from fastdata.errors import CorruptDataError
from fastdata.formats.column import PieceColumn
from fastdata.formats.integrity import LabelRange, piece_sums
from fastdata.formats.lmdb.envs import acquire_env, release_env
from fastdata.formats.lmdb.schema import PIECES_KEYS, piece_key


class LMDBColumns:
    """The stored columns of the LMDB dataset at ``path``, through this
    process's shared environment (acquired on first use, given back by
    :meth:`close`; one inherited across fork is left alone)."""

    def __init__(self, path: str, readahead: bool, dtypes: dict[bytes, str]) -> None:
        self.path, self.readahead = path, readahead
        self._dtypes = {key.decode(): np.dtype(d) for key, d in dtypes.items()}
        self._env = self._key = self._pid = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_env": None, "_key": None, "_pid": None}

    def dtype(self, name: str) -> np.dtype:
        """Column ``name``'s type as stored."""
        return self._dtypes[name]

    def _environment(self):
        if self._pid != os.getpid():
            self._env = self._key = None  # the parent's: never used or released here
        if self._env is None:
            self._env, self._key = acquire_env(self.path, self.readahead)
            self._pid = os.getpid()
        return self._env

    def close(self) -> None:
        env, key, self._env, self._key = self._env, self._key, None, None
        if env is not None and self._pid == os.getpid():
            release_env(key)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - may run at interpreter exit: nothing to do
            pass

    @contextmanager
    def _txn(self, name: str, *, buffers: bool = False):
        """A read transaction; LMDB's errors as CorruptDataError naming ``name``."""
        import lmdb

        try:
            txn = self._environment().begin(buffers=buffers)
        except lmdb.Error as exc:
            raise self._error(name, exc) from None
        try:
            yield txn
        except lmdb.Error as exc:
            raise self._error(name, exc) from None
        finally:
            txn.abort()  # read-only: nothing to commit

    def _error(self, name: str, exc: Exception) -> CorruptDataError:
        return CorruptDataError(f"the column {name!r} cannot be read ({exc}): the LMDB file "
                                f"is damaged; re-pack it or restore it", path=self.path,
                                key=name)

    def read(self, name: str, pieces: list[int]) -> list[np.ndarray]:
        """The stored values of each of ``pieces`` of column ``name``, unchecked
        (a missing piece gives no values)."""
        dtype = self._dtypes[name]
        with self._txn(name) as txn:
            raws = [txn.get(piece_key(name, p)) for p in pieces]
        return [np.frombuffer(raw or b"", dtype=dtype) for raw in raws]

    def sha256(self, name: str) -> str | None:
        """The SHA-256 of the whole value ``name`` (None: missing)."""
        with self._txn(name, buffers=True) as txn:
            raw = txn.get(name.encode())
            return None if raw is None else hashlib.sha256(raw).hexdigest()


def piece_column(store: LMDBColumns, txn, manifest, rows: int, key: bytes) -> PieceColumn:
    """Column ``key`` of ``store`` as a :class:`PieceColumn`: its pieces'
    checksums read in ``txn`` and checked against the manifest."""
    count = manifest.count
    name, sums_key = key.decode(), PIECES_KEYS[key].decode()
    sums = piece_sums(manifest, sums_key, txn.get(PIECES_KEYS[key]), -(-count // rows),
                      path=store.path, what=f"the piece checksums of {name!r} (key "
                      f"{sums_key!r})")
    check = LabelRange(len(manifest.classes), store.path) if name == "__labels__" else None
    return PieceColumn(store, name, count=count, stored=store.dtype(name), sums=sums, rows=rows,
                       path=store.path, what=f"the {_WHAT.get(name, name)} (LMDB key "
                       f"{name!r} and its pieces)", check=check)


_WHAT = {"__labels__": "labels", "__crc32__": "record CRC32s",
         "__metadata_crc32__": "metadata CRC32s"}

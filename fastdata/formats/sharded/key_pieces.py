"""One record's key without the others (no torch).

The keys file (``NAME.fastdata.keys.json``) is one JSON list. Its pieces file
(``NAME.fastdata.keys-pieces.npy``, named by the manifest's
``extra.keys_pieces``) gives where each piece of 128 keys begins and the
CRC-32 of the piece's bytes, and a last row where the list ends. A message
that names a record (a damaged record, a skipped one) reads that piece alone:
the keys of 10^9 records are tens of GB as Python strings.

What grows with the dataset: the pieces file, read whole and checked against
the manifest's SHA-256 when a key is first asked for (12 bytes per 128 keys:
94 MB at 10^9 records).
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from collections import OrderedDict

import numpy as np

from fastdata.errors import CorruptDataError
from fastdata.formats.integrity import check_sha256, expected_sha256
from fastdata.formats.record_spool import KEY_PIECE
from fastdata.formats.remote_files import is_remote, keys_limit, local_copy, read_bytes

#: Pieces of keys kept parsed (a run of warnings names neighbouring records).
PIECES_KEPT = 8


class KeyPieces:
    """The keys of a local keys file ``keys_path``, a piece at a time.

    Args:
        keys_path: the keys file (a URL's local copy).
        rows: the pieces file's rows (:data:`KEY_PIECE`), checked.
        per_piece: keys per piece (the manifest's ``keys_pieces.keys``).
        count: the dataset's records.
    """

    def __init__(self, keys_path: str, rows: np.ndarray, per_piece: int, count: int,
                 read_range=None) -> None:
        pieces = -(-count // per_piece) if count else 0
        if len(rows) != pieces + 1 or per_piece < 1:
            raise CorruptDataError(f"the keys' pieces file has {len(rows)} rows, not "
                                   f"{pieces + 1} for {count} keys; re-pack the dataset",
                                   path=keys_path)
        self.path, self.rows, self.per_piece, self.count = keys_path, rows, per_piece, count
        self._read_range = read_range or self._pread
        self._kept: OrderedDict[int, list] = OrderedDict()
        self._lock = threading.Lock()

    def key(self, index: int) -> str:
        """Record ``index``'s key.

        Raises:
            CorruptDataError: its piece fails its CRC-32 or is not a JSON list
                of its keys.
        """
        piece, within = divmod(index, self.per_piece)
        with self._lock:
            keys = self._kept.get(piece)
            if keys is None:
                keys = self._read(piece)
                self._kept[piece] = keys
                if len(self._kept) > PIECES_KEPT:
                    self._kept.popitem(last=False)
            return keys[within]

    def _read(self, piece: int) -> list:
        lo, hi = int(self.rows[piece]["offset"]), int(self.rows[piece + 1]["offset"])
        # The keys file's size: its closing bracket is the last byte.
        return self.parse(piece, self._read_range(lo, hi - lo, int(self.rows[-1]["offset"]) + 1))

    def _pread(self, start: int, length: int, size: int) -> bytes:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return os.pread(fd, length, start)
        finally:
            os.close(fd)

    def parse(self, piece: int, raw: bytes) -> list:
        """The keys of piece ``piece``, from its bytes ``raw``, checked."""
        first = piece * self.per_piece
        wanted = min(self.per_piece, self.count - first)
        if zlib.crc32(raw) != int(self.rows[piece]["crc32"]):
            raise CorruptDataError(f"the keys of records {first}..{first + wanted - 1} fail "
                                   f"their CRC-32: the keys file is damaged; re-pack the "
                                   f"dataset", path=self.path, record=first)
        body = raw[:-2] if piece + 1 < len(self.rows) - 1 else raw  # its ", " after
        try:
            keys = json.loads(b"[" + body + b"]")
        except ValueError:
            keys = None
        if not isinstance(keys, list) or len(keys) != wanted:
            raise CorruptDataError(f"the keys of records {first}..{first + wanted - 1} are "
                                   f"not where the keys' pieces file says; re-pack the "
                                   f"dataset", path=self.path, record=first)
        return keys

    def check_file(self, f, size: int) -> None:
        """Check every piece against the keys file open as ``f`` (``size``
        bytes), one piece in memory at a time (``verify`` in pieces)."""
        if int(self.rows[-1]["offset"]) != size - 1:
            raise CorruptDataError("the keys' pieces file does not end where the keys do; "
                                   "re-pack the dataset", path=self.path)
        for piece in range(len(self.rows) - 1):
            lo, hi = int(self.rows[piece]["offset"]), int(self.rows[piece + 1]["offset"])
            f.seek(lo)
            self.parse(piece, f.read(hi - lo))

    def check_all(self, raw: bytes) -> None:
        """Check every piece against the whole keys file ``raw`` (``verify``)."""
        if int(self.rows[-1]["offset"]) != len(raw) - 1:
            raise CorruptDataError("the keys' pieces file does not end where the keys do; "
                                   "re-pack the dataset", path=self.path)
        for piece in range(len(self.rows) - 1):
            lo, hi = int(self.rows[piece]["offset"]), int(self.rows[piece + 1]["offset"])
            self.parse(piece, raw[lo:hi])


def load_key_pieces(manifest, extra_pieces, pieces_path: str, keys_local: str,
                    count: int, read_range=None) -> KeyPieces:
    """The :class:`KeyPieces` a manifest's ``keys_pieces`` describes: its file
    (``pieces_path``, local) checked whole against the manifest's SHA-256;
    ``read_range(start, length, size)`` reads the keys file of ``size`` bytes
    (default: ``keys_local`` with ``pread``; at a URL, a ranged request)."""
    from fastdata.formats.integrity import check_file_sha256
    from fastdata.formats.sharded.index_file import load_array

    per = extra_pieces.get("keys") if isinstance(extra_pieces, dict) else None
    if type(per) is not int or per < 1:
        raise CorruptDataError(f"the manifest's keys_pieces.keys is {per!r}, not a number of "
                               f"keys per piece; re-pack the dataset", path=pieces_path)
    check_file_sha256(manifest, extra_pieces["file"], pieces_path,
                      what="the keys' piece offsets")
    rows = load_array(pieces_path, (-(-count // per) if count else 0) + 1, KEY_PIECE)
    return KeyPieces(keys_local, rows, per, count, read_range)


class ShardedKeys:
    """The keys side of :class:`~fastdata.formats.sharded.reader.ShardedReader`
    (a mixin: it uses the reader's manifest, keys paths and ranged reads)."""

    def key_of(self, index: int) -> str | None:
        """Record ``index``'s key for a message: read from its piece of the
        keys file alone, unless the keys are in memory already (or the
        dataset has no pieces file: packed before it, another tool's, one
        shard of a set). None when it cannot be read."""
        if self._keys is not None or self._records is not None \
                or getattr(self, "_keys_pieces_path", None) is None:
            return super().key_of(index)
        try:
            if self._key_pieces is None:
                keys, ranged = self._keys_path, None
                if is_remote(keys):  # a piece by a ranged request, not the file whole
                    def ranged(start: int, length: int, size: int) -> bytes:
                        return self._ranged.read(keys, [(start, length)], size=size)[0]
                else:
                    keys = local_copy(keys)
                self._key_pieces = self._load_key_pieces(keys, ranged)
            return self._key_pieces.key(index % len(self))
        except Exception:  # noqa: BLE001 - only for a message: never mask the error reported
            return None

    def check_key_pieces(self) -> None:
        """Check that the keys' pieces file describes the keys file (``verify``).

        Raises:
            CorruptDataError: a file is damaged, or they disagree.
        """
        if getattr(self, "_keys_pieces_path", None) is None or self._records is not None:
            return
        local = local_copy(self._keys_path, limit=keys_limit(self.manifest.count))
        with open(local, "rb") as f:
            self._load_key_pieces(local).check_all(f.read())

    def check_keys_streamed(self) -> bool:
        """Check the keys file against its SHA-256 and every piece of it,
        reading it in pieces: no key held in memory (``verify`` in pieces).
        False when the dataset has no pieces file (then load :attr:`keys`).

        Raises:
            CorruptDataError: a file is damaged, or they disagree.
        """
        if getattr(self, "_keys_pieces_path", None) is None or self._records is not None \
                or self._foreign_keys is not None:
            return False
        from fastdata.formats.integrity import check_file_sha256

        local = local_copy(self._keys_path, limit=keys_limit(self.manifest.count))
        check_file_sha256(self.manifest, os.path.basename(self._keys_path), local,
                          what="the keys")
        with open(local, "rb") as f:
            self._load_key_pieces(local).check_file(f, os.path.getsize(local))
        return True

    def _load_key_pieces(self, keys: str, read_range=None) -> KeyPieces:
        """The dataset's :class:`KeyPieces` over the keys file ``keys``."""
        return load_key_pieces(self.manifest, self.manifest.extra["keys_pieces"],
                               local_copy(self._keys_pieces_path), keys, self.manifest.count,
                               read_range)

    def _load_keys(self) -> list[str]:
        if self._foreign_keys is not None:
            return self._foreign_keys
        try:
            raw = read_bytes(self._keys_path, limit=keys_limit(self.manifest.count))
        except OSError as exc:
            if expected_sha256(self.manifest, os.path.basename(self._keys_path),
                               path=self._keys_path) is None:
                return None  # keys are optional in datasets packed before their checksum
            raise CorruptDataError(f"cannot read the keys ({exc.strerror or exc}); restore "
                                   f"the file or re-pack", path=self._keys_path) from None
        check_sha256(self.manifest, os.path.basename(self._keys_path), raw,
                     path=self._keys_path, what="the keys")
        try:
            keys = json.loads(raw)
        except ValueError:
            return None
        if self._records is not None and isinstance(keys, list):
            first, count, _ = self._records
            keys = keys[first:first + count]
        return keys

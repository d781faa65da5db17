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
from fastdata.formats.record_spool import KEY_PIECE

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

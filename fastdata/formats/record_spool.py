"""Per-record facts of a pack, kept on disk while it is written (no torch).

A writer learns each record's key, label and checksums as it goes, and needs
them all only at the end (the dataset index, the keys file). Held in Python
lists they cost about 100 bytes per record: 100 GB at 10^9 records. A spool
appends them to files in a folder of the writer's (beside the output) a block
of :data:`BLOCK` rows at a time, and gives them back in order, a block at a
time.

What grows with the dataset: the spool's files (the rows' bytes, each key's
JSON); in memory, one block of rows
(and :data:`FLUSH_ROWS` rows waiting to be written).
"""

from __future__ import annotations

import io
import json
import os
import zlib
from collections.abc import Iterator

import numpy as np

from fastdata.errors import FastDataError

#: A piece of the keys file: where its first key begins, the CRC-32 of its bytes.
KEY_PIECE = np.dtype([("offset", "<u8"), ("crc32", "<u4")])
#: Keys per piece of the keys file.
PIECE_KEYS = 128

#: Rows per block read back: a multiple of the index's piece, so blocks are
#: whole pieces. What the end of a pack holds at once is about two blocks,
#: each read, copied and turned into index rows: ~3 MB at 2^14 rows of 48 B.
BLOCK = 1 << 14
#: Rows gathered in memory (as tuples, ~300 bytes each) before they are
#: appended to the file.
FLUSH_ROWS = 4096


class RowSpool:
    """Fixed-size rows (``dtype``) appended to the file ``path``, read back
    in order. Rows are tuples in ``dtype``'s field order."""

    def __init__(self, path: str, dtype) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self._file = open(path, "w+b")  # noqa: SIM115 - kept open while the pack writes
        self._pending: list[tuple] = []
        self._flushed = 0

    def __len__(self) -> int:
        return self._flushed + len(self._pending)

    def append(self, row: tuple) -> None:
        self._pending.append(row)
        if len(self._pending) >= FLUSH_ROWS:
            self._flush()

    def extend(self, rows) -> None:
        for row in rows:
            self.append(tuple(row))

    def _flush(self) -> None:
        if self._pending:
            self._file.write(np.array(self._pending, dtype=self.dtype).tobytes())
            self._flushed += len(self._pending)
            self._pending = []
        self._file.flush()

    def rows(self, first: int = 0, end: int | None = None) -> np.ndarray:
        """Rows ``first..end`` (default: to the last) as one array."""
        end = len(self) if end is None else end
        if end <= first:
            return np.zeros(0, self.dtype)
        self._flush()
        size = self.dtype.itemsize
        raw = os.pread(self._file.fileno(), (end - first) * size, first * size)
        return np.frombuffer(raw, dtype=self.dtype).copy()

    def blocks(self, size: int = BLOCK) -> Iterator[np.ndarray]:
        """Every row in order, ``size`` rows at a time."""
        for first in range(0, len(self), size):
            yield self.rows(first, min(len(self), first + size))

    def close(self) -> None:
        self._file.close()


class KeySpool:
    """Keys appended to the file ``path`` (one JSON string per line), written
    back as the JSON list ``json.dumps(keys, ensure_ascii=False)`` gives."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "w+b", buffering=1 << 20)  # noqa: SIM115
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, key: str) -> None:
        try:
            line = json.dumps(key, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise FastDataError("a key is not valid UTF-8 (a file name's undecodable bytes); "
                                "rename the file", key=key) from None
        self._file.write(line + b"\n")  # JSON escapes newlines: one key per line
        self._count += 1

    def write_json(self, f, piece_keys: int) -> np.ndarray:
        """Write the keys' JSON list to the binary file ``f``; return where each
        piece of ``piece_keys`` keys begins in it and the CRC-32 of its bytes
        (up to the next piece's first key: the ", " after its last key
        included), and a last row giving where the closing bracket is
        (rows of :data:`KEY_PIECE`)."""
        self._file.flush()
        rows = []
        f.write(b"[")
        position, start, crc = 1, 1, 0
        with open(self.path, "rb") as spool:
            for k, line in enumerate(spool):
                if k:
                    f.write(b", ")
                    crc = zlib.crc32(b", ", crc)
                    position += 2
                    if k % piece_keys == 0:
                        rows.append((start, crc))
                        start, crc = position, 0
                key = line[:-1]
                f.write(key)
                crc = zlib.crc32(key, crc)
                position += len(key)
            if position > 1:
                rows.append((start, crc))
        f.write(b"]")
        rows.append((position, 0))
        return np.array(rows, dtype=KEY_PIECE)

    def blocks(self, size: int = BLOCK) -> Iterator[list[str]]:
        """Every key, in order, ``size`` at a time."""
        self._file.flush()
        block: list[str] = []
        with open(self.path, "rb") as spool:
            for line in spool:
                block.append(json.loads(line))
                if len(block) == size:
                    yield block
                    block = []
        if block:
            yield block

    def json_bytes(self) -> bytes:
        """The keys' JSON list whole (for a format that stores it as one value)."""
        out = io.BytesIO()
        self.write_json(out, PIECE_KEYS)
        return out.getvalue()

    def all(self) -> list[str]:
        """Every key, in order."""
        return json.loads(self.json_bytes())

    def close(self) -> None:
        self._file.close()

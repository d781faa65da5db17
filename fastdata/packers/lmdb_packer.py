"""LMDB writer, and the LMDB key schema (the loader imports these constants).

Layout: ``out.lmdb/`` is an ordinary LMDB environment folder (``data.mdb``,
``lock.mdb``) with one unnamed database holding

==================  ==========================================================
key (ASCII)         value
==================  ==========================================================
``0000000000`` ...  record i's payload (the original file bytes by default);
                    the key is i as 10 zero-padded decimal digits
``__labels__``      int64 little-endian array of the N labels
``__crc32__``       uint32 little-endian array of the N payload CRC32s (zlib)
``__keys__``        JSON list of the N source keys (relative paths), UTF-8
``__manifest__``    the manifest, JSON, UTF-8 (written last)
==================  ==========================================================

Sample keys sort before the ``__`` keys, so a cursor walks records in order.
"""

from __future__ import annotations

import json
import os

import numpy as np

from fastdata.errors import FastDataError
from fastdata.packers.writer import Writer
from fastdata.records import Manifest, Record

SAMPLE_KEY_FORMAT = "{:010d}"
LABELS_KEY = b"__labels__"
CRC32_KEY = b"__crc32__"
KEYS_KEY = b"__keys__"
MANIFEST_KEY = b"__manifest__"
LABEL_DTYPE = "<i8"
CRC32_DTYPE = "<u4"
KEY_SCHEMA = "fastdata-lmdb-1"


def sample_key(index: int) -> bytes:
    """The LMDB key of record ``index``."""
    return b"%010d" % index


class LMDBWriter(Writer):
    """Writes records into an LMDB environment folder.

    Puts are committed in batches (``commit_every`` records or ``commit_bytes``
    bytes) and the map grows by doubling when it fills, so no size needs to be
    guessed up front.
    """

    format_name = "lmdb"
    output_is_dir = True

    def __init__(self, path, *, overwrite: bool = False, commit_every: int = 1000,
                 commit_bytes: int = 64 << 20, map_size: int = 1 << 30) -> None:
        self._commit_every = commit_every
        self._commit_bytes = commit_bytes
        self._map_size = map_size
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._keys: list[str] = []
        self._env = None
        super().__init__(path, overwrite=overwrite)

    def _open(self, temp_path: str) -> None:
        import lmdb

        self._env = lmdb.open(temp_path, map_size=self._map_size, subdir=True,
                              metasync=False, sync=False, readahead=False, meminit=False)

    def _write(self, record: Record, crc: int) -> None:
        self._pending.append((sample_key(record.index), record.payload))
        self._pending_bytes += len(record.payload)
        self._keys.append(record.key)
        if len(self._pending) >= self._commit_every or self._pending_bytes >= self._commit_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._put_all(self._pending)
            self._pending = []
            self._pending_bytes = 0

    def _put_all(self, items: list[tuple[bytes, bytes]]) -> None:
        import lmdb

        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in items:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:
                # The transaction was aborted; grow the map and retry the batch.
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)

    def _close(self, manifest: Manifest) -> Manifest:
        self._flush()
        info = self._env.info()
        stat = self._env.stat()
        meta = [
            (LABELS_KEY, np.asarray(self.labels, dtype=LABEL_DTYPE).tobytes()),
            (CRC32_KEY, np.asarray(self.crcs, dtype=CRC32_DTYPE).tobytes()),
            (KEYS_KEY, json.dumps(self._keys, ensure_ascii=False).encode("utf-8")),
        ]
        self._put_all(meta)
        on_disk = (info["last_pgno"] + 1) * stat["psize"]
        manifest = _with_layout(manifest, on_disk)
        self._put_all([(MANIFEST_KEY, manifest.to_json().encode("utf-8"))])
        self._env.sync(True)
        self._env.close()
        self._env = None
        size = os.path.getsize(os.path.join(self.temp_path, "data.mdb"))
        if size <= 0:
            raise FastDataError("LMDB data file is empty after writing", path=self.path)
        return manifest

    def _discard(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def _with_layout(manifest: Manifest, on_disk: int) -> Manifest:
    import dataclasses

    size = dict(manifest.bytes, on_disk=on_disk)
    return dataclasses.replace(
        manifest,
        bytes=size,
        shards=[{"path": "data.mdb", "count": manifest.count, "bytes": on_disk}],
        extra={"key_schema": KEY_SCHEMA, "sample_key": SAMPLE_KEY_FORMAT,
               "labels_key": LABELS_KEY.decode(), "crc32_key": CRC32_KEY.decode(),
               "keys_key": KEYS_KEY.decode(), "manifest_key": MANIFEST_KEY.decode()},
    )

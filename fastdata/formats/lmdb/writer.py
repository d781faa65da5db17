"""LMDB writer: records into an LMDB environment folder (schema in ``schema.py``)."""

from __future__ import annotations

import errno
import json
import os

import numpy as np

from fastdata.errors import FastDataError
from fastdata.formats.lmdb.schema import (
    CRC32_DTYPE,
    CRC32_KEY,
    DATA_FILE,
    KEY_SCHEMA,
    KEYS_KEY,
    LABEL_DTYPE,
    LABELS_KEY,
    MANIFEST_KEY,
    SAMPLE_KEY_FORMAT,
    sample_key,
)
from fastdata.formats.integrity import sha256_hex, with_metadata_sha256
from fastdata.formats.output import free_bytes
from fastdata.formats.writer import Writer
from fastdata.records import Manifest, Record


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
        self._env = None
        super().__init__(path, overwrite=overwrite)

    def _open(self, temp_path: str) -> None:
        import lmdb

        free = free_bytes(temp_path)
        if free is not None and free < _OPEN_HEADROOM:
            # LMDB maps its lock file into memory: on a full disk, touching that
            # mapping kills the process (SIGBUS) instead of failing a call.
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), temp_path)
        try:
            # meminit: zero the unused part of each page before it is written;
            # otherwise stale heap bytes land in data.mdb and two packs of the
            # same source differ byte for byte.
            self._env = lmdb.open(temp_path, map_size=self._map_size, subdir=True,
                                  metasync=False, sync=False, readahead=False, meminit=True)
        except lmdb.Error as exc:
            raise _as_os_error(exc, 0, temp_path) from exc

    def _write(self, record: Record, crc: int) -> None:
        self._pending.append((sample_key(record.index), record.payload))
        self._pending_bytes += len(record.payload)
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
            except lmdb.Error as exc:
                raise _as_os_error(exc, sum(len(v) for _, v in items), self.temp_path) from exc

    def _close(self, manifest: Manifest) -> Manifest:
        import lmdb

        self._flush()
        info = self._env.info()
        stat = self._env.stat()
        meta = [
            (LABELS_KEY, np.asarray(self.labels, dtype=LABEL_DTYPE).tobytes()),
            (CRC32_KEY, np.asarray(self.crcs, dtype=CRC32_DTYPE).tobytes()),
            (KEYS_KEY, json.dumps(self.keys, ensure_ascii=False).encode("utf-8")),
        ]
        self._put_all(meta)
        on_disk = (info["last_pgno"] + 1) * stat["psize"]
        manifest = with_metadata_sha256(_with_layout(manifest, on_disk),
                                        {key.decode(): sha256_hex(value) for key, value in meta})
        self._put_all([(MANIFEST_KEY, manifest.to_json().encode("utf-8"))])
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise _as_os_error(exc, 0, self.temp_path) from exc
        self._env.close()
        self._env = None
        size = os.path.getsize(os.path.join(self.temp_path, DATA_FILE))
        if size <= 0:
            raise FastDataError("LMDB data file is empty after writing", path=self.path)
        return manifest

    def _discard(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def _as_os_error(exc: Exception, batch_bytes: int, folder: str) -> OSError:
    """LMDB's failed commit as the OSError it stands for. A short write on a full
    disk reaches LMDB as EIO ("Input/output error"): with too little room left
    for the batch, that is a full disk."""
    text = str(exc)
    if "Input/output error" in text:
        free = free_bytes(folder)
        if free is not None and free < batch_bytes + _HEADROOM:
            return OSError(errno.ENOSPC, f"No space left on device (LMDB: {text})")
        return OSError(errno.EIO, f"Input/output error (LMDB: {text})")
    if "No space left" in text or "Disk quota" in text:
        return OSError(errno.ENOSPC, f"No space left on device (LMDB: {text})")
    return OSError(errno.EIO, f"LMDB failed: {text}")


#: Free bytes below which a failed commit is taken for a full disk (pages,
#: the meta page and file-system reserve come on top of the batch itself).
_HEADROOM = 16 << 20
#: Free bytes an environment needs to be opened at all (its lock file, meta pages).
_OPEN_HEADROOM = 1 << 20


def _with_layout(manifest: Manifest, on_disk: int) -> Manifest:
    import dataclasses

    size = dict(manifest.bytes, on_disk=on_disk)
    return dataclasses.replace(
        manifest,
        bytes=size,
        shards=[{"path": DATA_FILE, "count": manifest.count, "bytes": on_disk}],
        extra={"key_schema": KEY_SCHEMA, "sample_key": SAMPLE_KEY_FORMAT,
               "labels_key": LABELS_KEY.decode(), "crc32_key": CRC32_KEY.decode(),
               "keys_key": KEYS_KEY.decode(), "manifest_key": MANIFEST_KEY.decode()},
    )

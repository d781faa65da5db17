"""LMDB writer: records into an LMDB environment folder (schema in ``schema.py``)."""

from __future__ import annotations

import errno
import itertools
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
    LOCK_FILE,
    MANIFEST_KEY,
    METADATA_CRC32_KEY,
    METADATA_KEY_FORMAT,
    PIECES_KEYS,
    SAMPLE_KEY_FORMAT,
    metadata_key,
    piece_key,
    sample_key,
)
from fastdata.formats.integrity import (
    COLUMN_PIECE_ROWS,
    COLUMN_PIECES,
    piece_crc32s,
    sha256_hex,
    with_metadata_sha256,
)
from fastdata.formats.lmdb.snapshot import drop_last_commit
from fastdata.formats.output import free_bytes, is_disk_full
from fastdata.formats.writer import (
    PieceLost,
    UploadStep,
    Writer,
    check_piece_payload,
    remove_path,
)
from fastdata.records import Manifest, PieceRecord, Record


class LMDBWriter(Writer):
    """Writes records into an LMDB environment folder.

    Puts are committed in batches (``commit_every`` records or ``commit_bytes``
    bytes) and the map grows by doubling when it fills, so no size needs to be
    guessed up front. In ``piece_mode`` a piece is one transaction, committed by
    ``end_piece`` (see "Resuming" below).

    Resuming: a piece's commit is durable when ``end_piece`` returns (the
    environment is then opened with ``sync=True``: LMDB writes and syncs the
    data pages before the meta page that names them, so a power loss leaves
    the previous commit whole), and each piece starts with a freshly opened
    environment (see ``_fresh_env``). A piece's state: the record count after
    it, the map size and its LMDB transaction id. ``adopt_piece`` checks each
    record's size and CRC-32. ``done_adopting`` drops what lies past the
    adopted records: a piece committed but never journaled is taken back as a
    whole commit (``snapshot.py``), anything else (an interrupted ``finish``)
    deleted. A resumed ``data.mdb`` is byte-identical to an uninterrupted one,
    but after that deletion (same records, pages placed differently).
    """

    format_name = "lmdb"
    output_is_dir = True
    resumable = True
    stores_metadata = True

    def __init__(self, path, *, overwrite: bool = False, commit_every: int = 1000,
                 commit_bytes: int = 64 << 20, map_size: int = 1 << 30,
                 resume_path: str | None = None) -> None:
        self._commit_every = commit_every
        self._commit_bytes = commit_bytes
        self._map_size = map_size
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._env = None
        self._durable = False  # whether each commit is synced (piece mode)
        self._txnid = 0  # the LMDB transaction of the last adopted piece
        super().__init__(path, overwrite=overwrite, resume_path=resume_path)

    @classmethod
    def remote_marker(cls, url: str) -> str:
        from fastdata.storage import join

        return join(url.rstrip("/"), DATA_FILE)  # a folder is no object; its data file is

    @classmethod
    def upload_step(cls, name: str) -> UploadStep | None:
        return UploadStep.NEVER if name.rsplit("/", 1)[-1] == LOCK_FILE else None

    def _open(self, temp_path: str) -> None:
        self._open_env(temp_path, durable=False)

    def _open_env(self, temp_path: str, *, durable: bool, create: bool = True) -> None:
        import lmdb

        free = free_bytes(temp_path)
        if free is not None and free < _OPEN_HEADROOM:
            # LMDB maps its lock file into memory: on a full disk, touching that
            # mapping kills the process (SIGBUS) instead of failing a call.
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), temp_path)
        try:
            # meminit: zero the unused part of each page before it is written;
            # otherwise stale heap bytes land in data.mdb and two packs of the
            # same source differ byte for byte. The sync flags change when the
            # file is synced, never what it holds.
            self._env = lmdb.open(temp_path, map_size=self._map_size, subdir=True,
                                  metasync=durable, sync=durable, readahead=False,
                                  meminit=True, create=create)
        except lmdb.Error as exc:
            raise _as_os_error(exc, 0, temp_path) from exc
        self._durable = durable

    def _write(self, record: Record, crc: int) -> None:
        self._pending.append((sample_key(record.index), record.payload))
        self._pending_bytes += len(record.payload)
        if record.metadata is not None:  # beside its payload, in the same commit
            self._pending.append((metadata_key(record.index), record.metadata))
            self._pending_bytes += len(record.metadata)
        if self.piece_mode:
            return  # committed whole by end_piece
        if len(self._pending) >= self._commit_every or self._pending_bytes >= self._commit_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._put_all(self._pending)
            self._pending = []
            self._pending_bytes = 0

    def _put_all(self, items) -> None:
        """Put ``items`` ((key, value) pairs, or a function giving them anew
        for each try) in one commit."""
        import lmdb

        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in (items() if callable(items) else items):
                        txn.put(key, value)
                return
            except lmdb.MapFullError:
                # The transaction was aborted; grow the map and retry the batch.
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)
            except lmdb.Error as exc:
                pairs = items() if callable(items) else items
                raise _as_os_error(exc, sum(len(v) for _, v in pairs), self.temp_path) from exc

    def _close(self, manifest: Manifest) -> Manifest:
        import lmdb

        if self.piece_mode:
            self._fresh_env()  # as after every piece (a resumed pack may end here)
        self._flush()
        info = self._env.info()
        stat = self._env.stat()
        # Each column is stored twice: whole, for readers of key schema 1 (which
        # open a 1.1 dataset and read only the whole value) and for plain
        # `lmdb` users (the documented schema); and in pieces with their
        # CRC-32s, which this reader gets instead (a get of the whole value
        # touches all its pages). The copy costs 12 B per record on disk; it
        # can go only with a major key schema. Whole in memory here, once.
        columns = self._whole_columns()
        meta = [(key, _raw(values)) for key, values in columns]
        meta += [(PIECES_KEYS[key], piece_crc32s(values, COLUMN_PIECE_ROWS).tobytes())
                 for key, values in columns]
        meta.append((KEYS_KEY, self.keys_json()))
        # One commit: a resumed pack takes back a finish that was cut short
        # as one commit (see _drop_unjournaled_piece).
        self._put_all(lambda: itertools.chain(meta, *(
            _pieces(key.decode(), values) for key, values in columns)))
        on_disk = (info["last_pgno"] + 1) * stat["psize"]
        manifest = with_metadata_sha256(_with_layout(manifest, on_disk, self),
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

    def _whole_columns(self) -> list[tuple[bytes, np.ndarray]]:
        """(key, values) of the label and CRC32 columns, and the metadata's
        CRC32s where there is metadata: each filled from the spool a block at
        a time (12 B per record, 16 with metadata)."""
        fields = [(LABELS_KEY, "label", LABEL_DTYPE), (CRC32_KEY, "crc32", CRC32_DTYPE)]
        if self.has_metadata:
            fields.append((METADATA_CRC32_KEY, "metadata_crc32", CRC32_DTYPE))
        columns = [(key, np.empty(self.count, dtype)) for key, _, dtype in fields]
        at = 0
        for block in self.fact_blocks():
            for (_, field, _), (_, values) in zip(fields, columns):
                values[at:at + len(block)] = block[field]
            at += len(block)
        if at != self.count:
            raise FastDataError(f"the writer's spool holds {at} records, it wrote {self.count}",
                                path=self.path)
        return columns

    def _discard(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    # -- pieces of a resumable pack ------------------------------------------------

    def _end_piece(self, number: int) -> dict:
        self._fresh_env()
        self._flush()  # one transaction, synced before and after its meta page
        return {"count": self.count, "map_size": self._map_size,
                "txnid": self._env.info()["last_txnid"]}

    def _fresh_env(self) -> None:
        """Reopen the environment, with synced commits. LMDB gives a transaction
        the page buffers of earlier ones without zeroing them, so the unused
        bytes of its pages depend on what this process wrote before: a resumed
        pack starts with none, and so, this way, does each piece."""
        self._env.close()
        self._env = None
        self._open_env(self.temp_path, durable=True)

    def _reopen(self, temp_path: str) -> None:
        if not os.path.isfile(os.path.join(temp_path, DATA_FILE)):
            raise PieceLost(f"the partial output has no {DATA_FILE}: nothing of it can be "
                            "resumed", path=temp_path)
        try:
            self._open_env(temp_path, durable=True, create=False)
        except OSError as exc:
            if is_disk_full(exc):
                raise
            raise PieceLost(f"LMDB cannot open the partial output ({exc}): nothing of it "
                            "can be resumed", path=temp_path) from exc

    def _adopt_piece(self, number: int, state: dict, records: list[PieceRecord]) -> None:
        import lmdb

        if state.get("count") != self.count + len(records):
            raise PieceLost(f"piece {number}: the journal says {state.get('count')} records "
                            f"after it, its records end at {self.count + len(records)}",
                            path=self.temp_path)
        try:
            with self._env.begin(buffers=True) as txn:
                for i, record in enumerate(records, start=self.count):
                    check_piece_payload(number, i, record, txn.get(sample_key(i)),
                                        self.temp_path)
                    _check_piece_metadata(number, i, record, txn.get(metadata_key(i)),
                                          self.temp_path)
        except lmdb.Error as exc:
            raise PieceLost(f"piece {number} cannot be read back ({exc})",
                            path=self.temp_path) from exc
        self._map_size = int(state.get("map_size", self._map_size))
        self._txnid = state.get("txnid")

    def _payloads(self, number: int, state: dict, records: list[PieceRecord]):
        with self._env.begin(buffers=True) as txn:
            for i in range(self.count, self.count + len(records)):
                yield txn.get(sample_key(i))

    def _after_adopting(self) -> None:
        import lmdb

        if self.count == 0:
            # Nothing adopted: start from an empty environment, as a fresh pack does.
            self._discard()
            for name in os.listdir(self.temp_path):
                remove_path(os.path.join(self.temp_path, name))
            self._open(self.temp_path)
            return
        try:
            if self._holds_beyond() and isinstance(self._txnid, int):
                self._drop_unjournaled_piece()
            # The map size the uninterrupted pack had here: each commit stores it
            # in a meta page, so another one would change data.mdb.
            self._env.set_mapsize(self._map_size)
            self._map_size = self._env.info()["map_size"]
            if self._holds_beyond():
                self._delete_beyond()
        except lmdb.Error as exc:
            raise _as_os_error(exc, 0, self.temp_path) from exc

    def _holds_beyond(self) -> bool:
        """Whether the environment holds keys past the adopted records."""
        with self._env.begin() as txn:
            return txn.cursor().set_range(sample_key(self.count))

    def _drop_unjournaled_piece(self) -> None:
        """Take back the last commit when it is the one right after the last
        adopted piece (a piece committed but never journaled): the environment
        is then as the uninterrupted pack had it (see ``snapshot.py``)."""
        page_size = self._env.stat()["psize"]
        self._env.close()
        self._env = None
        dropped = drop_last_commit(os.path.join(self.temp_path, DATA_FILE), page_size,
                                   self._txnid)
        self._open_env(self.temp_path, durable=True, create=False)
        expected = self.count + self.metadata_records  # a metadata key per record with some
        if dropped and self._env.stat()["entries"] != expected:
            raise PieceLost(f"after dropping its last commit the partial output holds "
                            f"{self._env.stat()['entries']} entries, not the {expected} of "
                            f"the {self.count} records adopted; pack again without resuming",
                            path=self.temp_path)

    def _delete_beyond(self) -> None:
        """Delete every key past the adopted records, in one commit (where
        ``_drop_unjournaled_piece`` cannot help: an interrupted ``finish``)."""
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor()
            beyond = cursor.set_range(sample_key(self.count))
            while beyond and cursor.delete():
                pass


def _raw(values: np.ndarray) -> memoryview:
    """The bytes of the contiguous array ``values``, not copied."""
    return memoryview(values.view(np.uint8))


def _pieces(column: str, values):
    """Column ``column`` in pieces of ``COLUMN_PIECE_ROWS`` values: (key, value)
    pairs, what readers read (each checked by its CRC-32 in ``*_pieces__``)."""
    raw = _raw(values)
    step = COLUMN_PIECE_ROWS * values.dtype.itemsize
    for lo in range(0, len(raw), step):
        yield piece_key(column, lo // step), raw[lo:lo + step]


def _check_piece_metadata(number: int, index: int, record: PieceRecord, stored,
                          path: str) -> None:
    """Raise ``PieceLost`` unless the partial output holds record ``index``'s
    metadata as the journal gives it (None: no metadata key)."""
    if (None if stored is None else bytes(stored)) != record.metadata:
        raise PieceLost(f"piece {number}: the metadata of record {index} differs from the "
                        "journal", path=path, key=record.key, record=index)


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


def _with_layout(manifest: Manifest, on_disk: int, writer: LMDBWriter) -> Manifest:
    import dataclasses

    size = dict(manifest.bytes, on_disk=on_disk)
    extra = {"key_schema": KEY_SCHEMA, "sample_key": SAMPLE_KEY_FORMAT,
             "labels_key": LABELS_KEY.decode(), "crc32_key": CRC32_KEY.decode(),
             "keys_key": KEYS_KEY.decode(), "manifest_key": MANIFEST_KEY.decode()}
    pieced = [LABELS_KEY, CRC32_KEY]
    if writer.has_metadata:
        extra["metadata"] = {"records": writer.metadata_records,
                             "key": METADATA_KEY_FORMAT,
                             "crc32_key": METADATA_CRC32_KEY.decode()}
        pieced.append(METADATA_CRC32_KEY)
    extra[COLUMN_PIECES] = {"rows": COLUMN_PIECE_ROWS,
                            "checksums": {k.decode(): PIECES_KEYS[k].decode() for k in pieced}}
    return dataclasses.replace(
        manifest,
        bytes=size,
        shards=[{"path": DATA_FILE, "count": manifest.count, "bytes": on_disk}],
        extra=extra,
    )

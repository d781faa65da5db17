"""LMDB reader (no torch). The key schema lives in ``schema.py``.

One LMDB environment is shared per path per process (see ``envs.py``): lmdb
refuses to open the same path twice in one process, and train/val views of
one file are common.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence

import numpy as np

from fastdata.contained import check_inside
from fastdata.errors import CorruptDataError, ManifestError
from fastdata.formats.column import PieceColumn, column_problems
from fastdata.formats.integrity import check_sha256, column_pieces
from fastdata.formats.lmdb.columns import LMDBColumns, piece_column
from fastdata.formats.lmdb.envs import acquire_env, release_env
from fastdata.formats.lmdb.schema import (
    CRC32_DTYPE,
    CRC32_KEY,
    DATA_FILE,
    KEY_SCHEMA_MAJOR,
    KEY_SCHEMA_PREFIX,
    KEYS_KEY,
    LABEL_DTYPE,
    LABELS_KEY,
    MANIFEST_KEY,
    METADATA_CRC32_KEY,
    PIECES_KEYS,
    metadata_key,
    sample_key,
)
from fastdata.formats.reader import Reader

#: The columns checked by piece, by name, and the names of their checksums.
_PIECES = {key.decode(): value.decode() for key, value in PIECES_KEYS.items()}
#: The stored type of each column.
_DTYPES = {LABELS_KEY: LABEL_DTYPE, CRC32_KEY: CRC32_DTYPE, METADATA_CRC32_KEY: CRC32_DTYPE}


class LMDBReader(Reader):
    """Reads a fastdata LMDB folder.

    The label and CRC32 columns (key schema 1.1) are read a piece of 128
    values at a time, the pieces a batch touches, each checked against its
    CRC-32 the first time (:mod:`.columns`); the last 2,048 pieces read stay
    in memory (at most 3 MiB for both columns). What grows with the dataset,
    per process: the pieces' checksums, read and checked against the
    manifest's SHA-256 on open (4 bytes per 128 records per column: 62 MB
    for the two columns of 10^9 records), and a flag per piece (1 byte per
    128 records per column). A dataset of key schema 1 (no pieces) has its
    columns read and checked whole on open: 12 bytes per record.

    Args:
        path: the ``.lmdb`` folder.
        verify: check record CRC32s on read.
        readahead: let the OS read ahead. Helps sequential scans on a cold page
            cache, hurts shuffled reads of datasets larger than RAM. The first
            reader of a path in a process decides for that process.
        allow_outside: follow symbolic links that lead out of the dataset's
            folder (see :class:`fastdata.formats.reader.Reader`).
    """

    format_name = "lmdb"
    needs_local_file = True
    # LMDB's C library trusts its pages: a damaged branch or leaf page makes a
    # cursor walk fail an assertion (abort) and a damaged node size makes a read
    # run off the map (SIGSEGV/SIGBUS). A checksum cannot stand guard in front
    # of it: the manifest lives inside data.mdb and every commit moves pages, so
    # no hash of the file or its pages can be stored in it, and hashing ~all of
    # it on open would cost a full read. So whole-file walks run in a child
    # process (one interpreter start, ~0.2 s, next to a walk over every record)
    # and a death there becomes a CorruptDataError naming data.mdb; records are
    # walked by key (a B-tree search checks each page's type and returns
    # MDB_CORRUPTED) rather than by cursor (which asserts).
    walk_in_child = True

    def __init__(self, path, *, verify: bool = True, readahead: bool = False,
                 allow_outside: bool = False) -> None:
        self.readahead = readahead
        self._env_key = None
        self._columns: LMDBColumns | None = None
        self._pieces: tuple[int, dict[str, str]] | None = None
        super().__init__(path, verify=verify, allow_outside=allow_outside)

    def _get_env(self):
        return self._process_handle()

    def _open_handle(self):
        env, self._env_key = acquire_env(self.path, self.readahead)
        return env

    def _release_handle(self, handle) -> None:
        release_env(self._env_key)

    def _data_url(self, url: str) -> str:
        # An LMDB dataset is a folder; its data is the one file data.mdb
        # (opened with subdir=False once downloaded).
        return url if url.endswith("/" + DATA_FILE) else url.rstrip("/") + "/" + DATA_FILE

    def _load_metadata(self) -> None:
        import lmdb

        if not os.path.isdir(self.path) and not os.path.isfile(self.path):
            raise ManifestError("no such LMDB dataset", path=self.path)
        if os.path.isdir(self.path):  # the folder's data file, not one a link leads to
            check_inside(os.path.join(self.path, DATA_FILE), self.path, field=DATA_FILE,
                         where=self.path, allow_outside=self.allow_outside, kind="file")
        env = self._get_env()
        try:
            self._check_size(env)
            with env.begin() as txn:
                raw = txn.get(MANIFEST_KEY)
                if raw is None:
                    raise ManifestError(
                        "LMDB environment has no fastdata manifest (key '__manifest__'): it "
                        "was not written by fastdata or its pack did not finish; re-run "
                        "`fastdata pack`", path=self.path)
                manifest = self._accept_manifest(raw, self.path)
                _check_key_schema(manifest, self.path)
                self._pieces = column_pieces(manifest, _PIECES, path=self.path)
                self._columns = LMDBColumns(self.path, self.readahead, _DTYPES)
                labels = self._column(txn, manifest, LABELS_KEY)
                crcs = self._column(txn, manifest, CRC32_KEY)
        except lmdb.Error as exc:
            raise CorruptDataError(f"LMDB environment is damaged ({exc})", path=self.path) from None
        if not isinstance(labels, PieceColumn):  # checked whole (key schema 1)
            if labels is None or len(labels) != manifest.count * 8:
                raise CorruptDataError("label array missing or of the wrong length",
                                       path=self.path, key=LABELS_KEY.decode())
            self._check_value(manifest, LABELS_KEY, labels, "the labels")
            labels = np.frombuffer(labels, dtype=LABEL_DTYPE).astype(np.int64, copy=False)
        if not isinstance(crcs, PieceColumn):
            self._check_value(manifest, CRC32_KEY, crcs, "the record CRC32s")
            crcs = (np.frombuffer(crcs, dtype=CRC32_DTYPE)
                    if crcs is not None and len(crcs) == manifest.count * 4 else None)
        self._manifest, self._labels, self._crcs = manifest, labels, crcs

    def _column(self, txn, manifest, key: bytes):
        """Column ``key``: a :class:`PieceColumn` when the dataset has its
        pieces' checksums, else its bytes (None: missing), to be checked whole."""
        if self._pieces is not None and key.decode() in self._pieces[1]:
            return piece_column(self._columns, txn, manifest, self._pieces[0], key)
        return txn.get(key)

    def close(self) -> None:
        columns = getattr(self, "_columns", None)
        if columns is not None:
            columns.close()  # reopened if its columns are read again
        super().close()

    def check_layout(self) -> list[dict]:
        """Every piece of the columns checked by piece (and each column
        against its SHA-256, the labels against the class counts)."""
        labels = self.labels
        columns = [c for c in (labels, self._stored_crcs()) if isinstance(c, PieceColumn)]
        if self.has_metadata:
            try:
                metadata = self.metadata_crcs()
            except CorruptDataError:
                metadata = None  # reported by verify's metadata check
            if isinstance(metadata, PieceColumn):
                columns.append(metadata)
        return column_problems(columns, self.manifest,
                               labels if isinstance(labels, PieceColumn) else None)

    def _check_value(self, manifest, key: bytes, value: bytes | None, what: str) -> None:
        check_sha256(manifest, key.decode(), value, path=self.path,
                     what=f"{what} (key {key.decode()!r})")

    def child_options(self) -> dict:
        # The child walks every record in order: readahead pays there.
        return {**super().child_options(), "readahead": True}

    def crash_path(self) -> str:
        return os.path.join(self.path, DATA_FILE) if os.path.isdir(self.path) else self.path

    def _check_size(self, env) -> None:
        # Reading pages past the end of a truncated file would crash with SIGBUS:
        # refuse up front instead.
        data_file = self.crash_path()
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = os.path.getsize(data_file)
        if size < needed:
            raise CorruptDataError(
                f"LMDB file is truncated ({size} bytes, its pages need {needed}); re-pack it",
                path=data_file)

    def _load_keys(self) -> list[str]:
        import lmdb

        try:
            with self._get_env().begin() as txn:
                raw = txn.get(KEYS_KEY)
        except lmdb.Error as exc:
            raise CorruptDataError(f"the stored keys cannot be read ({type(exc).__name__}: "
                                   f"{exc}); the LMDB file is damaged, re-pack it",
                                   path=self.path, key=KEYS_KEY.decode()) from None
        self._check_value(self.manifest, KEYS_KEY, raw, "the keys")
        try:
            keys = None if raw is None else json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise CorruptDataError(f"the stored keys cannot be read ({type(exc).__name__}: "
                                   f"{exc}); the LMDB file is damaged, re-pack it",
                                   path=self.path, key=KEYS_KEY.decode()) from None
        if keys is not None and not (isinstance(keys, list) and len(keys) == len(self)
                                     and all(isinstance(k, str) for k in keys)):
            raise CorruptDataError(f"the stored keys are not a list of {len(self)} strings; "
                                   f"re-pack it", path=self.path, key=KEYS_KEY.decode())
        return keys

    def _load_metadata_crcs(self):
        import lmdb

        try:
            with self._get_env().begin() as txn:
                raw = self._column(txn, self.manifest, METADATA_CRC32_KEY)
        except lmdb.Error as exc:
            raise self._read_error(None, exc) from None
        if isinstance(raw, PieceColumn):
            return raw
        self._check_value(self.manifest, METADATA_CRC32_KEY, raw, "the metadata CRC32s")
        if raw is None or len(raw) != len(self) * 4:
            raise CorruptDataError("the metadata CRC32 array is missing or of the wrong "
                                   "length; re-pack it", path=self.path,
                                   key=METADATA_CRC32_KEY.decode())
        return np.frombuffer(raw, dtype=CRC32_DTYPE)

    def _read_metadata_many(self, indices: Sequence[int]) -> list[bytes | None]:
        import lmdb

        out: list[bytes | None] = []
        try:
            with self._get_env().begin() as txn:
                for i in indices:
                    out.append(txn.get(metadata_key(i)))
        except lmdb.Error as exc:
            raise self._read_error(indices[len(out)], exc) from None
        return out

    def _read_many(self, indices: Sequence[int]) -> list[bytes]:
        import lmdb

        env = self._get_env()
        out = []
        try:
            with env.begin() as txn:
                for i in indices:
                    value = txn.get(sample_key(i))
                    if value is None:
                        raise CorruptDataError(
                            f"record {i} is missing (key {sample_key(i).decode()})",
                            path=self.path, key=self.key_of(i), record=i)
                    out.append(value)
        except lmdb.Error as exc:
            raise self._read_error(indices[len(out)] if len(out) < len(indices) else None,
                                   exc) from None
        return out

    def _iter_payloads(self) -> Iterator[tuple[int, bytes]]:
        import lmdb

        # By key, not by cursor: see walk_in_child.
        with self._get_env().begin() as txn:
            for i in range(len(self)):
                try:
                    value = txn.get(sample_key(i))
                except lmdb.Error as exc:
                    raise self._read_error(i, exc) from None
                if value is None:
                    raise CorruptDataError(
                        f"record {i} is missing (key {sample_key(i).decode()})",
                        path=self.path, key=self.key_of(i), record=i)
                yield i, value

    def _read_error(self, index: int | None, exc: Exception) -> CorruptDataError:
        what = "LMDB read failed" if index is None else f"record {index} cannot be read"
        return CorruptDataError(f"{what} ({exc}): the file is damaged; re-pack it or restore "
                                f"it", path=self.path,
                                key=None if index is None else self.key_of(index), record=index)


def _check_key_schema(manifest, path: str) -> None:
    """Refuse a dataset of a newer major key schema (a minor one adds only
    what this reader may ignore)."""
    extra = manifest.extra if isinstance(manifest.extra, dict) else {}
    schema = extra.get("key_schema")
    if not isinstance(schema, str) or not schema.startswith(KEY_SCHEMA_PREFIX):
        return  # none recorded: written before the schema was named
    major = schema[len(KEY_SCHEMA_PREFIX):].split(".", 1)[0]
    if major.isdigit() and int(major) > KEY_SCHEMA_MAJOR:
        raise ManifestError(f"LMDB key schema {schema!r} is newer than this fastdata reads "
                            f"({KEY_SCHEMA_PREFIX}{KEY_SCHEMA_MAJOR}.x); upgrade fastdata",
                            path=path)

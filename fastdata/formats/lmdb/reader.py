"""LMDB reader (no torch). The key schema lives in ``schema.py``.

One LMDB environment is shared per path per process: lmdb refuses to open the
same path twice in one process, and train/val views of one file are common.
An environment inherited across fork is closed in the child (never used) and
opened afresh.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from fastdata.contained import check_inside
from fastdata.errors import CorruptDataError, ManifestError
from fastdata.formats.lmdb.schema import (
    CRC32_DTYPE,
    CRC32_KEY,
    DATA_FILE,
    KEYS_KEY,
    LABEL_DTYPE,
    LABELS_KEY,
    MANIFEST_KEY,
    METADATA_CRC32_KEY,
    metadata_key,
    sample_key,
)
from fastdata.formats.integrity import check_sha256
from fastdata.formats.reader import Reader

# (device, inode) of the data file -> [pid, env, users]; guarded by _LOCK
# (thread-pool decoders share readers; re-entrant, because a reader that the
# garbage collector frees inside _acquire_env releases its environment here). lmdb itself recognises an environment
# by its file, not its path: a symlinked path is the same environment, and a
# folder replaced by a new pack is a new one.
_ENVS: dict[tuple[int, int], list] = {}
_LOCK = threading.RLock()


def _env_id(path: str) -> tuple[int, int]:
    data_file = os.path.join(path, DATA_FILE) if os.path.isdir(path) else path
    try:
        st = os.stat(data_file)
    except OSError as exc:
        raise ManifestError(f"not an LMDB environment ({exc.strerror}: {data_file})",
                            path=path) from None
    return st.st_dev, st.st_ino


def _acquire_env(path: str, readahead: bool):
    """The process's shared environment for ``path``, and its id for release."""
    import lmdb

    pid = os.getpid()
    key = _env_id(path)
    with _LOCK:
        entry = _ENVS.get(key)
        if entry is not None and entry[0] == pid:
            entry[2] += 1
            return entry[1], key
        if entry is not None:
            # Inherited from the parent across fork: close this process's copy
            # of the mapping (the parent's stays open) and open our own.
            try:
                entry[1].close()
            except lmdb.Error:
                pass
        try:
            env = lmdb.open(path, readonly=True, lock=False, readahead=readahead,
                            subdir=os.path.isdir(path), max_readers=2048, max_spare_txns=4)
        except lmdb.Error as exc:
            raise ManifestError(f"not a readable LMDB environment ({exc})", path=path) from None
        _ENVS[key] = [pid, env, 1]
        return env, key


def _release_env(key: tuple[int, int]) -> None:
    with _LOCK:
        entry = _ENVS.get(key)
        if entry is None or entry[0] != os.getpid():
            return
        entry[2] -= 1
        if entry[2] <= 0:
            entry[1].close()
            del _ENVS[key]


class LMDBReader(Reader):
    """Reads a fastdata LMDB folder.

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
        super().__init__(path, verify=verify, allow_outside=allow_outside)

    def _get_env(self):
        return self._process_handle()

    def _open_handle(self):
        env, self._env_key = _acquire_env(self.path, self.readahead)
        return env

    def _release_handle(self, handle) -> None:
        _release_env(self._env_key)

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
                labels = txn.get(LABELS_KEY)
                crcs = txn.get(CRC32_KEY)
        except lmdb.Error as exc:
            raise CorruptDataError(f"LMDB environment is damaged ({exc})", path=self.path) from None
        if raw is None:
            raise ManifestError(
                "LMDB environment has no fastdata manifest (key '__manifest__'): it was not "
                "written by fastdata or its pack did not finish; re-run `fastdata pack`",
                path=self.path)
        manifest = self._accept_manifest(raw, self.path)
        if labels is None or len(labels) != manifest.count * 8:
            raise CorruptDataError("label array missing or of the wrong length", path=self.path,
                                   key=LABELS_KEY.decode())
        self._check_value(manifest, LABELS_KEY, labels, "the labels")
        self._check_value(manifest, CRC32_KEY, crcs, "the record CRC32s")
        self._manifest = manifest
        self._labels = np.frombuffer(labels, dtype=LABEL_DTYPE).astype(np.int64, copy=False)
        self._crcs = (np.frombuffer(crcs, dtype=CRC32_DTYPE)
                      if crcs is not None and len(crcs) == manifest.count * 4 else None)

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

    def _load_metadata_crcs(self) -> np.ndarray:
        import lmdb

        try:
            with self._get_env().begin() as txn:
                raw = txn.get(METADATA_CRC32_KEY)
        except lmdb.Error as exc:
            raise self._read_error(None, exc) from None
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

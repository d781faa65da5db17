"""One LMDB environment per data file per process, shared by its readers (no torch).

lmdb refuses to open the same path twice in one process, and train/val views
of one file are common, so readers (and their columns) share an environment,
counted by users. An environment inherited across fork is closed in the
child (never used) and opened afresh.
"""

from __future__ import annotations

import os
import threading

from fastdata.errors import ManifestError
from fastdata.formats.lmdb.schema import DATA_FILE

# (device, inode) of the data file -> [pid, env, users]; guarded by _LOCK
# (thread-pool decoders share readers; re-entrant, because a reader that the
# garbage collector frees inside acquire_env releases its environment here).
# lmdb itself recognises an environment by its file, not its path: a
# symlinked path is the same environment, and a folder replaced by a new
# pack is a new one.
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


def acquire_env(path: str, readahead: bool):
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


def release_env(key: tuple[int, int]) -> None:
    """Give back one use of the environment ``acquire_env`` returned with ``key``
    (closed with its last use; nothing for one inherited across fork)."""
    with _LOCK:
        entry = _ENVS.get(key)
        if entry is None or entry[0] != os.getpid():
            return
        entry[2] -= 1
        if entry[2] <= 0:
            entry[1].close()
            del _ENVS[key]

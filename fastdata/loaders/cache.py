"""A RAM cache of a dataset's stored payloads, shared by every DataLoader worker.

The payloads (encoded bytes or raw pixels) are copied once, up front, into one
POSIX shared-memory block (``/dev/shm``) together with their offsets. Workers
use that block: forked workers inherit the mapping, spawned workers attach to
it by name. So N workers hold one copy, not N (the pitfall of per-worker
caches). The block is freed when the Dataset that made it is garbage collected
or the process exits. No torch here.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence

import numpy as np

from fastdata.errors import FastDataError
from fastdata.progress import progress_bar


def available_memory() -> int | None:
    """Bytes of memory available for new allocations (Linux MemAvailable), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def shm_free() -> int | None:
    """Free bytes in /dev/shm, where the shared block lives, or None."""
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def check_fits(needed: int, *, path: str | None = None, margin: float = 1.1) -> None:
    """Refuse a cache that would not fit in memory (needed vs available)."""
    avail = available_memory()
    if avail is not None and needed * margin > avail:
        raise FastDataError(
            f"cache='ram' needs {_human(needed)} but only {_human(avail)} of memory is "
            f"available; use cache=None, or pack a smaller dataset (--resize)", path=path)
    shm = shm_free()
    if shm is not None and needed > shm:
        raise FastDataError(
            f"cache='ram' needs {_human(needed)} in /dev/shm but only {_human(shm)} is free "
            f"there; enlarge /dev/shm (docker: --shm-size) or use cache=None", path=path)


class SharedPayloadCache:
    """All payloads of a reader, in one shared-memory block.

    Args:
        reader: any fastdata Reader; every record is read (and checksummed) once.
        progress: show a progress bar while filling (None: only on a terminal).
    """

    def __init__(self, reader, *, progress: bool | None = None) -> None:
        from multiprocessing import shared_memory

        n = len(reader)
        payload = int(reader.manifest.bytes.get("payload", 0))
        self.nbytes = payload
        self.count = n
        self.path = reader.path
        check_fits(payload + 8 * (n + 1), path=reader.path)
        self._shm = shared_memory.SharedMemory(create=True, size=max(1, payload + 8 * (n + 1)))
        self._owner_pid = os.getpid()
        self._finalizer = weakref.finalize(self, _unlink, self._shm, self._owner_pid)
        self._views(self._shm)
        bar = progress_bar(n, "cache", enabled=progress)
        pos = 0
        try:
            for index, data, _label in reader:  # sequential: the fastest way through a file
                size = len(data)
                if pos + size > payload:
                    raise FastDataError("payloads are larger than the manifest says; re-pack",
                                        path=reader.path)
                self._data[pos: pos + size] = np.frombuffer(data, dtype=np.uint8)
                self._offsets[index] = pos
                pos += size
                bar.update(1)
        except BaseException:
            self._finalizer()
            raise
        finally:
            bar.close()
        self._offsets[n] = pos
        self.name = self._shm.name

    def _views(self, shm) -> None:
        n = self.count
        self._offsets = np.ndarray((n + 1,), dtype=np.int64, buffer=shm.buf, offset=0)
        self._data = np.ndarray((self.nbytes,), dtype=np.uint8, buffer=shm.buf,
                                offset=8 * (n + 1))

    def read_many(self, indices: Sequence[int]) -> list[bytes]:
        """Payloads of the given (already range-checked) records."""
        off = self._offsets
        data = self._data
        return [data[off[i]: off[i + 1]].tobytes() for i in indices]

    def __len__(self) -> int:
        return self.count

    # Spawned workers attach by name; the creator alone unlinks.
    def __getstate__(self):
        return {"name": self.name, "nbytes": self.nbytes, "count": self.count,
                "path": self.path}

    def __setstate__(self, state):
        from multiprocessing import shared_memory

        self.__dict__.update(state)
        # Spawned workers share the creator's resource tracker, so attaching
        # registers nothing new and the creator alone unlinks the block.
        self._shm = shared_memory.SharedMemory(name=state["name"])
        self._owner_pid = None
        self._finalizer = None
        self._views(self._shm)

    def close(self) -> None:
        """Free the block now (creator) or detach from it (workers)."""
        if self._finalizer is not None:
            self._finalizer()
        else:
            self._offsets = self._data = None
            self._shm.close()


def _unlink(shm, owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked child holds a copy: never free the parent's block
        return
    try:
        shm.close()
    except BufferError:  # numpy views still alive; the OS frees it at exit
        pass
    try:
        shm.unlink()
    except FileNotFoundError:
        pass

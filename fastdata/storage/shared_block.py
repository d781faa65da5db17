"""Named POSIX shared-memory blocks, made by one process and read by its
DataLoader workers (the RAM cache, the stall meter's table). No torch here."""

from __future__ import annotations

import os
import secrets
import weakref

#: Shared-memory blocks of fastdata are named
#: ``fastdata-<pid namespace>-<pid>-<start time>-<random>`` after the process that
#: made them, so that blocks left behind by a killed process (``kill -9`` of a
#: process group takes Python's resource tracker with it) are found and removed
#: when the next cache is made. Only blocks of this pid namespace are judged: a
#: /dev/shm shared between containers may hold live blocks of processes that
#: this one cannot see.
SHM_PREFIX = "fastdata-"
SHM_DIR = "/dev/shm"


def _start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _block_name() -> str | None:
    """A name for a new block: ours on Linux, the system's choice elsewhere
    (macOS limits names to 31 characters and has no /dev/shm to clean)."""
    if not os.path.isdir(SHM_DIR):
        return None
    pid = os.getpid()
    return (f"{SHM_PREFIX}{_pid_namespace()}-{pid}-{_start_time(pid) or 0}-"
            f"{secrets.token_hex(4)}")


def _alive(pid: int, start: int) -> bool:
    """Whether the process that made a block still runs (the same pid with
    another start time is a new process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    now = _start_time(pid)
    return not (start and now is not None and now != start)


def remove_stale_blocks(directory: str = SHM_DIR) -> list[str]:
    """Remove the shared-memory blocks of fastdata processes of this pid
    namespace that no longer run.

    Returns:
        The names removed.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    namespace = _pid_namespace()
    removed = []
    for name in names:
        if not name.startswith(SHM_PREFIX):
            continue
        try:
            ns, pid, start = (int(x) for x in name[len(SHM_PREFIX):].split("-")[:3])
        except ValueError:
            continue  # not a name we gave
        if ns != namespace or _alive(pid, start):
            continue
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:  # gone already, or not ours to remove
            continue
        removed.append(name)
    return removed


class SharedBlock:
    """One POSIX shared-memory block: created (and freed) by one process, attached
    by name in spawned workers, inherited by forked ones. Subclasses lay out
    numpy views over it in ``_views``."""

    def _create(self, nbytes: int) -> None:
        from multiprocessing import shared_memory

        remove_stale_blocks()
        self._shm = shared_memory.SharedMemory(name=_block_name(), create=True,
                                               size=max(1, nbytes))
        self._owner_pid = os.getpid()
        self._finalizer = weakref.finalize(self, _unlink, self._shm, self._owner_pid)
        self.name = self._shm.name
        self._views(self._shm)

    def _views(self, shm) -> None:
        raise NotImplementedError

    def _state(self) -> dict:
        raise NotImplementedError

    def __getstate__(self):
        return dict(self._state(), name=self.name)

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
            for name in ("_offsets", "_data", "pixels"):
                self.__dict__.pop(name, None)
            try:
                self._shm.close()
            except BufferError:  # a batch still views the block; the OS unmaps at exit
                pass


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

"""The account of a shard cache folder: the bytes it holds and the most it held.

One file per folder, :data:`ACCOUNT_NAME`, holds a fixed 24-byte record (a
tag, the bytes held, the peak; little-endian) and is also the lock every
change to the folder takes (``flock``, so every process and thread of a
machine is serialised by it). Under that lock the folder is surveyed rather
than trusted to running totals, so the account is exact whatever a killed
process left: the finished copies and partial downloads by their sizes, plus
what each download under way reserved beyond what it has written. A download
reserves by writing its size into its object's lock file, on which it holds
an exclusive lock while it runs; a reservation whose lock is free is void.

Between two changes only partial downloads grow, so the most the folder held
is seen by surveying at every change before applying it: the recorded peak is
the true one (counting a reservation whole from its start).
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

#: The account of a cache folder, and the lock of every change to what it holds.
ACCOUNT_NAME = ".account.lock"
#: The account's one record: a tag, the bytes held, the most bytes ever held.
_RECORD = struct.Struct("<8sqq")
_TAG = b"fdcache1"
#: What a download under way reserved, in its object's lock file while it runs.
RESERVED = struct.Struct("<q")
#: A partial download this old was left by a killed process: removed.
STALE_PARTIAL_S = 24 * 3600


@dataclass(frozen=True)
class CacheUsage:
    """What a cache folder holds, from its account (every process's alike).

    Attributes:
        held: bytes held after the last change: finished copies, partial
            downloads, and the whole size a download under way reserved.
        peak: the most bytes held at once since the account began (or was reset).
    """

    held: int
    peak: int


class Folder(NamedTuple):
    """A survey of the folder: its copies (mtime, size, path), least recently
    used first; the bytes it holds; what downloads under way reserved and
    have not written yet, by object path."""

    entries: list[tuple[float, int, str]]
    held: int
    unwritten: dict[str, int]


class Account:
    """The account record on ``fd`` (its lock held): ``held`` and ``peak``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        raw = os.pread(fd, _RECORD.size, 0)
        tag, held, peak = _RECORD.unpack(raw) if len(raw) == _RECORD.size else (b"", 0, 0)
        self.held, self.peak = (held, peak) if tag == _TAG else (0, 0)

    def saw(self, held: int) -> None:
        """Bytes held at this moment (what the folder grew to since the last change)."""
        self.peak = max(self.peak, held)

    def store(self, held: int) -> None:
        """Bytes held after this change; written with the peak."""
        self.held = held
        self.saw(held)
        os.pwrite(self.fd, _RECORD.pack(_TAG, held, self.peak), 0)


@contextmanager
def account(cache_dir: str):
    """The folder's :class:`Account`, its lock held until the block ends."""
    fd = os.open(os.path.join(cache_dir, ACCOUNT_NAME), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield Account(fd)
    finally:
        unlock(fd)


def survey(cache_dir: str) -> Folder:
    """What the folder holds; exact under the account's lock, since every
    change but a download's writes takes it. Removes stale partial downloads."""
    entries, partial, waiting, total = [], {}, [], 0
    now = time.time()
    with os.scandir(cache_dir) as found:
        for item in found:
            if item.name.startswith("."):       # the account
                continue
            if item.name.endswith(".lock"):
                waiting.append(item.path[:-len(".lock")])
                continue
            try:
                st = item.stat()
            except FileNotFoundError:
                continue
            if ".partial-" in item.name:
                if now - st.st_mtime > STALE_PARTIAL_S:
                    unlink(item.path)
                    continue
                target = item.path.rsplit(".partial-", 1)[0]
                partial[target] = partial.get(target, 0) + st.st_size
            else:
                entries.append((st.st_mtime, st.st_size, item.path))
            total += st.st_size
    there = {full for _, _, full in entries}
    unwritten = {}
    for target in waiting:
        if target not in there:
            extra = reservation(target + ".lock") - partial.get(target, 0)
            if extra > 0:
                unwritten[target] = extra
    return Folder(sorted(entries), total + sum(unwritten.values()), unwritten)


def reservation(lock_path: str) -> int:
    """What the download under way of the object of ``lock_path`` reserved: 0
    when none runs (a reservation left by a killed process is void, its
    exclusive lock gone with it)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        raw = os.pread(fd, RESERVED.size, 0)
        if len(raw) != RESERVED.size:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:                 # its downloader holds it: under way
            return RESERVED.unpack(raw)[0]
        return 0
    finally:
        unlock(fd)


def unlock(fd: int) -> None:
    """Release the flock on ``fd`` and close it. Unlocked first: a process
    forked meanwhile holds a copy of ``fd``, which would keep a lock taken only
    for this call (flock belongs to the open file, not the descriptor) for as
    long as that process lives."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def unlink(path: str) -> None:
    """Remove ``path`` if it is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

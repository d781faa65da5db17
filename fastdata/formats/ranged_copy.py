"""A remote object read by ranges through one sparse local copy per machine.

The copy (``<cache>/<hash>-<name>.ranges``, made by
:meth:`fastdata.storage.ShardCache.sparse`) is a file of the object's size
followed by one mark byte per :data:`BLOCK` bytes of it. A read looks at the
marks of the blocks it needs, fetches the missing ones (runs at most
:data:`GAP_BLOCKS` apart as one request, the requests at once), checks that
every answer holds all the bytes asked for, writes them, and only then sets
their marks: a process killed in between, or a short answer, leaves them
unmarked, fetched again later.
Every process of the machine (ranks, DataLoader workers) shares the copy, so a
block is fetched about once per machine: two processes asking at the same
moment may both fetch it and write the same bytes. No lock is taken per read.

The copy is named by the object's URL, its size and its identity where the
reader knows one (:meth:`RangedCopy.keyed`: the dataset index's is a digest
of its pieces' checksums, which the manifest's SHA-256 vouches for): the same
URL packed again is another copy, never old blocks read as new ones.

What grows with the object: the copy on disk (counted in the cache whole,
though only the blocks read take space) and one mark byte per 4 KiB in it.
Nothing grows in memory. Readers check what they read (the dataset index's
header and its pieces' CRC-32s); a block that fails is fetched again once
with ``fresh`` before the reader gives up, so a damaged copy mends itself.
"""

from __future__ import annotations

import os

from fastdata.errors import StorageError
from fastdata.storage.forked import process_threads
from fastdata.storage.objects import check_ranges, open_remote

#: Bytes per marked block (a page: an index piece spans at most two).
BLOCK = 4096
#: Missing runs this few blocks apart are fetched as one request.
GAP_BLOCKS = 8


class RangedCopy:
    """Ranges of the ``size``-byte object at ``url``, through the machine's
    sparse copy in ``cache`` (default: this process's shard cache);
    ``identity`` (a checksum, an ETag) tells this object from another one
    of the same size at the same URL."""

    def __init__(self, url: str, size: int, *, identity: str | None = None, cache=None,
                 storage_options=None) -> None:
        self.url, self.size = url, int(size)
        self.identity = identity
        self.blocks = -(-self.size // BLOCK)
        self._cache = cache
        self._options = storage_options
        self._path: str | None = None
        self._pid: int | None = None
        self._remote = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_path": None, "_pid": None, "_remote": None}

    def keyed(self, identity: str) -> RangedCopy:
        """The same object known by ``identity`` too: its own copy."""
        return RangedCopy(self.url, self.size, identity=identity, cache=self._cache,
                          storage_options=self._options)

    def read(self, ranges: list[tuple[int, int]], *, fresh: bool = False) -> list[bytes]:
        """The bytes of each (start, length) range, fetched into the copy
        first where missing (``fresh``: fetched again whatever is there)."""
        check_ranges(ranges, self.size, self.url)
        wanted = sorted({b for start, length in ranges if length
                         for b in range(start // BLOCK, (start + length - 1) // BLOCK + 1)})
        try:
            fd = os.open(self._local(), os.O_RDWR)
        except FileNotFoundError:  # evicted since this process took it: made again
            self._path = None
            fd = os.open(self._local(), os.O_RDWR)
        try:
            self._fill(fd, wanted, fresh)
            return [os.pread(fd, length, start) for start, length in ranges]
        finally:
            os.close(fd)

    def _local(self) -> str:
        if self._path is None or self._pid != os.getpid():
            from fastdata.formats.remote_files import process_cache

            if self._pid != os.getpid():  # a client never crosses fork
                self._remote = None
            cache = self._cache or process_cache()
            self._path = cache.sparse(self.url, self.size, self.blocks, self._options,
                                      identity=self.identity)
            self._pid = os.getpid()
        return self._path

    def _fill(self, fd: int, wanted: list[int], fresh: bool) -> None:
        """Fetch the blocks of ``wanted`` not marked (all of them when
        ``fresh``), write them, then mark them."""
        if not wanted:
            return
        if fresh:
            missing = wanted
        else:
            lo, hi = wanted[0], wanted[-1] + 1
            # A copy cut short (a full disk) lacks marks: those blocks are missing.
            marks = os.pread(fd, hi - lo, self.size + lo).ljust(hi - lo, b"\0")
            missing = [b for b in wanted if marks[b - lo] == 0]
        if not missing:
            return
        runs: list[list[int]] = []  # [first block, end block]
        for b in missing:  # near runs as one, the blocks between fetched too
            if runs and b - runs[-1][1] <= GAP_BLOCKS:
                runs[-1][1] = b + 1
            else:
                runs.append([b, b + 1])
        spans = [(a * BLOCK, min(self.size, z * BLOCK) - a * BLOCK) for a, z in runs]
        if self._remote is None:  # this process's (_local resets it after a fork)
            self._remote = open_remote(self.url, self._options, size=self.size)
        # One request per span, at once: a store's own merging of ranges up to
        # 1 MiB apart would fetch megabytes of index for a shuffled batch.
        fetch = lambda span: self._remote.read_range(*span)  # noqa: E731
        bodies = list(_threads().map(fetch, spans)) if len(spans) > 1 else [fetch(spans[0])]
        for (start, length), body in zip(spans, bodies):  # all checked before any is kept
            if len(body) != length:
                raise StorageError(f"the server sent {len(body)} bytes for range "
                                   f"{start}+{length}; the object is shorter than its "
                                   f"{self.size} bytes", path=self.url, offset=start)
        for (start, _), body in zip(spans, bodies):
            _write_all(fd, body, start)
        for a, z in runs:  # after the bytes: a mark is never ahead of its block
            _write_all(fd, b"\x01" * (z - a), self.size + a)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``pwrite`` may write less)."""
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        if done <= 0:
            raise OSError(f"nothing written to the ranged copy at byte {offset}")
        view, offset = view[done:], offset + done


def _threads():
    """This process's request threads for ranged copies (their own: a read
    may come from another pool's thread, which must not wait on itself)."""
    return process_threads("fastdata-ranged-copy", 8)

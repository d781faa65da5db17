"""A local cache of downloaded objects, shared by every process of a machine.

Each object lives in ``<cache_dir>/<hash>-<basename>`` beside a lock file
``<same>.lock``:

* a process downloading an object holds an exclusive flock on its lock file,
  so two processes never download the same object at once (the second waits
  on a shared lock, then finds the file there; the exclusive lock is only ever
  tried, never waited for, since readers of a copy hold shared locks on it);
* a process using an object holds a shared flock on it (the most recent
  ``keep_locked`` objects per ShardCache; older ones are released), and
  eviction only removes objects whose exclusive lock it can take at once, so
  an object in use is never evicted;
* a download of known size (``local(size=...)``, what a manifest gives a
  shard) reserves it before its first byte, evicting least recently used
  objects (a file's mtime is touched on every ``local()``) until the cache
  holds at most its limit with it; every download evicts again when it lands
  (the size of one not given is known only then). Objects in use are never evicted,
  so only what is in use at once can take the cache past its limit: one object
  larger than the limit stays while in use;
* the bytes held (finished copies, partial downloads, and the reservations of
  downloads under way) and the most ever held are kept in ``.account.lock``
  (see :class:`CacheUsage`), whose lock serialises the events that change them.

A copy is named by the object's URL and endpoint, and by its identity where
the caller knows one (``identity``: a checksum or ETag, as a manifest gives
it; a sparse copy's size always): an object packed again at the same URL is
then another copy, never old bytes taken for new. Without one an object is
taken as immutable (shards are written once): a changed remote object keeps
its cached copy until evicted or the cache folder is removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import time
from collections import OrderedDict
from collections.abc import Collection

from fastdata.errors import FastDataError
from fastdata.storage.cache_account import (
    RESERVED,
    CacheUsage,
    Folder,
    account,
    survey,
    unlink,
    unlock,
)
from fastdata.storage.endpoints import endpoint_of
from fastdata.storage.objects import open_remote
from fastdata.storage.partial import partial_file
from fastdata.storage.urls import basename, local_path, parse_url

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str | int, what: str = "FASTDATA_CACHE_LIMIT") -> int:
    """Bytes in "50GB", "1GiB", "2.5 TB" or "1000000"."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise FastDataError(f"{what}={text!r} is not a size; write e.g. 50GB, 1GiB or 1000000")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def default_cache_dir() -> str:
    base = os.environ.get("FASTDATA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "fastdata")
    return os.path.join(base, "objects")


def _lock(path: str, mode: int, blocking: bool = True) -> int | None:
    """An fd on ``path`` holding a flock of ``mode``; None when not blocking and
    taken. Re-tries when the file was replaced (evicted) while we waited."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, mode | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


#: This process's copies found in a cache, and copies downloaded (the stall meter's).
_COUNTS = [0, 0]


def cache_counts() -> tuple[int, int]:
    """(copies found in the cache, copies downloaded) by this process so far."""
    return _COUNTS[0], _COUNTS[1]


class ShardCache:
    """Downloaded copies of remote objects under ``cache_dir`` (default
    ``$FASTDATA_CACHE_DIR/objects`` or ``~/.cache/fastdata/objects``), kept under
    ``limit`` bytes (default ``$FASTDATA_CACHE_LIMIT``, else no limit).

    Every process using the folder keeps one account of what it holds
    (:meth:`usage`). Cost: each download (twice: when it starts and when it
    lands) and each discard lists the folder once under the account's lock,
    evictions included: a ``stat`` per copy and a look into the lock file of
    each object not yet there (measured here: 4.5 ms for a folder of a
    thousand copies, a few hundredths of that for the few dozen a stream
    keeps), in the download threads. A use of a copy already there costs
    nothing more, and no record read ever touches the account.
    """

    def __init__(self, cache_dir: str | None = None, limit: int | str | None = None,
                 keep_locked: int = 64) -> None:
        self.cache_dir = os.fspath(cache_dir) if cache_dir else default_cache_dir()
        what = "limit"
        if limit is None and os.environ.get("FASTDATA_CACHE_LIMIT"):
            limit, what = os.environ["FASTDATA_CACHE_LIMIT"], "FASTDATA_CACHE_LIMIT"
        self.limit = parse_size(limit, what) if limit is not None else None
        self.keep_locked = keep_locked
        self._held: OrderedDict[str, int] = OrderedDict()   # path -> fd with a shared lock
        self._pid = os.getpid()
        os.makedirs(self.cache_dir, exist_ok=True)

    def path_for(self, url: str, storage_options: dict | None = None, *,
                 identity: str | None = None) -> str:
        """Where ``url`` is cached: a hash of the URL and its endpoint (the same
        bucket name on two servers is two objects) and of the object's
        ``identity`` when given (new bytes at the URL: another copy), then
        its name for readability."""
        key = f"{url}\n{endpoint_of(parse_url(url), storage_options)}"
        if identity is not None:
            key += f"\n{identity}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        name = re.sub(r"[^A-Za-z0-9._-]", "_", basename(url))[-80:]
        return os.path.join(self.cache_dir, f"{digest}-{name}")

    def local(self, url: str, storage_options: dict | None = None, *,
              limit: int | None = None, size: int | None = None,
              identity: str | None = None) -> str:
        """The local path of ``url``'s object, downloaded on first use.

        Args:
            url: the object.
            storage_options: the store's settings, as for ``open_remote``.
            limit: copy at most this many bytes (a bound such as a manifest
                gives: a server that sends more is cut off there).
            size: the object's size when known exactly (a shard's, from its
                manifest): reserved in the cache before the download starts,
                room made for it first, and the most bytes copied.
            identity: what tells this object from another one at the same URL
                (the SHA-256 its manifest records): part of the copy's name.
        """
        own = local_path(url)
        if own is not None:
            return own
        path = self.path_for(url, storage_options, identity=identity)
        _COUNTS[0 if os.path.exists(path) else 1] += 1
        return self._obtain(path, lambda fd: self._download(url, storage_options, path, fd,
                                                            limit=limit, size=size))

    def sparse(self, url: str, size: int, tail: int, storage_options: dict | None = None,
               *, identity: str | None = None) -> str:
        """The local path of a sparse file for ``url``'s object of ``size``
        bytes, followed by ``tail`` bytes of zeros (a reader's own record of
        which parts it filled: see :class:`fastdata.formats.ranged_copy.RangedCopy`).
        Made empty on first use (no byte downloaded), counted and evicted like a
        copy of its whole size, and held like one. Named by the size and the
        ``identity`` too: an object of another size or identity at the same
        URL (packed again) has a copy of its own."""
        version = f"{size} bytes" if identity is None else f"{size} bytes, {identity}"
        path = self.path_for(url, storage_options, identity=version) + ".ranges"
        return self._obtain(path, lambda fd: self._make_sparse(path, fd, size + tail))

    def _obtain(self, path: str, make) -> str:
        """``path`` once there, made by ``make(fd)`` under its exclusive lock
        when it is not; then held with a shared lock."""
        while True:
            fd = _lock(path + ".lock", fcntl.LOCK_SH)
            if os.path.exists(path):
                break
            unlock(fd)
            # Not blocking: a process that downloaded the object holds a shared
            # lock on it from then on, and a writer waiting behind it would wait
            # for ever. Busy: someone is downloading (the shared lock above then
            # waits for the end) or looked at the same moment; go round again.
            fd = _lock(path + ".lock", fcntl.LOCK_EX, blocking=False)
            if fd is None:
                time.sleep(0.01)
                continue
            try:
                if not os.path.exists(path):    # nobody downloaded it while we waited
                    make(fd)
            finally:
                unlock(fd)                      # then take the shared lock like a reader
        os.utime(path)
        self._hold(path, fd)
        return path

    def _download(self, url: str, storage_options: dict | None, path: str, fd: int, *,
                  limit: int | None, size: int | None) -> None:
        """Download under the object's exclusive lock ``fd``, accounted: the size
        reserved (and room made) first, the copy's own size once it lands."""
        if size is not None:
            limit = size if limit is None else min(limit, size)
        with account(self.cache_dir) as ledger:
            os.ftruncate(fd, 0)                     # what a killed downloader left
            folder = survey(self.cache_dir)
            ledger.saw(folder.held)
            os.pwrite(fd, RESERVED.pack(size or 0), 0)
            ledger.store(self._evict(folder, folder.held + (size or 0), keep=path))
        try:
            open_remote(url, storage_options).download(
                path, limit=limit, size=None if size is None else limit)
        except BaseException:
            with account(self.cache_dir) as ledger:
                folder = survey(self.cache_dir)
                ledger.saw(folder.held)            # the reservation, still counted
                os.ftruncate(fd, 0)
                ledger.store(folder.held - folder.unwritten.get(path, 0))
            raise
        with account(self.cache_dir) as ledger:
            folder = survey(self.cache_dir)
            ledger.saw(folder.held)
            os.ftruncate(fd, 0)                     # the copy itself counts from now on
            ledger.store(self._evict(folder, folder.held, keep=path))

    def _make_sparse(self, path: str, fd: int, size: int) -> None:
        """Make the sparse file ``path`` of ``size`` bytes under its exclusive
        lock ``fd``, room made for it first (it counts whole)."""
        with account(self.cache_dir) as ledger:
            folder = survey(self.cache_dir)
            ledger.saw(folder.held)
            held = self._evict(folder, folder.held + size, keep=path)
            out, tmp = partial_file(path, 0o600)
            try:
                try:
                    os.ftruncate(out, size)
                finally:
                    os.close(out)
                os.replace(tmp, path)
            except BaseException:
                unlink(tmp)
                raise
            ledger.store(held)

    def _hold(self, path: str, fd: int) -> None:
        if os.getpid() != self._pid:            # inherited across fork: not ours to release
            self._held, self._pid = OrderedDict(), os.getpid()
        old = self._held.pop(path, None)
        if old is not None:
            os.close(old)
        self._held[path] = fd
        while len(self._held) > self.keep_locked:
            os.close(self._held.popitem(last=False)[1])

    def discard(self, path: str) -> None:
        """Drop this cache's lock on ``path`` and remove the copy unless another
        process (or cache) holds it: its reader has done with it."""
        fd = self._held.pop(path, None)
        if fd is not None:
            os.close(fd)
        # The account's lock first: a lock tried under it (pinned) then never
        # makes this copy look read elsewhere.
        with account(self.cache_dir) as ledger:
            fd = _lock(path + ".lock", fcntl.LOCK_EX, blocking=False)
            if fd is None:                      # still read elsewhere: theirs to drop
                return
            try:
                folder = survey(self.cache_dir)
                ledger.saw(folder.held)
                held = folder.held - sum(n for _, n, full in folder.entries if full == path)
                unlink(path)
                unlink(path + ".lock")
                ledger.store(held)
            finally:
                unlock(fd)

    def release(self) -> None:
        """Drop the shared locks this cache holds (the files may then be evicted)."""
        while self._held:
            os.close(self._held.popitem()[1])

    def usage(self) -> CacheUsage:
        """The folder's account as the last change left it (every process's
        downloads, evictions and discards alike); read without listing."""
        with account(self.cache_dir) as ledger:
            return CacheUsage(ledger.held, ledger.peak)

    def reset_peak(self) -> None:
        """Start the peak again from what is held now (e.g. before a measured run)."""
        with account(self.cache_dir) as ledger:
            ledger.peak = 0
            ledger.store(survey(self.cache_dir).held)

    def pinned(self, skip: Collection[str] = ()) -> int:
        """Bytes no eviction may remove now: the copies some process uses and
        what downloads under way reserved, leaving out the objects at the
        paths in ``skip`` (a reader's own shards, which its budget counts).
        Costs a listing and a lock tried per copy: once per pass, not per read."""
        skip = set(skip)
        with account(self.cache_dir):
            folder = survey(self.cache_dir)
            total = sum(n for target, n in folder.unwritten.items() if target not in skip)
            for _, size, full in folder.entries:
                if full in skip:
                    continue
                fd = _lock(full + ".lock", fcntl.LOCK_EX, blocking=False)
                if fd is None:
                    total += size
                else:
                    unlock(fd)
        return total

    def _evict(self, folder: Folder, held: int, keep: str) -> int:
        """Remove copies nobody uses, least recently used first, until ``held``
        bytes fit the limit (the account's lock held); what is held then."""
        if self.limit is None:
            return held
        for _, size, full in folder.entries:
            if held <= self.limit:
                break
            if full == keep:
                continue
            fd = _lock(full + ".lock", fcntl.LOCK_EX, blocking=False)
            if fd is None:                      # in use by some process: keep it
                continue
            try:
                unlink(full)
                unlink(full + ".lock")
                held -= size
            finally:
                unlock(fd)
        return held

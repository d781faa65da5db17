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
* eviction runs after each download: least recently used first (a file's mtime
  is touched on every ``local()``), until the cache is under its limit. One
  object larger than the limit stays while in use.

Objects are taken as immutable (shards are written once): a changed remote
object keeps its cached copy until evicted or the cache folder is removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import time
from collections import OrderedDict

from fastdata.errors import FastDataError
from fastdata.storage.endpoints import endpoint_of
from fastdata.storage.objects import open_remote
from fastdata.storage.urls import basename, local_path, parse_url

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_STALE_PARTIAL_S = 24 * 3600


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


class ShardCache:
    """Downloaded copies of remote objects under ``cache_dir`` (default
    ``$FASTDATA_CACHE_DIR/objects`` or ``~/.cache/fastdata/objects``), kept under
    ``limit`` bytes (default ``$FASTDATA_CACHE_LIMIT``, else no limit)."""

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

    def path_for(self, url: str, storage_options: dict | None = None) -> str:
        """Where ``url`` is cached: a hash of the URL and its endpoint (the same
        bucket name on two servers is two objects), then its name for readability."""
        identity = f"{url}\n{endpoint_of(parse_url(url), storage_options)}"
        digest = hashlib.sha256(identity.encode()).hexdigest()[:20]
        name = re.sub(r"[^A-Za-z0-9._-]", "_", basename(url))[-80:]
        return os.path.join(self.cache_dir, f"{digest}-{name}")

    def local(self, url: str, storage_options: dict | None = None, *,
              limit: int | None = None) -> str:
        """The local path of ``url``'s object, downloaded on first use; at most
        ``limit`` bytes of it (the size a manifest gives: a server that sends
        more is cut off there)."""
        own = local_path(url)
        if own is not None:
            return own
        path = self.path_for(url, storage_options)
        while True:
            fd = _lock(path + ".lock", fcntl.LOCK_SH)
            if os.path.exists(path):
                break
            os.close(fd)
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
                    open_remote(url, storage_options).download(path, limit=limit)
                    self._evict(keep=path)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)                       # then take the shared lock like a reader
        os.utime(path)
        self._hold(path, fd)
        return path

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
        fd = _lock(path + ".lock", fcntl.LOCK_EX, blocking=False)
        if fd is None:                          # still read elsewhere: theirs to drop
            return
        try:
            _unlink(path)
            _unlink(path + ".lock")
        finally:
            os.close(fd)

    def release(self) -> None:
        """Drop the shared locks this cache holds (the files may then be evicted)."""
        while self._held:
            os.close(self._held.popitem()[1])

    def _entries(self) -> list[tuple[float, int, str]]:
        entries = []
        now = time.time()
        for name in os.listdir(self.cache_dir):
            full = os.path.join(self.cache_dir, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:
                continue
            if ".partial-" in name:
                if now - st.st_mtime > _STALE_PARTIAL_S:    # left by a killed process
                    _unlink(full)
            elif not name.endswith(".lock"):
                entries.append((st.st_mtime, st.st_size, full))
        return sorted(entries)

    def _evict(self, keep: str) -> None:
        if self.limit is None:
            return
        entries = self._entries()
        total = sum(size for _, size, _ in entries)
        for _, size, full in entries:
            if total <= self.limit:
                break
            if full == keep:
                continue
            fd = _lock(full + ".lock", fcntl.LOCK_EX, blocking=False)
            if fd is None:                      # in use by some process: keep it
                continue
            try:
                _unlink(full)
                _unlink(full + ".lock")
                total -= size
            finally:
                os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

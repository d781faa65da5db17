"""Files of a packed dataset that may live at a URL: what the readers need of them.

Readers name their files by path or URL alike. Small metadata files (the
manifest, the sharded index and keys) are read whole; files a C library must
open itself (LMDB's ``data.mdb``, an HDF5 file) and shards that are checked or
scanned whole are downloaded once into the shared cache
(:class:`fastdata.storage.ShardCache`); records of remote shards are read with
ranged requests. Plain paths and ``file://`` URLs stay local files, untouched.
"""

from __future__ import annotations

import os


def is_remote(path) -> bool:
    from fastdata.storage import is_url

    return isinstance(path, str) and is_url(path)


def as_local(path):
    """``file://`` URLs as plain paths; anything else unchanged."""
    if isinstance(path, str) and path.startswith("file://"):
        from fastdata.storage import local_path

        return local_path(path)
    return path


def exists(path) -> bool:
    if is_remote(path):
        from fastdata.storage import exists as remote_exists

        return remote_exists(path)
    return os.path.exists(path)


#: The most a manifest may take (a million shards take ~150 MB): a server that
#: answers with more is refused rather than buffered.
MANIFEST_LIMIT = 256 << 20


def read_bytes(path, *, limit: int | None = None) -> bytes:
    """A whole file's bytes (raises OSError locally, StorageError remotely);
    more than ``limit`` bytes is refused without reading past the limit."""
    if is_remote(path):
        from fastdata.storage import open_remote

        return open_remote(path).read(limit=limit)
    with open(path, "rb") as f:
        # Its size first: a read of ``limit + 1`` bytes would reserve them all.
        if limit is None or os.fstat(f.fileno()).st_size <= limit:
            data = f.read()
        else:
            data = f.read(limit + 1)
    if limit is not None and len(data) > limit:
        from fastdata.errors import CorruptDataError

        raise CorruptDataError(f"file is larger than the {limit:,} bytes it may take here; "
                               f"the dataset is damaged or not what it claims", path=path)
    return data


#: Manifests fetched from URLs a moment ago by a format's detection, for the
#: reader that opens the dataset next: the manifest is fetched once per open.
_RECENT: dict[str, tuple[float, bytes]] = {}
_RECENT_SECONDS = 5.0


def manifest_bytes(path, *, for_reader: bool = False) -> bytes:
    """A manifest's bytes (at most :data:`MANIFEST_LIMIT`). At a URL, the bytes
    a detection fetched are handed to the reader that asks next
    (``for_reader``, within a few seconds) instead of being fetched again;
    every other call fetches them."""
    if not is_remote(path):
        return read_bytes(path, limit=MANIFEST_LIMIT)
    import time

    now = time.monotonic()
    entry = _RECENT.pop(path, None)
    if for_reader and entry is not None and now - entry[0] <= _RECENT_SECONDS:
        return entry[1]
    data = read_bytes(path, limit=MANIFEST_LIMIT)
    if not for_reader:
        _RECENT[path] = (now, data)
        for url in [u for u, (at, _) in _RECENT.items() if now - at > _RECENT_SECONDS]:
            del _RECENT[url]
    return data


def peek_manifest(path) -> bytes:
    """A manifest's bytes without taking them from the reader that asks next:
    at a URL, those a detection fetched a moment ago (else fetched, and kept
    for that reader)."""
    if is_remote(path):
        import time

        entry = _RECENT.get(path)
        if entry is not None and time.monotonic() - entry[0] <= _RECENT_SECONDS:
            return entry[1]
    return manifest_bytes(path)


def head_bytes(path, size: int = 64) -> bytes | None:
    """The first ``size`` bytes of the file at ``path`` (a manifest at a URL:
    :func:`peek_manifest`'s); None when it cannot be read."""
    from fastdata.errors import FastDataError

    text = as_local(path)
    try:
        if is_remote(text):
            return peek_manifest(text)[:size]
        with open(text, "rb") as f:
            return f.read(size)
    except (OSError, FastDataError):
        return None


def fetched_manifest(path) -> bool:
    """Whether the manifest at ``path`` (a URL) was fetched a moment ago, so it
    need not be asked about again."""
    import time

    entry = _RECENT.get(path)
    return entry is not None and time.monotonic() - entry[0] <= _RECENT_SECONDS


def local_copy(path, *, limit: int | None = None) -> str:
    """A local file with the contents of ``path``: itself, or a cached download
    of at most ``limit`` bytes (what the manifest says the file holds: a server
    that sends more is cut off there)."""
    if not is_remote(path):
        return path
    return process_cache().local(path, limit=limit)


def index_limit(count: int) -> int:
    """The most an index file (``.npy`` rows) of ``count`` records may take."""
    return count * 64 + (1 << 20)


def keys_limit(count: int) -> int:
    """The most a keys file (a JSON list) of ``count`` records may take: a
    thousand bytes a key, far past any real path, and 16 MiB."""
    return count * 1024 + (16 << 20)


#: One ShardCache per process and cache settings: it holds a shared lock on
#: the copies it returned (so they are not evicted while read), and a cache
#: made per call would leave those lock descriptors open.
_caches: dict[tuple, object] = {}


def process_cache():
    """This process's :class:`fastdata.storage.ShardCache` for the current cache
    settings (downloads of LMDB/HDF5 files, DALI's shard copies)."""
    from fastdata.storage import ShardCache

    key = (os.getpid(), os.environ.get("FASTDATA_CACHE_DIR"),
           os.environ.get("FASTDATA_CACHE_LIMIT"), os.environ.get("XDG_CACHE_HOME"))
    cache = _caches.get(key)
    if cache is None:
        cache = _caches[key] = ShardCache()
    return cache


def parallel_map(fn, items: list) -> list:
    """``fn`` of each item, on this process's request threads (in the calling
    thread for one item); the first error is raised after all have ended.
    As many threads as a server's gate may let through
    (fastdata.storage.adaptive), which decides."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    from fastdata.storage import adaptive
    from fastdata.storage.forked import map_all

    return map_all("fastdata-ranges", adaptive.HIGH, fn, items)


class RangedReads:
    """Ranged reads of remote shards, one client object per shard and process."""

    def __init__(self) -> None:
        self._objects: dict[str, object] = {}
        self._pid = os.getpid()

    def read(self, url: str, ranges: list[tuple[int, int]], *, size: int | None = None,
             coalesce: int | None = None) -> list[bytes]:
        """The bytes of each (start, length) range of ``url``; ``size``: the
        object's size as the manifest gives it (no request asks for it);
        ``coalesce``: see ``RemoteObject.read_ranges``."""
        if self._pid != os.getpid():  # a client never crosses fork
            self._objects, self._pid = {}, os.getpid()
        obj = self._objects.get(url)
        if obj is None:
            from fastdata.storage import open_remote

            obj = self._objects[url] = open_remote(url, size=size or None)
        return obj.read_ranges(ranges, coalesce=coalesce)

    def __getstate__(self):
        return {"_objects": {}, "_pid": None}


def absolute(path) -> str:
    """An absolute local path, or the URL as given."""
    text = as_local(os.fspath(path))
    return text if is_remote(text) else os.path.abspath(text)

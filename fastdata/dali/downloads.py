"""Local files of a dataset's shards for DALI's own readers, which open local files only.

A dataset at a URL (s3://, gs://, az://, http(s)://) is downloaded whole
before its pipeline starts: every shard, and every shard's side file asked for
(TFRecord's ``<shard>.idx``), into fastdata's shared per-machine cache
(:class:`fastdata.storage.ShardCache`, ``$FASTDATA_CACHE_DIR/objects`` or
``~/.cache/fastdata/objects``), once per machine. This process holds a shared
lock on every copy, so no other process evicts one while DALI reads it.
A dataset larger than the cache limit (``FASTDATA_CACHE_LIMIT``) is not
downloaded: :func:`cache_shortfall` says why, and the planner reads it through
the external source instead (ranged reads of the records).

Shards of another tool at a URL (no fastdata manifest) are downloaded already
when fastdata's reader opens them (it scans them whole); they are used as they are.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastdata.formats.remote_files import is_remote
from fastdata.redaction import redact

log = logging.getLogger(__name__)

# Parallel downloads: enough to overlap request latency, few enough to be polite.
_DOWNLOAD_THREADS = 8


@dataclass(frozen=True)
class ShardFiles:
    """The local files DALI's reader opens for a dataset.

    Attributes:
        paths: every shard, in shard order.
        side: each shard's side file (when asked for), None where it has none.
        cached: the files are copies in the cache, whose mtime the cache touches
            on every use (an index generated for one is keyed by ``identities``).
        identities: what tells a cached copy's contents apart, per shard (the
            copy's inode, and the shard's SHA-256 from the manifest); None for
            files the user owns.
    """

    paths: list[str]
    side: list[str | None]
    cached: bool
    identities: list[str] | None


def remote_shards(reader: Any) -> bool:
    """Whether DALI's readers need ``reader``'s shards downloaded first."""
    paths = reader.shard_paths
    return bool(paths) and is_remote(paths[0])


def cache_shortfall(reader: Any) -> str | None:
    """Why the cache cannot hold ``reader``'s remote shards (a message naming the
    sizes and the limit), or None when they fit or need no download."""
    if not remote_shards(reader):
        return None
    limit = shard_cache().limit
    need = dataset_bytes(reader)
    if limit is None or need <= limit:
        return None
    setting = os.environ.get("FASTDATA_CACHE_LIMIT", str(limit))
    return (f"the dataset's shards ({need:,} bytes) are more than the cache may hold "
            f"(FASTDATA_CACHE_LIMIT={setting}); raise FASTDATA_CACHE_LIMIT, or use "
            f"reader='external' (fastdata reads the records by ranged requests)")


def dataset_bytes(reader: Any) -> int:
    """The shards' bytes, as the manifest lists them."""
    return sum(int(s.get("bytes", 0)) for s in reader.manifest.shards)


def shard_files(reader: Any, side_suffix: str | None = None) -> ShardFiles:
    """Local files of ``reader``'s shards (and of each ``<shard><side_suffix>``
    that exists): the shards themselves, or, for a remote dataset, copies in
    the shared cache, downloaded now where missing (the whole dataset).

    The reader reads its records from those copies too (``attach_local``).

    Raises:
        StorageError: a download failed.
    """
    if not remote_shards(reader):
        paths = list(reader.shard_paths)
        side = [_beside(reader, n, side_suffix) for n in range(len(paths))]
        # Shards of another tool at a URL: the reader's own cached downloads.
        cached = reader.url is not None
        return ShardFiles(paths, side, cached, _identities(reader, paths) if cached else None)
    urls = list(reader.shard_paths)
    cache = shard_cache()
    # Every copy stays locked while the pipeline may read it.
    cache.keep_locked = max(cache.keep_locked, 2 * len(urls) + 16)
    log.info("DALI's reader reads local files only: the %d shards of %s (%s bytes) are "
             "downloaded into the cache at %s, where not there already", len(urls),
             redact(reader.url or urls[0]), f"{dataset_bytes(reader):,}", cache.cache_dir)
    with ThreadPoolExecutor(min(_DOWNLOAD_THREADS, len(urls))) as pool:
        paths = list(pool.map(lambda shard: reader.shard_copy(shard, cache), range(len(urls))))
        side = list(pool.map(lambda url: _side_copy(cache, url, side_suffix), urls))
    for shard, path in enumerate(paths):
        reader.attach_local(shard, path)
    return ShardFiles(paths, side, True, _identities(reader, paths))


def _beside(reader: Any, shard: int, suffix: str | None) -> str | None:
    if suffix is None or not os.path.isfile(reader.shard_paths[shard] + suffix):
        return None
    return reader.side_path(shard, suffix)  # a link out of the folder is refused


def _side_copy(cache: Any, url: str, suffix: str | None) -> str | None:
    from fastdata.storage import exists

    if suffix is None or not exists(url + suffix):
        return None
    return cache.local(url + suffix)


def _identities(reader: Any, paths: list[str]) -> list[str]:
    # A copy is only ever replaced by a rename (a new inode); the manifest's
    # SHA-256 tells a rewritten shard apart even where an inode is reused.
    shards = reader.manifest.shards
    return [f"{os.stat(p).st_ino}:{(shards[i] if i < len(shards) else {}).get('sha256', '')}"
            for i, p in enumerate(paths)]


def shard_cache() -> Any:
    """This process's shard cache (shared with fastdata's own remote reads)."""
    from fastdata.formats.remote_files import process_cache

    return process_cache()

"""Record indices of a streaming worker's positions, in chunks, and their
payloads fetched ahead of use (for ``ShardedIterableDataset``).

For a dataset at a URL the whole of the worker's order is known before its
first chunk, so the reads follow a plan (:mod:`fastdata.formats.sharded.fetch_plan`):
shards the order uses heavily over a short stretch are downloaded whole, in
order of first use, several at once, into a bounded cache, and dropped after
their last use; the records of every other shard are read by ranged requests,
a chunk's shards at once.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Literal, get_args

import numpy as np

from fastdata.errors import CorruptDataError, FastDataError
from fastdata.formats.sharded.fetch_plan import WHOLE_SHARE, FetchPlan, plan_fetches
from fastdata.order.slices import Slice
from fastdata.redaction import redact

#: Positions of a worker's sequence read (and decoded) at a time.
READ_CHUNK = 64
#: How often a shard download is tried before the stream stops with an error.
DOWNLOAD_TRIES = 3
#: How each remote stream reads: "auto" plans whole shards and ranges from
#: the order; "ranges" reads every record by range; "shards" downloads every
#: shard whole that fits the budget.
RemoteRead = Literal["auto", "ranges", "shards"]
REMOTE_READS = get_args(RemoteRead)


class Chunks:
    """The record indices of a worker's remaining positions, ``READ_CHUNK`` at
    a time, made when asked for (not a whole epoch's lists up front)."""

    #: Chunks whose records are computed together (the order costs per call).
    GROUP = 16

    def __init__(self, plan: Slice, order, positions) -> None:
        self.plan, self.order, self.positions = plan, order, positions
        self._groups: dict[int, list[list[int]]] = {}

    def __len__(self) -> int:
        return -(-len(self.positions) // READ_CHUNK)

    def __getitem__(self, k: int) -> list[int]:
        if not 0 <= k < len(self):
            raise IndexError(k)
        g = k // self.GROUP
        groups = self._groups  # read ahead in a thread and used here: two groups kept
        chunks = groups.get(g)
        if chunks is None:
            span = READ_CHUNK * self.GROUP
            part = np.asarray(self.positions[g * span:(g + 1) * span])
            records = self.plan.record_indices(self.order, part).tolist()
            chunks = [records[i:i + READ_CHUNK] for i in range(0, len(records), READ_CHUNK)]
            self._groups = {**{k2: v for k2, v in groups.items() if k2 >= g - 1}, g: chunks}
        return chunks[k % self.GROUP]

    def all_records(self):
        """Every remaining record index, in order of use, and the chunk of each."""
        return (self.plan.record_indices(self.order, np.asarray(self.positions)),
                np.arange(len(self.positions), dtype=np.int64) // READ_CHUNK)


def cache_budget(cache_dir: str, workers: int = 1, *, own: Iterable[str] = ()) -> int:
    """Bytes of whole shards one worker may hold, shared among the rank's
    ``workers`` (the cache is one folder for them all).

    With ``FASTDATA_CACHE_LIMIT``: the limit less what the cache must keep
    meanwhile (copies in use, such as the dataset's index, and other
    downloads under way: :meth:`fastdata.storage.ShardCache.pinned`, which
    leaves out the reader's own shards at the URLs ``own``, counted by the
    budget itself), so the folder as a whole stays within the limit. Else a
    quarter of the cache folder's free space, at most 8 GiB.
    """
    from fastdata.storage.cache import ShardCache, parse_size

    limit = os.environ.get("FASTDATA_CACHE_LIMIT")
    if limit:
        cache = ShardCache(cache_dir)
        total = parse_size(limit) - cache.pinned({cache.path_for(url) for url in own})
    else:
        os.makedirs(cache_dir, exist_ok=True)
        total = min(8 << 30, shutil.disk_usage(cache_dir).free // 4)
    return max(0, total // max(1, workers))


class ReadAhead:
    """Chunks of records fetched ``depth`` chunks ahead of use in one thread, so
    that a remote dataset's requests overlap decoding; ``depth`` 0 reads nothing
    ahead (local files are read as they are used).

    ``remote_read`` picks the plan (see ``REMOTE_READS``); ``budget``: bytes
    of whole shards held at once (default :func:`cache_budget`), downloads in
    flight included. The first ``depth`` chunks never wait for a download:
    what they need of a shard still on its way is read by range, so the first
    batch comes as soon as ranged reads allow.
    """

    def __init__(self, reader, chunks: Chunks, depth: int, remote_read: str = "auto", *,
                 workers: int = 1, budget: int | None = None) -> None:
        self.reader = reader
        self.chunks = chunks
        self.depth = depth
        self.pending: dict[int, Any] = {}
        self.pool = self.downloads = self.cache = None
        self.fetches = FetchPlan(budget=0)
        self.shards: dict[int, Any] = {}   # whole shard -> future of its local copy
        self.copies: dict[int, str] = {}   # whole shard -> its local copy, attached
        self.queue: deque[int] = deque()   # whole shards not yet asked for
        self.held = 0                      # bytes of whole shards asked for and not dropped
        self.release_after: dict[int, list[int]] = {}
        self.lock = threading.Lock()         # held and the cache's locks, across threads
        if depth <= 0:
            return
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(1, thread_name_prefix="fastdata-read-ahead")
        if remote_read == "ranges" or len(chunks) == 0:
            return
        from fastdata.storage import ShardCache

        # Holds every copy it returned until discarded: the plan's copies are
        # never evicted by another process's downloads while in use.
        self.cache = ShardCache(keep_locked=1 << 30)
        if budget is None:
            budget = cache_budget(self.cache.cache_dir, workers, own=reader.shard_paths)
        records, chunk_of = chunks.all_records()
        shards, sizes = reader.placement(records)
        self.fetches = plan_fetches(
            shards, sizes, reader.shard_sizes(), chunk=chunk_of, budget=budget,
            whole_share=0.0 if remote_read == "shards" else WHOLE_SHARE)
        self.queue.extend(self.fetches.by_first_use)
        for shard, (_first, last) in self.fetches.spans.items():
            self.release_after.setdefault(last, []).append(shard)
        if self.queue:
            # Twice the chunks ahead: under latency, more shards on their way keep
            # the link full (the budget still bounds the bytes they hold).
            self.downloads = ThreadPoolExecutor(max(1, 2 * depth),
                                                thread_name_prefix="fastdata-shard")

    # -- whole shards -------------------------------------------------------------

    def _pump(self) -> None:
        """Ask for the next whole shards, in order of first use, while they fit."""
        with self.lock:
            while self.queue and self.held + self.fetches.sizes[self.queue[0]] <= \
                    self.fetches.budget:
                shard = self.queue.popleft()
                self.held += self.fetches.sizes[shard]
                self.shards[shard] = self.downloads.submit(self._download, shard)

    def _download(self, shard: int) -> str:
        for attempt in range(DOWNLOAD_TRIES - 1):
            try:
                return self.reader.shard_copy(shard, self.cache)
            except (OSError, FastDataError):
                time.sleep(0.2 * 2 ** attempt)
        return self.reader.shard_copy(shard, self.cache)  # the last try's error is raised

    def _attach(self, k: int, indices: list[int]) -> None:
        """Read chunk k's whole shards from their copies: waited for after the
        first ``depth`` chunks, taken when already there before."""
        for shard in self.reader.shards_of(indices):
            future = self.shards.get(shard)
            if future is None or shard in self.copies or (k < self.depth and not future.done()):
                continue
            try:
                path = future.result()
            except (OSError, FastDataError) as exc:
                record = next(i for i in indices if self.reader.shards_of([i]) == [shard])
                url = self.reader.shard_paths[shard]
                raise FastDataError(
                    f"cannot download shard {redact(url)} (tried {DOWNLOAD_TRIES} times), "
                    f"which record {record} is read from: {exc}. Check the server, or read "
                    f"the records by range with remote_read='ranges'",
                    path=url, record=record, key=self.reader.key_of(record)) from None
            self.copies[shard] = path
            self.reader.attach_local(shard, path)

    def _release(self, k: int) -> None:
        """Drop the whole shards chunk k was the last use of (one still on its
        way when the order no longer needs it is dropped when it arrives)."""
        for shard in self.release_after.pop(k, []):
            future = self.shards.pop(shard, None)
            self.reader.detach_local(shard)
            path = self.copies.pop(shard, None)
            if path is not None:
                self._drop(shard, path)
            elif future is not None and future.cancel():
                self._drop(shard, None)
            elif future is not None:
                future.add_done_callback(lambda f, s=shard: self._drop(
                    s, f.result() if f.exception() is None else None))

    def _drop(self, shard: int, path: str | None) -> None:
        with self.lock:
            if path is not None:
                self.cache.discard(path)
            self.held -= self.fetches.sizes[shard]

    # -- chunks -------------------------------------------------------------------

    def _fetch(self, k: int, indices: list[int]):
        if self.downloads is not None:
            self._pump()
            self._attach(k, indices)
        try:
            return self.reader.read_many(indices)
        except CorruptDataError:
            return None  # read again one record at a time, where damage is reported
        finally:
            if self.downloads is not None:
                self._release(k)
                self._pump()

    def take(self, k: int) -> list | None:
        """Chunk k's payloads (None: read them with the damage-aware path)."""
        if self.pool is None:
            return None
        for j in range(k, min(len(self.chunks), k + 1 + self.depth)):
            if j not in self.pending:
                self.pending[j] = self.pool.submit(self._fetch, j, self.chunks[j])
        return self.pending.pop(k).result()

    def close(self) -> None:
        if self.pool is not None:
            for future in self.pending.values():
                future.cancel()
            self.pool.shutdown(wait=True)
            if self.downloads is not None:
                for future in self.shards.values():
                    future.cancel()
                self.downloads.shutdown(wait=True)
                for shard, future in list(self.shards.items()):  # a pass left early
                    self.reader.detach_local(shard)
                    if not future.cancelled() and future.exception() is None:
                        self.cache.discard(future.result())
            if self.cache is not None:
                self.cache.release()

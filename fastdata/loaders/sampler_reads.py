"""A map-style dataset at a URL reading ahead of the batches its sampler will ask for.

:class:`fastdata.EpochBatches` knows a whole epoch's batches before the
first; it writes what they depend on (epoch, start, rank, world, batch size)
into a small shared tensor of its dataset, which DataLoader workers forked
earlier see too. Each worker then finds the batch it is asked for in that
epoch's sequence, and from it the batches it will be asked for next (the
DataLoader deals batches to its workers in turn), and fetches those through
the stream's read-ahead (:class:`fastdata.loaders.read_ahead.ReadAhead`):
shards the order reads heavily over a short stretch downloaded whole in order
of first use within the cache budget, every other record by range.

Driven by another sampler, whose order it cannot know, the dataset caches by
shard (:class:`ShardsOnFirstUse`) when the whole dataset fits the cache budget:
once a sixteenth of a shard's bytes has been read by range (so a few records
looked at never download a shard), its download starts, and its records are
read by range until the copy is there. A dataset larger than the budget is
read by range: under a random order any smaller unit of cache would fetch
more bytes than the records it serves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from fastdata.loaders.read_ahead import ReadAhead
from fastdata.order.epochs import epoch_order, shard_starts
from fastdata.order.slices import Slice

#: Batches of a worker fetched ahead of the one it is asked for.
BATCHES_AHEAD = 4


class _WorkerBatches:
    """The record indices of batches t0, t0 + step, ... of a rank's epoch."""

    def __init__(self, plan: Slice, order: np.ndarray, first: int, step: int) -> None:
        self.plan, self.order = plan, order
        self.ts = range(first, plan.batches(), step)

    def __len__(self) -> int:
        return len(self.ts)

    def positions(self, k: int) -> np.ndarray:
        span = self.plan.batch_positions(self.ts[k])
        return np.arange(span.start, span.stop)

    def __getitem__(self, k: int) -> list[int]:
        if not 0 <= k < len(self):
            raise IndexError(k)
        return self.plan.record_indices(self.order, self.positions(k)).tolist()

    def all_records(self) -> tuple[np.ndarray, np.ndarray]:
        """Every record index of these batches, in order, and the batch of each."""
        if not len(self):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        parts = [self.positions(k) for k in range(len(self))]
        return (self.plan.record_indices(self.order, np.concatenate(parts)),
                np.repeat(np.arange(len(parts), dtype=np.int64), [len(p) for p in parts]))


#: Share of a shard's bytes read by range before it is downloaded whole.
DOWNLOAD_AFTER = 1 / 16


class ShardsOnFirstUse:
    """Whole shards downloaded once used enough, kept while the dataset is open."""

    def __init__(self, reader) -> None:
        self.reader = reader
        self._pool = self._cache = None
        self._wanted: bool | None = None
        self._copies: dict[int, Any] = {}     # shard -> future of its local copy
        self._attached: set[int] = set()
        self._ranged: dict[int, int] = {}     # shard -> bytes read by range so far

    def _start(self) -> bool:
        if self._wanted is None:
            from fastdata.loaders.read_ahead import cache_budget
            from fastdata.storage import ShardCache

            self._cache = ShardCache(keep_locked=1 << 30)
            self._shard_bytes = self.reader.shard_sizes()
            self._wanted = sum(self._shard_bytes) <= cache_budget(self._cache.cache_dir)
            if self._wanted:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(BATCHES_AHEAD,
                                                thread_name_prefix="fastdata-shard")
        return self._wanted

    def read(self, indices: list[int]) -> list | None:
        """The payloads of ``indices``, the shards already here read locally
        (None: the dataset is larger than the cache budget; read it yourself)."""
        if not self._start():
            return None
        shards, sizes = self.reader.placement(indices)
        for shard, size in zip(shards.tolist(), sizes.tolist()):
            if shard not in self._attached:
                self._ranged[shard] = self._ranged.get(shard, 0) + size
        for shard in dict.fromkeys(shards.tolist()):
            if shard in self._attached:
                continue
            future = self._copies.get(shard)
            if future is None:
                if self._ranged[shard] >= DOWNLOAD_AFTER * self._shard_bytes[shard]:
                    self._copies[shard] = self._pool.submit(self.reader.shard_copy, shard,
                                                            self._cache)
            elif future.done() and future.exception() is None:
                self.reader.attach_local(shard, future.result())
                self._attached.add(shard)
            elif future.done():      # a failed download: try again on the next use
                del self._copies[shard]
        return self.reader.read_many(indices)

    def close(self) -> None:
        if self._pool is not None:
            for future in self._copies.values():
                future.cancel()
            self._pool.shutdown(wait=True)
        for shard in self._attached:
            self.reader.detach_local(shard)
        if self._cache is not None:
            self._cache.release()
        self.__init__(self.reader)

    def __getstate__(self):
        return {"reader": self.reader}   # threads, locks and copies stay with this process

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["reader"])


class SamplerReads:
    """The read-ahead of one map-style dataset over a remote sharded reader."""

    def __init__(self, reader, order) -> None:
        self.reader = reader
        self.order = order          # the dataset's fastdata.Order
        # [serial, epoch, start, rank, world, batch size]; serial 0: no sampler.
        self.shared = torch.zeros(6, dtype=torch.int64).share_memory_()
        self._key = None
        self._ahead: ReadAhead | None = None
        self._next = 0              # the next batch, in this worker's sequence
        self._firsts: dict[int, int] = {}
        self._other = ShardsOnFirstUse(reader)   # reads for another sampler

    def follow(self, epoch: int, start: int, rank: int, world: int, batch_size: int) -> None:
        """Called by the sampler before a pass: the batches it will give."""
        serial = int(self.shared[0]) + 1
        self.shared.copy_(torch.tensor([serial, epoch, start, rank, world, batch_size]))

    def payloads(self, indices: list[int]) -> list | None:
        """The payloads of batch ``indices`` when it is one the sampler said it
        would give (fetched ahead, with the next ones asked for); None: read it
        directly."""
        key = tuple(self.shared.tolist())
        if not indices:
            return None
        if key[0] == 0:                      # not fastdata's sampler: cache by shard
            return self._other.read(indices)
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if key != self._key:
            self._start_pass(key, workers)
        ahead = self._ahead
        if ahead is not None and self._next < len(ahead.chunks) \
                and ahead.chunks[self._next] == indices:
            self._next += 1
            return ahead.take(self._next - 1)
        t = self._firsts.get(indices[0])     # another worker's turn, or a resumed pass
        if t is None:
            return None
        self._close_ahead()
        chunks = _WorkerBatches(self._plan, self._epoch_order, t, max(1, workers))
        if chunks[0] != indices:
            return None
        self._ahead = ReadAhead(self.reader, chunks, BATCHES_AHEAD, workers=workers)
        self._next = 1
        return self._ahead.take(0)

    def _start_pass(self, key: tuple, workers: int) -> None:
        _, epoch, start, rank, world, batch_size = key
        self._close_ahead()
        self._key = key
        self._plan = Slice(len(self.reader), start, world, rank, batch_size, self.order.policy)
        shuffle = self.order.shuffle_of(len(self.reader), stream=False)
        self._epoch_order = epoch_order(len(self.reader), shuffle, epoch,
                                        shard_starts(shuffle, self.reader))
        every = _WorkerBatches(self._plan, self._epoch_order, 0, 1)
        firsts = every.plan.record_indices(
            self._epoch_order, np.asarray([every.plan.batch_positions(t).start
                                           for t in every.ts], dtype=np.int64))
        self._firsts = {int(r): t for t, r in enumerate(firsts.tolist())}

    def _close_ahead(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
        self._ahead, self._next = None, 0

    def close(self) -> None:
        self._close_ahead()
        self._other.close()
        self._key = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state.update(_key=None, _ahead=None, _next=0, _firsts={},
                     _other=ShardsOnFirstUse(self.reader))
        return state

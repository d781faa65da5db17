"""Record indices of a streaming worker's positions, in chunks, and their
payloads fetched ahead of use (for ``ShardedIterableDataset``)."""

from __future__ import annotations

from typing import Any

from fastdata.errors import CorruptDataError
from fastdata.order.slices import Slice

#: Positions of a worker's sequence read (and decoded) at a time.
READ_CHUNK = 64


class Chunks:
    """The record indices of a worker's remaining positions, ``READ_CHUNK`` at
    a time, made when asked for (not a whole epoch's lists up front)."""

    def __init__(self, plan: Slice, order, positions) -> None:
        self.plan, self.order, self.positions = plan, order, positions

    def __len__(self) -> int:
        return -(-len(self.positions) // READ_CHUNK)

    def __getitem__(self, k: int) -> list[int]:
        if not 0 <= k < len(self):
            raise IndexError(k)
        part = self.positions[k * READ_CHUNK:(k + 1) * READ_CHUNK]
        return self.plan.record_indices(self.order, part).tolist()


class ReadAhead:
    """Chunks of records fetched ``depth`` chunks ahead of use in one thread, so
    that a remote dataset's requests overlap decoding; ``depth`` 0 reads nothing
    ahead (local files are read as they are used)."""

    def __init__(self, reader, chunks: Chunks, depth: int,
                 whole_shards: bool = False) -> None:
        self.reader = reader
        self.chunks = chunks
        self.depth = depth
        self.pending: dict[int, Any] = {}
        self.pool = self.downloads = None
        self.shards: dict[int, Any] = {}  # shard -> future of its local copy
        self.cache = None
        if depth > 0:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(1, thread_name_prefix="fastdata-read-ahead")
            if whole_shards:
                self.downloads = ThreadPoolExecutor(depth, thread_name_prefix="fastdata-shard")

    def _download(self, k: int) -> None:
        """Ask for the shards of chunk k that are not asked for yet."""
        if self.cache is None:
            from fastdata.storage import ShardCache

            self.cache = ShardCache()  # holds the copies it returned until closed
        for shard in self.reader.shards_of(self.chunks[k]):
            if shard not in self.shards:
                self.shards[shard] = self.downloads.submit(self.reader.shard_copy, shard,
                                                           self.cache)

    def _fetch(self, k: int, indices: list[int]):
        if self.downloads is not None:
            for shard in self.reader.shards_of(indices):
                self.reader.attach_local(shard, self.shards[shard].result())
        try:
            return self.reader.read_many(indices)
        except CorruptDataError:
            return None  # read again one record at a time, where damage is reported

    def take(self, k: int) -> list | None:
        """Chunk k's payloads (None: read them with the damage-aware path)."""
        if self.pool is None:
            return None
        for j in range(k, min(len(self.chunks), k + 1 + self.depth)):
            if j not in self.pending:
                if self.downloads is not None:
                    self._download(j)
                self.pending[j] = self.pool.submit(self._fetch, j, self.chunks[j])
        return self.pending.pop(k).result()

    def close(self) -> None:
        if self.pool is not None:
            for future in [*self.pending.values(), *self.shards.values()]:
                future.cancel()
            self.pool.shutdown(wait=True)
            if self.downloads is not None:
                self.downloads.shutdown(wait=True)
            if self.cache is not None and hasattr(self.cache, "release"):
                self.cache.release()

"""Which remote shards to download whole, from the order records will be read in.

A stream knows its epoch's order before the first batch, so it can decide per
shard: a shard whose records are needed in a large share, over a stretch of
the order short enough that it fits in the cache beside the others needed at
the same time, is downloaded whole (one request, then local reads); the
records of every other shard are read by ranged requests. Torch-free: it sees
only record sizes, shard sizes and the order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: A shard is downloaded whole when the order reads at least this share of its
#: bytes. Below it, ranged reads move fewer bytes than the download would.
WHOLE_SHARE = 0.25


@dataclass
class FetchPlan:
    """The shards to download whole, with the chunks (of the order) of their
    first and last use; every other shard is read by range. ``budget``: bytes
    of whole shards the plan may hold at once."""

    budget: int
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    first_record: dict[int, int] = field(default_factory=dict)  # position of first use

    @property
    def by_first_use(self) -> list[int]:
        """The whole shards in the order their download is needed."""
        return sorted(self.spans, key=lambda s: self.first_record[s])

    def peak(self) -> int:
        """The most bytes of whole shards in use (between first and last use) at once."""
        if not self.spans:
            return 0
        ends = max(last for _, last in self.spans.values()) + 2
        load = np.zeros(ends, dtype=np.int64)
        for shard, (first, last) in self.spans.items():
            load[first] += self.sizes[shard]
            load[last + 1] -= self.sizes[shard]
        return int(np.cumsum(load).max())


def plan_fetches(shards: np.ndarray, record_bytes: np.ndarray, shard_bytes, *,
                 chunk: int | np.ndarray, budget: int, whole_share: float = WHOLE_SHARE
                 ) -> FetchPlan:
    """The fetch plan for reading records in order: ``shards[j]`` and
    ``record_bytes[j]`` are the shard and size of the j-th record read;
    ``shard_bytes[s]`` is shard s's size; ``chunk``: records per chunk, or the
    chunk number of each record read (chunks of different sizes, such as
    batches). ``whole_share`` 0 takes every shard whole that fits the budget;
    above 1, none.

    Shards are taken greedily, the most used share first, while at every chunk
    of the order the whole shards in use (from their first to their last use)
    fit in ``budget`` bytes: so the reader can always fetch what the next
    chunk needs after releasing what the order has done with.
    """
    plan = FetchPlan(budget=int(budget))
    shards = np.asarray(shards, dtype=np.int64)
    if len(shards) == 0 or whole_share > 1:
        return plan
    shard_bytes = np.asarray(shard_bytes, dtype=np.int64)
    chunks = np.arange(len(shards), dtype=np.int64) // chunk if np.isscalar(chunk) \
        else np.asarray(chunk, dtype=np.int64)
    used = np.bincount(shards, weights=np.asarray(record_bytes, dtype=np.float64),
                       minlength=len(shard_bytes))
    at = np.full(len(shard_bytes), np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(len(shard_bytes), -1, dtype=np.int64)
    np.minimum.at(at, shards, np.arange(len(shards), dtype=np.int64))
    np.maximum.at(last, shards, chunks)
    first = np.where(last >= 0, chunks[np.minimum(at, len(shards) - 1)], 0)
    share = used / np.maximum(shard_bytes, 1)
    candidates = np.flatnonzero((last >= 0) & (share >= whole_share) & (shard_bytes <= budget)
                                & (shard_bytes > 0))
    # Most used share first; among equals, the sooner needed.
    candidates = candidates[np.lexsort((first[candidates], -share[candidates]))]
    load = np.zeros(int(chunks[-1]) + 1, dtype=np.int64)
    for s in candidates.tolist():
        a, b, size = int(first[s]), int(last[s]), int(shard_bytes[s])
        if int(load[a:b + 1].max()) + size <= budget:
            load[a:b + 1] += size
            plan.spans[s] = (a, b)
            plan.sizes[s] = size
            plan.first_record[s] = int(at[s])
    return plan

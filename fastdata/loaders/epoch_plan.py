"""The order a whole job reads an epoch in, and each rank's and worker's part.

One sequence per (seed, epoch): every rank and DataLoader worker computes the
same permutation of the records and takes its slice, so the samples the job
consumes, and their order, do not depend on how many ranks or workers read
them. The slices are cut so that

- every rank gets the same number of samples M (padding with repeats of the
  sequence's first samples, fewer than one per rank, or dropping the last
  ones), hence the same number of batches: DistributedDataParallel never
  waits for a rank that ran out;
- the job consumes the sequence as a prefix: global batch round t is rank 0's
  t-th batch, then rank 1's, ...; after every rank has taken t batches the
  first ``W x t x B`` samples are done, whatever W. A checkpoint is then one
  number, and a run with another number of ranks or workers resumes from it;
- worker k of a rank's K workers takes the rank's batches k, k+K, ...: the
  DataLoader fetches batches from its workers in turn, so the rank sees its
  batches in order.

Shuffling is a block shuffle: the records are cut into blocks of consecutive
records (which sit near each other in a shard), the blocks are permuted, and
the records of every ``window`` consecutive blocks are permuted together. A
batch then mixes records from many blocks (many shards, many classes of a
class-sorted pack) while a worker reads within a bounded set of blocks.

Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

POLICIES = ("pad", "drop")


def stable_seed(*parts: int | str) -> int:
    """A 64-bit seed from ints and tags: the same in every process and Python run
    (unlike ``hash()``), and unrelated for neighbouring inputs."""
    # int() first: a numpy integer's repr differs from the equal Python int's.
    text = repr(tuple(p if isinstance(p, str) else int(p) for p in parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Shuffle:
    """How an epoch's order is made: ``block`` consecutive records move together,
    ``window`` records (whole blocks) are permuted among themselves."""

    enabled: bool = False
    seed: int = 0
    block: int | str = 16     # records, or "shard": each shard is one block
    window: int = 8192

    def describe(self) -> dict:
        block = self.block if self.block == "shard" else int(self.block)
        return {"shuffle": self.enabled, "seed": int(self.seed), "block": block,
                "window": int(self.window)}


def epoch_order(n: int, shuffle: Shuffle, epoch: int,
                block_starts: np.ndarray | None = None) -> np.ndarray:
    """Record indices in the order the job reads epoch ``epoch`` (int64, length n).

    ``block_starts`` (the first record of each block, from 0, ascending) gives
    blocks of their own lengths, such as whole shards (``block="shard"``)."""
    if not shuffle.enabled or n <= 1:
        return np.arange(n, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(stable_seed("order", shuffle.seed, epoch)))
    if block_starts is not None:
        return _order_of_blocks(n, np.asarray(block_starts, dtype=np.int64),
                                int(shuffle.window), rng)
    block = max(1, int(shuffle.block))
    blocks = -(-n // block)
    starts = rng.permutation(blocks).astype(np.int64) * block
    # Records of the permuted blocks, in block order (the last block may be short).
    lengths = np.minimum(block, n - starts)
    order = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(n)
    # Permute inside each window of whole blocks: sort by (window, random key).
    per_window = max(1, int(shuffle.window) // block) * block
    window_of = np.arange(n, dtype=np.int64) // per_window
    return order[np.lexsort((rng.random(n), window_of))]


def _order_of_blocks(n: int, firsts: np.ndarray, window: int, rng) -> np.ndarray:
    """The block shuffle over blocks of any lengths: the blocks permuted, then
    the records of every ``window``-records' worth of consecutive blocks."""
    lengths_all = np.diff(np.append(firsts, n))
    perm = rng.permutation(len(firsts))
    starts, lengths = firsts[perm], lengths_all[perm]
    order = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(n)
    per_window = max(1, round(window / max(1.0, float(lengths_all.mean()))))
    window_of = np.repeat(np.arange(len(perm), dtype=np.int64) // per_window, lengths)
    return order[np.lexsort((rng.random(n), window_of))]


@dataclass(frozen=True)
class Slice:
    """One rank's share of an epoch that starts ``start`` samples into the order."""

    n: int            # records in the dataset
    start: int        # samples of the epoch's order already consumed (a resume point)
    world: int        # ranks
    rank: int
    batch_size: int   # the DataLoader's batch size (1 when not given)
    policy: str = "pad"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be 'pad' or 'drop', not {self.policy!r}")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside a world of size {self.world}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {self.batch_size}")

    @property
    def remaining(self) -> int:
        """Samples of the order not yet consumed."""
        return max(0, self.n - self.start)

    @property
    def per_rank(self) -> int:
        """M: samples every rank yields this epoch (from ``start`` on)."""
        left = self.remaining
        if self.policy == "drop":
            return left // self.world
        return -(-left // self.world)

    @property
    def repeats(self) -> int:
        """Samples read twice this epoch (padding), over all ranks: < world."""
        return self.per_rank * self.world - self.remaining if self.policy == "pad" else 0

    @property
    def dropped(self) -> int:
        return self.remaining - self.per_rank * self.world if self.policy == "drop" else 0

    def batches(self) -> int:
        """Batches every rank yields (the last may be partial)."""
        return -(-self.per_rank // self.batch_size)

    def batch_positions(self, t: int) -> range:
        """Positions, counted from ``start`` in the (padded) order, of this rank's batch t."""
        m, b, w = self.per_rank, self.batch_size, self.world
        size = min(b, m - t * b)
        first = w * t * b + self.rank * size
        return range(first, first + size)

    def consumed_after(self, batches: int) -> int:
        """The resume point (samples of the order consumed, counted from 0)
        once every rank has taken ``batches`` batches."""
        if batches >= self.batches():
            return self.n  # the epoch is done (padding included)
        return self.start + self.world * batches * self.batch_size

    def record_indices(self, order: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Record indices at ``positions``; positions past the end wrap to the
        start of the remaining order (padding)."""
        left = self.remaining
        return order[self.start + positions % left] if left else positions[:0]


def worker_batches(total: int, worker: int, workers: int) -> range:
    """The batches (of ``total``) worker ``worker`` of ``workers`` reads: every
    ``workers``-th, so a DataLoader taking batches from its workers in turn
    delivers them in order."""
    return range(worker, total, workers)


def batches_delivered(yielded: list[int], total_batches: int, workers: int) -> int:
    """Batches a rank has consumed, from the number of its batches each worker
    had delivered (the DataLoader delivers them in order, so these agree with
    one count n: worker k delivered the batches k, k+K, ... below n)."""
    n = sum(yielded)
    expected = [len(worker_batches(min(n, total_batches), k, workers)) for k in range(workers)]
    if expected != list(yielded):
        raise ValueError(f"worker batch counts {yielded} are not a prefix of the rank's batches "
                         f"taken in turn ({expected} expected for {n}); the state was not "
                         f"taken by a DataLoader that delivers batches in order (in_order=True)")
    return n

"""Each rank's and DataLoader worker's equal part of an epoch's order.

The slices are cut so that

- every rank gets the same number of samples M (padding with repeats of the
  sequence's first samples, fewer than one per rank, or dropping the last
  ones: fewer than one per rank and a partial last batch), hence the same
  number of batches: DistributedDataParallel never waits for a rank that
  ran out;
- the job consumes the sequence as a prefix: global batch round t is rank 0's
  t-th batch, then rank 1's, ...; after every rank has taken t batches the
  first ``W x t x B`` samples are done, whatever W. A checkpoint is then one
  number, and a run with another number of ranks or workers resumes from it;
- worker k of a rank's K workers takes the rank's batches k, k+K, ...: the
  DataLoader fetches batches from its workers in turn, so the rank sees its
  batches in order.

Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POLICIES = ("pad", "drop")


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
        """M: samples every rank yields this epoch (from ``start`` on); under
        "drop", whole batches only (a partial last batch is left out too)."""
        left = self.remaining
        if self.policy == "drop":
            return left // self.world // self.batch_size * self.batch_size
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

    def batch_records(self, order, t: int) -> np.ndarray:
        """The record indices of this rank's batch ``t`` in ``order`` (an
        epoch's :class:`~fastdata.order.epochs.EpochOrder`)."""
        span = self.batch_positions(t)
        return self.record_indices(order, np.arange(span.start, span.stop, dtype=np.int64))

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

"""Which records rank r reads in step t of epoch e: the order engine asked
directly, without torch or data, for debugging and simulation.

    >>> from fastdata import Order
    >>> from fastdata.order import batch_records
    >>> order = Order(shuffle=True, batch_size=4, rank=1, world_size=2)
    >>> batch_records(10**10, order, epoch=0, step=0).shape
    (4,)

The answer is the one ``fastdata.EpochBatches`` (map-style), a stream
(``stream=True``), ``fastdata.loader()`` and DALI's external source give for
the same order, computed for that batch alone: its time and memory do not
depend on ``records``.
"""

from __future__ import annotations

import numpy as np

from fastdata.order.epochs import epoch_order
from fastdata.order.options import Order
from fastdata.order.slices import Slice


def rank_slice(records: int, order: Order, *, start: int = 0) -> Slice:
    """Rank ``order.rank`` of ``order.world_size``'s share of an epoch of
    ``records`` records from ``start`` samples on (None rank and world: 0 of 1)."""
    rank = 0 if order.rank is None else order.rank
    world = 1 if order.world_size is None else order.world_size
    return Slice(int(records), int(start), world, rank, order.loader_batch, order.policy)


def batch_records(records: int, order: Order, *, epoch: int = 0, step: int = 0,
                  stream: bool = False, start: int = 0,
                  shard_starts: np.ndarray | None = None) -> np.ndarray:
    """The record indices rank ``order.rank`` reads in its batch ``step`` of
    epoch ``epoch`` (int64).

    Args:
        records: the dataset's records.
        order: the :class:`fastdata.Order` read (its rank, world size and
            batch size; None batch size: 64, as ``loader()`` has it).
        epoch: the epoch.
        step: the rank's batch, from 0 (from ``start`` on).
        stream: the defaults of a stream (``block=16, window=8192``) rather
            than of random access (a permutation of every record) where the
            order leaves ``block``/``window`` unset.
        start: samples of the epoch already consumed (a resume point's).
        shard_starts: the first record of each shard, for ``block="shard"``.

    Raises:
        IndexError: ``step`` is not a batch of this epoch.
    """
    plan = rank_slice(records, order, start=start)
    if not 0 <= step < plan.batches():
        raise IndexError(f"step {step} is outside this rank's {plan.batches()} batches of "
                         f"epoch {epoch}")
    shuffle = order.shuffle_of(int(records), stream=stream)
    return plan.batch_records(epoch_order(records, shuffle, epoch, shard_starts), step)

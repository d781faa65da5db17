"""Batches of record indices for map-style Datasets, from the order engine.

``DataLoader(ds, batch_sampler=fastdata.EpochBatches(ds))`` reads a map-style
dataset in the :class:`fastdata.Order` it was opened with, the job's one
order (:mod:`fastdata.order`): for
(seed, epoch) one sequence of the records, each torch.distributed rank an
equal part of it (padded or dropped, as streams are), and a resume state that
is one position in it. A ``StatefulDataLoader`` saves and restores that
position with the rest of its state; another number of ranks or workers
resumes from the same position. The sampler also sets its dataset's epoch, so
random crops follow the epoch the sampler reads, resumed or not.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Sampler

from fastdata.keywords import check_read_values, explain_keywords
from fastdata.machine import rank_and_world
from fastdata.order.epochs import epoch_order, shard_starts
from fastdata.order.options import Order
from fastdata.order.slices import Slice
from fastdata.order.state import StreamPoint, order_description, parse_state


class EpochBatches(Sampler[list[int]]):
    """This rank's batches of record indices, epoch by epoch, in the job's order.

    Args:
        dataset (Dataset | int): the map-style Dataset read (its epoch follows this sampler's),
            or a record count.
        order: a :class:`fastdata.Order` (shuffle, seed, batch_size, drop_last,
            rank, world_size, block, window); None: the dataset's ``order``
            (the one it was opened with). Its ``batch_size`` is the indices per
            batch (None: 64); the last batch of an epoch may be short unless
            ``drop_last``, which also drops the last samples of the order
            (fewer than one per rank) instead of padding with repeats of its
            first ones. The shuffle is a permutation of every record unless
            ``block``/``window`` say otherwise (a stream's (16, 8192) give the
            order a stream reads).

    Every rank yields the same number of batches. After a whole pass the
    next epoch follows (``set_epoch`` sets one). ``state_dict()`` is the point
    the job has reached (epoch and samples consumed); ``load_state_dict`` takes
    it, or a ``StatefulDataLoader``'s whole state, and continues there.
    """

    @explain_keywords()
    def __init__(self, dataset, order: Order | None = None) -> None:
        check_read_values(None, order)
        self.dataset = None if isinstance(dataset, int) else dataset
        self.records = int(dataset) if isinstance(dataset, int) else len(dataset)
        if order is None:
            mine = getattr(self.dataset, "order", None)
            order = mine if isinstance(mine, Order) else Order()
        #: The order read (:class:`fastdata.Order`) and its engine shuffle.
        self.order = order
        # A dataset that orders itself (a mixture) gives the order of its positions.
        self.shuffle_mode = getattr(self.dataset, "position_order", None) \
            or order.shuffle_of(self.records, stream=False)
        # Whole shards as blocks: the dataset's shard bounds (refused by name
        # for a dataset without shards, or a bare record count).
        self._starts = shard_starts(self.shuffle_mode, getattr(self.dataset, "reader", None))
        self.batch_size = order.loader_batch
        self.drop_last = order.drop_last
        self._rank, self._world = order.rank, order.world_size
        self.epoch = 0
        self._start = 0     # samples of this epoch's order consumed before this pass
        self._taken = 0     # batches this pass has handed on

    def plan(self) -> Slice:
        """This rank's share of the current epoch (from a loaded position on)."""
        rank, world = rank_and_world(self._rank, self._world)
        return Slice(self.records, self._start, world, rank, self.batch_size,
                     self.order.policy)

    def __len__(self) -> int:
        """Batches this rank yields this epoch (the same on every rank)."""
        return self.plan().batches()

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (its order, and the dataset's crops)."""
        if int(epoch) != self.epoch:
            self._start = 0  # a position of another epoch no longer applies
        self.epoch = int(epoch)
        if self.dataset is not None and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)

    def __iter__(self) -> Iterator[list[int]]:
        plan = self.plan()
        order = epoch_order(self.records, self.shuffle_mode, self.epoch, self._starts)
        self._taken = 0
        if self.dataset is not None and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)  # crops follow the epoch read
        self._announce(plan)
        for t in range(plan.batches()):
            batch = plan.batch_records(order, t).tolist()  # this batch's positions alone
            self._taken = t + 1  # counted before it is handed on: state_dict() is after it
            yield batch
        # A whole pass read: the next one reads the next epoch (set_epoch() may
        # still say which), so a loop without set_epoch() does not repeat an
        # order. The dataset learns it when that pass starts: DataLoader workers
        # are still decoding this pass's last batches, with this epoch's crops.
        self._start, self._taken = 0, 0
        self.epoch += 1

    def _announce(self, plan: Slice) -> None:
        """Tell a dataset that reads ahead (shards at a URL) which batches come,
        when they are in the dataset's own order."""
        reads = getattr(self.dataset, "_sampler_reads", None)
        if reads is not None and reads.order.shuffle_of(self.records, stream=False) \
                == self.shuffle_mode and reads.order.policy == self.order.policy:
            reads.follow(self.epoch, plan.start, plan.rank, plan.world, self.batch_size)

    def describe_order(self, epoch: int) -> dict:
        """What fixes the samples of epoch ``epoch``, for a resume state: the
        order, the shards' bounds of ``block="shard"``, the dataset's random
        crop (:func:`fastdata.order.state.order_description`)."""
        shaping = getattr(self.dataset, "shaping", None)
        reader = getattr(self.dataset, "reader", None)
        identity = reader.identity if reader is not None else \
            getattr(self.dataset, "sources_identity", None)
        return order_description(self.shuffle_mode, epoch, starts=self._starts,
                                 shaping=shaping() if shaping is not None else None,
                                 dataset=identity)

    def state_dict(self) -> dict:
        """The point the job has reached: this epoch and the samples of its
        order consumed once every rank has taken the batches this one has."""
        consumed = self.plan().consumed_after(self._taken)
        return StreamPoint(self.epoch, consumed, self.records,
                           self.describe_order(self.epoch)).to_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (this sampler's, or a ``StatefulDataLoader``'s
        whole state): its epoch, from the samples it had consumed on, with any
        number of ranks and workers.

        Raises:
            ValueError: the state belongs to another dataset or order.
        """
        # Without a fastdata dataset this sampler gives record indices alone.
        point = parse_state(state, records=self.records, describe=self.describe_order,
                            indices_only=getattr(self.dataset, "shaping", None) is None)
        if not isinstance(point, StreamPoint):
            raise ValueError("this is one stream worker's position; load the loader's whole "
                             "state_dict() or a resume point")
        self.set_epoch(point.epoch)
        self._start, self._taken = point.consumed, 0

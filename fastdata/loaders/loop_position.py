"""The training loop's point in the job's order, for ``fastdata.loader()``.

A loader made by :func:`fastdata.loader` reads batches ahead of the loop (a
background thread, DataLoader workers, the prefetcher's copies), so the
position of what *made* the batches — a map-style dataset's
:class:`~fastdata.EpochBatches`, a stream — runs ahead of the step. The
loader counts instead the batches it hands to the loop in each pass: after
``t`` of them every rank has taken ``t`` batches of the pass's plan (the same
number on every rank), which is one point of the order
(:class:`~fastdata.order.state.StreamPoint`), the same whatever the workers,
threads or run-ahead, and loadable with any number of ranks and workers.
"""

from __future__ import annotations

from fastdata.order.state import StreamPoint


def order_source(loader):
    """What orders ``loader``'s batches and can resume: its EpochBatches, or the
    fastdata stream it reads (itself or in whole batches); None for others."""
    from fastdata.loaders.iterable import ShardedIterableDataset
    from fastdata.loaders.sampler import EpochBatches

    sampler = getattr(loader, "batch_sampler", None)
    if isinstance(sampler, EpochBatches):
        return sampler
    dataset = getattr(loader, "dataset", None)
    dataset = getattr(dataset, "stream", dataset)  # StreamBatches: the stream's own state
    return dataset if isinstance(dataset, ShardedIterableDataset) else None


def _records(source) -> int:
    return source.records if hasattr(source, "records") else len(source.reader)


class LoopPosition:
    """Batches handed to the loop in the current pass, and the point they make."""

    def __init__(self, loader) -> None:
        self.source = order_source(loader)
        self._mark = None     # (epoch, plan) of the pass being read
        self._handed = 0
        self._ended = False

    def begin(self) -> None:
        """A pass starts: it reads the source's current epoch from its current plan."""
        if self.source is not None:
            self._mark = (self.source.epoch, self.source.plan())
            self._handed, self._ended = 0, False

    def took(self) -> None:
        self._handed += 1

    def ended(self) -> None:
        """The pass was read to its end: the next one is the next epoch's."""
        self._ended = True

    def state_dict(self) -> dict:
        source = self._need()
        if self._mark is None:  # nothing read yet: where the first pass will start
            epoch, plan, handed = source.epoch, source.plan(), 0
        else:
            (epoch, plan), handed = self._mark, self._handed
        # Every batch of the pass handed over is its end too, whether or not
        # the loop asked once more (Lightning stops at the length it knows).
        if self._ended or handed >= plan.batches():
            epoch, consumed = epoch + 1, 0
        else:
            consumed = plan.consumed_after(handed)
        return StreamPoint(epoch, consumed, _records(source),
                           source.describe_order(epoch)).to_dict()

    def load_state_dict(self, state: dict) -> None:
        self._need().load_state_dict(state)
        self._mark, self._handed, self._ended = None, 0, False

    def _need(self):
        if self.source is None:
            raise TypeError(
                "this loader reads a dataset that fastdata does not order (a torch sampler, "
                "or a dataset of another library), so it has no position to save: open the "
                "dataset with fastdata.open_dataset(..., order=fastdata.Order(...)) and let "
                "fastdata.loader() order it, or save the state of your own sampler")
        return self.source

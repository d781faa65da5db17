"""The stall meter set up on a loader: one table shared with the workers,
the collate function timed, the table a dataset adds to."""

from __future__ import annotations

from fastdata.meter.table import StageTable, clock


class TimedCollate:
    """A DataLoader's ``collate_fn`` whose time the stall meter counts, in the
    process that runs it (a worker, or the training process)."""

    def __init__(self, fn, table: StageTable) -> None:
        self.fn = fn
        self.table = table

    def __call__(self, batch):
        start = clock()
        out = self.fn(batch)
        self.table.add("collate", clock() - start, busy=True)
        return out


def table_of(dataset) -> StageTable:
    """``dataset``'s table (made for this process when it has none)."""
    table = getattr(dataset, "_meter", None)
    if table is None:
        table = StageTable()
        try:
            dataset._meter = table
        except AttributeError:  # a Dataset that takes no attributes: not metered
            pass
    return table


def share_table(dataset, workers: int) -> StageTable:
    """Give ``dataset`` (and a mixture's sources) one table, in shared memory
    when it has ``workers`` (before they start), and return it. Without
    workers every batch is made in this process: no block is made."""
    table = StageTable(workers, shared=workers > 0)
    for ds in (dataset, *getattr(dataset, "sources", {}).values()):
        try:
            ds._meter = table
        except AttributeError:
            pass
    return table

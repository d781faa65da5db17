"""What the training loop waited for: the stall meter's consumer side.

A loader that hands batches to the loop (``CUDAPrefetcher``, so
``fastdata.loader()``; ``BackgroundBatches``; ``DALILoader``) times each
batch from the loop asking for it to the loop getting it (the data wait, or
batch-ready latency) and from getting it to asking for the next (the step:
the loop's own work). With the producers' :class:`~fastdata.meter.table.StageTable`
that is everything :func:`fastdata.stats` reports.

What it holds does not grow with the run: sums, and the waits of the last
8,192 batches for the percentiles.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import GeneratorType

import numpy as np

from fastdata.meter.table import StageTable, clock

#: Batches whose waits the percentiles are taken over (the most recent).
WINDOW = 8192


class LoopMeter:
    """The data wait and the step time of each batch handed to the loop."""

    def __init__(self) -> None:
        self._waits = np.zeros(WINDOW, dtype=np.float64)
        self.reset()

    def reset(self) -> None:
        self.batches = 0
        self.wait_s = 0.0
        self.step_s = 0.0
        self.first: float | None = None
        self.last: float | None = None
        self._handed: float | None = None

    def wrap(self, batches: Iterable) -> Iterator:
        """``batches``, each timed: the wait for it, and the step after it
        (until the loop asks again). Time between passes is neither."""
        it = iter(batches)
        self._handed = None
        try:
            while True:
                asked = clock()
                if self._handed is not None:
                    self.step_s += asked - self._handed
                    self.last = asked
                    self._handed = None
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self.took(asked)
                yield batch
        finally:
            if isinstance(it, GeneratorType):  # left early: it ends now, not when collected
                it.close()

    def took(self, asked: float) -> None:
        """A batch reached the loop, asked for at ``asked`` (a :data:`clock` time)."""
        got = clock()
        wait = got - asked
        self._waits[self.batches % WINDOW] = wait
        self.batches += 1
        self.wait_s += wait
        if self.first is None:
            self.first = asked
        self.last = self._handed = got

    def figures(self) -> dict:
        """The loop's side of :func:`fastdata.stats`."""
        spent = self.wait_s + self.step_s
        out = {"batches": self.batches, "wait_s": self.wait_s, "step_s": self.step_s,
               "data_wait": self.wait_s / spent if spent > 0 else None,
               "elapsed_s": 0.0 if self.first is None else self.last - self.first,
               "batch_ready_ms": None}
        if self.batches:
            waits = self._waits[:min(self.batches, WINDOW)] * 1e3
            p50, p95, p99 = np.percentile(waits, [50, 95, 99])
            out["batch_ready_ms"] = {"p50": float(p50), "p95": float(p95), "p99": float(p99)}
        return out


class Meter:
    """A loader's stall meter: the loop's waits (:class:`LoopMeter`) and the
    producers' stage times (a :class:`~fastdata.meter.table.StageTable`),
    read since the meter was made or last reset.

    Args:
        table: the producers' table (the dataset's).
        gpu: whether the loader copies to a GPU (the ``copy`` stage is reported).
    """

    def __init__(self, table: StageTable | None = None, *, gpu: bool = False) -> None:
        self.loop = LoopMeter()
        self.table = StageTable() if table is None else table
        self.gpu = bool(gpu)
        self._since = np.zeros_like(self.table.values)

    def reset(self) -> None:
        """Start counting again (the workers' rows are kept; a copy of them
        now is taken off later readings)."""
        self.loop.reset()
        self._since = self.table.snapshot()

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(the rows now, the rows at the last reset)."""
        now = self.table.snapshot()
        since = self._since if self._since.shape == now.shape else np.zeros_like(now)
        return now, since

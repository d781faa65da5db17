"""Measuring a training row with a simulated step (``--step-ms``): the loop
sleeps after each batch, and the stall meter (:func:`fastdata.stats`) says how
long it waited for data. The results and the report: :mod:`fastdata.bench.step`.

The row's Dataset and DataLoader are the training row's (same crops, order,
collate, uint8 batches); its batches reach the loop as ``fastdata.loader()``
hands them over, so at 0 workers :data:`RUN_AHEAD` batches are made ahead on a
thread while the step runs, as ``loader(num_workers=0)`` does."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Subset

from fastdata.bench import loading
from fastdata.bench.loading import LoaderFactory, release_row
from fastdata.bench.measure import check_batch, error_text, measure_loader
from fastdata.bench.options import BenchOptions
from fastdata.bench.step import StepResult
from fastdata.bench.targets import Target
from fastdata.meter.advice import KEEPS_UP

#: Batches made ahead on a thread at 0 workers, as ``fastdata.loader()`` makes them.
RUN_AHEAD = 2


class _Stepped:
    """One epoch of a row's batches as the training loop gets them, with a sleep
    of ``step_s`` after each (between the loop getting a batch and asking again)."""

    def __init__(self, batches, step_s: float, persistent: bool) -> None:
        self.batches = batches
        self.step_s = step_s
        self.persistent_workers = persistent  # measure_loader's CPU reading

    def __iter__(self) -> Iterator[Any]:
        for batch in self.batches:
            yield batch
            if self.step_s > 0:
                time.sleep(self.step_s)


class SteppedFactory(LoaderFactory):
    """A row's DataLoaders (:class:`~fastdata.bench.loading.LoaderFactory`), each
    epoch handed to the loop as ``fastdata.loader(num_workers=W)`` hands batches
    (a :class:`~fastdata.loaders.prefetch.CUDAPrefetcher`: at 0 workers made
    ahead on a thread; the row's uint8 batches, unconverted), through one stall
    meter (:attr:`meter`) that starts counting again when the first measured
    epoch begins, with a simulated step after each batch."""

    def __init__(self, ds, *, options: BenchOptions, workers: int, step_ms: float) -> None:
        from fastdata.loaders.meter_setup import share_table
        from fastdata.meter.loop import Meter

        super().__init__(ds, batch_size=options.batch_size, workers=workers, seed=options.seed,
                         timeout=options.timeout, persistent=options.persistent_workers)
        inner = ds.dataset if isinstance(ds, Subset) else ds
        # In shared memory before the workers start: their stage times reach this process.
        self.table = share_table(inner, workers)
        #: The stall meter of every epoch (:func:`fastdata.stats` reads it).
        self.meter = Meter(self.table)
        self.step_s = step_ms / 1e3
        self.warmup = options.warmup

    def _make(self, seed: int) -> DataLoader:
        from fastdata.loaders.meter_setup import TimedCollate

        loader = super()._make(seed)
        loader.collate_fn = TimedCollate(loader.collate_fn, self.table)
        return loader

    def __call__(self) -> _Stepped:
        from fastdata.loaders.prefetch import CUDAPrefetcher

        if self._epoch == self.warmup:
            self.meter.reset()  # the measured epochs only
        loader = super().__call__()
        batches = CUDAPrefetcher(loader, "cpu", convert=False,
                                 run_ahead=RUN_AHEAD if self.workers == 0 else 0)
        batches.meter = self.meter  # one meter over the row's epochs
        return _Stepped(batches, self.step_s, loader.persistent_workers)

    def close(self, timeout: float = loading.WORKER_EXIT_TIMEOUT) -> None:
        try:
            super().close(timeout)
        finally:
            self.table.close()


def measure_step(target: Target, options: BenchOptions, workers: int, step_ms: float,
                 cache: str, on_epoch: Callable[[], None]) -> StepResult:
    """``target`` (a training row) at ``workers`` with a step of ``step_ms``."""
    from fastdata.loaders import stats as meter_stats

    common = {"name": target.name, "dataset": target.base or target.name,
              "pipeline": target.pipeline, "workers": workers, "step_ms": step_ms}
    ds = factory = figures = m = None
    error: str | None = None
    try:
        ds = loading.make_dataset(target, options)
        n = len(ds)
        shape = (3, options.size, options.size)
        factory = SteppedFactory(ds, options=options, workers=workers, step_ms=step_ms)
        m = measure_loader(
            factory, epochs=options.epochs, warmup=options.warmup, expected_samples=n,
            check=lambda b: check_batch(b, sample_shape=shape,
                                        batch_size=min(options.batch_size, n)),
            cold=cache == "cold", on_epoch=on_epoch)
        figures = meter_stats.stats(factory)
    except Exception as exc:  # a failed measurement is reported, never a crash of the run
        error = error_text(exc)
    error = release_row(factory, ds, error)
    if error is not None:
        return StepResult(status="failed", error=error, **common)
    wait = figures["data_wait"]
    return StepResult(
        status="ok", samples_per_s=m.samples_per_s, data_wait=wait,
        batch_ready_ms=figures["batch_ready_ms"], wait_s=figures["wait_s"],
        step_s=figures["step_s"], batches=figures["batches"],
        fed=None if wait is None else wait < KEEPS_UP, bound=figures["bound"],
        workers_busy=(figures.get("workers") or {}).get("utilisation"),
        advice=figures["advice"], **common)

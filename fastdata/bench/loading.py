"""The Dataset and the DataLoaders one row reads, and releasing them between rows."""

from __future__ import annotations

import gc
import multiprocessing
import time

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from fastdata.bench.baseline import ImageFolderBaseline
from fastdata.bench.cpu import process_exists
from fastdata.bench.measure import MeasurementError, error_text
from fastdata.bench.options import BenchOptions
from fastdata.bench.targets import Target
from fastdata.bench.train import make_crop
from fastdata.loaders.collate import collate

#: Seconds the workers of a closed row may take to exit before the row fails.
WORKER_EXIT_TIMEOUT = 10.0


def make_dataset(target: Target, options: BenchOptions) -> Dataset:
    """The torch Dataset a row reads: the baseline, or fastdata's Dataset
    (with a training row's random crop, seeded with the run's seed)."""
    size = (options.size, options.size)
    if target.kind == "folder":
        return ImageFolderBaseline(target.samples, size)
    from fastdata.decoding.options import Decode
    from fastdata.loaders.opening import open_dataset
    from fastdata.order.options import Order

    crop = make_crop(target, options)
    # crop= replaces size= (it resizes to its own size, S x S).
    decode = Decode(size=size if crop is None else None, crop=crop, decoder=options.decoder)
    if target.format == "mixture":  # several datasets, read as one (fastdata.mix)
        from fastdata.loaders.mixed import mix

        ds = mix(target.path, decode=decode, order=Order(shuffle=True, seed=options.seed))
    else:
        ds = open_dataset(target.path, decode=decode, order=Order(seed=options.seed),
                          cache="ram" if options.ram_cache else None, progress=False)
    if target.indices is not None:
        # Subset forwards __getitems__, so batched fetching is kept.
        return Subset(ds, list(target.indices))
    return ds


def close_dataset(ds: Dataset) -> None:
    """Release what a Dataset holds in this process (decode threads, file handles),
    so that no thread of ours is running when the next row's workers fork.

    fastdata's Datasets have ``close()``; the baseline holds nothing to release.
    """
    inner = ds.dataset if isinstance(ds, Subset) else ds
    close = getattr(inner, "close", None)
    if callable(close):
        close()


def set_epoch(ds: Dataset, epoch: int) -> None:
    """Tell a Dataset which epoch begins (a training row's crops change with it);
    a Dataset without ``set_epoch`` (the baseline) is left alone."""
    inner = ds.dataset if isinstance(ds, Subset) else ds
    setter = getattr(inner, "set_epoch", None)
    if callable(setter):
        setter(epoch)


def _worker_pids() -> set[int]:
    # DataLoader workers are multiprocessing Processes: they are listed here
    # whatever the start method (fork, spawn, forkserver), while helpers such as
    # a fork server or resource tracker are not. Listing also reaps exited ones.
    return {p.pid for p in multiprocessing.active_children() if p.pid is not None}


class LoaderFactory:
    """The DataLoader of each epoch for one row, shuffled with the same order
    for every row (a generator seeded with ``seed``).

    With persistent workers one DataLoader serves every epoch (its sampler
    draws the next permutation each time); otherwise a new DataLoader is made
    per epoch, seeded ``seed + epoch``. Either way the Dataset's ``set_epoch``
    is called with the epoch's number (0 for the first, the warm-up) before
    its DataLoader is handed out, as a training loop does. ``close()`` stops
    the workers.
    """

    def __init__(self, ds: Dataset, *, batch_size: int, workers: int, seed: int,
                 timeout: float = 600.0, persistent: bool = True) -> None:
        self.ds = ds
        self.batch_size = batch_size
        self.workers = workers
        self.seed = seed
        self.timeout = timeout
        self.persistent = persistent and workers > 0
        self._epoch = 0
        self._loader: DataLoader | None = None
        self._pids_before = _worker_pids()  # processes that are not this row's workers

    def _make(self, seed: int) -> DataLoader:
        g = torch.Generator()
        g.manual_seed(seed)
        # fastdata.collate hands on the batch tensor that fastdata's
        # __getitems__ stacked once; for every other dataset (the baseline) it
        # is torch's default_collate.
        return DataLoader(self.ds, batch_size=self.batch_size, shuffle=True,
                          num_workers=self.workers, persistent_workers=self.persistent,
                          generator=g, collate_fn=collate,
                          timeout=self.timeout if self.workers > 0 else 0)

    def __call__(self) -> DataLoader:
        epoch = self._epoch
        self._epoch += 1
        # Before the loader is iterated: workers (persistent ones too) read
        # the epoch from shared memory when they fetch.
        set_epoch(self.ds, epoch)
        if self.persistent:
            if self._loader is None:
                self._loader = self._make(self.seed)
            return self._loader
        return self._make(self.seed + epoch)

    def close(self, timeout: float = WORKER_EXIT_TIMEOUT) -> None:
        """Stop this row's DataLoader workers and wait until they have exited.

        A DataLoader's iterator shuts its workers down (and joins them) when it
        is collected, so dropping the last reference is enough; call this after
        any exception raised while iterating has been handled, since its
        traceback holds the iterator.

        Raises:
            MeasurementError: workers still exist ``timeout`` seconds later
                (something else still holds the DataLoader or its iterator).
        """
        workers = _worker_pids() - self._pids_before
        self._loader = None
        gc.collect()  # the iterator may sit in a reference cycle
        deadline = time.monotonic() + timeout
        while True:
            _worker_pids()  # reaps workers that have exited
            left = sorted(pid for pid in workers if process_exists(pid))
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        if left:
            raise MeasurementError(
                f"{len(left)} DataLoader worker process(es) ({', '.join(map(str, left))}) "
                f"still running {timeout:g} s after the row ended; later rows would share "
                f"the CPU with them")


def loader_factory(ds: Dataset, *, batch_size: int, workers: int, seed: int,
                   timeout: float = 600.0, persistent: bool = True) -> LoaderFactory:
    """DataLoaders for successive epochs of one row (see :class:`LoaderFactory`)."""
    return LoaderFactory(ds, batch_size=batch_size, workers=workers, seed=seed,
                         timeout=timeout, persistent=persistent)


def release_row(factory: LoaderFactory | None, ds: Dataset | None,
                error: str | None) -> str | None:
    """Stop a row's workers and close its Dataset; the row's error, if any, after that.

    Called once a failure has been handled, never while its exception is in
    flight: a traceback holds the DataLoader's iterator, and so its workers.
    """
    if factory is not None:
        try:
            factory.close()
        except Exception as exc:  # workers left running would disturb the next rows: say so
            error = error or error_text(exc)
    if ds is not None:
        try:
            close_dataset(ds)
        except Exception:  # cleanup only; the measurement stands
            pass
    return error

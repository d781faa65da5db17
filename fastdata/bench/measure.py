"""Measuring one loader: timed epochs, the output check, the page cache.

:func:`measure_loader` takes any factory of per-epoch iterables, so
``bench/peers.py`` measures other libraries' pipelines with the same code.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from fastdata.bench.cpu import children_cpu_seconds, cpu_seconds, machine_busy_seconds
from fastdata.errors import FastDataError


class MeasurementError(FastDataError):
    """A row produced the wrong output or the wrong number of samples."""


@dataclass(frozen=True)
class Measurement:
    """Figures of one loader over its measured epochs.

    Attributes:
        samples_per_s: median over the measured epochs.
        mb_per_s: stored payload read per second (MB = 10^6 bytes), median.
        cpu: CPU seconds of this process and its child processes (DataLoader
            workers) per wall second (1.85 means 185 %), over all measured epochs.
        other_cpu: CPU seconds per wall second used meanwhile by every other
            process on the machine (Linux; None elsewhere): above ~0.2 the
            figures are disturbed by other work.
        p50_ms, p99_ms: time between consecutive batches (the first batch of
            each epoch excluded: it is ``first_batch_ms``).
        first_batch_ms: median time from the start of an epoch to its first batch.
        samples: samples per epoch.
        batches: batches per epoch.
        epoch_seconds: wall time of each measured epoch.
        epoch_samples_per_s: rate of each measured epoch.
        cache: "warm" or "cold" (page cache dropped before every measured epoch).
        output_shape: shape of the first batch's images.
        output_dtype: their dtype.
    """

    samples_per_s: float
    mb_per_s: float
    cpu: float
    other_cpu: float | None
    p50_ms: float
    p99_ms: float
    first_batch_ms: float
    samples: int
    batches: int
    epoch_seconds: tuple[float, ...]
    epoch_samples_per_s: tuple[float, ...]
    cache: str
    output_shape: tuple[int, ...] | None = None
    output_dtype: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values."""
        data = asdict(self)
        data["epoch_seconds"] = list(self.epoch_seconds)
        data["epoch_samples_per_s"] = list(self.epoch_samples_per_s)
        data["output_shape"] = list(self.output_shape) if self.output_shape else None
        return data


def error_text(exc: BaseException) -> str:
    """An exception as a row's one-line error: its type and first line."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def batch_length(batch: Any) -> int:
    """Samples in a collated batch: ``(images, labels)``, a dict, or a tensor."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    elif isinstance(batch, (tuple, list)):
        batch = batch[0]
    return len(batch)


def check_batch(batch: Any, *, sample_shape: Sequence[int], dtype: torch.dtype = torch.uint8,
                batch_size: int | None = None) -> str | None:
    """Why ``batch`` is not the benchmark's output, or None when it is.

    The output every row must give is ``(images, labels)``: images a tensor of
    ``(B, *sample_shape)`` and ``dtype``, labels B integers.

    Args:
        batch: the first batch a loader returned.
        sample_shape: expected per-sample shape, e.g. (3, 224, 224).
        dtype: expected image dtype.
        batch_size: expected B, when known.
    """
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        return f"a batch is {type(batch).__name__}, expected (images, labels)"
    images, labels = batch
    if not isinstance(images, torch.Tensor):
        return f"images are {type(images).__name__}, expected a torch.Tensor"
    want = tuple(int(x) for x in sample_shape)
    if images.dtype != dtype or tuple(images.shape[1:]) != want:
        return (f"images are {tuple(images.shape)} {str(images.dtype).replace('torch.', '')}, "
                f"expected (B, {', '.join(map(str, want))}) {str(dtype).replace('torch.', '')}")
    if batch_size is not None and images.shape[0] != batch_size:
        return f"the first batch holds {images.shape[0]} images, expected {batch_size}"
    n_labels = len(labels) if hasattr(labels, "__len__") else -1
    if n_labels != images.shape[0]:
        return f"the first batch has {images.shape[0]} images but {n_labels} labels"
    if isinstance(labels, torch.Tensor) and labels.is_floating_point():
        return f"labels are {labels.dtype}, expected integers"
    return None


def drop_page_cache() -> str | None:
    """Drop the OS page cache (Linux, root). Returns None, or why it cannot."""
    if not sys.platform.startswith("linux"):
        return f"dropping the page cache is only done on Linux, not {sys.platform}"
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        return (f"cannot drop the page cache ({exc.strerror or exc}); it needs root on Linux "
                f"(sync; echo 3 > /proc/sys/vm/drop_caches)")
    return None


@dataclass
class _Epoch:
    wall: float
    cpu: float
    samples: int
    gaps: list[float]
    first: Any = None
    other: float | None = None


def _run_epoch(make_loader: Callable[[], Iterable], keep_first: bool) -> _Epoch:
    loader = make_loader()
    gc.collect()  # no collection of the previous epoch's garbage inside the timing
    # Persistent workers live on between epochs, so their CPU time is never
    # reaped into cpu_seconds(): read the live child processes' from /proc
    # (before the clock starts: it takes a few reads per thread of ours).
    persistent = bool(getattr(loader, "persistent_workers", False))
    busy0 = machine_busy_seconds()
    cpu0 = cpu_seconds() + (children_cpu_seconds() if persistent else 0.0)
    t0 = last = time.perf_counter()
    gaps: list[float] = []
    samples = 0
    first = None
    it = iter(loader)
    for batch in it:
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        samples += batch_length(batch)
        if keep_first and first is None:
            first = batch
    wall = time.perf_counter() - t0
    live = children_cpu_seconds() if persistent else 0.0
    del it  # non-persistent workers are joined (reaped) here at the latest
    cpu = cpu_seconds() + live - cpu0
    busy1 = machine_busy_seconds()
    # CPU that other processes used meanwhile: a sign that the figure is low
    # because something else was running.
    other = None if busy0 is None or busy1 is None else max(0.0, busy1 - busy0 - cpu)
    return _Epoch(wall, cpu, samples, gaps, first, other)


def _release_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames in ``exc``'s tracebacks (and its causes').

    They hold the epoch's loader and DataLoader iterator, and a traceback is often
    part of a reference cycle. Left alone, the iterator is freed by the cycle
    collector, which finalizes the worker queues before the iterator: torch's
    shutdown message never reaches the workers and it waits its 5 s status
    interval for each. Cleared, the iterator goes with its last reference and
    its workers stop at once. The traceback still prints (it keeps its lines).
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # skips frames still running
        exc = exc.__cause__ or exc.__context__


def _describe(batch: Any) -> tuple[tuple[int, ...] | None, str | None]:
    images = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if isinstance(images, torch.Tensor):
        return tuple(images.shape), str(images.dtype).replace("torch.", "")
    return None, None


def measure_loader(
    make_loader: Callable[[], Iterable],
    *,
    epochs: int = 3,
    warmup: int = 1,
    payload_bytes: int = 0,
    expected_samples: int | None = None,
    check: Callable[[Any], str | None] | None = None,
    cold: bool = False,
    on_epoch: Callable[[], None] | None = None,
) -> Measurement:
    """Time full passes over a loader.

    Args:
        make_loader: returns the iterable for one epoch (a DataLoader, or any
            iterable of batches); called once per epoch, outside the timing.
        epochs: measured epochs.
        warmup: epochs run first and discarded (caches, lazy opens, imports).
        payload_bytes: stored bytes read per epoch, for MB/s.
        expected_samples: samples an epoch must yield; a different count fails.
        check: called with the first batch; a returned string fails the row.
        cold: drop the page cache before every measured epoch (the caller
            checks first that :func:`drop_page_cache` works).
        on_epoch: called after every epoch (progress display).

    Raises:
        MeasurementError: ``check`` refused the output, or an epoch yielded a
            different number of samples than expected.
    """
    first_checked = False
    measured: list[_Epoch] = []
    for index in range(warmup + epochs):
        is_measured = index >= warmup
        if is_measured and cold:
            reason = drop_page_cache()
            if reason:
                raise MeasurementError(reason)
        try:
            epoch = _run_epoch(make_loader, keep_first=not first_checked)
        except Exception as exc:
            _release_frames(exc)
            raise
        if not first_checked:
            first_checked = True
            if epoch.first is None:
                raise MeasurementError("the loader yielded no batch")
            info = epoch.first
            epoch.first = None
            reason = check(info) if check is not None else None
            if reason:
                raise MeasurementError(f"wrong output: {reason}")
            shape, dtype = _describe(info)
            del info
        if expected_samples is not None and epoch.samples != expected_samples:
            raise MeasurementError(f"an epoch yielded {epoch.samples} samples, expected "
                                   f"{expected_samples} (each sample exactly once)")
        if is_measured:
            measured.append(epoch)
        if on_epoch is not None:
            on_epoch()
    return _summarize(measured, payload_bytes=payload_bytes, cold=cold,
                      output_shape=shape, output_dtype=dtype)


def _summarize(measured: list[_Epoch], *, payload_bytes: int, cold: bool,
               output_shape: tuple[int, ...] | None, output_dtype: str | None) -> Measurement:
    rates = [e.samples / e.wall if e.wall > 0 else 0.0 for e in measured]
    mbs = [payload_bytes / e.wall / 1e6 if e.wall > 0 else 0.0 for e in measured]
    steady = [g for e in measured for g in e.gaps[1:]] or [g for e in measured for g in e.gaps]
    wall = sum(e.wall for e in measured)
    return Measurement(
        samples_per_s=statistics.median(rates),
        mb_per_s=statistics.median(mbs),
        cpu=sum(e.cpu for e in measured) / wall if wall > 0 else 0.0,
        other_cpu=(sum(e.other for e in measured) / wall
                   if wall > 0 and all(e.other is not None for e in measured) else None),
        p50_ms=float(np.percentile(steady, 50)) * 1e3 if steady else 0.0,
        p99_ms=float(np.percentile(steady, 99)) * 1e3 if steady else 0.0,
        first_batch_ms=statistics.median(e.gaps[0] for e in measured if e.gaps) * 1e3
        if any(e.gaps for e in measured) else 0.0,
        samples=measured[-1].samples,
        batches=len(measured[-1].gaps),
        epoch_seconds=tuple(e.wall for e in measured),
        epoch_samples_per_s=tuple(rates),
        cache="cold" if cold else "warm",
        output_shape=output_shape,
        output_dtype=output_dtype,
    )

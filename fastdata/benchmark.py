"""``fastdata bench``: data-loading throughput on this machine, every format side by side.

One run measures, with identical output size, batch size, shuffling and
DataLoader workers:

* the baseline: a plain image folder read the way torchvision's ``ImageFolder``
  does it (one file open + PIL decode + PIL resize per ``__getitem__``);
* the same images packed into every registered format (and optional pack-time
  variants), read through fastdata's own map-style Datasets.

Rules that keep the figures honest:

* every row returns the same thing: a batch of ``(B, 3, S, S)`` uint8 images and
  ``B`` int64 labels; a row whose first batch differs is marked failed;
* every row reads every sample of the epoch exactly once (counted);
* one warm-up epoch is run and discarded; the figure is the median of the
  measured epochs;
* every row decodes, unless its stored format is pre-decoded ("raw"), which is
  then said in its name;
* workers are persistent, as in a training run (``fastdata.loader`` sets it):
  worker start-up falls in the warm-up epoch, and the CPU time of the live
  workers is read from /proc; ``--no-persistent-workers`` restarts workers
  every epoch (PyTorch's default), start-up included in every epoch.

The measurement loop, :func:`measure_loader`, takes any loader factory, so
``bench/peers.py`` measures other libraries' pipelines with the same code.
"""

from __future__ import annotations

import datetime as _dt
import gc
import importlib
import json
import os
import platform
import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from fastdata import __version__
from fastdata.errors import FastDataError, SourceError, UnknownFormatError
from fastdata.loaders.collate import collate
from fastdata.machine import meminfo, usable_cores

BASELINE_NAME = "folder (PIL)"
#: Other processes' CPU use (cores) above which a measurement is flagged as disturbed.
OTHER_CPU_WARN = 0.2
RAW_LABEL = "raw (pre-decoded)"
DECODERS = ("auto", "pil", "opencv", "simplejpeg", "jpeg4py")

#: Libraries whose versions are recorded with the results (distribution names).
_VERSIONED = ("torch", "numpy", "Pillow", "opencv-python-headless", "opencv-python",
              "simplejpeg", "lmdb", "h5py", "tfrecord", "webdataset", "click")


class MeasurementError(FastDataError):
    """A row produced the wrong output or the wrong number of samples."""


# --------------------------------------------------------------------------- #
# Options and parsing
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Variant:
    """How the images are stored: original bytes, resized at pack time, or raw pixels.

    Attributes:
        name: "keep", "resizeN" or "raw".
        preprocess: the pack-time preprocessing it stands for.
    """

    name: str
    preprocess: Any

    @property
    def suffix(self) -> str:
        """What is appended to the format's name in a row name."""
        if self.name == "keep":
            return ""
        if self.name == "raw":
            return " " + RAW_LABEL
        return " " + self.name


def parse_variants(text: str | Sequence[str], size: int) -> list[Variant]:
    """Parse ``--variants`` ("keep,resize256,raw").

    Args:
        text: comma-separated names, or a sequence of them.
        size: the benchmark's output side S: ``raw`` stores S x S pixels.

    Raises:
        FastDataError: an unknown variant name.
    """
    from fastdata.packers.preprocess import Preprocess

    names = [t.strip().lower() for t in (text.split(",") if isinstance(text, str) else text)]
    out: list[Variant] = []
    for name in dict.fromkeys(n for n in names if n):
        if name == "keep":
            out.append(Variant(name, Preprocess()))
        elif name == "raw":
            out.append(Variant(name, Preprocess(resize=(size, size), encoding="raw")))
        elif m := re.fullmatch(r"resize(\d+)", name):
            side = int(m.group(1))
            if side < 1:
                raise FastDataError(f"--variants: {name!r} needs a positive size")
            out.append(Variant(name, Preprocess(resize=side, encoding="keep")))
        else:
            raise FastDataError(f"unknown variant {name!r} in --variants; use keep, resizeN "
                                f"(for example resize256) or raw")
    if not out:
        raise FastDataError("--variants names no variant; use keep, resizeN or raw")
    return out


def parse_workers(text: str | int | Sequence[int]) -> tuple[int, ...]:
    """Parse ``--workers`` ("0,1,2,4") into a tuple of distinct worker counts.

    Raises:
        FastDataError: not a list of non-negative integers.
    """
    if isinstance(text, int):
        items: Iterable = [text]
    elif isinstance(text, str):
        items = [t for t in text.replace(" ", "").split(",") if t]
    else:
        items = text
    try:
        counts = tuple(dict.fromkeys(int(x) for x in items))
    except ValueError:
        raise FastDataError(f"--workers must be comma-separated integers such as 0,1,2,4, "
                            f"not {text!r}") from None
    if not counts or min(counts) < 0:
        raise FastDataError(f"--workers needs counts of 0 or more, not {text!r}")
    return counts


def parse_formats(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """Parse ``--formats`` (default: every registered format).

    Raises:
        UnknownFormatError: a name that is not registered.
    """
    from fastdata.formats import FORMATS, get_format

    if text is None or text == "" or text == "all":
        return tuple(FORMATS)
    names = text.split(",") if isinstance(text, str) else list(text)
    return tuple(dict.fromkeys(get_format(n.strip()).name for n in names if n.strip()))


@dataclass(frozen=True)
class BenchOptions:
    """Settings shared by every row of one benchmark run.

    Attributes:
        size: output side S; every row returns S x S images.
        batch_size: DataLoader batch size.
        workers: DataLoader worker counts to sweep.
        epochs: measured epochs (the median is reported).
        warmup: epochs run first and discarded.
        decoder: decoder of the fastdata rows (the baseline always uses PIL).
        cold: drop the page cache before every measured epoch.
        seed: shuffling seed (every row sees the same order) and ``limit`` selection.
        limit: use only this many samples (a seeded random selection).
        timeout: seconds a DataLoader worker may take for one batch before the
            row fails instead of hanging.
        ram_cache: fastdata rows hold their payloads in the shared RAM cache
            (``cache="ram"``); the baseline reads its files as before.
        persistent_workers: keep DataLoader workers between epochs (every row alike).
    """

    size: int = 224
    batch_size: int = 64
    workers: tuple[int, ...] = (2,)
    epochs: int = 3
    warmup: int = 1
    decoder: str = "auto"
    cold: bool = False
    seed: int = 0
    limit: int | None = None
    timeout: float = 600.0
    ram_cache: bool = False
    persistent_workers: bool = True

    def __post_init__(self) -> None:
        if self.size < 1:
            raise FastDataError(f"--size must be positive, not {self.size}")
        if self.batch_size < 1:
            raise FastDataError(f"--batch-size must be positive, not {self.batch_size}")
        if self.epochs < 1:
            raise FastDataError(f"--epochs must be at least 1, not {self.epochs}")
        if self.warmup < 0:
            raise FastDataError(f"warm-up epochs cannot be negative, not {self.warmup}")
        if self.limit is not None and self.limit < 1:
            raise FastDataError(f"--limit must be positive, not {self.limit}")
        if self.decoder not in DECODERS:
            raise FastDataError(f"unknown decoder {self.decoder!r}; choose one of "
                                f"{', '.join(DECODERS)}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["workers"] = list(self.workers)
        return data


# --------------------------------------------------------------------------- #
# The baseline
# --------------------------------------------------------------------------- #


class ImageFolderBaseline(Dataset):
    """The plain image-folder pipeline: torchvision's ``ImageFolder`` with
    ``Resize((S, S))`` and ``PILToTensor()``, written out without torchvision.

    Each ``__getitem__`` opens one file, decodes it with PIL, converts it to
    RGB, resizes it to (S, S) with PIL's bilinear filter (what torchvision's
    Resize does on PIL images) and returns a uint8 CHW tensor. There is no
    ``__getitems__``: the DataLoader fetches sample by sample and collates
    with its default collate function, as it does for torchvision.

    Args:
        samples: (path, label) pairs, in the source's order.
        size: (height, width) of the output.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], size: tuple[int, int]) -> None:
        self.samples = list(samples)
        self.size = (int(size[0]), int(size[1]))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        from PIL import Image

        path, label = self.samples[index]
        with open(path, "rb") as f:  # torchvision's pil_loader
            img = Image.open(f)
            img = img.convert("RGB")
        img = img.resize((self.size[1], self.size[0]), Image.Resampling.BILINEAR)
        array = np.array(img, copy=True)  # torchvision's PILToTensor copies too
        return torch.from_numpy(array).permute(2, 0, 1), label


# --------------------------------------------------------------------------- #
# Measuring one loader
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Measurement:
    """Figures of one loader over its measured epochs.

    Attributes:
        samples_per_s: median over the measured epochs.
        mb_per_s: stored payload read per second (MB = 10^6 bytes), median.
        cpu: CPU seconds of this process and its reaped children per wall
            second (1.85 means 185 %), over all measured epochs.
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
        data = asdict(self)
        data["epoch_seconds"] = list(self.epoch_seconds)
        data["epoch_samples_per_s"] = list(self.epoch_samples_per_s)
        data["output_shape"] = list(self.output_shape) if self.output_shape else None
        return data


def batch_length(batch) -> int:
    """Samples in a collated batch: ``(images, labels)``, a dict, or a tensor."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    elif isinstance(batch, (tuple, list)):
        batch = batch[0]
    return len(batch)


def check_batch(batch, *, sample_shape: Sequence[int], dtype: torch.dtype = torch.uint8,
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


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (user + system), in seconds.

    getrusage has microsecond resolution; os.times (the fallback off Unix)
    counts clock ticks of 10 ms, too coarse for short epochs.
    """
    try:
        import resource
    except ImportError:  # not on Unix
        t = os.times()
        return t[0] + t[1] + t[2] + t[3]
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine has used since boot (Linux), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    values = [int(x) for x in fields[1:9]]
    busy = sum(values) - values[3] - values[4]
    return busy / ticks


def worker_cpu_seconds(it) -> float:
    """CPU time (user + system) of a DataLoader iterator's live worker processes,
    from /proc (0 off Linux, or when the iterator has no workers)."""
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for w in getattr(it, "_workers", None) or []:
        try:
            with open(f"/proc/{w.pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, ValueError, IndexError, AttributeError):
            continue
    return total


def _run_epoch(make_loader: Callable[[], Iterable], keep_first: bool) -> _Epoch:
    loader = make_loader()
    gc.collect()  # no collection of the previous epoch's garbage inside the timing
    busy0 = machine_busy_seconds()
    cpu0 = cpu_seconds()
    t0 = last = time.perf_counter()
    gaps: list[float] = []
    samples = 0
    first = None
    it = iter(loader)
    # Persistent workers live on between epochs: count their CPU from /proc.
    cpu0 += worker_cpu_seconds(it) if getattr(loader, "persistent_workers", False) else 0.0
    for batch in it:
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        samples += batch_length(batch)
        if keep_first and first is None:
            first = batch
    wall = time.perf_counter() - t0
    live = worker_cpu_seconds(it) if getattr(loader, "persistent_workers", False) else 0.0
    del it  # non-persistent workers are joined (reaped) here at the latest
    cpu = cpu_seconds() + live - cpu0
    busy1 = machine_busy_seconds()
    # CPU that other processes used meanwhile: a sign that the figure is low
    # because something else was running.
    other = None if busy0 is None or busy1 is None else max(0.0, busy1 - busy0 - cpu)
    return _Epoch(wall, cpu, samples, gaps, first, other)


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
        epoch = _run_epoch(make_loader, keep_first=not first_checked)
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
        output_shape=shape,
        output_dtype=dtype,
    )


def _describe(batch) -> tuple[tuple[int, ...] | None, str | None]:
    images = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if isinstance(images, torch.Tensor):
        return tuple(images.shape), str(images.dtype).replace("torch.", "")
    return None, None


# --------------------------------------------------------------------------- #
# What to measure: targets
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Target:
    """One row of the benchmark: a folder or a packed dataset.

    Attributes:
        name: row name ("folder (PIL)", "lmdb", "lmdb resize256", ...).
        kind: "folder" (the baseline) or "packed".
        format: "folder" or a registered format name.
        variant: "keep", "resizeN", "raw", or "existing" for a dataset given as is.
        path: the folder or dataset.
        count: samples per epoch.
        payload_bytes: stored bytes read per epoch.
        size_bytes: size on disk of the whole dataset (None for a folder).
        pack_seconds: how long packing took (None when not packed here).
        samples: (path, label) pairs of a folder target.
        indices: the records used, when ``limit`` selects part of a dataset.
        error: why this row cannot be measured (packing or opening failed).
    """

    name: str
    kind: str
    format: str
    variant: str
    path: str | None
    count: int = 0
    payload_bytes: int = 0
    size_bytes: int | None = None
    pack_seconds: float | None = None
    samples: tuple[tuple[str, int], ...] = ()
    indices: tuple[int, ...] | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        """What is stored, in words."""
        if self.kind == "folder":
            return "image files, PIL decode + resize per sample"
        if self.variant == "raw" or self.name.endswith(RAW_LABEL):
            return RAW_LABEL
        if self.variant.startswith("resize"):
            return f"re-encoded at pack time, shorter side {self.variant[6:]}"
        return "original bytes"


def select_indices(n: int, limit: int | None, seed: int) -> list[int] | None:
    """A seeded random selection of ``limit`` of ``n`` indices, sorted; None for all."""
    if limit is None or limit >= n:
        return None
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(n, size=limit, replace=False))


def folder_target(root: str | os.PathLike, *, limit: int | None = None, seed: int = 0,
                  name: str = BASELINE_NAME) -> Target:
    """The baseline row over an image folder (a seeded selection under ``limit``).

    Raises:
        SourceError: ``root`` is not an image folder.
    """
    from fastdata.packers.source import ImageFolderSource

    src = ImageFolderSource(root)
    entries = list(src.entries)
    chosen = select_indices(len(entries), limit, seed)
    if chosen is not None:
        entries = [entries[i] for i in chosen]
    size = sum(os.path.getsize(e.path) for e in entries)
    return Target(name=name, kind="folder", format="folder", variant="keep", path=src.root,
                  count=len(entries), payload_bytes=size,
                  samples=tuple((e.path, e.label) for e in entries),
                  indices=tuple(chosen) if chosen is not None else None)


def limited_tree(root: str, dest: str, samples: Sequence[tuple[str, int]]) -> str:
    """An ImageFolder tree at ``dest`` holding only ``samples`` (symlinks, or copies
    where links are refused), with the same relative paths as under ``root``."""
    for path, _label in samples:
        rel = os.path.relpath(path, root)
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        try:
            os.symlink(path, out)
        except OSError:  # no symlinks here (some file systems): copy instead
            shutil.copyfile(path, out)
    return dest


def pack_targets(
    source: str | os.PathLike,
    work_dir: str | os.PathLike,
    *,
    formats: Sequence[str],
    variants: Sequence[Variant],
    limit: int | None = None,
    seed: int = 0,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Target]:
    """Pack ``source`` into every format and variant; the baseline row first.

    A format whose pack fails gives a row that carries the error instead of
    stopping the benchmark.

    Raises:
        SourceError: ``source`` is not an image folder.
    """
    from fastdata.formats import get_format
    from fastdata.formats import read_manifest
    from fastdata.packers.pack import PackOptions, pack

    work_dir = os.path.abspath(os.fspath(work_dir))
    os.makedirs(work_dir, exist_ok=True)
    baseline = folder_target(source, limit=limit, seed=seed)
    pack_source = baseline.path
    if baseline.indices is not None:  # pack exactly the samples the baseline reads
        pack_source = limited_tree(baseline.path, os.path.join(work_dir, f"source-{limit}"),
                                   baseline.samples)
    targets = [baseline]
    for variant in variants:
        for fmt in formats:
            spec = get_format(fmt)
            name = spec.name + variant.suffix
            out = os.path.join(work_dir, f"{spec.name}-{variant.name}{spec.extensions[0]}")
            try:
                summary = pack(pack_source, out, progress=progress,
                               options=PackOptions(format=spec.name, overwrite=True,
                                                   preprocess=variant.preprocess))
                manifest = read_manifest(summary.output)
                targets.append(Target(
                    name=name, kind="packed", format=spec.name, variant=variant.name,
                    path=summary.output, count=manifest.count,
                    payload_bytes=int(manifest.bytes.get("payload", 0)),
                    size_bytes=int(manifest.bytes.get("on_disk", summary.bytes_out)),
                    pack_seconds=summary.seconds))
                if log:
                    log(f"packed {name}: {manifest.count} records in {summary.seconds:.1f} s, "
                        f"{summary.bytes_out / 1e6:.1f} MB on disk")
            except Exception as exc:  # a broken format must not stop the others
                reason = f"pack failed: {_error_text(exc)}"
                targets.append(Target(name=name, kind="packed", format=spec.name,
                                       variant=variant.name, path=out, error=reason))
                if log:
                    log(f"{name}: {reason}")
    return targets


def existing_target(path: str | os.PathLike, *, limit: int | None = None,
                    seed: int = 0) -> Target:
    """A row for an existing packed dataset, or (as the baseline) an image folder.

    Never raises: a path that is neither gives a row that carries the error.
    """
    from fastdata.formats import detect_format
    from fastdata.formats import read_manifest

    path = os.fspath(path)
    base = os.path.basename(path.rstrip("/\\")) or path
    if base.endswith(".fastdata.json"):  # a sharded dataset named by its manifest
        base = base[: -len(".fastdata.json")]
    try:
        spec = detect_format(path)
    except UnknownFormatError as exc:
        if os.path.isdir(path):
            try:
                return folder_target(path, limit=limit, seed=seed,
                                     name=f"{BASELINE_NAME} {base}")
            except SourceError as src_exc:
                return Target(name=base, kind="packed", format="?", variant="existing",
                              path=path, error=f"neither a packed dataset ({exc.message}) "
                                               f"nor an image folder ({src_exc.message})")
        return Target(name=base, kind="packed", format="?", variant="existing", path=path,
                      error=_error_text(exc))
    try:
        manifest = read_manifest(path)
    except Exception as exc:  # a damaged or half-written dataset is a failed row
        return Target(name=f"{spec.name} {base}", kind="packed", format=spec.name,
                      variant="existing", path=path, error=_error_text(exc))
    raw = (manifest.encoding or {}).get("storage") == "raw"
    name = f"{spec.name} {base}" + (" " + RAW_LABEL if raw else "")
    chosen = select_indices(manifest.count, limit, seed)
    count = manifest.count if chosen is None else len(chosen)
    payload = int(manifest.bytes.get("payload", 0))
    if chosen is not None and manifest.count:
        payload = round(payload * count / manifest.count)  # proportional estimate
    return Target(name=name, kind="packed", format=spec.name,
                  variant="raw" if raw else "existing", path=os.path.abspath(path),
                  count=count, payload_bytes=payload,
                  size_bytes=int(manifest.bytes.get("on_disk", 0)) or None,
                  indices=tuple(chosen) if chosen is not None else None)


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


# --------------------------------------------------------------------------- #
# Running the rows
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Result:
    """One row at one worker count (what ``--json`` lists under ``rows``)."""

    name: str
    format: str
    variant: str
    label: str
    path: str | None
    workers: int
    status: str
    error: str | None
    cache: str
    decoder: str
    samples_per_s: float | None = None
    mb_per_s: float | None = None
    ratio: float | None = None
    pack_seconds: float | None = None
    size_bytes: int | None = None
    payload_bytes: int | None = None
    cpu: float | None = None
    other_cpu: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    first_batch_ms: float | None = None
    samples: int | None = None
    batches: int | None = None
    epoch_samples_per_s: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    output_shape: list[int] | None = None
    output_dtype: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BenchReport:
    """Everything one run measured, and where."""

    machine: dict[str, Any]
    options: dict[str, Any]
    cache: str
    cache_note: str | None
    results: list[Result]
    seconds: float
    created_at: str

    @property
    def row_names(self) -> list[str]:
        return list(dict.fromkeys(r.name for r in self.results))

    def best(self) -> dict[str, Result]:
        """Per row name, its fastest worker count."""
        out: dict[str, Result] = {}
        for r in self.results:
            if r.ok and (r.name not in out or r.samples_per_s > out[r.name].samples_per_s):
                out[r.name] = r
        return out

    def fastest(self) -> Result | None:
        best = list(self.best().values())
        return max(best, key=lambda r: r.samples_per_s) if best else None

    def baseline(self) -> Result | None:
        """The baseline's best result."""
        return self.best().get(BASELINE_NAME) or next(
            (r for n, r in self.best().items() if n.startswith(BASELINE_NAME)), None)

    def to_dict(self) -> dict[str, Any]:
        fastest = self.fastest()
        return {
            "kind": "fastdata-bench",
            "version": 1,
            "created_at": self.created_at,
            "seconds": round(self.seconds, 2),
            "cache": self.cache,
            "cache_note": self.cache_note,
            "machine": self.machine,
            "options": self.options,
            "rows": [r.to_dict() for r in self.results],
            "best": {name: {"workers": r.workers, "samples_per_s": r.samples_per_s,
                            "ratio": r.ratio} for name, r in self.best().items()},
            "fastest": None if fastest is None else {
                "name": fastest.name, "workers": fastest.workers,
                "samples_per_s": fastest.samples_per_s, "ratio": fastest.ratio},
        }


def make_dataset(target: Target, options: BenchOptions):
    """The torch Dataset a row reads: the baseline, or fastdata's Dataset."""
    size = (options.size, options.size)
    if target.kind == "folder":
        return ImageFolderBaseline(target.samples, size)
    from fastdata.loaders.datasets import open_dataset

    ds = open_dataset(target.path, size=size, decoder=options.decoder,
                      cache="ram" if options.ram_cache else None, progress=False)
    if target.indices is not None:
        # Subset forwards __getitems__, so batched fetching is kept.
        return Subset(ds, list(target.indices))
    return ds


def close_dataset(ds) -> None:
    """Release what a Dataset holds in this process (decode threads, file handles),
    so that no thread of ours is running when the next row's workers fork."""
    inner = ds.dataset if isinstance(ds, Subset) else ds
    pool = getattr(inner, "_pool", None)
    if pool is not None:
        pool.shutdown(wait=True)
        inner._pool = None
        inner._pool_pid = None
    reader = getattr(inner, "reader", None)
    if reader is not None:
        reader.close()


class LoaderFactory:
    """The DataLoader of each epoch for one row, shuffled with the same order
    for every row (a generator seeded with ``seed``).

    With persistent workers one DataLoader serves every epoch (its sampler
    draws the next permutation each time); otherwise a new DataLoader is made
    per epoch, seeded ``seed + epoch``. ``close()`` stops the workers.
    """

    def __init__(self, ds, *, batch_size: int, workers: int, seed: int,
                 timeout: float = 600.0, persistent: bool = True) -> None:
        self.ds = ds
        self.batch_size = batch_size
        self.workers = workers
        self.seed = seed
        self.timeout = timeout
        self.persistent = persistent and workers > 0
        self._epoch = 0
        self._loader: DataLoader | None = None

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
        if self.persistent:
            if self._loader is None:
                self._loader = self._make(self.seed)
            return self._loader
        loader = self._make(self.seed + self._epoch)
        self._epoch += 1
        return loader

    def close(self) -> None:
        loader, self._loader = self._loader, None
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def loader_factory(ds, *, batch_size: int, workers: int, seed: int,
                   timeout: float = 600.0, persistent: bool = True) -> LoaderFactory:
    """DataLoaders for successive epochs of one row (see :class:`LoaderFactory`)."""
    return LoaderFactory(ds, batch_size=batch_size, workers=workers, seed=seed,
                         timeout=timeout, persistent=persistent)


def run_bench(
    targets: Sequence[Target],
    options: BenchOptions,
    *,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
    machine: dict[str, Any] | None = None,
) -> BenchReport:
    """Measure every target at every worker count.

    Worker counts are the outer loop, so that a row and the baseline it is
    compared with are measured close together in time.

    Args:
        targets: the rows (the baseline is the target whose kind is "folder").
        options: shared settings.
        progress: show a progress bar (None: when stderr is a terminal).
        log: receives one line per finished measurement and notes.
    """
    from fastdata.loaders.decode import check_decoder
    from fastdata.progress import progress_bar

    check_decoder(options.decoder)
    if machine is None:
        machine = machine_info()  # before the run: its load average is the one that matters
    started = time.perf_counter()
    cache, note = "warm", None
    if options.cold:
        reason = drop_page_cache()
        if reason:
            note = f"--cold: {reason}; running warm"
        else:
            cache = "cold"
            note = "page cache dropped before every measured epoch"
    measurable = [t for t in targets if t.error is None]
    bar = progress_bar(len(measurable) * len(options.workers) * (options.warmup + options.epochs),
                       "bench", enabled=progress, unit="epoch")

    def say(line: str) -> None:
        if hasattr(bar, "write"):  # a tqdm bar: print above it
            bar.write(line, file=sys.stderr)
        elif log is not None:
            log(line)

    if note and cache == "warm":
        say(f"warning: {note}")
    sample_shape = (3, options.size, options.size)
    results: list[Result] = []
    # The baseline first in each worker group, so every line logged can carry its ratio.
    in_order = sorted(targets, key=lambda t: t.kind != "folder")
    try:
        for workers in options.workers:
            baseline_rate: float | None = None
            for target in in_order:
                result = _measure_target(target, options, workers, cache, sample_shape,
                                         on_epoch=lambda: bar.update(1))
                if target.kind == "folder" and result.ok and baseline_rate is None:
                    baseline_rate = result.samples_per_s
                if result.ok and baseline_rate:
                    result = replace(result, ratio=result.samples_per_s / baseline_rate)
                results.append(result)
                say(describe_result(result))
    finally:
        bar.close()
    order = {t.name: i for i, t in enumerate(in_order)}
    results.sort(key=lambda r: (order.get(r.name, len(order)),
                                options.workers.index(r.workers)))
    return BenchReport(
        machine=machine,
        options=options.to_dict(),
        cache=cache,
        cache_note=note,
        results=results,
        seconds=time.perf_counter() - started,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


def _measure_target(target: Target, options: BenchOptions, workers: int, cache: str,
                    sample_shape: tuple[int, ...], on_epoch: Callable[[], None]) -> Result:
    common = dict(name=target.name, format=target.format, variant=target.variant,
                  label=target.label, path=target.path, workers=workers, cache=cache,
                  decoder="pil" if target.kind == "folder" else options.decoder,
                  pack_seconds=target.pack_seconds, size_bytes=target.size_bytes,
                  payload_bytes=target.payload_bytes or None)
    if target.error is not None:
        return Result(status="failed", error=target.error, **common)
    ds = None
    try:
        ds = make_dataset(target, options)
        n = len(ds)
        expected_b = min(options.batch_size, n)

        def check(batch) -> str | None:
            return check_batch(batch, sample_shape=sample_shape, batch_size=expected_b)

        factory = loader_factory(ds, batch_size=options.batch_size, workers=workers,
                                 seed=options.seed, timeout=options.timeout,
                                 persistent=options.persistent_workers)
        try:
            m = measure_loader(
                factory, epochs=options.epochs, warmup=options.warmup,
                payload_bytes=target.payload_bytes, expected_samples=n, check=check,
                cold=cache == "cold", on_epoch=on_epoch)
        finally:
            factory.close()
    except Exception as exc:  # any failure of a format is that row's result, not a crash
        return Result(status="failed", error=_error_text(exc), **common)
    finally:
        if ds is not None:
            try:
                close_dataset(ds)
            except Exception:  # cleanup only; the measurement stands
                pass
    return Result(status="ok", error=None, samples_per_s=m.samples_per_s, mb_per_s=m.mb_per_s,
                  cpu=m.cpu, other_cpu=m.other_cpu, p50_ms=m.p50_ms, p99_ms=m.p99_ms,
                  first_batch_ms=m.first_batch_ms,
                  samples=m.samples, batches=m.batches,
                  epoch_samples_per_s=list(m.epoch_samples_per_s),
                  epoch_seconds=list(m.epoch_seconds),
                  output_shape=list(m.output_shape) if m.output_shape else None,
                  output_dtype=m.output_dtype, **common)


def describe_result(r: Result) -> str:
    """One line for the log (stderr) about a finished measurement."""
    head = f"{r.name}, {r.workers} worker{'s' if r.workers != 1 else ''}"
    if not r.ok:
        return f"{head}: FAILED: {r.error}"
    ratio = f", {r.ratio:.2f}x baseline" if r.ratio is not None else ""
    return (f"{head}: {r.samples_per_s:,.0f} samples/s, {r.mb_per_s:.1f} MB/s{ratio}, "
            f"CPU {r.cpu * 100:.0f}%, p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms ({r.cache})")


# --------------------------------------------------------------------------- #
# The machine
# --------------------------------------------------------------------------- #


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, OS, Python and library versions of this machine."""
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    cpu = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = meminfo("MemTotal")
    cores = usable_cores()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    versions = {dist: version(dist) for dist in _VERSIONED}
    try:
        cv2 = importlib.import_module("cv2")
        versions["cv2"] = getattr(cv2, "__version__", None)
    except ImportError:
        versions["cv2"] = None
    versions["fastdata"] = __version__
    return {
        "cpu_model": cpu or platform.processor() or platform.machine(),
        "usable_cores": cores,
        "logical_cpus": os.cpu_count(),
        "memory_total_bytes": memory,
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "load_average_at_start": load,
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
        "fastdata_version": __version__,
    }


def machine_line(machine: dict[str, Any]) -> str:
    """The machine in one line (table header, plot title)."""
    mem = machine.get("memory_total_bytes")
    mem_text = f", {mem / 2**30:.0f} GiB" if mem else ""
    return (f"{machine.get('cpu_model')}, {machine.get('usable_cores')} cores{mem_text}, "
            f"Python {str(machine.get('python', '')).split()[-1]}, "
            f"torch {machine.get('versions', {}).get('torch')}")


# --------------------------------------------------------------------------- #
# Output: table, summary, JSON, plot
# --------------------------------------------------------------------------- #

_COLUMNS = ("row", "workers", "samples/s", "MB/s", "x baseline", "pack s", "size MB",
            "CPU %", "p50 ms", "p99 ms", "cache")


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(report: BenchReport) -> str:
    """The results as a fixed-width text table, then best workers and the fastest row."""
    rows: list[tuple[str, ...]] = []
    for r in report.results:
        if r.ok:
            rows.append((r.name, str(r.workers), _num(r.samples_per_s, ",.0f"),
                         _num(r.mb_per_s, ".1f"),
                         "-" if r.ratio is None else f"{r.ratio:.2f}x",
                         _num(r.pack_seconds, ".1f"),
                         "-" if r.size_bytes is None else f"{r.size_bytes / 1e6:.1f}",
                         _num(None if r.cpu is None else r.cpu * 100, ".0f"),
                         _num(r.p50_ms, ".1f"), _num(r.p99_ms, ".1f"), r.cache))
        else:
            rows.append((r.name, str(r.workers), f"FAILED: {r.error}"))
    widths = [len(c) for c in _COLUMNS]
    for row in rows:
        if len(row) == len(_COLUMNS):
            widths = [max(w, len(v)) for w, v in zip(widths, row)]

    def line(cells: Sequence[str]) -> str:
        if len(cells) != len(_COLUMNS):  # a failed row: the reason spans the figures
            return f"{cells[0]:<{widths[0]}}  {cells[1]:>{widths[1]}}  {cells[2]}"
        out = [f"{cells[0]:<{widths[0]}}"]
        out += [f"{v:>{w}}" for v, w in zip(cells[1:], widths[1:])]
        return "  ".join(out)

    opts = report.options
    lines = [f"fastdata bench: {opts.get('size')}x{opts.get('size')} uint8, batch "
             f"{opts.get('batch_size')}, decoder {opts.get('decoder')} (baseline: PIL), "
             f"{opts.get('epochs')} measured epoch(s) after {opts.get('warmup')} warm-up, "
             f"median; {report.cache} page cache",
             f"machine: {machine_line(report.machine)}",
             "", line(_COLUMNS), line(["-" * w for w in widths])]
    lines += [line(row) for row in rows]
    lines.append("")
    lines += summary_lines(report)
    return "\n".join(lines)


def summary_lines(report: BenchReport) -> list[str]:
    """Best worker count per row, the fastest row, and notes."""
    out = []
    best = report.best()
    if len(report.options.get("workers", [])) > 1 and best:
        out.append("best workers:")
        for name in report.row_names:
            if name in best:
                r = best[name]
                ratio = f", {r.ratio:.2f}x baseline" if r.ratio is not None else ""
                out.append(f"  {name}: {r.workers} ({r.samples_per_s:,.0f} samples/s{ratio})")
    fastest = report.fastest()
    if fastest is not None:
        ratio = (f", {fastest.ratio:.2f}x the folder baseline at {fastest.workers} workers"
                 if fastest.ratio is not None else "")
        out.append(f"fastest: {fastest.name} with {fastest.workers} worker(s): "
                   f"{fastest.samples_per_s:,.0f} samples/s{ratio}")
        base = report.baseline()
        if base is not None and base is not fastest and base.samples_per_s:
            out.append(f"  best against best: {fastest.samples_per_s / base.samples_per_s:.2f}x "
                       f"the baseline at its best worker count ({base.workers}: "
                       f"{base.samples_per_s:,.0f} samples/s)")
    failed = sorted({r.name for r in report.results if not r.ok})
    if failed:
        out.append(f"failed: {', '.join(failed)}")
    if report.cache_note:
        out.append(f"note: {report.cache_note}")
    disturbed = [r for r in report.results if r.ok and (r.other_cpu or 0) > OTHER_CPU_WARN]
    if disturbed:
        worst = max(disturbed, key=lambda r: r.other_cpu)
        out.append(f"warning: other processes used CPU during {len(disturbed)} measurement(s) "
                   f"(up to {worst.other_cpu * 100:.0f}% of a core, {worst.name}, "
                   f"{worst.workers} workers): those figures are low; rerun on an idle machine")
    out.append("CPU % = process + worker CPU time / wall time (200% = two cores busy); "
               "p50/p99 = time between batches")
    return out


def write_json(report: BenchReport, path: str) -> None:
    """Write ``report.to_dict()`` to ``path`` (atomically)."""
    tmp = f"{path}.partial"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report.to_dict(), f, indent=2, ensure_ascii=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one fixed bitmap size
        return ImageFont.load_default()


def write_plot(report: BenchReport, path: str) -> None:
    """A horizontal bar chart (PNG, drawn with Pillow) of samples/s per row at its
    best worker count, with the baseline marked by a dashed vertical line."""
    from PIL import Image, ImageDraw

    from fastdata.formats import FORMATS

    names = report.row_names
    best = report.best()
    width, bar_h, gap = 1100, 26, 12
    left, right, top = 300, 170, 92
    height = top + len(names) * (bar_h + gap) + 50
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    title_font, font, small = _font(20), _font(14), _font(12)
    opts = report.options
    draw.text((16, 12), f"fastdata bench: samples/s at the best worker count "
                        f"({opts.get('size')}x{opts.get('size')}, batch {opts.get('batch_size')}, "
                        f"{report.cache} cache)", fill="black", font=title_font)
    draw.text((16, 42), machine_line(report.machine), fill="#444444", font=small)
    draw.text((16, 60), "grey: folder baseline (PIL); blue: fastdata; orange: fastdata raw "
                        "(pre-decoded); green: other libraries; dashed line and ratios: the "
                        "baseline at its best worker count", fill="#444444", font=small)
    peak = max((r.samples_per_s for r in best.values()), default=1.0) or 1.0
    scale = (width - left - right) / peak
    base = report.baseline()
    bottom = height - 40
    draw.line([left, top - 4, left, bottom], fill="black", width=1)
    if base is not None:  # first, so that bars and figures are drawn over it
        x = left + round(base.samples_per_s * scale)
        for y in range(top - 8, bottom, 10):
            draw.line([x, y, x, min(y + 6, bottom)], fill="#d62728", width=2)
        draw.text((x + 4, height - 36), f"baseline {base.samples_per_s:,.0f}/s",
                  fill="#d62728", font=small)
    for i, name in enumerate(names):
        y = top + i * (bar_h + gap)
        draw.text((16, y + 5), name[:40], fill="black", font=font)
        r = best.get(name)
        if r is None:
            failed = next((x for x in report.results if x.name == name), None)
            reason = failed.error if failed is not None and failed.error else "failed"
            draw.text((left + 6, y + 5), f"failed: {reason}"[:100], fill="#b00020", font=font)
            continue
        if r.format == "folder":
            color = "#9e9e9e"
        elif r.format not in FORMATS:
            color = "#59a14f"
        elif RAW_LABEL in name or r.variant == "raw":
            color = "#f28e2b"
        else:
            color = "#4e79a7"
        x1 = left + max(1, round(r.samples_per_s * scale))
        draw.rectangle([left, y, x1, y + bar_h], fill=color)
        # Against the dashed line (the baseline's best), not the same worker count.
        ratio = (f"  {r.samples_per_s / base.samples_per_s:.2f}x"
                 if base is not None and base.samples_per_s and r.format != "folder" else "")
        text = f"{r.samples_per_s:,.0f}/s ({r.workers}w){ratio}"
        box = draw.textbbox((x1 + 6, y + 5), text, font=font)
        draw.rectangle([box[0] - 2, box[1] - 2, box[2] + 2, box[3] + 2], fill="white")
        draw.text((x1 + 6, y + 5), text, fill="black", font=font)
    img.save(path, format="PNG")

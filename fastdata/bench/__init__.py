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
  every epoch (PyTorch's default), start-up included in every epoch;
* a row's DataLoader workers have exited before the next row starts.

The measurement loop, :func:`measure_loader`, takes any loader factory, so
``bench/peers.py`` measures other libraries' pipelines with the same code.

Modules: :mod:`~fastdata.bench.options` (what to run), :mod:`~fastdata.bench.targets`
(the rows), :mod:`~fastdata.bench.baseline` (the image-folder Dataset),
:mod:`~fastdata.bench.loading` (Datasets and DataLoaders of a row),
:mod:`~fastdata.bench.measure` and :mod:`~fastdata.bench.cpu` (timing and CPU
accounting), :mod:`~fastdata.bench.train` (the ``--train`` rows), :mod:`~fastdata.bench.step`
(``--step-ms``: the training rows with a simulated step, through the stall meter),
:mod:`~fastdata.bench.defaults` (the defaults rows: ``fastdata.loader()`` as it
chooses, beside it at the row's best worker count), :mod:`~fastdata.bench.network`
(what the network did for a row read from a URL), :mod:`~fastdata.bench.run`
(the sweep), :mod:`~fastdata.bench.results`,
:mod:`~fastdata.bench.report` and :mod:`~fastdata.bench.plot` (the output).
Importing this package imports torch; ``import fastdata`` does not import it.
"""

from __future__ import annotations

from fastdata.bench.baseline import ImageFolderBaseline
from fastdata.bench.cpu import child_pids, children_cpu_seconds, cpu_seconds
from fastdata.bench.loading import (
    LoaderFactory,
    close_dataset,
    loader_factory,
    make_dataset,
)
from fastdata.bench.measure import (
    Measurement,
    MeasurementError,
    batch_length,
    check_batch,
    drop_page_cache,
    measure_loader,
)
from fastdata.bench.options import (
    BASELINE_NAME,
    DECODERS,
    RAW_LABEL,
    BenchOptions,
    Variant,
    parse_formats,
    parse_variants,
    parse_workers,
)
from fastdata.bench.plot import write_plot
from fastdata.bench.report import (
    OTHER_CPU_WARN,
    format_table,
    machine_info,
    machine_line,
    network_lines,
    summary_lines,
    write_json,
)
from fastdata.bench.results import BenchReport, Result, describe_result, train_summary
from fastdata.bench.run import run_bench
from fastdata.bench.step import StepResult, parse_step_ms, step_lines, step_summary
from fastdata.bench.train import decode_path, make_crop, train_lines, train_targets
from fastdata.bench.targets import (
    Target,
    existing_target,
    folder_target,
    pack_targets,
    select_indices,
)

__all__ = [
    "BASELINE_NAME", "DECODERS", "OTHER_CPU_WARN", "RAW_LABEL",
    "BenchOptions", "BenchReport", "ImageFolderBaseline", "LoaderFactory", "Measurement",
    "MeasurementError", "Result", "Target", "Variant",
    "batch_length", "check_batch", "child_pids", "children_cpu_seconds", "close_dataset",
    "cpu_seconds", "describe_result", "drop_page_cache", "existing_target", "folder_target",
    "format_table", "loader_factory", "machine_info", "machine_line", "make_dataset",
    "measure_loader", "network_lines", "pack_targets", "parse_formats", "parse_variants",
    "parse_workers",
    "run_bench", "select_indices", "summary_lines", "write_json", "write_plot",
    "decode_path", "make_crop", "train_lines", "train_summary", "train_targets",
    "StepResult", "parse_step_ms", "step_lines", "step_summary",
]

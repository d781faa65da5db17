"""Running a benchmark: every row at every worker count, into a :class:`BenchReport`."""

from __future__ import annotations

import datetime as _dt
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

# make_dataset and drop_page_cache are looked up on their modules when used, so
# a caller (a test) may substitute either there.
from fastdata.bench import loading, measure
from fastdata.bench.defaults import defaults_rows
from fastdata.bench.defaults import measurable as has_defaults
from fastdata.bench.loading import loader_factory, release_row
from fastdata.bench.measure import check_batch, error_text, measure_loader
from fastdata.bench.network import NetworkWatch
from fastdata.bench.options import TRAIN_PIPELINES, BenchOptions
from fastdata.bench.report import machine_info
from fastdata.bench.results import BenchReport, Result, describe_result
from fastdata.bench.step import StepResult, describe_step
from fastdata.bench.step_run import measure_step
from fastdata.bench.targets import Target
from fastdata.bench.train import decode_path


def _cache_mode(options: BenchOptions) -> tuple[str, str | None]:
    """"warm" or "cold" for this run, and a note on why when asked for cold."""
    if not options.cold:
        return "warm", None
    reason = measure.drop_page_cache()
    if reason:
        return "warm", f"--cold: {reason}; running warm"
    return "cold", "page cache dropped before every measured epoch"


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
        machine: the machine's description (default: :func:`machine_info` now).
    """
    from fastdata.decoding.decode import check_decoder
    from fastdata.progress import progress_bar

    check_decoder(options.decoder)
    if machine is None:
        machine = machine_info()  # before the run: its load average is the one that matters
    started = time.perf_counter()
    cache, note = _cache_mode(options)
    measurable = [t for t in targets if t.error is None]
    with_defaults = [t for t in targets if has_defaults(t, options)]
    stepped = [t for t in measurable if t.pipeline in TRAIN_PIPELINES] \
        if options.step_ms else []
    bar = progress_bar((len(measurable) * len(options.workers) + 2 * len(with_defaults)
                        + len(stepped) * len(options.workers) * len(options.step_ms))
                       * (options.warmup + options.epochs),
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
    steps: list[StepResult] = []
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
        # --step-ms: each training row again, the loop sleeping after each batch.
        for workers in options.workers:
            for target in stepped:
                for step_ms in options.step_ms:
                    step = measure_step(target, options, workers, step_ms, cache,
                                        on_epoch=lambda: bar.update(1))
                    steps.append(step)
                    say(describe_step(step))
        # Each packed row once more, as the defaults read it (after the sweep:
        # the row's best worker count is the hand-tuned setting beside it).
        for target in with_defaults:
            best = [r for r in results if r.name == target.name and r.ok]
            if not best:
                continue
            workers = max(best, key=lambda r: r.samples_per_s).workers
            for result in defaults_rows(target, options, workers, cache,
                                        on_epoch=lambda: bar.update(1)):
                results.append(result)
                say(describe_result(result))
    finally:
        bar.close()
    order = {t.name: i for i, t in enumerate(in_order)}
    # The defaults rows last, in the order they ran (the sort is stable).
    results.sort(key=lambda r: (True, 0, 0) if r.pipeline.startswith("defaults") else
                 (False, order.get(r.name, len(order)), options.workers.index(r.workers)))
    return BenchReport(
        machine=machine, options=options.to_dict(), cache=cache, cache_note=note,
        results=results, seconds=time.perf_counter() - started,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        steps=steps,
    )


def _measure_target(target: Target, options: BenchOptions, workers: int, cache: str,
                    sample_shape: tuple[int, ...], on_epoch: Callable[[], None]) -> Result:
    common: dict[str, Any] = {
        "name": target.name, "format": target.format, "variant": target.variant,
        "label": target.label, "path": target.path, "workers": workers, "cache": cache,
        "decoder": "pil" if target.kind == "folder" else options.decoder,
        "pack_seconds": target.pack_seconds, "size_bytes": target.size_bytes,
        "payload_bytes": target.payload_bytes or None, "pipeline": target.pipeline}
    if target.error is not None:
        return Result(status="failed", error=target.error, **common)
    ds = factory = m = network = None
    error: str | None = None
    try:
        ds = loading.make_dataset(target, options)
        common["decode_path"] = decode_path(ds, target, options)
        n = len(ds)
        expected_b = min(options.batch_size, n)

        def check(batch) -> str | None:
            return check_batch(batch, sample_shape=sample_shape, batch_size=expected_b)

        factory = loader_factory(ds, batch_size=options.batch_size, workers=workers,
                                 seed=options.seed, timeout=options.timeout,
                                 persistent=options.persistent_workers)
        # After the dataset is opened: its requests (manifest, index) are not the epochs'.
        watch = NetworkWatch(target.path, warmup=options.warmup)
        m = measure_loader(
            factory, epochs=options.epochs, warmup=options.warmup,
            payload_bytes=target.payload_bytes, expected_samples=n, check=check,
            cold=cache == "cold", on_epoch=watch.on_epoch(on_epoch))
        network = watch.figures(m, workers)
    except Exception as exc:  # any failure of a format is that row's result, not a crash
        error = error_text(exc)
    error = release_row(factory, ds, error)
    if error is not None:
        return Result(status="failed", error=error, **common)
    return Result(status="ok", error=None, samples_per_s=m.samples_per_s, mb_per_s=m.mb_per_s,
                  cpu=m.cpu, other_cpu=m.other_cpu, p50_ms=m.p50_ms, p99_ms=m.p99_ms,
                  first_batch_ms=m.first_batch_ms,
                  samples=m.samples, batches=m.batches,
                  epoch_samples_per_s=list(m.epoch_samples_per_s),
                  epoch_seconds=list(m.epoch_seconds),
                  output_shape=list(m.output_shape) if m.output_shape else None,
                  output_dtype=m.output_dtype, network=network, **common)

"""The "defaults" rows: what ``open_dataset`` + ``fastdata.loader()`` give with
no tuning, beside ``loader(num_workers=W)`` at the row's best worker count W.

Both give the same batches (float32 scaled to 0-1, on the default device), so
their ratio says what the defaults leave on the table; a regression in
:mod:`fastdata.loaders.choice` shows as a ratio below 1. The dataset is
opened with what a training script states anyway (the S x S size, shuffling,
the batch size), nothing that tunes speed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastdata.bench.loading import LoaderFactory
from fastdata.bench.measure import check_batch, error_text, measure_loader
from fastdata.bench.network import NetworkWatch
from fastdata.bench.options import BenchOptions
from fastdata.bench.results import BenchReport, Result
from fastdata.bench.targets import Target

DEFAULTS = "defaults"
TUNED = "defaults, tuned"


class _Loader(LoaderFactory):
    """One ``fastdata.loader()`` for every epoch (it goes on to the next epoch
    itself); ``workers`` None: the loader chooses."""

    def __init__(self, ds, workers: int | None, options: BenchOptions) -> None:
        super().__init__(ds, batch_size=options.batch_size, workers=workers or 0,
                         seed=options.seed, timeout=options.timeout, persistent=True)
        self.chosen = workers
        self.choice = None

    def __call__(self):
        if self._loader is None:
            from fastdata.loaders.make_loader import loader

            kw = {} if self.chosen is None else {"num_workers": self.chosen}
            self._loader = loader(self.ds, **kw)
            self.choice = self._loader.choice
        return self._loader


def _open(target: Target, options: BenchOptions):
    import fastdata

    order = fastdata.Order(shuffle=True, seed=options.seed, batch_size=options.batch_size)
    decode = fastdata.Decode(size=(options.size, options.size))
    if target.format == "mixture":
        return fastdata.mix(target.path, decode=decode, order=order)
    return fastdata.open_dataset(target.path, decode=decode, order=order)


def measurable(target: Target, options: BenchOptions) -> bool:
    """Whether ``target`` gets defaults rows (packed data, every record)."""
    return (target.kind != "folder" and target.error is None and target.indices is None
            and not options.train and not options.ram_cache)


def defaults_rows(target: Target, options: BenchOptions, best_workers: int, cache: str,
                  on_epoch: Callable[[], None]) -> list[Result]:
    """``target`` read by ``loader()`` as it chooses, then at ``best_workers``."""
    rows = []
    for pipeline, workers in ((DEFAULTS, None), (TUNED, best_workers)):
        name = f"{target.name} [loader()]" if workers is None \
            else f"{target.name} [loader(num_workers={workers})]"
        common: dict[str, Any] = {
            "name": name, "format": target.format, "variant": target.variant,
            "label": target.label, "path": target.path, "cache": cache,
            "decoder": "auto", "pack_seconds": None, "size_bytes": target.size_bytes,
            "payload_bytes": target.payload_bytes or None, "pipeline": pipeline}
        ds = factory = None
        try:
            ds = _open(target, options)
            factory = _Loader(ds, workers, options)
            batch = min(options.batch_size, len(ds))
            watch = NetworkWatch(target.path, warmup=options.warmup)
            m = measure_loader(
                factory, epochs=options.epochs, warmup=options.warmup,
                payload_bytes=target.payload_bytes, expected_samples=len(ds),
                check=lambda b: check_batch(b, sample_shape=(3, options.size, options.size),
                                            dtype=torch.float32, batch_size=batch),
                cold=cache == "cold", on_epoch=watch.on_epoch(on_epoch))
            chosen = factory.choice
            network = watch.figures(m, chosen.num_workers)
            rows.append(Result(
                status="ok", error=None, workers=chosen.num_workers,
                decode_path=str(chosen), samples_per_s=m.samples_per_s, mb_per_s=m.mb_per_s,
                cpu=m.cpu, other_cpu=m.other_cpu, p50_ms=m.p50_ms, p99_ms=m.p99_ms,
                first_batch_ms=m.first_batch_ms, samples=m.samples, batches=m.batches,
                epoch_samples_per_s=list(m.epoch_samples_per_s),
                epoch_seconds=list(m.epoch_seconds),
                output_shape=list(m.output_shape) if m.output_shape else None,
                output_dtype=m.output_dtype, network=network, **common))
        except Exception as exc:  # a failed row is reported, never a crash of the run
            rows.append(Result(status="failed", error=error_text(exc),
                               workers=-1 if workers is None else workers, **common))
        finally:
            if factory is not None:
                factory.close()
            if ds is not None:
                ds.close()
    return rows


def defaults_lines(report: BenchReport) -> list[str]:
    """Per packed row: the defaults' samples/s, how they ran, and the ratio to
    ``loader()`` at the row's best worker count."""
    by_target: dict[str, dict[str, Result]] = {}
    for r in report.results:
        if r.pipeline in (DEFAULTS, TUNED) and r.ok:
            by_target.setdefault(r.name.rsplit(" [", 1)[0], {})[r.pipeline] = r
    if not by_target:
        return []
    out = ["defaults (open_dataset + fastdata.loader(), float32 0-1 batches) against "
           "loader(num_workers=W) at the row's best worker count W:"]
    for name, pair in by_target.items():
        if DEFAULTS in pair and TUNED in pair:
            d, t = pair[DEFAULTS], pair[TUNED]
            out.append(f"  {name}: {d.samples_per_s:,.0f} samples/s, "
                       f"{d.samples_per_s / t.samples_per_s:.2f}x W={t.workers} "
                       f"({t.samples_per_s:,.0f}); chose {d.decode_path}")
    return out

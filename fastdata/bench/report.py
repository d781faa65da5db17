"""Reporting a run: the machine, the text table and its summary, and the JSON file."""

from __future__ import annotations

import importlib
import json
import os
import platform
from collections.abc import Sequence
from typing import Any

import torch

from fastdata import __version__
from fastdata.bench.results import BenchReport
from fastdata.bench.train import train_lines
from fastdata.decoding.decode import decoder_status, decoder_status_line
from fastdata.machine import meminfo, usable_cores
from fastdata.storage.partial import replace_file

#: Other processes' CPU use (cores) above which a measurement is flagged as disturbed.
OTHER_CPU_WARN = 0.2

#: Libraries whose versions are recorded with the results (distribution names).
_VERSIONED = ("torch", "numpy", "Pillow", "opencv-python-headless", "opencv-python",
              "simplejpeg", "lmdb", "h5py", "tfrecord", "webdataset", "click")

_COLUMNS = ("row", "workers", "samples/s", "MB/s", "x baseline", "pack s", "size MB",
            "CPU %", "p50 ms", "p99 ms", "cache")


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    versions = {dist: version(dist) for dist in _VERSIONED}
    try:
        cv2 = importlib.import_module("cv2")
        versions["cv2"] = getattr(cv2, "__version__", None)
    except ImportError:
        versions["cv2"] = None
    versions["fastdata"] = __version__
    return versions


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, OS, Python, library versions and decoders of this machine."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu_model": _cpu_model() or platform.processor() or platform.machine(),
        "usable_cores": usable_cores(),
        "logical_cpus": os.cpu_count(),
        "memory_total_bytes": meminfo("MemTotal"),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "load_average_at_start": load,
        "torch_threads": torch.get_num_threads(),
        "versions": _versions(),
        "decoders": decoders_info(),
        "fastdata_version": __version__,
    }


def decoders_info() -> dict[str, Any]:
    """The decoders offered here, and why each other registered one is not."""
    status = decoder_status()
    return {"offered": [n for n, why in status.items() if why is None],
            "not_offered": {n: why for n, why in status.items() if why is not None}}


def machine_line(machine: dict[str, Any]) -> str:
    """The machine in one line (table header, plot title)."""
    mem = machine.get("memory_total_bytes")
    mem_text = f", {mem / 2**30:.0f} GiB" if mem else ""
    return (f"{machine.get('cpu_model')}, {machine.get('usable_cores')} cores{mem_text}, "
            f"Python {str(machine.get('python', '')).split()[-1]}, "
            f"torch {machine.get('versions', {}).get('torch')}")


def decoders_line(decoders: dict[str, Any]) -> str:
    """``simplejpeg, opencv, pil; not offered: jpeg4py (REASON)``."""
    status: dict[str, str | None] = dict.fromkeys(decoders.get("offered") or [])
    status.update(decoders.get("not_offered") or {})
    return decoder_status_line(status)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _cells(report: BenchReport) -> list[tuple[str, ...]]:
    """One tuple of cells per result; a failed one has three (name, workers, reason)."""
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
    return rows


def format_table(report: BenchReport) -> str:
    """The results as a fixed-width text table, then best workers and the fastest row."""
    rows = _cells(report)
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
    header = (f"fastdata bench: {opts.get('size')}x{opts.get('size')} uint8, batch "
              f"{opts.get('batch_size')}, decoder {opts.get('decoder')} (baseline: PIL), "
              f"{opts.get('epochs')} measured epoch(s) after {opts.get('warmup')} warm-up, "
              f"median; {report.cache} page cache")
    if opts.get("train"):
        header += (f"\ntraining rows: RandomResizedCrop({opts.get('size')}) with flips, "
                   f"seed {opts.get('seed')}, new crops every epoch (set_epoch)")
    lines = [header, f"machine: {machine_line(report.machine)}"]
    decoders = report.machine.get("decoders")
    if isinstance(decoders, dict):  # reports written before it was recorded have none
        lines.append(f"decoders: {decoders_line(decoders)}")
    lines += ["", line(_COLUMNS), line(["-" * w for w in widths])]
    lines += [line(row) for row in rows]
    lines.append("")
    lines += summary_lines(report)
    return "\n".join(lines)


def _best_lines(report: BenchReport) -> list[str]:
    """Best worker count per row, the fastest row, and best against best."""
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
    return out


def summary_lines(report: BenchReport) -> list[str]:
    """Best worker count per row, the fastest row, and notes."""
    from fastdata.bench.defaults import defaults_lines

    out = _best_lines(report) + train_lines(report) + defaults_lines(report)
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
    replace_file(path, json.dumps(report.to_dict(), indent=2, ensure_ascii=False,
                                  default=str) + "\n")

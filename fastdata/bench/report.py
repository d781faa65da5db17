"""Reporting a run: the machine, the text table and its summary, and the JSON file."""

from __future__ import annotations

import importlib
import json
import os
import platform
import textwrap
from collections.abc import Sequence
from typing import Any

import torch

from fastdata import __version__
from fastdata.bench.network import ALL, NOT_COUNTED, RERUN, verdict
from fastdata.bench.results import BenchReport, Result
from fastdata.bench.step import step_lines
from fastdata.bench.train import train_lines
from fastdata.decoding.decode import decoder_status, decoder_status_line
from fastdata.machine import meminfo, usable_cores
from fastdata.storage.partial import replace_file

#: Other processes' CPU use (cores) above which a measurement is flagged as disturbed.
OTHER_CPU_WARN = 0.2

#: Libraries whose versions are recorded with the results (distribution names).
_VERSIONED = ("torch", "numpy", "Pillow", "opencv-python-headless", "opencv-python",
              "simplejpeg", "lmdb", "h5py", "tfrecord", "webdataset", "click")

#: The network lines' legend (the first of its two lines).
NETWORK_LEGEND = ("network: requests of this process for records and shards, per "
                  "measured epoch (the open's")

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

    out = (_best_lines(report) + train_lines(report) + step_lines(report.steps)
           + defaults_lines(report) + network_lines(report))
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


def network_lines(report: BenchReport) -> list[str]:
    """Per row read from a URL, at its best worker count: its requests, bytes
    and rate per measured epoch, the round trip and one connection's rate,
    and what limited it (see fastdata.bench.network). A best count with
    worker processes, whose requests this process did not see, is followed
    by the row's 0-worker figures when the sweep measured them. The defaults
    rows are left out (their figures are in ``--json``)."""
    best = report.best()
    cores = report.machine.get("usable_cores") or usable_cores()
    out: list[str] = []
    for name in report.row_names:
        r = best.get(name)
        if r is None or r.network is None or r.pipeline.startswith("defaults"):
            continue
        zero = None if r.network.get("counted") == ALL else _counted_row(report, name)
        out += _network_row(r, cores, "see 0 workers, below" if zero else None)
        if zero is not None:
            out += _network_row(zero, cores)
    if out:
        out += [NETWORK_LEGEND, "  and worker processes' requests are not counted)"]
    return out


def _counted_row(report: BenchReport, name: str) -> Result | None:
    """The row ``name`` at 0 workers, where this process saw every request."""
    return next((r for r in report.results if r.name == name and r.ok and r.network
                 and r.network.get("counted") == ALL), None)


def _network_row(r: Result, cores: int, instead: str | None = None) -> list[str]:
    """One row's network sentence, wrapped at 100 characters; ``instead``: what
    to say in place of "rerun with --workers 0"."""
    net = r.network or {}
    head = f"network ({r.name} at {r.workers} worker{'s' if r.workers != 1 else ''}): "
    why = verdict(net, r.cpu, cores)
    if net.get("counted") != ALL:
        if why == "decode-bound":
            why = f"decode-bound (the network is not measured here: {_uncounted(net)})"
        text = head + (why.replace(RERUN, instead) if instead else why)
    elif net.get("measured_requests"):
        text = head + ", ".join(_traffic(net) + _link(net)) + _start_up(r, net) + "; " + why
    elif net.get("requests"):
        text = (f"{head}the warm-up made {net['requests']:,} requests, "
                f"{net['bytes'] / 1e6:.1f} MB; {why}")
    else:
        text = head + why
    return textwrap.wrap(text, 100, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False)


def _uncounted(net: dict[str, Any]) -> str:
    """Why a row's requests are not all counted (its ``counted``)."""
    return NOT_COUNTED.get(net.get("counted"), "not every request counted")


def _traffic(net: dict[str, Any]) -> list[str]:
    """Requests and bytes per measured epoch, and their rate."""
    epochs = max(1, net["epochs"] - net["warmup_epochs"])
    rate = net.get("network_mb_s")
    return [f"{net['measured_requests'] / epochs:,.0f} requests, "
            f"{net['bytes_per_epoch'] / 1e6:.1f} MB per epoch"
            + ("" if rate is None else f" (={_short(rate)} MB/s)")]


def _link(net: dict[str, Any]) -> list[str]:
    """Round trip, one connection's rate, requests at once, throttling (every epoch)."""
    parts = []
    if net.get("ttfb_ms") is not None:
        parts.append(f"first byte {_short(net['ttfb_ms'])} ms (median)")
    if net.get("connection_mb_s") is not None:
        parts.append(f"one connection {_short(net['connection_mb_s'])} MB/s")
    parts.append(f"up to {net.get('peak', 0)} requests at once")
    throttled = net.get("throttled") or 0
    parts.append(f"{throttled} throttled answer{'s' if throttled != 1 else ''} (retried)"
                 if throttled else "no throttled answers")
    return parts


def _start_up(r: Result, net: dict[str, Any]) -> str:
    """"; first batch after N ms (about K round trips)" when the round trip is known."""
    ttfb = net.get("ttfb_ms")
    if not ttfb or r.first_batch_ms is None:
        return ""
    return (f"; first batch after {r.first_batch_ms:.0f} ms "
            f"(about {round(r.first_batch_ms / ttfb)} round trips)")


def _short(value: float) -> str:
    """A figure with a decimal only where it is small (0.4 ms, 61 MB/s)."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def write_json(report: BenchReport, path: str) -> None:
    """Write ``report.to_dict()`` to ``path`` (atomically)."""
    replace_file(path, json.dumps(report.to_dict(), indent=2, ensure_ascii=False,
                                  default=str) + "\n")

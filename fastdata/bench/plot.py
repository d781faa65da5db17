"""``--plot``: a bar chart of samples/s per row, drawn with Pillow (no matplotlib)."""

from __future__ import annotations

from typing import Any

from fastdata.bench.options import RAW_LABEL
from fastdata.bench.report import machine_line
from fastdata.bench.results import BenchReport, Result

_WIDTH, _BAR_H, _GAP = 1100, 26, 12
_LEFT, _RIGHT, _TOP = 300, 170, 92


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one fixed bitmap size
        return ImageFont.load_default()


def _bar_color(r: Result, name: str) -> str:
    from fastdata.formats import FORMATS

    if r.format == "folder":
        return "#9e9e9e"
    if r.format not in FORMATS:  # another library's row (bench/peers.py)
        return "#59a14f"
    if RAW_LABEL in name or r.variant == "raw":
        return "#f28e2b"
    return "#4e79a7"


def _draw_header(draw: Any, report: BenchReport) -> None:
    opts = report.options
    small = _font(12)
    draw.text((16, 12), f"fastdata bench: samples/s at the best worker count "
                        f"({opts.get('size')}x{opts.get('size')}, batch {opts.get('batch_size')}, "
                        f"{report.cache} cache)", fill="black", font=_font(20))
    draw.text((16, 42), machine_line(report.machine), fill="#444444", font=small)
    draw.text((16, 60), "grey: folder baseline (PIL); blue: fastdata; orange: fastdata raw "
                        "(pre-decoded); green: other libraries; dashed line and ratios: the "
                        "baseline at its best worker count", fill="#444444", font=small)


def _draw_baseline(draw: Any, base: Result, scale: float, height: int) -> None:
    bottom = height - 40
    x = _LEFT + round(base.samples_per_s * scale)
    for y in range(_TOP - 8, bottom, 10):
        draw.line([x, y, x, min(y + 6, bottom)], fill="#d62728", width=2)
    draw.text((x + 4, height - 36), f"baseline {base.samples_per_s:,.0f}/s",
              fill="#d62728", font=_font(12))


def write_plot(report: BenchReport, path: str) -> None:
    """A horizontal bar chart (PNG, drawn with Pillow) of samples/s per row at its
    best worker count, with the baseline marked by a dashed vertical line."""
    from PIL import Image, ImageDraw

    names = report.row_names
    best = report.best()
    height = _TOP + len(names) * (_BAR_H + _GAP) + 50
    img = Image.new("RGB", (_WIDTH, height), "white")
    draw = ImageDraw.Draw(img)
    font = _font(14)
    _draw_header(draw, report)
    peak = max((r.samples_per_s for r in best.values()), default=1.0) or 1.0
    scale = (_WIDTH - _LEFT - _RIGHT) / peak
    base = report.baseline()
    draw.line([_LEFT, _TOP - 4, _LEFT, height - 40], fill="black", width=1)
    if base is not None:  # first, so that bars and figures are drawn over it
        _draw_baseline(draw, base, scale, height)
    for i, name in enumerate(names):
        y = _TOP + i * (_BAR_H + _GAP)
        draw.text((16, y + 5), name[:40], fill="black", font=font)
        r = best.get(name)
        if r is None:
            failed = next((x for x in report.results if x.name == name), None)
            reason = failed.error if failed is not None and failed.error else "failed"
            draw.text((_LEFT + 6, y + 5), f"failed: {reason}"[:100], fill="#b00020", font=font)
            continue
        x1 = _LEFT + max(1, round(r.samples_per_s * scale))
        draw.rectangle([_LEFT, y, x1, y + _BAR_H], fill=_bar_color(r, name))
        # Against the dashed line (the baseline's best), not the same worker count.
        ratio = (f"  {r.samples_per_s / base.samples_per_s:.2f}x"
                 if base is not None and base.samples_per_s and r.format != "folder" else "")
        text = f"{r.samples_per_s:,.0f}/s ({r.workers}w){ratio}"
        box = draw.textbbox((x1 + 6, y + 5), text, font=font)
        draw.rectangle([box[0] - 2, box[1] - 2, box[2] + 2, box[3] + 2], fill="white")
        draw.text((x1 + 6, y + 5), text, fill="black", font=font)
    img.save(path, format="PNG")

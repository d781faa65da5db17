"""The stall meter's figures where users look: TensorBoard, JSON Lines, Lightning.

``fastdata.log_stats(figures, to, step=...)`` writes the dict that
:func:`fastdata.stats` returns as scalars named ``fastdata/...``:

* to a ``torch.utils.tensorboard.SummaryWriter`` (anything with
  ``add_scalar``);
* to a LightningModule (anything with ``log_dict``), from a callback or the
  module itself;
* to a path: one JSON line per call, appended, with every figure as given.

No dependency of its own: the writer is the user's.
"""

from __future__ import annotations

import json
import os
from typing import Any


def scalars(figures: dict[str, Any], prefix: str = "fastdata") -> dict[str, float]:
    """The numbers of :func:`fastdata.stats`'s dict, flat, by name:
    ``fastdata/data_wait``, ``fastdata/batch_ready_ms/p95``,
    ``fastdata/stages/decode/share``, ``fastdata/workers/utilisation``, ...
    (absent figures, text and per-worker lists left out)."""
    out: dict[str, float] = {}

    def walk(value, name: str) -> None:
        if isinstance(value, bool) or value is None or isinstance(value, (str, list)):
            return
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{name}/{key}")
        elif isinstance(value, (int, float)):
            out[name] = float(value)

    for key, value in figures.items():
        if key not in ("ranks", "rank", "world", "slowest_rank"):
            walk(value, f"{prefix}/{key}")
    return out


def log_stats(figures: dict[str, Any], to, *, step: int | None = None) -> None:
    """Write :func:`fastdata.stats`'s figures to ``to``.

    Args:
        figures: what ``fastdata.stats(loader)`` returned.
        to (object): a TensorBoard ``SummaryWriter`` (scalars at ``step``), a
            LightningModule (``log_dict``), or a path (``.jsonl``: one line
            appended, with ``step`` and every figure).
        step: the global step (or epoch) the figures belong to.

    Raises:
        TypeError: ``to`` is none of these.
    """
    if isinstance(to, (str, os.PathLike)):
        line = json.dumps({"step": step, **figures}, sort_keys=True)
        with open(to, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        return
    flat = scalars(figures)
    if callable(getattr(to, "add_scalar", None)):
        for name, value in flat.items():
            to.add_scalar(name, value, global_step=step)
        return
    if callable(getattr(to, "log_dict", None)):
        to.log_dict(flat)
        return
    raise TypeError(f"log_stats writes to a SummaryWriter, a LightningModule or a path, "
                    f"not {type(to).__name__}")

"""A simulated training step (``fastdata bench --train --step-ms MS``): does loading keep up?

Each training row is measured once more per worker count and step: after
every batch the loop sleeps MS milliseconds, as a model's step would take,
while the next batches are made as ``fastdata.loader(num_workers=W)`` makes
them (W worker processes, or at 0 workers a thread a few batches ahead). The
figures are the stall meter's, read with :func:`fastdata.stats` over the
measured epochs: the share of the loop's time spent waiting for data, the
batch-ready latency (p50/p95/p99), the stage that limits loading and the
workers' utilisation. A step "keeps the GPU fed" when the data wait
is under :data:`fastdata.meter.advice.KEEPS_UP` (5%).

The rows are the same Dataset and DataLoader as the training row beside
them (same crops, order and collate), with the stall meter's table shared
with the workers before they start, as ``fastdata.loader()`` shares it
(:mod:`fastdata.bench.step_run` measures them; this module holds their
results and what the report says of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fastdata.errors import FastDataError
from fastdata.meter.advice import KEEPS_UP

#: What the step table's header says the rows are.
STEP_HEADER = ("simulated training step (--step-ms: the loop sleeps MS after each batch; "
               "data wait and batch-ready latency from fastdata.stats, measured epochs):")
_COLUMNS = ("row", "workers", "step ms", "samples/s", "data wait", "p95 ready ms",
            "workers busy")


def parse_step_ms(text: str | float | Sequence[str | float] | None) -> tuple[float, ...]:
    """Parse ``--step-ms`` (repeatable, each a number or a comma-separated list)
    into distinct step lengths in milliseconds, in the order given.

    Raises:
        FastDataError: not a list of non-negative numbers.
    """
    if text is None:
        return ()
    items = [text] if isinstance(text, (str, int, float)) else list(text)
    parts = [p for item in items
             for p in (item.replace(" ", "").split(",") if isinstance(item, str) else [item])
             if p != ""]
    try:
        steps = tuple(dict.fromkeys(float(p) for p in parts))
    except ValueError:
        raise FastDataError(f"--step-ms takes milliseconds such as 10,25, not "
                            f"{', '.join(map(str, items))!r}") from None
    if any(not (s >= 0) or s == float("inf") for s in steps):
        raise FastDataError(f"--step-ms needs step lengths of 0 ms or more, not "
                            f"{', '.join(map(str, items))!r}")
    return steps


@dataclass(frozen=True)
class StepResult:
    """One training row at one worker count and one simulated step (``--json``'s
    ``steps``); the figures are :func:`fastdata.stats`'s over the measured epochs.

    Attributes:
        name: the training row ("lmdb train fused").
        dataset: the dataset it reads ("lmdb").
        pipeline: "train unfused" or "train fused".
        workers: DataLoader worker processes.
        step_ms: the simulated step after each batch.
        status: "ok" or "failed" (then ``error`` says why).
        samples_per_s: samples per second of the loop, step included (median epoch).
        data_wait: share of the loop's time spent waiting for batches.
        batch_ready_ms: each batch's wait, ``p50``, ``p95``, ``p99``.
        wait_s, step_s: the loop's seconds waiting and stepping.
        batches: batches the loop took in the measured epochs.
        fed: the data wait is under KEEPS_UP.
        bound: the stage that limits loading (None when it keeps up).
        workers_busy: the workers' mean busy share.
        advice: the meter's line.
    """

    name: str
    dataset: str
    pipeline: str
    workers: int
    step_ms: float
    status: str
    error: str | None = None
    samples_per_s: float | None = None
    data_wait: float | None = None
    batch_ready_ms: dict[str, float] | None = None
    wait_s: float | None = None
    step_s: float | None = None
    batches: int | None = None
    fed: bool | None = None
    bound: str | None = None
    workers_busy: float | None = None
    advice: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.data_wait is not None

    @property
    def p95_ms(self) -> float | None:
        return None if not self.batch_ready_ms else self.batch_ready_ms["p95"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the report -----------------------------------------------------------------


def describe_step(s: StepResult) -> str:
    """One line for the log (stderr) about a finished step measurement."""
    head = f"{s.name}, {_workers(s.workers)}, {s.step_ms:g} ms step"
    if not s.ok:
        return f"{head}: FAILED: {s.error}"
    p95 = "" if s.p95_ms is None else f", p95 batch ready {s.p95_ms:.1f} ms"
    return (f"{head}: data wait {_pct(s.data_wait)}{p95}, "
            f"{s.samples_per_s:,.0f} samples/s")


def _pct(share: float) -> str:
    """41%, or 3.2% below 10%."""
    return f"{share:.0%}" if share >= 0.1 else f"{share:.1%}"


def _workers(n: int) -> str:
    return f"{n} worker{'s' if n != 1 else ''}"


def step_summary(steps: Sequence[StepResult]) -> list[dict[str, Any]]:
    """Per dataset and step (longest first): whether some worker count keeps the
    GPU fed; if so the fewest that do, else the one with the least data wait
    (``--json``'s ``step_summary``, with each dataset's sentence)."""
    out = []
    for dataset in dict.fromkeys(s.dataset for s in steps):
        mine = [s for s in steps if s.dataset == dataset]
        entries = []
        for step in sorted({s.step_ms for s in mine}, reverse=True):
            ok = [s for s in mine if s.step_ms == step and s.ok]
            fed = [s for s in ok if s.fed]
            pick = (min(fed, key=lambda s: (s.workers, s.data_wait)) if fed else
                    min(ok, key=lambda s: (s.data_wait, s.workers)) if ok else None)
            entries.append({
                "step_ms": step, "fed": bool(fed) if ok else None,
                "workers": None if pick is None else pick.workers,
                "pipeline": None if pick is None else pick.pipeline,
                "data_wait": None if pick is None else pick.data_wait,
                "p95_ms": None if pick is None else pick.p95_ms})
        pipelines = len({s.pipeline for s in mine})
        out.append({"name": dataset, "steps": entries,
                    "line": _sentence(entries, pipelines > 1)})
    return out


def _ms(step: float) -> str:
    return f"{step:g} ms"


def _sentence(entries: list[dict[str, Any]], name_pipeline: bool) -> str:
    """"at 25 ms per step this dataset keeps the GPU fed on 2 workers (data wait
    3%); at 10 ms it does not (data wait 41% at its best worker count, 2)"."""
    parts = []
    before = None
    for k, e in enumerate(entries):
        at = f"at {_ms(e['step_ms'])} per step this dataset" if k == 0 else \
            f"at {_ms(e['step_ms'])} it"
        how = f" with {e['pipeline']}" if name_pipeline and e["pipeline"] else ""
        if e["fed"] is None:
            parts.append(f"{at} was not measured (every row failed)")
        elif e["fed"]:
            verb = "keeps the GPU fed" if k == 0 else "does too" if before else "does"
            parts.append(f"{at} {verb} on {_workers(e['workers'])}{how} "
                         f"(data wait {_pct(e['data_wait'])})")
        else:
            verb = "does not keep the GPU fed" if k == 0 else \
                "does not either" if before is False else "does not"
            parts.append(f"{at} {verb} (data wait {_pct(e['data_wait'])} at its best "
                         f"worker count, {e['workers']}{how})")
        before = e["fed"]
    return "; ".join(parts)


def step_lines(steps: Sequence[StepResult]) -> list[str]:
    """The step table, then one sentence per dataset."""
    if not steps:
        return []
    rows: list[tuple[str, ...]] = []
    for s in steps:
        if not s.ok:
            rows.append((s.name, str(s.workers), f"{s.step_ms:g}", f"FAILED: {s.error}"))
            continue
        busy = "-" if s.workers_busy is None or s.workers == 0 else f"{s.workers_busy:.0%}"
        rows.append((s.name, str(s.workers), f"{s.step_ms:g}", f"{s.samples_per_s:,.0f}",
                     _pct(s.data_wait), "-" if s.p95_ms is None else f"{s.p95_ms:.1f}",
                     busy))
    widths = [max([len(c)] + [len(r[i]) for r in rows if len(r) == len(_COLUMNS)])
              for i, c in enumerate(_COLUMNS)]

    def line(cells: Sequence[str]) -> str:
        if len(cells) != len(_COLUMNS):
            return "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                             for i, (c, w) in enumerate(zip(cells[:3], widths))) + \
                "  " + cells[3]
        return "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                         for i, (c, w) in enumerate(zip(cells, widths)))

    out = [STEP_HEADER, line(_COLUMNS), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    out.append(f"the GPU is kept fed when the data wait is under {KEEPS_UP:.0%} of the "
               f"loop's time:")
    out += [f"  {e['name']}: {e['line']}" for e in step_summary(steps)]
    return out

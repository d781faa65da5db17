"""What a run found: one :class:`Result` per row and worker count, the report,
and its training rows' summary (fused against unfused: see fastdata.bench.train)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fastdata.bench.options import BASELINE_NAME, TRAIN_FUSED, TRAIN_PIPELINES, TRAIN_UNFUSED
from fastdata.decoding.fused_crop import FUSED_CUT, FUSED_REGION

#: What a fused row's path says when a fused decode ran.
FUSED_PATHS = (FUSED_CUT, FUSED_REGION)


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
    #: "eval", "train unfused" or "train fused" (see fastdata.bench.train).
    pipeline: str = "eval"
    #: A training row: what its Dataset really ran (fused or whole decode, and why).
    decode_path: str | None = None
    #: A row read from a URL: what the network did over its epochs (see
    #: fastdata.bench.network); None for local data.
    network: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """Whether the row was measured (rather than failed)."""
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
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
    #: ``--step-ms``: the training rows with a simulated step
    #: (:class:`fastdata.bench.step.StepResult`), none without it.
    steps: list[Any] = field(default_factory=list)

    @property
    def row_names(self) -> list[str]:
        """Row names in table order, each once."""
        return list(dict.fromkeys(r.name for r in self.results))

    def best(self) -> dict[str, Result]:
        """Per row name, its fastest worker count."""
        out: dict[str, Result] = {}
        for r in self.results:
            if r.ok and (r.name not in out or r.samples_per_s > out[r.name].samples_per_s):
                out[r.name] = r
        return out

    def fastest(self) -> Result | None:
        """The fastest row at its best worker count, or None when every row failed
        (the defaults rows, float batches, are compared among themselves)."""
        best = [r for r in self.best().values() if not r.pipeline.startswith("defaults")]
        return max(best, key=lambda r: r.samples_per_s) if best else None

    def baseline(self) -> Result | None:
        """The baseline's best result."""
        return self.best().get(BASELINE_NAME) or next(
            (r for n, r in self.best().items() if n.startswith(BASELINE_NAME)), None)

    def to_dict(self) -> dict[str, Any]:
        """The report as ``--json`` writes it."""
        fastest = self.fastest()
        data = {
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
        if self.steps:
            from fastdata.bench.step import step_summary

            data["steps"] = [s.to_dict() for s in self.steps]
            data["step_summary"] = step_summary(self.steps)
        train = train_summary(self)
        if train:
            data["train"] = train
            overall = best_of_all(self)
            if overall is not None:
                data["train_best"] = overall
        return data


def describe_result(r: Result) -> str:
    """One line for the log (stderr) about a finished measurement."""
    head = f"{r.name}, {r.workers} worker{'s' if r.workers != 1 else ''}"
    if not r.ok:
        return f"{head}: FAILED: {r.error}"
    ratio = f", {r.ratio:.2f}x baseline" if r.ratio is not None else ""
    return (f"{head}: {r.samples_per_s:,.0f} samples/s, {r.mb_per_s:.1f} MB/s{ratio}, "
            f"CPU {r.cpu * 100:.0f}%, p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms ({r.cache})")


def _pairs(report: BenchReport) -> list[tuple[str, Result | None, Result | None]]:
    """Per dataset (in table order): its best unfused and best fused result."""
    best = report.best()
    bases = dict.fromkeys(r.name.removesuffix(f" {r.pipeline}") for r in report.results
                          if r.pipeline in TRAIN_PIPELINES)
    return [(base, best.get(f"{base} {TRAIN_UNFUSED}"), best.get(f"{base} {TRAIN_FUSED}"))
            for base in bases]


def _path_of(report: BenchReport, name: str) -> str | None:
    """What the row ``name`` ran (the first of its results that says)."""
    return next((r.decode_path for r in report.results
                 if r.name == name and r.decode_path), None)


def train_summary(report: BenchReport) -> list[dict[str, Any]]:
    """Per dataset: fused against unfused, best against best (``--json``'s ``train``)."""
    out = []
    for base, unfused, fused in _pairs(report):
        ratio = (fused.samples_per_s / unfused.samples_per_s
                 if fused and unfused and unfused.samples_per_s else None)
        path = _path_of(report, f"{base} {TRAIN_FUSED}")
        out.append({
            "name": base,
            "unfused": None if unfused is None else {
                "workers": unfused.workers, "samples_per_s": unfused.samples_per_s},
            "fused": None if fused is None else {
                "workers": fused.workers, "samples_per_s": fused.samples_per_s},
            "ratio_fused_to_unfused": ratio,
            "fused_path": path,
            "unfused_path": _path_of(report, f"{base} {TRAIN_UNFUSED}"),
            "fused_ran": path in FUSED_PATHS,
        })
    return out


def best_of_all(report: BenchReport) -> dict[str, Any] | None:
    """The fastest fused row (that ran a fused decode) against the fastest
    unfused row, over every dataset; None for fewer than two datasets."""
    pairs = _pairs(report)
    fused = [(f, base) for base, _, f in pairs
             if f is not None and _path_of(report, f"{base} {TRAIN_FUSED}") in FUSED_PATHS]
    unfused = [(u, base) for base, u, _ in pairs if u is not None]
    if len(pairs) < 2 or not fused or not unfused:
        return None
    (f, f_base), (u, u_base) = (max(fused, key=lambda x: x[0].samples_per_s),
                                max(unfused, key=lambda x: x[0].samples_per_s))
    if not u.samples_per_s:
        return None
    return {"ratio": f.samples_per_s / u.samples_per_s,
            "fused": f"{f_base} at {f.workers} workers", "fused_rate": f.samples_per_s,
            "unfused": f"{u_base} at {u.workers} workers", "unfused_rate": u.samples_per_s}

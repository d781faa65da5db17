"""Tests of the stall meter: ``fastdata.meter`` (the loop's waits, the
producers' stage table, the advice, the export) and ``fastdata.stats`` over
real loaders.

The loop meter runs on a clock the tests move by hand (``fastdata.meter.loop.clock``
replaced), so its waits, steps and percentiles are pinned exactly; the advice is
pinned on hand-made figures, one test per rule. The loaders read a small
dataset of tiny PNGs made here, map-style (LMDB) and as a stream (tar shards),
with no workers and with two, forked and spawned; their figures are timings,
so those tests pin what does not depend on the machine: counts, which stages
ran, which processes made batches.
"""

from __future__ import annotations

import json
import os
import re
import time
from types import SimpleNamespace

import optional
import pytest
from conftest import build_tree, no_hang, run_python, run_ranks, uniform_spec
from torch.utils.data import DataLoader

import fastdata
from fastdata import Decode, Order
from fastdata.meter import advice, loop
from fastdata.meter.advice import advise, advise_ranks
from fastdata.meter.export import log_stats, scalars
from fastdata.meter.loop import WINDOW, LoopMeter, Meter
from fastdata.meter.table import COLUMNS, STAGES, StageTable
from fastdata.packers.pack import PackOptions

SIZE = (16, 16)
BATCH = 5
N = 24  # 5 batches of 5, the last of 4
#: The stages a CPU loader's pass runs: decoding, reading, the DataLoader's
#: collate and the float conversion on the CPU (no "copy": no GPU).
CPU_STAGES = {"read", "decode", "collate", "convert"}


class FakeClock:
    """``time.perf_counter`` stand-in: the time is what the test makes it."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(loop, "clock", fake)
    return fake


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    """24 PNGs of 16x16 in 3 classes, packed into LMDB and into 3 tar shards."""
    root = tmp_path_factory.mktemp("stall")
    tree = build_tree(root / "src", uniform_spec(("a", "b", "c"), N // 3, exts=(".png",)),
                      size=SIZE)
    fastdata.pack(tree.root, root / "ds.lmdb", options=PackOptions(), progress=False)
    fastdata.pack(tree.root, root / "ds.tar", options=PackOptions(shard_size=10),
                  progress=False)
    return {"map": str(root / "ds.lmdb"), "stream": str(root / "ds.tar")}


def open_ds(data, source: str, **options):
    return fastdata.open_dataset(data[source], streaming=source == "stream",
                                 decode=Decode(size=SIZE), order=Order(batch_size=BATCH),
                                 **options)


def one_epoch(loader, step: float = 0.002) -> tuple[int, int]:
    """(batches, samples) of one pass, with a short training step after each batch."""
    batches = samples = 0
    for _images, labels in loader:
        batches += 1
        samples += len(labels)
        time.sleep(step)
    return batches, samples


# -- LoopMeter: the loop's waits --------------------------------------------------------


def test_loop_meter_times_each_wait_and_step(clock):
    waits = [0.5, 0.25, 0.125, 1.0]
    steps = [0.25, 0.25, 0.5, 0.5]

    def batches():
        for k, wait in enumerate(waits):
            clock.t += wait
            yield k

    meter = LoopMeter()
    for k in meter.wrap(batches()):
        clock.t += steps[k]
    assert meter.figures() == {
        "batches": 4, "wait_s": 1.875, "step_s": 1.5, "data_wait": 1.875 / 3.375,
        "elapsed_s": 3.375,
        # np.percentile, linear, of [125, 250, 500, 1000] ms
        "batch_ready_ms": {"p50": pytest.approx(375.0), "p95": pytest.approx(925.0),
                           "p99": pytest.approx(985.0)}}
    # Time between passes is neither a wait nor a step.
    clock.t += 10.0
    for k in meter.wrap(batches()):
        clock.t += steps[k]
    figures = meter.figures()
    assert (figures["batches"], figures["wait_s"], figures["step_s"]) == (8, 3.75, 3.0)
    assert figures["data_wait"] == 3.75 / 6.75
    assert figures["elapsed_s"] == 6.75 + 10.0
    # of [125, 125, 250, 250, 500, 500, 1000, 1000] ms
    assert figures["batch_ready_ms"] == {"p50": pytest.approx(375.0), "p95": 1000.0,
                                         "p99": 1000.0}


def test_loop_meter_percentiles_of_a_known_array(clock):
    meter = LoopMeter()
    for k in range(1, 101):  # waits of 1, 2, ..., 100 ms, in a shuffled order
        asked = clock.t
        clock.t += ((k * 37) % 100 + 1) / 1000
        meter.took(asked)
    figures = meter.figures()
    assert figures["batches"] == 100
    assert figures["wait_s"] == pytest.approx(5.05)
    assert figures["step_s"] == 0.0
    assert figures["data_wait"] == 1.0
    assert figures["batch_ready_ms"] == {"p50": pytest.approx(50.5), "p95": pytest.approx(95.05),
                                         "p99": pytest.approx(99.01)}


def test_loop_meter_percentiles_are_over_the_last_window(clock):
    meter = LoopMeter()
    for k in range(WINDOW + 10):  # 10 waits of 500 ms, then 8192 of 2**-10 s
        asked = clock.t
        clock.t += 0.5 if k < 10 else 2.0 ** -10
        meter.took(asked)
    figures = meter.figures()
    assert figures["batches"] == WINDOW + 10 == 8202
    assert figures["wait_s"] == 13.0  # every wait is summed...
    # ...but the percentiles are of the last 8192 only
    assert figures["batch_ready_ms"] == {"p50": 0.9765625, "p95": 0.9765625, "p99": 0.9765625}


def test_loop_meter_reset(clock):
    meter = LoopMeter()
    for _ in meter.wrap(iter([1, 2, 3])):
        clock.t += 0.25
    assert meter.figures()["batches"] == 3
    meter.reset()
    assert meter.figures() == {"batches": 0, "wait_s": 0.0, "step_s": 0.0, "data_wait": None,
                               "elapsed_s": 0.0, "batch_ready_ms": None}
    asked = clock.t
    clock.t += 0.125
    meter.took(asked)
    assert meter.figures() == {"batches": 1, "wait_s": 0.125, "step_s": 0.0, "data_wait": 1.0,
                               "elapsed_s": 0.125,
                               "batch_ready_ms": {"p50": 125.0, "p95": 125.0, "p99": 125.0}}


def test_loop_left_early_closes_the_inner_generator(clock):
    closed = []

    def batches():
        try:
            for k in range(10):
                clock.t += 0.5
                yield k
        finally:
            closed.append(clock.t)

    meter = LoopMeter()
    inner = batches()
    for k in meter.wrap(inner):
        clock.t += 0.25
        if k == 1:
            break
    # Closed when the loop left (this test still holds it: not by its collection).
    assert closed == [101.5] and inner.gi_frame is None
    # Two batches waited for; the step after the second never ended.
    assert meter.figures()["batches"] == 2
    assert (meter.figures()["wait_s"], meter.figures()["step_s"]) == (1.0, 0.25)


# -- stats() over a hand-filled table ---------------------------------------------------


def _row(table: StageTable, r: int, **values) -> None:
    for name, value in values.items():
        table.values[r, COLUMNS[name]] = value


def test_stats_of_a_hand_filled_table():
    """The producers' figures are the rows' sums and each worker's busy share;
    a row that made no batch (the loop's own conversions) is not a worker, and
    a GPU stage is absent without a GPU."""
    table = StageTable(workers=2, shared=True)
    try:
        _row(table, 0, convert=0.5, copy=1.0, busy=0.5, last=12.0)
        _row(table, 1, read=0.25, decode=1.0, collate=0.25, busy=1.5, batches=3, samples=12,
             first=10.0, last=12.0)
        _row(table, 2, decode=0.5, busy=1.1, batches=2, samples=12, first=10.0, last=12.0)
        loader = SimpleNamespace(meter=Meter(table))
        figures = fastdata.stats(loader)
        assert figures["stages"] == {
            "read": {"seconds": 0.25, "share": 0.1}, "decode": {"seconds": 1.5, "share": 0.6},
            "collate": {"seconds": 0.25, "share": 0.1}, "convert": {"seconds": 0.5, "share": 0.2}}
        assert figures["samples"] == 24
        assert figures["workers"] == {"count": 2, "utilisation": pytest.approx(0.65),
                                      "each": [0.75, pytest.approx(0.55)]}
        assert figures["requests"] == {"count": 0, "bytes": 0}
        assert figures["cache"] == {"ram_records": 0, "shard_hits": 0, "shard_downloads": 0}
        assert (figures["rank"], figures["world"]) == (0, 1)
        assert (figures["batches"], figures["data_wait"], figures["batch_ready_ms"]) == \
            (0, None, None)
        assert figures["bound"] == "decode"
        assert figures["advice"] == (
            "decode 60% of the loading time, workers 65% busy: decode-bound: decode fewer "
            "pixels (fastdata pack --resize to the training size, or --encoding raw for "
            "tiny images), use more workers (fastdata.loader(..., num_workers=N)), or decode "
            "on the GPU (fastdata.DALILoader)")
        assert "ranks" not in figures and "slowest_rank" not in figures
        # With a GPU the copy is a stage.
        gpu = fastdata.stats(SimpleNamespace(meter=Meter(table, gpu=True)))
        assert gpu["stages"]["copy"] == {"seconds": 1.0, "share": pytest.approx(1.0 / 3.5)}
        # Without a process group, ranks=True is this rank alone.
        alone = fastdata.stats(loader, ranks=True)
        assert alone["slowest_rank"] is None and len(alone["ranks"]) == 1
        assert alone["ranks"][0]["stages"] == figures["stages"]

        # A reading with reset=True starts the counts again...
        assert fastdata.stats(loader, reset=True)["samples"] == 24
        again = fastdata.stats(loader)
        assert again["stages"] == {} and again["samples"] == 0
        # ...and a worker that made nothing since is no worker at all.
        assert again["workers"] == {"count": 0, "utilisation": None, "each": []}
        assert (again["bound"], again["advice"]) == (None, "no batches measured yet")
        # Worker 1 makes one more batch: only it counts, from its last batch on.
        _row(table, 2, decode=1.0, busy=1.35, batches=3, samples=16, last=12.5)
        after = fastdata.stats(loader)
        assert after["stages"] == {"decode": {"seconds": 0.5, "share": 1.0}}
        assert after["samples"] == 4
        assert after["workers"] == {"count": 1, "utilisation": pytest.approx(0.5),
                                    "each": [pytest.approx(0.5)]}
    finally:
        table.close()


def test_a_pause_between_passes_is_no_idle_time(clock):
    """A worker's busy share is of the loop's time in its passes: validation
    between two passes (here 97 s) does not make the workers look idle."""
    table = StageTable()  # this process's row alone, as with num_workers=0
    meter = Meter(table)
    loader = SimpleNamespace(meter=meter)

    def one_pass(wait: float, step: float):
        clock.t += wait
        yield 0

    for wait, step in ((0.25, 0.75), (0.25, 0.75)):
        for _ in meter.loop.wrap(one_pass(wait, step)):
            clock.t += step
        clock.t += 97.0
    _row(table, 0, decode=1.0, busy=1.75, batches=2, samples=10, first=10.0, last=110.0)
    figures = fastdata.stats(loader, reset=True)
    assert (figures["batches"], figures["wait_s"], figures["step_s"]) == (2, 0.5, 1.5)
    assert figures["workers"] == {"count": 1, "utilisation": 0.875, "each": [0.875]}
    assert figures["bound"] == "decode"  # not "handover": the workers were not idle
    # After the reset: one more pass, 90 s later.
    for _ in meter.loop.wrap(one_pass(0.5, 0.5)):
        clock.t += 0.5
    _row(table, 0, decode=1.25, busy=2.625, batches=3, samples=15, last=200.0)
    figures = fastdata.stats(loader)
    assert (figures["batches"], figures["wait_s"], figures["step_s"]) == (1, 0.5, 0.5)
    assert figures["workers"] == {"count": 1, "utilisation": 0.875, "each": [0.875]}
    assert figures["stages"] == {"decode": {"seconds": 0.25, "share": 1.0}}


# -- the advice: one test per rule ------------------------------------------------------


def figures_of(stages: dict[str, float] | None = None, *, wait: float | None = 0.5,
               busy: float | None = None, p95: float | None = 12.5,
               wait_s: float | None = 10.0) -> dict:
    """Hand-made figures: stage seconds, the data wait, workers' utilisation."""
    stages = stages or {}
    whole = sum(stages.values())
    out = {"data_wait": wait, "wait_s": wait_s,
           "batch_ready_ms": None if p95 is None else {"p50": 1.0, "p95": p95, "p99": 20.0},
           "stages": {s: {"seconds": v, "share": v / whole} for s, v in stages.items()}}
    if busy is not None:
        out["workers"] = {"count": 2, "utilisation": busy, "each": [busy, busy]}
    return out


#: Each stage's line, written out.
LINES = {
    "fetch": ("fetch-bound: read further ahead (a stream: open_dataset(..., read_ahead=16), "
              "more shards downloaded at once) or from a local copy (fastdata convert URL "
              "copy.lmdb, once)"),
    "read": ("read-bound: keep the records in memory (open_dataset(..., cache='ram')) "
             "or move the dataset to a faster disk"),
    "decode": ("decode-bound: decode fewer pixels (fastdata pack --resize to the training "
               "size, or --encoding raw for tiny images), use more workers "
               "(fastdata.loader(..., num_workers=N)), or decode on the GPU "
               "(fastdata.DALILoader)"),
    "transform": ("transform-bound: the per-sample transform runs in Python for each image; "
                  "do it on the batch on the GPU, or at pack time (--resize)"),
    "collate": ("collate-bound: let fastdata stack uint8 images (no per-sample transform "
                "that makes floats) and pass mean/std to fastdata.loader(), which normalises "
                "whole batches"),
    "convert": ("bound by float conversion on the CPU: with a GPU, fastdata.loader() copies "
                "uint8 and converts there; on the CPU, pass dtype=torch.bfloat16"),
    "copy": ("copy-bound: copy uint8 and normalise on the GPU (mean/std to fastdata.loader(), "
             "no float transform in the Dataset), from pinned memory"),
}


def test_every_stage_has_a_line():
    assert set(LINES) == set(STAGES) == set(advice.ADVICE)


def test_advice_loading_keeps_up():
    figures = figures_of({"decode": 0.6, "read": 0.4}, wait=0.04, busy=0.3, p95=1.5)
    assert advise(figures) == (
        None, ("data wait 4% of the loop's time (p95 1.5 ms per batch); loading keeps up: "
              "the training step is the bottleneck"))


@pytest.mark.parametrize("stage", STAGES)
def test_advice_names_the_bound_stage(stage):
    others = [s for s in STAGES if s != stage][:2]
    figures = figures_of({stage: 0.6, others[0]: 0.2, others[1]: 0.2}, busy=0.9)
    assert advise(figures) == (
        stage, (f"data wait 50% of the loop's time (p95 12.5 ms per batch); {stage} 60% of "
               f"the loading time, workers 90% busy: {LINES[stage]}"))


def test_advice_at_the_thresholds():
    # 5% waiting is not keeping up; workers 80% busy are saturated.
    figures = figures_of({"decode": 0.6, "read": 0.4}, wait=0.05, busy=0.8)
    assert advise(figures) == (
        "decode", ("data wait 5% of the loop's time (p95 12.5 ms per batch); decode 60% of the "
                  f"loading time, workers 80% busy: {LINES['decode']}"))


@pytest.mark.parametrize("stage", advice.WORKER_STAGES)
def test_advice_handover_when_workers_idle(stage):
    figures = figures_of({stage: 0.6, "convert": 0.4}, busy=0.25)
    assert advise(figures) == (
        "handover",
        (f"data wait 50% of the loop's time (p95 12.5 ms per batch); {stage} 60% of the "
        "loading time, workers 25% busy: the workers idle 75% of the time while the loop "
        "waits: the time goes between them and the loop (start-up, handing batches over); "
        "try num_workers=0 (decoding on threads in this process) or run_ahead=4"))


def test_advice_no_handover_where_the_stage_explains_the_wait():
    # Two workers fetching 1.2 s each while the loop waited 2 s: idle between
    # slow fetches (a full queue), yet the fetches are what the loop waits for.
    figures = figures_of({"fetch": 2.4, "decode": 0.1}, busy=0.6, wait_s=2.0)
    assert advise(figures)[0] == "fetch"
    figures = figures_of({"fetch": 1.8, "decode": 0.1}, busy=0.6, wait_s=4.0)
    assert advise(figures)[0] == "handover"
    # Workers idle most of the time: the hand-over, whatever the stage's time.
    figures = figures_of({"decode": 2.4, "collate": 0.1}, busy=0.2, wait_s=2.0)
    assert advise(figures)[0] == "handover"


@pytest.mark.parametrize("stage", ["convert", "copy"])
def test_advice_no_handover_for_the_loops_own_stages(stage):
    figures = figures_of({stage: 0.6, "decode": 0.4}, busy=0.25)
    assert advise(figures) == (
        stage, (f"data wait 50% of the loop's time (p95 12.5 ms per batch); {stage} 60% of "
               f"the loading time, workers 25% busy: {LINES[stage]}"))


def test_advice_of_a_dataset_alone():
    # No loop measured: no data wait, and no handover without one.
    figures = figures_of({"read": 0.6, "decode": 0.4}, wait=None, busy=0.25, p95=None)
    assert advise(figures) == (
        "read", f"read 60% of the loading time, workers 25% busy: {LINES['read']}")
    figures = figures_of({"read": 0.2, "decode": 0.8}, wait=None, p95=None)
    assert advise(figures) == ("decode", f"decode 80% of the loading time: {LINES['decode']}")
    assert advise(figures_of(wait=None, p95=None)) == (None, "no batches measured yet")
    assert advise({}) == (None, "no batches measured yet")


def test_advice_of_a_loop_without_stages():
    # DALI: the loop's waits, no stage measured.
    assert advise(figures_of(wait=0.5)) == (None, ("data wait 50% of the loop's time "
                                                  "(p95 12.5 ms per batch)"))
    assert advise(figures_of(wait=0.5, p95=None)) == (None, "data wait 50% of the loop's time")


def rank_figures(wait: float | None, stages: dict[str, float] | None = None,
                 busy: float | None = 0.95) -> dict:
    if stages is None:
        stages = {"decode": 0.9, "read": 0.1}
    figures = figures_of(stages, wait=wait, busy=busy)
    figures["bound"], figures["advice"] = advise(figures)
    return figures


def test_advise_ranks_names_a_slow_rank():
    everyone = [rank_figures(0.1), rank_figures(0.12), rank_figures(0.6), rank_figures(0.1)]
    assert advise_ranks(everyone) == (
        2, ("rank 2 waits 60% of its time for data, the others 10%-12%; on rank 2: decode 90% "
           f"of the loading time, workers 95% busy: {LINES['decode']}"))
    # A slow rank whose loading keeps up by its own measure is named without its advice.
    everyone[2] = rank_figures(0.6, {})
    assert advise_ranks(everyone) == (
        2, "rank 2 waits 60% of its time for data, the others 10%-12%")


@pytest.mark.parametrize("waits,slowest", [
    ([0.5, 0.4, 0.45, 0.42], 0),   # 8 points above the median: close
    ([0.3, 0.45, 0.3, 0.3], 1),    # 15 points above, but not twice as long
    ([0.01, 0.01, 0.05, 0.01], 2),  # 5 times as long, but 4 points above
    ([0.9], 0),                    # one rank: no one to compare with
    ([None, None], None),          # no loop measured
])
def test_advise_ranks_names_no_rank_when_they_are_close(waits, slowest):
    assert advise_ranks([rank_figures(w) for w in waits]) == (slowest, "")


# -- export -----------------------------------------------------------------------------


FIGURES = {
    "batches": 5, "wait_s": 1.0, "step_s": 3.0, "data_wait": 0.25, "elapsed_s": 4.0,
    "batch_ready_ms": {"p50": 1.5, "p95": 2.5, "p99": 3.5},
    "stages": {"read": {"seconds": 0.25, "share": 0.25},
               "decode": {"seconds": 0.75, "share": 0.75}},
    "samples": 24,
    "workers": {"count": 2, "utilisation": 0.5, "each": [0.25, 0.75]},
    "requests": {"count": 3, "bytes": 4096},
    "cache": {"ram_records": 24, "shard_hits": 1, "shard_downloads": 2},
    "rank": 1, "world": 2, "bound": "decode", "advice": "a line",
}


def test_scalars_flat_names():
    assert scalars(FIGURES) == {
        "fastdata/batches": 5.0, "fastdata/wait_s": 1.0, "fastdata/step_s": 3.0,
        "fastdata/data_wait": 0.25, "fastdata/elapsed_s": 4.0,
        "fastdata/batch_ready_ms/p50": 1.5, "fastdata/batch_ready_ms/p95": 2.5,
        "fastdata/batch_ready_ms/p99": 3.5,
        "fastdata/stages/read/seconds": 0.25, "fastdata/stages/read/share": 0.25,
        "fastdata/stages/decode/seconds": 0.75, "fastdata/stages/decode/share": 0.75,
        "fastdata/samples": 24.0,
        "fastdata/workers/count": 2.0, "fastdata/workers/utilisation": 0.5,
        "fastdata/requests/count": 3.0, "fastdata/requests/bytes": 4096.0,
        "fastdata/cache/ram_records": 24.0, "fastdata/cache/shard_hits": 1.0,
        "fastdata/cache/shard_downloads": 2.0}
    # Absent figures, text, lists and the ranks' list are left out.
    dataset_only = {"batches": None, "data_wait": None, "batch_ready_ms": None,
                    "stages": {}, "samples": 3, "bound": None, "advice": "x",
                    "ranks": [FIGURES], "slowest_rank": 1, "flag": True}
    assert scalars(dataset_only) == {"fastdata/samples": 3.0}
    assert scalars({"data_wait": 0.5}, prefix="train/loading") == {"train/loading/data_wait": 0.5}


def test_log_stats_appends_json_lines(tmp_path):
    path = tmp_path / "stats.jsonl"
    log_stats(FIGURES, path, step=1)
    log_stats({**FIGURES, "batches": 6}, str(path), step=2)
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 1, **FIGURES},
                                                    {"step": 2, **FIGURES, "batches": 6}]
    assert fastdata.log_stats is log_stats


def test_log_stats_to_a_tensorboard_writer(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    log_stats(FIGURES, writer, step=3)
    log_stats({**FIGURES, "data_wait": 0.125}, writer, step=4)
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(scalars(FIGURES))
    assert [(e.step, e.value) for e in events.Scalars("fastdata/data_wait")] == \
        [(3, 0.25), (4, 0.125)]
    assert [(e.step, e.value) for e in events.Scalars("fastdata/stages/decode/share")] == \
        [(3, 0.75), (4, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("fastdata/requests/bytes")] == \
        [(3, 4096.0), (4, 4096.0)]


def test_log_stats_to_a_lightning_module_and_refuses_others():
    class Module:  # what log_stats asks of a LightningModule: log_dict
        def __init__(self):
            self.logged = []

        def log_dict(self, values):
            self.logged.append(values)

    module = Module()
    log_stats(FIGURES, module, step=7)
    assert module.logged == [scalars(FIGURES)]
    with pytest.raises(TypeError, match="^log_stats writes to a SummaryWriter, a "
                                        "LightningModule or a path, not int$"):
        log_stats(FIGURES, 42)


# -- real loaders ------------------------------------------------------------------------


WORKERS = ["none", "fork", pytest.param("spawn", marks=pytest.mark.slow)]


def make_loader(ds, workers: str, **options):
    if workers == "none":
        return fastdata.loader(ds, num_workers=0, **options)
    return fastdata.loader(ds, num_workers=2, multiprocessing_context=workers, **options)


def check_epoch(figures: dict, producers: int) -> None:
    """One pass of the 24 records in 5 batches, on the CPU, by ``producers`` processes."""
    assert figures["batches"] == 5
    assert figures["samples"] == N
    assert set(figures["stages"]) == CPU_STAGES  # no "copy": absent, not zero, without a GPU
    assert all(s["seconds"] > 0 for s in figures["stages"].values())
    assert sum(s["share"] for s in figures["stages"].values()) == pytest.approx(1.0)
    assert figures["workers"]["count"] == producers == len(figures["workers"]["each"])
    assert all(0 < u <= 1 for u in figures["workers"]["each"])
    assert (figures["rank"], figures["world"]) == (0, 1)
    assert 0 < figures["data_wait"] < 1
    assert figures["data_wait"] == figures["wait_s"] / (figures["wait_s"] + figures["step_s"])
    assert figures["step_s"] >= 5 * 0.002
    assert figures["elapsed_s"] == pytest.approx(figures["wait_s"] + figures["step_s"])
    ready = figures["batch_ready_ms"]
    assert 0 <= ready["p50"] <= ready["p95"] <= ready["p99"]
    assert figures["requests"] == {"count": 0, "bytes": 0}
    assert figures["cache"] == {"ram_records": 0, "shard_hits": 0, "shard_downloads": 0}
    # Workers read ahead during the 2 ms steps: on a loaded machine the loop
    # may wait under 5% of its time, where loading keeps up and no stage is named.
    if figures["data_wait"] < advice.KEEPS_UP:
        assert figures["bound"] is None
        assert figures["advice"].endswith(f"; {advice.KEEPS_UP_LINE}")
    else:
        assert figures["bound"] in CPU_STAGES | {"handover"}
    assert figures["advice"].startswith(f"data wait {figures['data_wait']:.0%} of the loop's "
                                        f"time (p95 {ready['p95']:.1f} ms per batch); ")


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("source", ["map", "stream"])
def test_loader_epoch_figures(data, source, workers):
    producers = 1 if workers == "none" else 2
    with no_hang(120):
        loader = make_loader(open_ds(data, source), workers)
        assert len(loader) == 5
        assert one_epoch(loader) == (5, N)
        figures = fastdata.stats(loader, reset=True)
        check_epoch(figures, producers)
        # reset=True: the next reading starts from zero.
        assert fastdata.stats(loader) == {
            "batches": 0, "wait_s": 0.0, "step_s": 0.0, "data_wait": None, "elapsed_s": 0.0,
            "batch_ready_ms": None, "stages": {}, "samples": 0,
            "workers": {"count": 0, "utilisation": None, "each": []},
            "requests": {"count": 0, "bytes": 0},
            "cache": {"ram_records": 0, "shard_hits": 0, "shard_downloads": 0},
            "rank": 0, "world": 1, "bound": None, "advice": "no batches measured yet"}
        # The next epoch alone (the same workers, kept between epochs).
        assert one_epoch(loader) == (5, N)
        check_epoch(fastdata.stats(loader), producers)
        # Without reset the epochs add up.
        assert one_epoch(loader) == (5, N)
        both = fastdata.stats(loader)
        assert (both["batches"], both["samples"]) == (10, 2 * N)
        del loader


@pytest.mark.parametrize("source", ["map", "stream"])
def test_a_per_sample_transform_is_the_transform_stage(data, source):
    def slow(image):
        time.sleep(0.01)
        return image

    with no_hang(60):
        loader = fastdata.loader(open_ds(data, source, transform=slow), num_workers=0)
        assert one_epoch(loader) == (5, N)
        figures = fastdata.stats(loader)
    assert figures["samples"] == N and figures["workers"]["count"] == 1
    assert figures["stages"]["transform"]["seconds"] >= N * 0.01
    assert figures["bound"] == "transform"


def test_a_slow_collate_fn_is_the_collate_stage_and_keeps_its_worker_busy(data):
    # The collate_fn runs in the producer: its time is busy time, not idling.
    def slow(batch):
        time.sleep(0.02)
        return fastdata.collate(batch)

    with no_hang(60):
        loader = fastdata.loader(open_ds(data, "map"), num_workers=0, collate_fn=slow)
        assert one_epoch(loader, step=0.0) == (5, N)
        figures = fastdata.stats(loader)
    assert figures["stages"]["collate"]["seconds"] >= 5 * 0.02
    assert figures["workers"]["utilisation"] > 0.8
    assert figures["bound"] == "collate"


def test_stats_of_a_dataset_alone(data):
    ds = open_ds(data, "map")
    with no_hang(30):
        batch = ds.__getitems__(list(range(10)))
    assert len(batch) == 10
    figures = fastdata.stats(ds)
    assert {k: figures[k] for k in ("batches", "wait_s", "step_s", "data_wait", "elapsed_s",
                                    "batch_ready_ms")} == dict.fromkeys(
        ("batches", "wait_s", "step_s", "data_wait", "elapsed_s", "batch_ready_ms"))
    assert set(figures["stages"]) == {"read", "decode"}
    assert figures["samples"] == 10
    # One call: busy all of its span.
    assert figures["workers"] == {"count": 1, "utilisation": 1.0, "each": [1.0]}
    bound = figures["bound"]
    share = figures["stages"][bound]["share"]
    assert bound == max(figures["stages"], key=lambda s: figures["stages"][s]["seconds"])
    assert figures["advice"] == (f"{bound} {share:.0%} of the loading time, workers 100% "
                                 f"busy: {LINES[bound]}")
    # A DataLoader over it: its dataset's figures.
    loader = DataLoader(ds, batch_size=BATCH, collate_fn=fastdata.collate)
    assert fastdata.stats(loader)["samples"] == 10


def test_background_batches_have_their_own_meter(data):
    ds = open_ds(data, "map")
    with no_hang(60):
        background = fastdata.BackgroundBatches(
            DataLoader(ds, batch_size=BATCH, collate_fn=fastdata.collate))
        # No training step: the loop waits for every batch, so a verdict is due
        # (a step of a few ms, stretched by a loaded machine, let loading keep up).
        assert one_epoch(background, step=0.0) == (5, N)
    figures = fastdata.stats(background)
    assert figures["batches"] == 5 and figures["samples"] == N
    # The dataset's stages; no DataLoader collate or conversion is timed here.
    assert set(figures["stages"]) == {"read", "decode"}
    assert figures["workers"]["count"] == 1
    assert 0 < figures["data_wait"] < 1
    assert figures["bound"] is not None


@pytest.mark.parametrize("workers", ["none", "fork"])
def test_ram_cache_counts_its_records(data, workers):
    with no_hang(60):
        ds = open_ds(data, "map", cache="ram")
        loader = make_loader(ds, workers)
        assert one_epoch(loader) == (5, N)
        figures = fastdata.stats(loader, reset=True)
        assert figures["cache"]["ram_records"] == N
        assert "read" in figures["stages"]
        assert one_epoch(loader) == (5, N)
        assert fastdata.stats(loader)["cache"]["ram_records"] == N
        del loader
        ds.close()
        ds.cache.close()


def test_advise_prints_one_line_per_pass(data):
    code = """
        import json, sys, time
        import fastdata
        ds = fastdata.open_dataset(sys.argv[1], decode=fastdata.Decode(size=(16, 16)),
                                   order=fastdata.Order(batch_size=5))
        loader = fastdata.loader(ds, num_workers=0, advise=True)
        for epoch in range(2):
            for x, y in loader:
                time.sleep(0.002)
            print(f"pass {epoch} ended", file=sys.stderr, flush=True)
        for k, (x, y) in enumerate(loader):  # left early: no line
            break
        print(json.dumps(fastdata.stats(loader)["batches"]))
    """
    proc = run_python(code, data["map"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines()
             if line.startswith(("fastdata: ", "pass "))]
    assert [line.startswith("fastdata: ") for line in lines] == [True, False, True, False], lines
    for line in lines[::2]:
        assert re.fullmatch(r"fastdata: data wait \d+% of the loop's time \(p95 \d+\.\d ms per "
                            r"batch\); .+", line), line
    # Each line started the counts again: the batch of the pass left early.
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == 1


def test_no_shared_block_left_after_the_loader(data):
    code = """
        import gc, json, os, sys
        import fastdata
        mine = f"-{os.getpid()}-"

        def blocks():
            return sorted(n for n in os.listdir("/dev/shm")
                          if n.startswith("fastdata-") and mine in n)

        seen = []
        for context, loaders in (("fork", 3), ("spawn", 1)):
            ds = fastdata.open_dataset(sys.argv[1], decode=fastdata.Decode(size=(16, 16)),
                                       order=fastdata.Order(batch_size=5))
            for _ in range(loaders):  # a new loader over the same dataset replaces its table
                loader = fastdata.loader(ds, num_workers=2, multiprocessing_context=context)
                sum(1 for _ in loader)
                seen.append(len(blocks()))
            del loader
            gc.collect()
            seen.append(len(blocks()))  # the dataset keeps its table
            del ds
            gc.collect()
            seen.append(blocks())
        print(json.dumps(seen))
    """
    assert os.path.isdir("/dev/shm")
    proc = run_python(code, data["map"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [1, 1, 1, 1, [], 1, 1, []]
    assert "leaked shared_memory" not in proc.stderr, proc.stderr[-3000:]


# -- DDP: every rank's figures ---------------------------------------------------------


RANKS_SCRIPT = """
    import json, os, sys, time
    import torch.distributed as dist
    import fastdata

    init, rank, world, out, path = sys.argv[1:6]
    rank, world = int(rank), int(world)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)

    def slow(image):  # rank 2 loads slowly: a per-sample transform that takes 50 ms
        time.sleep(0.05)
        return image

    try:
        ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(16, 16)),
                                   order=fastdata.Order(batch_size=2),
                                   transform=slow if rank == 2 else None)
        loader = fastdata.loader(ds, num_workers=0)
        for epoch in range(2):  # the first warms up (threads, decoders), uncounted
            batches = samples = 0
            for images, labels in loader:  # every rank's step takes as long
                time.sleep(0.02)
                batches += 1
                samples += len(labels)
            figures = fastdata.stats(loader, ranks=True, reset=True)
        with open(out, "w") as f:
            json.dump({"batches": batches, "samples": samples, "figures": figures}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
"""


def test_ranks_name_the_rank_slow_at_loading(data, tmp_path):
    ranks = run_ranks(RANKS_SCRIPT, 4, [data["map"]], tmp_path, timeout=90)
    assert [(r["batches"], r["samples"]) for r in ranks] == [(3, 6)] * 4
    waits = [r["data_wait"] for r in ranks[0]["figures"]["ranks"]]
    print("data_wait per rank:", waits)
    assert len(set(waits)) == 4, waits
    for rank, r in enumerate(ranks):
        figures = r["figures"]
        assert (figures["rank"], figures["world"]) == (rank, 4)
        assert [f["rank"] for f in figures["ranks"]] == [0, 1, 2, 3]
        assert figures["ranks"] == ranks[0]["figures"]["ranks"]  # the same on every rank
        assert figures["slowest_rank"] == 2
        assert figures["advice"].startswith("rank 2 waits "), figures["advice"]
        assert figures["advice"] == ranks[0]["figures"]["advice"]
        assert figures["ranks"][rank]["batches"] == 3 and figures["ranks"][rank]["samples"] == 6
    assert ranks[2]["figures"]["ranks"][2]["bound"] == "transform"
    assert ranks[2]["figures"]["advice"].endswith(LINES["transform"])
    assert waits[2] > max(waits[:2] + waits[3:])


# -- DALI -------------------------------------------------------------------------------


@optional.skip_unless("dali")
def test_dali_loader_has_the_loops_figures_and_no_stages(data, tmp_path, monkeypatch):
    from fastdata.dali import DALILoader

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    with no_hang(120):
        loader = DALILoader(data["map"], decode=Decode(size=SIZE), order=Order(batch_size=BATCH),
                            device="cpu")
        assert len(loader) == 5
        assert one_epoch(loader) == (5, N)
    figures = fastdata.stats(loader)
    assert figures["batches"] == 5
    assert 0 < figures["data_wait"] < 1
    assert figures["stages"] == {} and figures["samples"] == 0
    assert figures["workers"] == {"count": 0, "utilisation": None, "each": []}
    assert figures["bound"] is None
    assert re.fullmatch(r"data wait \d+% of the loop's time \(p95 \d+\.\d ms per batch\)",
                        figures["advice"]), figures["advice"]
    fastdata.stats(loader, reset=True)
    assert fastdata.stats(loader)["batches"] == 0

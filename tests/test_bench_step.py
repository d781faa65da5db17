"""``fastdata bench --train --step-ms``: a simulated training step, read through the stall meter.

No speed is asserted beyond the obvious: a step of 300 ms after each batch of
16 tiny images (a few ms to load) keeps the loop fed, a step of 0 ms cannot.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import no_hang

from fastdata import bench as bm
from fastdata.bench.step import StepResult, parse_step_ms, step_summary
from fastdata.cli import main
from fastdata.errors import FastDataError
from fastdata.loaders import stats as meter_stats
from fastdata.meter.advice import KEEPS_UP

ARGS = ["--demo", "tiny", "--limit", "48", "--batch-size", "16", "--train", "--formats", "lmdb",
        "--epochs", "1", "--no-progress"]


def _run(args):
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


def test_step_ms_parses_lists_and_repeats():
    assert parse_step_ms(None) == parse_step_ms(()) == ()
    assert parse_step_ms("10,25") == (10.0, 25.0)
    assert parse_step_ms(("10", "25,2.5", "10")) == (10.0, 25.0, 2.5)  # repeatable, once each
    assert parse_step_ms(("0",)) == (0.0,)
    for bad in ("x", "-1", "10,,y", "inf", "nan"):
        with pytest.raises(FastDataError, match="--step-ms"):
            parse_step_ms(bad)
    with pytest.raises(FastDataError, match="needs --train"):
        bm.BenchOptions(step_ms=(10.0,))
    assert "step_ms" not in bm.BenchOptions(train=True).to_dict()  # without it: as before
    assert bm.BenchOptions(train=True, step_ms=(10.0,)).to_dict()["step_ms"] == [10.0]


@pytest.mark.parametrize("args, says", [
    (["--step-ms", "10"], "needs --train"),
    (["--train", "--step-ms", "ten"], "--step-ms takes milliseconds"),
    (["--train", "--step-ms", "-5"], "0 ms or more"),
])
def test_bad_step_ms_is_a_one_line_error(tmp_path, args, says):
    result = CliRunner().invoke(main, ["bench", str(tmp_path), *args])
    assert result.exit_code != 0 and says in result.output, result.output


def test_help_explains_step_ms():
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert "--step-ms" in result.output and "simulated model step" in result.output


def test_step_rows_carry_the_meters_figures_and_the_verdict(tmp_path, monkeypatch):
    readings = []
    real = meter_stats.stats

    def spy(loader, **kw):  # the rows' figures must be what fastdata.stats returned
        figures = real(loader, **kw)
        readings.append(figures)
        return figures

    monkeypatch.setattr(meter_stats, "stats", spy)
    out = tmp_path / "r.json"
    with no_hang(120):
        result = _run([*ARGS, "--workers", "0", "--step-ms", "0", "--step-ms", "300",
                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["options"]["step_ms"] == [0.0, 300.0]
    steps = data["steps"]
    # Each training row (unfused, fused) at each worker count and step.
    assert sorted((s["name"], s["workers"], s["step_ms"]) for s in steps) == sorted(
        (f"lmdb train {p}", 0, ms) for p in ("unfused", "fused") for ms in (0.0, 300.0))
    assert len(readings) == len(steps)
    for step, figures in zip(steps, readings):
        assert step["status"] == "ok", step["error"]
        assert step["data_wait"] == figures["data_wait"]
        assert step["batch_ready_ms"] == figures["batch_ready_ms"]
        assert step["batch_ready_ms"]["p95"] > 0
        assert step["advice"] == figures["advice"] and step["bound"] == figures["bound"]
        # The measured epoch only (the warm-up's batches are not counted): 48 / 16.
        assert step["batches"] == 3
        assert step["data_wait"] == pytest.approx(
            step["wait_s"] / (step["wait_s"] + step["step_s"]))
        assert step["step_s"] >= 3 * step["step_ms"] / 1e3  # the sleeps are the loop's step
        assert step["fed"] is (step["data_wait"] < KEEPS_UP)
        assert step["fed"] is (step["step_ms"] == 300.0)  # obviously long / obviously none
    (summary,) = data["step_summary"]
    assert summary["name"] == "lmdb"
    assert [(e["step_ms"], e["fed"], e["workers"]) for e in summary["steps"]] == \
        [(300.0, True, 0), (0.0, False, 0)]
    line = summary["line"]
    assert line.startswith("at 300 ms per step this dataset keeps the GPU fed on 0 workers")
    assert "; at 0 ms it does not (data wait " in line and "at its best worker count, 0" in line
    # The table: the step rows with their data wait and p95, then the sentence.
    assert "simulated training step (--step-ms" in result.stdout
    assert "data wait" in result.stdout and "p95 ready ms" in result.stdout
    assert f"  lmdb: {line}" in result.stdout
    assert "0 ms step: data wait " in result.stderr  # one log line per measurement


def test_step_rows_with_workers_and_without_step_ms_nothing_changes(tmp_path):
    with no_hang(120):
        stepped = _run([*ARGS, "--workers", "2", "--step-ms", "0", "--json", "-"])
        plain = _run([*ARGS, "--workers", "2", "--json", "-"])
    assert stepped.exit_code == 0 and plain.exit_code == 0, stepped.output + plain.output
    data = json.loads(stepped.stdout)
    for step in data["steps"]:
        assert step["status"] == "ok" and step["workers"] == 2, step["error"]
        assert step["batches"] == 3 and step["fed"] is False
        assert 0 <= step["workers_busy"] <= 1  # the workers' rows reach the meter
    assert "worker count, 2" in data["step_summary"][0]["line"]
    # Without --step-ms: no step rows, no key, no table.
    before = json.loads(plain.stdout)
    assert "steps" not in before and "step_summary" not in before
    assert "step_ms" not in before["options"]
    assert "simulated training step" not in plain.stderr
    assert {r["name"] for r in before["rows"]} == {r["name"] for r in data["rows"]}


def test_summary_picks_the_fewest_workers_that_keep_up_else_the_least_wait():
    def row(workers, step, wait, pipeline="train unfused"):
        return StepResult(name=f"lmdb {pipeline}", dataset="lmdb", pipeline=pipeline,
                          workers=workers, step_ms=step, status="ok", data_wait=wait,
                          batch_ready_ms={"p50": 1.0, "p95": 2.0, "p99": 3.0},
                          fed=wait < KEEPS_UP)

    steps = [row(0, 10, 0.6), row(2, 10, 0.41), row(0, 25, 0.2), row(2, 25, 0.03),
             row(4, 25, 0.01), StepResult(name="lmdb train unfused", dataset="lmdb",
                                          pipeline="train unfused", workers=1, step_ms=5,
                                          status="failed", error="boom")]
    (summary,) = step_summary(steps)
    assert summary["line"] == (
        "at 25 ms per step this dataset keeps the GPU fed on 2 workers (data wait 3.0%); "
        "at 10 ms it does not (data wait 41% at its best worker count, 2); "
        "at 5 ms it was not measured (every row failed)")
    both = [row(0, 10, 0.3), row(0, 10, 0.2, "train fused")]
    assert step_summary(both)[0]["line"] == ("at 10 ms per step this dataset does not keep "
                                             "the GPU fed (data wait 20% at its best worker "
                                             "count, 0 with train fused)")

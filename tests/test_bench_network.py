"""``fastdata bench URL``: what the network did for a row read from a URL.

A packed dataset is served by the test's own HTTP server, over a real socket;
the requests the row's figures count are compared with the requests the
server logged while that row's epochs ran. The counts come from the gates
(fastdata.storage.adaptive) that every shard's GET passes, ranged or whole;
the open's (manifest, index) come before the row's epochs.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import no_hang

import fastdata
from fastdata import bench as bm
from fastdata.bench import network, run
from fastdata.cli import main
from fastdata.demo import synthesize

VERDICTS = ("decode-bound", "network-bound", "latency-bound", "not measured here")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """600 tiny images in 12 tar shards of 50, local and behind a fresh HTTP
    server per test (see ``site``)."""
    tmp = tmp_path_factory.mktemp("bench_network")
    synthesize(tmp / "src", kind="tiny", n=600, seed=3)
    www = tmp / "www"
    www.mkdir()
    summary = fastdata.pack(tmp / "src", www / "d-%06d.tar",
                            options=fastdata.PackOptions(shard_size=50), progress=False)
    return summary.output, www


@pytest.fixture
def site(served, monkeypatch, tmp_path):
    from servers import http_site

    local, www = served
    with http_site(www, monkeypatch, tmp_path / "cache") as server:
        server.local = local
        server.manifest = f"{server.url}/d.tar.fastdata.json"
        yield server


@pytest.fixture
def marks(site, monkeypatch):
    """Where the server's log stood when each measurement began, when each of
    its epochs ended, and when it returned: [("start"|"epoch"|"end", index)]."""
    seen: list[tuple[str, int]] = []
    measure = run.measure_loader

    def watched(*args, on_epoch, **kwargs):
        def epoch_done():
            seen.append(("epoch", len(site.log)))
            on_epoch()

        seen.append(("start", len(site.log)))
        result = measure(*args, on_epoch=epoch_done, **kwargs)
        seen.append(("end", len(site.log)))
        return result

    monkeypatch.setattr(run, "measure_loader", watched)
    return seen


def _bench(site, tmp_path, *args):
    """``fastdata bench`` on the served dataset (200 records: no defaults rows);
    its stdout and its one row from --json."""
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        main, ["bench", site.manifest, "--limit", "200", "--epochs", "2", "--size", "16",
               "--batch-size", "32", "--json", str(out), "--no-progress", *args],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["rows"]
    assert row["status"] == "ok", row["error"]
    return result.stdout, row


def _ranged(site, start: int, end: int) -> int:
    """GETs the server logged between two marks that pass a gate: every
    shard's, and every ranged one (the index's rows, read when first used)."""
    return sum(1 for method, path, rng in site.log[start:end]
               if method == "GET" and (rng or path.endswith(".tar")))


def _network_lines(stdout: str) -> list[str]:
    """The summary's "network (" sentence, as printed (wrapped in lines)."""
    lines = stdout.splitlines()
    first = next(k for k, line in enumerate(lines) if line.startswith("network ("))
    block = [lines[first]]
    for line in lines[first + 1:]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def _network_block(stdout: str) -> str:
    """The summary's "network (" sentence, its lines joined."""
    return " ".join(line.strip() for line in _network_lines(stdout))


def test_a_row_read_from_a_url_counts_the_ranged_requests_of_its_epochs(
        site, marks, monkeypatch, tmp_path):
    # No room in the shard cache: every epoch reads its records by range again.
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", "1")
    with no_hang(60):
        stdout, row = _bench(site, tmp_path, "--workers", "0")
    assert [kind for kind, _ in marks] == ["start", "epoch", "epoch", "epoch", "end"]
    at, warm_at, end_at = marks[0][1], marks[1][1], marks[-1][1]    # warm-up, then 2 epochs
    net = row["network"]
    assert net["counted"] == "all" and net["origins"] == 1
    assert net["requests"] > 0
    assert net["requests"] == _ranged(site, at, end_at)
    assert net["measured_requests"] == _ranged(site, warm_at, end_at) > 0
    assert (net["epochs"], net["warmup_epochs"]) == (3, 1)
    assert net["seconds"] == pytest.approx(sum(row["epoch_seconds"]))
    assert net["samples"] == 2 * 200
    assert net["bytes_per_epoch"] == pytest.approx(net["measured_bytes"] / 2)
    assert net["network_mb_s"] == pytest.approx(net["measured_bytes"] / net["seconds"] / 1e6)
    assert net["peak"] >= 1 and net["ttfb_ms"] > 0

    block = _network_block(stdout)
    assert block.startswith("network (tar http:d.tar at 0 workers): ")
    per_epoch = round(net["measured_requests"] / 2)
    assert f"{per_epoch:,} requests, " in block and " MB per epoch (=" in block
    assert "first batch after " in block and " round trips)" in block
    assert any(v in block for v in VERDICTS), block
    assert "the open's" in stdout                        # what is not counted, said once
    assert all(len(line) <= 100 for line in _network_lines(stdout))


def test_a_warm_up_that_fills_the_cache_leaves_the_measured_epochs_without_requests(
        site, marks, tmp_path):
    with no_hang(60):
        stdout, row = _bench(site, tmp_path, "--workers", "0")
    at, warm_at, end_at = marks[0][1], marks[1][1], marks[-1][1]
    net = row["network"]
    assert net["counted"] == "all"
    assert net["requests"] == _ranged(site, at, end_at) == _ranged(site, at, warm_at) > 0
    assert net["measured_requests"] == 0 and net["network_mb_s"] == 0
    block = _network_block(stdout)
    assert f"the warm-up made {net['requests']:,} requests" in block
    assert "not measured here (no requests counted in the measured epochs)" in block


def test_a_row_with_worker_processes_says_its_counts_are_not_whole(site, tmp_path):
    with no_hang(120):
        stdout, row = _bench(site, tmp_path, "--workers", "1")
    assert row["network"]["counted"] == "main process only"
    block = _network_block(stdout)
    assert block.startswith("network (tar http:d.tar at 1 worker): ")
    assert ("requests ran in worker processes" in block
            or "decode-bound (its requests ran in worker processes" in block), block
    assert " MB per epoch" not in block                  # no partial counts shown as whole


def test_a_local_row_has_no_network_figures(served):
    with no_hang(60):
        report = bm.run_bench([bm.existing_target(served[0], limit=64)],
                              bm.BenchOptions(size=16, batch_size=32, epochs=1, workers=(0,)),
                              progress=False)
    (row,) = report.results
    assert row.ok and row.network is None and row.to_dict()["network"] is None
    assert bm.network_lines(report) == []


@pytest.mark.parametrize("cpu, rate, peak, one, expected", [
    (1.8, 10.0, 8, 50.0, "decode-bound"),                 # 85 % of 2 cores busy
    (0.5, 330.0, 8, 50.0, "network-bound"),               # 0.8 x 8 x 50 = 320 MB/s
    (0.5, 100.0, 8, 50.0, "latency-bound"),
    (0.5, 100.0, 8, None, "not measured here"),           # no body timed one connection
])
def test_the_verdict(cpu, rate, peak, one, expected):
    with no_hang(5):
        net = {"counted": "all", "measured_requests": 10, "network_mb_s": rate, "peak": peak,
               "connection_mb_s": one}
        assert expected in network.verdict(net, cpu, cores=2)
        workers = {**net, "counted": "main process only"}
        assert network.verdict(workers, 0.5, cores=2).startswith("not measured here")
        assert network.verdict(workers, 1.9, cores=2) == "decode-bound"


def test_an_object_store_row_says_its_ranged_reads_are_not_counted(
        served, s3_env, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    src = served[1].parent / "src"
    with no_hang(120):
        s3_env.make_bucket("benchnet")
        url = fastdata.pack(src, "s3://benchnet/d-%06d.tar", progress=False,
                            options=fastdata.PackOptions(shard_size=50)).output
        report = bm.run_bench([bm.existing_target(url, limit=64)],
                              bm.BenchOptions(size=16, batch_size=32, epochs=1, workers=(0,)),
                              progress=False)
    (row,) = report.results
    assert row.ok, row.error
    assert row.network["counted"] == "part downloads only"
    (line, *more) = bm.network_lines(report)
    assert line.startswith("network (tar s3:d.tar at 0 workers): ")
    assert "obstore's ranged reads of s3://, gs:// and az:// objects are not counted" in \
        " ".join(part.strip() for part in [line, *more])

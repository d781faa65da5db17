"""Requests at once to a server, found by measuring (fastdata.storage.adaptive):
the gate's rules on their own, large objects in ranged parts, and a store
that throttles. The requests cross a socket to the test's own HTTP server,
which counts them, the most it answered at once and its 503s."""

from __future__ import annotations

import itertools
import logging
import re

import numpy as np
import pytest
from conftest import no_hang

import fastdata
from fastdata.demo import synthesize
from fastdata.errors import StorageError
from fastdata.storage import ShardCache, adaptive


@pytest.fixture(autouse=True)
def fresh_gates():
    adaptive.reset()
    yield
    adaptive.reset()


# -- the gate's rules --------------------------------------------------------------------

def _decisions(gate: adaptive.Gate, rates, queued=True) -> list[int]:
    out = []
    for rate in rates:
        gate._queued = queued
        gate._decide(rate)
        out.append(gate.limit)
    return out


def test_the_limit_climbs_while_the_rate_rises_and_steps_back_when_it_stops():
    gate = adaptive.Gate("t", start=8)
    # 8 -> 10 -> 12 -> 15 -> 18 while each step pays; no gain at 18: back to 15, held.
    assert _decisions(gate, [100, 150, 200, 250, 251]) == [10, 12, 15, 18, 15]
    assert _decisions(gate, [251] * 8) == [15] * 8
    assert _decisions(gate, [300]) == [18]


def test_the_limit_stays_when_nothing_waited_for_it():
    gate = adaptive.Gate("t", start=8)
    assert _decisions(gate, [100, 200, 400], queued=False) == [8, 8, 8]


def test_a_throttling_answer_halves_the_limit_and_pauses_growth(caplog):
    gate = adaptive.Gate("http://store:80", start=20)
    with caplog.at_level(logging.WARNING, logger="fastdata"):
        gate.throttle(503)
        gate.throttle(503)
    assert gate.limit == 5 and gate.throttled == 2
    assert [r.getMessage() for r in caplog.records] == [
        ("http://store:80 answered 503 (slow down): retried with backoff, with fewer requests "
         "at once to it (now 10; fastdata.storage.adaptive)")]
    assert _decisions(gate, [100] * 5) == [5, 5, 5, 5, 6]
    for _ in range(10):
        gate.throttle(429)
    assert gate.limit == adaptive.LOW


def test_parts_follow_the_measured_round_trip_and_rate():
    gate = adaptive.Gate("t")
    assert gate.part_size() == 4 << 20          # nothing measured yet
    for _ in range(8):
        gate.record(6_000_000, 0.040, 0.1)      # 40 ms to the first byte, 60 MB/s
    assert gate.part_size() == int(2 * 0.040 * 60e6)
    near = adaptive.Gate("near")
    for _ in range(8):
        near.record(6_000_000, 0.001, 0.012)    # 1 ms, 500 MB/s: 50 ms of it, capped
    assert near.part_size() == adaptive.PART_MAX
    assert adaptive.split(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert adaptive.split(0, 12, 4) == [(0, 4), (4, 8), (8, 12)]
    assert adaptive.split(5, 6, 4) == [(5, 6)]


def test_requests_wait_their_turn_in_order():
    import threading
    import time

    gate = adaptive.Gate("t", start=1)
    order = []
    with gate.slot():
        threads = []
        for k in range(4):
            t = threading.Thread(target=lambda k=k: _take(gate, order, k))
            t.start()
            threads.append(t)
            time.sleep(0.05)            # they queue in this order
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3] and gate.peak == 1


def test_reads_needed_now_go_before_reads_ahead():
    import threading
    import time

    gate = adaptive.Gate("t", start=1)
    order = []
    with gate.slot():
        threads = []
        for k, ahead in ((0, True), (1, True), (2, False), (3, False)):
            t = threading.Thread(target=lambda k=k, a=ahead: _take(gate, order, k, a))
            t.start()
            threads.append(t)
            time.sleep(0.05)            # they queue in this order
    for t in threads:
        t.join(10)
    assert order == [2, 3, 0, 1]        # downloads ahead of use wait behind the batch's reads


def _take(gate, order, k, ahead=False):
    with gate.slot(ahead=ahead):
        order.append(k)


# -- over a socket ------------------------------------------------------------------------

def _packed(tmp, kind: str, n: int, seed: int, shard_size: int):
    """``n`` generated images in tar shards of ``shard_size`` in ``tmp/www``:
    (the manifest, the folder)."""
    synthesize(tmp / "src", kind=kind, n=n, seed=seed)
    www = tmp / "www"
    www.mkdir()
    summary = fastdata.pack(tmp / "src", www / "d-%06d.tar",
                            options=fastdata.PackOptions(shard_size=shard_size), progress=False)
    return summary.output, www


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """Two tar shards of about 5 MB (photos), local and served."""
    return _packed(tmp_path_factory.mktemp("parts"), "photos", 96, 1, 48)


@pytest.fixture
def site(large, monkeypatch, tmp_path):
    from servers import http_site

    local, www = large
    with http_site(www, monkeypatch, tmp_path / "cache") as server:
        server.local = local
        server.manifest = f"{server.url}/d.tar.fastdata.json"
        yield server


def _samples(ds) -> list[tuple[int, bytes]]:
    return [(int(y), bytes(np.asarray(x).tobytes())) for x, y in ds]


def _records(ds) -> list[tuple[int, bytes]]:
    return [(int(y), bytes(np.asarray(x).tobytes())) for x, y in (ds[i] for i in range(len(ds)))]


def test_a_large_shard_is_downloaded_in_ranged_parts_at_once(site, tmp_path):
    shard = site.url + "/d-000000.tar"
    size = (site.root / "d-000000.tar").stat().st_size
    assert size > 4 << 20                       # larger than a part before measuring
    site.server.delay = 0.2                     # parts asked for at once overlap there
    with no_hang(60):
        path = ShardCache(tmp_path / "c").local(shard, size=size)
    with open(path, "rb") as got:
        assert got.read() == (site.root / "d-000000.tar").read_bytes()
    gets = [rng for method, path, rng in site.log if method == "GET" and path == "d-000000.tar"]
    assert None not in gets                     # no whole GET: ranges only
    spans = sorted((int(a), int(b)) for a, b in (r[len("bytes="):].split("-") for r in gets))
    assert spans[0][0] == 0 and spans[-1][1] == size - 1 and len(spans) >= 2
    assert all(b1 + 1 == a2 for (_, b1), (a2, _) in itertools.pairwise(spans))  # contiguous
    assert site.peak_active >= 2                 # at once, not one after another


def test_a_part_of_another_length_leaves_no_copy(site, tmp_path):
    shard = site.url + "/d-000000.tar"
    size = (site.root / "d-000000.tar").stat().st_size
    cache = ShardCache(tmp_path / "c")
    with no_hang(60), pytest.raises(StorageError, match="shorter"):
        cache.local(shard, size=size + 4096)    # the manifest says more than the server has
    assert [p.name for p in (tmp_path / "c").iterdir() if not p.name.endswith(".lock")
            and not p.name.startswith(".")] == []


def test_a_store_that_throttles_gives_the_same_epoch_and_says_so(site, caplog):
    want = _samples(fastdata.ShardedIterableDataset(site.local, order=fastdata.Order(
        shuffle=True, seed=2)))
    site.throttle(10)                            # one GET in ten: 503 SlowDown
    with no_hang(120), caplog.at_level(logging.WARNING, logger="fastdata"):
        stream = fastdata.ShardedIterableDataset(site.manifest, order=fastdata.Order(
            shuffle=True, seed=2))
        assert _samples(stream) == want
        mapped = _records(fastdata.open_dataset(site.manifest))
    assert mapped == _records(fastdata.open_dataset(site.local))
    assert site.throttled >= 2
    seen = adaptive.snapshot()
    assert seen["throttled"] >= 1
    assert any("answered 503 (slow down): retried with backoff" in r.getMessage()
               for r in caplog.records)


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    """600 tiny images in 20 tar shards of 30, served."""
    return _packed(tmp_path_factory.mktemp("many"), "tiny", 600, 4, 30)[1]


def test_a_batch_over_twenty_shards_is_one_round_trip(many_shards, monkeypatch, tmp_path):
    """A map-style batch's records in 20 shards: one request per shard, all
    at the server at once (each held there 0.3 s), not 8 at a time."""
    from servers import http_site

    with http_site(many_shards, monkeypatch, tmp_path / "cache") as site:
        ds = fastdata.open_dataset(f"{site.url}/d.tar.fastdata.json",
                                   decode=fastdata.Decode(output="bytes"))
        batch = [30 * s + 7 for s in range(20)]          # one record of every shard
        site.server.delay = 0.3
        before = len(site.log)
        with no_hang(60):
            got = ds.__getitems__(batch)
        ranged = [p for m, p, r in site.log[before:] if r is not None and p.endswith(".tar")]
        assert sorted(ranged) == [f"d-{s:06d}.tar" for s in range(20)]
        assert site.peak_active == 20
    local = fastdata.open_dataset(many_shards / "d.tar.fastdata.json",
                                  decode=fastdata.Decode(output="bytes"))
    assert [bytes(x) for x, _ in got] == [bytes(local[i][0]) for i in batch]


# -- uploads --------------------------------------------------------------------------------

def test_an_upload_counts_its_parts_and_a_full_one_steps_the_limit():
    gate = adaptive.Gate("t", start=4)
    gate.uploaded(3 << 20, 0.1, 1)                 # one part: times one connection
    assert gate.limit == 4 and gate.stats()["connection_mb_s"] == pytest.approx(31.457, 1e-3)
    gate.uploaded(20 << 20, 0.2, 4)                # every place busy: a window of the climb
    assert gate.limit == 5
    gate.uploaded(20 << 20, 0.2, 2)                # fewer parts than the limit: no evidence
    assert gate.limit == 5
    stats = gate.stats()
    assert (stats["uploads"], stats["upload_bytes"], stats["requests"]) == (3, 43 << 20, 7)
    assert stats["upload_seconds"] == 0           # none was under way (uploading())


def test_upload_seconds_are_the_time_any_upload_was_under_way():
    import time

    gate = adaptive.Gate("t")
    with gate.uploading():
        with gate.uploading():                     # two at once: counted once
            time.sleep(0.1)
        time.sleep(0.1)
    assert 0.2 <= gate.stats()["upload_seconds"] < 1.0


def test_a_large_upload_goes_in_parts_at_once_and_is_counted(s3_server, s3_env, tmp_path):
    from fastdata.storage import open_remote, upload_file
    from fastdata.storage.transfers import MIN_PART, upload_gate

    s3_server.make_bucket("up-parts")
    data = np.random.default_rng(0).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes()
    local = tmp_path / "big.bin"
    local.write_bytes(data)
    url = "s3://up-parts/big.bin"
    with no_hang(120):
        upload_file(str(local), url)
        assert open_remote(url).read() == data
    parts = -(-len(data) // MIN_PART)                # 5 MiB parts: 3
    assert s3_server.requests("PUT", url) == parts
    stats = upload_gate(url).stats()
    assert (stats["uploads"], stats["upload_bytes"], stats["requests"]) == (1, len(data), parts)


def test_a_pack_to_a_url_says_what_its_upload_did(s3_server, s3_env, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from fastdata.cli import main
    from fastdata.storage import open_remote

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    s3_server.make_bucket("up-pack")
    synthesize(tmp_path / "src", kind="tiny", n=200, seed=5)
    url = "s3://up-pack/d/d-%06d.tar"
    with no_hang(120):
        summary = fastdata.pack(tmp_path / "src", url, options=fastdata.PackOptions(
            shard_size=50), progress=False)
    sizes = [open_remote(f).size() for f in summary.files]
    assert summary.upload.bytes == sum(sizes) and summary.upload.parts == len(sizes)
    assert summary.upload.seconds > 0 and summary.upload.parts_at_once >= adaptive.LOW
    with no_hang(120):
        result = CliRunner().invoke(main, ["pack", str(tmp_path / "src"),
                                           "s3://up-pack/e/e-%06d.tar", "--shard-size", "50"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.strip().startswith("uploaded "))
    assert re.fullmatch(r"uploaded [0-9.]+ [kKMG]?B in [0-9.]+ s \([0-9,]+ MB/s; [0-9,]+ parts, "
                        r"at most \d+ at once per file(; one connection [0-9,]+ MB/s)?\)",
                        line.strip()), line

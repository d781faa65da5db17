"""Order-driven read-ahead of streams at URLs: which shards are downloaded whole,
in which order, within which budget, and what a broken download does. The
requests are counted at the test's own HTTP server, over a real socket."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import fastdata
from fastdata.demo import synthesize
from fastdata.errors import FastDataError
from fastdata.formats.sharded.fetch_plan import plan_fetches
from fastdata.loaders.read_ahead import READ_CHUNK

SHARD = 50


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """600 tiny images in 12 tar shards of 50, local and behind a fresh HTTP
    server per test (see ``site``)."""
    tmp = tmp_path_factory.mktemp("read_ahead")
    synthesize(tmp / "src", kind="tiny", n=600, seed=3)
    www = tmp / "www"
    www.mkdir()
    summary = fastdata.pack(tmp / "src", www / "d-%06d.tar",
                            options=fastdata.PackOptions(shard_size=SHARD), progress=False)
    return summary.output, www


@pytest.fixture
def site(served, monkeypatch, tmp_path):
    from servers import HTTPServer

    local, www = served
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTDATA_CACHE_LIMIT", raising=False)
    server = HTTPServer(www)
    server.local = local
    server.manifest = f"{server.url}/d.tar.fastdata.json"
    yield server
    server.close()


def _shard_bytes(local: str) -> list[int]:
    return fastdata.ShardedIterableDataset(local).reader.shard_sizes()


def _whole_gets(server) -> list[str]:
    return [path for method, path, rng in server.log
            if method == "GET" and rng is None and path.endswith(".tar")]


def _samples(ds) -> list[tuple[int, bytes]]:
    return [(int(y), bytes(np.asarray(x).tobytes())) for x, y in ds]


ORDER = fastdata.Order(shuffle=True, seed=5, block=16, window=128)


# -- the plan ----------------------------------------------------------------------

def test_a_plan_in_stored_order_takes_every_shard_whole_one_after_another():
    shards = np.repeat(np.arange(10), 200)
    plan = plan_fetches(shards, np.full(len(shards), 1000), [200_000] * 10, chunk=64,
                        budget=400_000)
    assert plan.by_first_use == list(range(10))
    assert plan.peak() <= 400_000
    firsts = [plan.spans[s][0] for s in plan.by_first_use]
    assert firsts == sorted(firsts)


def test_a_plan_keeps_within_its_budget_and_reads_sparse_shards_by_range():
    rng = np.random.default_rng(0)
    shards = rng.permutation(np.repeat(np.arange(40), 100))   # every shard over the whole epoch
    plan = plan_fetches(shards, np.full(len(shards), 10), [1000] * 40, chunk=64, budget=5000)
    assert len(plan.spans) == 5 and plan.peak() <= 5000
    sparse = plan_fetches(shards[:100], np.full(100, 10), [1000] * 40, chunk=64, budget=10**9)
    assert not sparse.spans          # a few records of each shard: ranges move fewer bytes
    everything = plan_fetches(shards[:100], np.full(100, 10), [1000] * 40, chunk=64,
                              budget=10**9, whole_share=0.0)
    assert len(everything.spans) == len(set(shards[:100].tolist()))


# -- the stream ---------------------------------------------------------------------

def test_default_remote_stream_downloads_each_shard_once_in_order_of_first_use(site):
    want = _samples(fastdata.ShardedIterableDataset(site.local, order=ORDER))
    ds = fastdata.ShardedIterableDataset(site.manifest, order=ORDER, read_ahead=2)
    assert _samples(ds) == want
    gets = _whole_gets(site)
    assert sorted(gets) == sorted(set(gets)), "a shard was downloaded twice"
    # Every shard is needed in a large share over a short stretch: all whole.
    assert len(gets) == 12
    # In the order the epoch first needs them (two downloads run at once).
    records = [int(i) for i in ds.plan().record_indices(
        fastdata.order.epochs.epoch_order(600, ds.shuffle_mode, 0), np.arange(600))]
    first_use = list(dict.fromkeys(ds.reader.shards_of(records)))
    got = [int(p.rsplit("-", 1)[1].split(".")[0]) for p in gets]
    assert all(abs(got.index(s) - k) < 2 for k, s in enumerate(first_use)), (got, first_use)
    # What a download covers is not also read by range after the first chunks.
    ranged = [p for m, p, r in site.log if r is not None and p.endswith(".tar")]
    assert len(ranged) <= 2 * 12


def test_the_cache_holds_at_most_its_budget(site, monkeypatch, tmp_path):
    sizes = _shard_bytes(site.local)
    budget = 3 * max(sizes)
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", str(budget))
    cache = tmp_path / "cache"
    peak, stop = [0], threading.Event()

    def watch() -> None:          # the bytes on disk, partial downloads included
        while not stop.is_set():
            total = 0
            for folder, _, names in os.walk(cache):
                for name in names:
                    if not name.endswith(".lock"):
                        try:
                            total += os.path.getsize(os.path.join(folder, name))
                        except FileNotFoundError:
                            pass
            peak[0] = max(peak[0], total)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        ds = fastdata.ShardedIterableDataset(site.manifest, order=ORDER, read_ahead=2)
        got = _samples(ds)
    finally:
        stop.set()
        watcher.join()
    assert got == _samples(fastdata.ShardedIterableDataset(site.local, order=ORDER))
    assert 0 < peak[0] <= budget
    assert _whole_gets(site), "nothing was downloaded whole"
    leftovers = [n for _, _, names in os.walk(cache) for n in names if n.endswith(".tar")]
    assert leftovers == [], "the epoch's shards stay in the cache after their last use"


def test_a_download_cut_off_is_tried_again(site):
    site.cut["d-000003.tar"] = 1
    ds = fastdata.ShardedIterableDataset(site.manifest, order=ORDER, read_ahead=1)
    assert _samples(ds) == _samples(fastdata.ShardedIterableDataset(site.local, order=ORDER))
    assert _whole_gets(site).count("d-000003.tar") == 2


def test_a_download_that_keeps_failing_names_the_url_and_record(site):
    site.cut["d-000003.tar"] = 100
    ds = fastdata.ShardedIterableDataset(site.manifest, order=fastdata.Order(), read_ahead=1)
    with pytest.raises(FastDataError) as caught:
        _samples(ds)
    message = str(caught.value)
    assert "d-000003.tar" in message and "record 150" in message
    assert "remote_read='ranges'" in message
    assert _whole_gets(site).count("d-000003.tar") == 3


def test_ranges_mode_downloads_nothing_whole(site):
    ds = fastdata.ShardedIterableDataset(site.manifest, order=ORDER, remote_read="ranges")
    assert _samples(ds) == _samples(fastdata.ShardedIterableDataset(site.local, order=ORDER))
    assert _whole_gets(site) == []


def test_workers_share_the_downloads(site):
    import torch

    loader = torch.utils.data.DataLoader(
        fastdata.ShardedIterableDataset(site.manifest, order=ORDER.changed(batch_size=32)),
        batch_size=32, num_workers=2, collate_fn=fastdata.collate)
    local = torch.utils.data.DataLoader(
        fastdata.ShardedIterableDataset(site.local, order=ORDER.changed(batch_size=32)),
        batch_size=32, num_workers=2, collate_fn=fastdata.collate)
    got = [(x.numpy().tobytes(), y.tolist()) for x, y in loader]
    assert got == [(x.numpy().tobytes(), y.tolist()) for x, y in local]
    gets = _whole_gets(site)
    assert set(gets) == {f"d-{n:06d}.tar" for n in range(12)}
    # The two workers need the same shards; the shared cache downloads each once.
    assert len(gets) == 12
    assert READ_CHUNK == 64


# -- map-style, driven by fastdata's sampler ---------------------------------------

def _batches(path, workers: int, sampler: bool = True):
    import torch

    ds = fastdata.open_dataset(path, order=fastdata.Order(shuffle=True, seed=2, batch_size=32))
    if sampler:
        loader = torch.utils.data.DataLoader(ds, batch_sampler=fastdata.EpochBatches(ds),
                                             num_workers=workers, collate_fn=fastdata.collate)
    else:
        loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=workers,
                                             sampler=range(600), collate_fn=fastdata.collate)
    return [(x.numpy().tobytes(), y.tolist()) for x, y in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_map_style_reads_ahead_of_fastdatas_sampler(site, workers):
    assert _batches(site.manifest, workers) == _batches(site.local, workers)
    gets = _whole_gets(site)
    # A permutation of the epoch uses every shard all through it: all 12 fit
    # the default budget, and each is downloaded once (workers share the cache).
    assert sorted(gets) == [f"d-{n:06d}.tar" for n in range(12)]


def test_map_style_without_fastdatas_sampler_caches_shards_that_fit(site, monkeypatch):
    assert _batches(site.manifest, 0, sampler=False) == _batches(site.local, 0, sampler=False)
    gets = _whole_gets(site)
    # The dataset fits the budget: each shard downloaded once, on first use.
    assert sorted(gets) == [f"d-{n:06d}.tar" for n in range(12)]
    del site.log[:]
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", str(sum(_shard_bytes(site.local)) - 1))
    assert _batches(site.manifest, 0, sampler=False) == _batches(site.local, 0, sampler=False)
    assert _whole_gets(site) == []     # larger than the budget: read by range


def test_map_style_resumed_mid_epoch_reads_ahead_from_there(site):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(path):
        ds = fastdata.open_dataset(path, order=fastdata.Order(shuffle=True, seed=2,
                                                              batch_size=32))
        return StatefulDataLoader(ds, batch_sampler=fastdata.EpochBatches(ds), num_workers=2,
                                  collate_fn=fastdata.collate)

    first = loader(site.manifest)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    resumed = loader(site.manifest)
    resumed.load_state_dict(state)
    rest = list(resumed)
    whole = [(x.numpy().tobytes(), y.tolist()) for x, y in head + rest]
    assert whole == _batches(site.local, 0)[:len(whole)] and len(whole) == 19

"""Order-driven read-ahead of streams at URLs: which shards are downloaded whole,
in which order, within which budget, and what a broken download does. The
requests are counted at the test's own HTTP server, over a real socket; the
bytes the cache held, at the peak and after, are read from the cache folder's
own account, which every process downloading into it keeps."""

from __future__ import annotations

import gc
import os
from dataclasses import replace

import numpy as np
import pytest

import fastdata
from fastdata.demo import synthesize
from fastdata.errors import FastDataError
from fastdata.formats.sharded.fetch_plan import plan_fetches
from fastdata.loaders.read_ahead import READ_CHUNK
from fastdata.storage import ShardCache
from fastdata.formats.ranged_copy import BLOCK

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
    from servers import http_site

    local, www = served
    with http_site(www, monkeypatch, tmp_path / "cache") as server:
        server.local = local
        server.manifest = f"{server.url}/d.tar.fastdata.json"
        yield server


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
    # Asked for in the order the epoch first needs them; 2 x read_ahead = 4 run
    # at once, so one may reach the server up to a round of four late.
    records = [int(i) for i in ds.plan().record_indices(
        fastdata.order.epochs.epoch_order(600, ds.shuffle_mode, 0), np.arange(600))]
    first_use = list(dict.fromkeys(ds.reader.shards_of(records)))
    got = [int(p.rsplit("-", 1)[1].split(".")[0]) for p in gets]
    assert all(abs(got.index(s) - k) < 8 for k, s in enumerate(first_use)), (got, first_use)
    # What a download covers is not also read by range after the first chunks.
    ranged = [p for m, p, r in site.log if r is not None and p.endswith(".tar")]
    assert len(ranged) <= 2 * 12


#: The dataset's pieces' checksums and its index's ranged copy (the index's
#: bytes, filled as read, then a mark per block), which the cache keeps.
INDEX_FILES = ["d.tar.fastdata.index-crc.npy", "d.tar.fastdata.index.npy.ranges"]


def _index_bytes(site) -> int:
    """The bytes of the index files the cache keeps beside the shards."""
    folder = os.path.dirname(site.local)
    index = os.path.getsize(os.path.join(folder, "d.tar.fastdata.index.npy"))
    return (os.path.getsize(os.path.join(folder, "d.tar.fastdata.index-crc.npy"))
            + index + -(-index // BLOCK))


def _usage():
    """The account of the cache folder the ``site`` fixture points at."""
    return ShardCache().usage()


def _cached(tmp_path) -> list[str]:
    """What the cache folder holds besides lock files and the account, by name."""
    folder = tmp_path / "cache" / "objects"
    return sorted(n.split("-", 1)[1] if ".partial-" not in n else n
                  for n in os.listdir(folder) if not n.endswith(".lock"))


def _plan_peak(ds, budget: int) -> int:
    """The most bytes of whole shards the stream's plan holds at once under ``budget``."""
    records = ds.plan().record_indices(
        fastdata.order.epochs.epoch_order(600, ds.shuffle_mode, 0), np.arange(600))
    shards, sizes = ds.reader.placement(records)
    return plan_fetches(shards, sizes, ds.reader.shard_sizes(), chunk=READ_CHUNK,
                        budget=budget).peak()


def test_the_cache_holds_at_most_its_budget(site, monkeypatch, tmp_path):
    index = _index_bytes(site)
    ds = fastdata.ShardedIterableDataset(site.manifest, order=ORDER, read_ahead=2)
    # A budget that the shards alone could fill to within less than the index:
    # the folder keeps within it only if the index the cache holds counts too.
    budget = _plan_peak(ds, 3 * max(_shard_bytes(site.local))) + index - 1
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", str(budget))
    got = _samples(ds)
    assert got == _samples(fastdata.ShardedIterableDataset(site.local, order=ORDER))
    usage = _usage()      # every byte the cache held, partial downloads included
    assert 0 < usage.peak <= budget, (usage, budget)
    assert _whole_gets(site), "nothing was downloaded whole"
    # The epoch's shards go after their last use; the index stays (cached once).
    assert _cached(tmp_path) == INDEX_FILES
    assert usage.held == index


def test_workers_keep_within_the_budget_together(site, monkeypatch, tmp_path):
    import torch
    from worker_pids import CollatedIn, assert_workers_did_it

    # Each worker's share holds two shards at once; the whole budget, four.
    budget = 4 * max(_shard_bytes(site.local))
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", str(budget))
    log = tmp_path / "collated"
    order = replace(ORDER, batch_size=32)
    loader = torch.utils.data.DataLoader(
        fastdata.ShardedIterableDataset(site.manifest, order=order),
        batch_size=32, num_workers=2, collate_fn=CollatedIn(log, fastdata.collate))
    local = torch.utils.data.DataLoader(
        fastdata.ShardedIterableDataset(site.local, order=order),
        batch_size=32, num_workers=2, collate_fn=fastdata.collate)
    got = [(x.numpy().tobytes(), y.tolist()) for x, y in loader]
    assert got == [(x.numpy().tobytes(), y.tolist()) for x, y in local]
    assert_workers_did_it(log, 2)
    assert _whole_gets(site), "nothing was downloaded whole"
    # One account for the folder both worker processes download into.
    usage = _usage()
    assert 0 < usage.peak <= budget, (usage, budget)
    assert _cached(tmp_path) == INDEX_FILES
    assert usage.held == _index_bytes(site)


def test_a_budget_smaller_than_a_shard_reads_every_shard_by_range(site, monkeypatch):
    budget = min(_shard_bytes(site.local)) - 1
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", str(budget))
    ds = fastdata.ShardedIterableDataset(site.manifest, order=ORDER, read_ahead=2)
    assert _samples(ds) == _samples(fastdata.ShardedIterableDataset(site.local, order=ORDER))
    # No shard fits: none is downloaded whole, so the cache only ever held the index.
    assert _whole_gets(site) == []
    assert [p for m, p, r in site.log if r is not None and p.endswith(".tar")]
    assert _usage().peak == _index_bytes(site)


def test_a_cache_smaller_than_one_shard_holds_one_at_a_time(site, tmp_path):
    """One object larger than the limit stays while in use; the next download
    makes room by evicting it before its first byte."""
    sizes = _shard_bytes(site.local)
    cache = ShardCache(str(tmp_path / "small"), limit=min(sizes) - 1)
    remote = fastdata.ShardedIterableDataset(site.manifest).reader
    local = fastdata.ShardedIterableDataset(site.local).reader
    for shard, (first, count) in enumerate(remote.shard_ranges()):
        remote.attach_local(shard, remote.shard_copy(shard, cache))
        records = list(range(first, first + count))
        assert remote.read_many(records) == local.read_many(records)
        assert cache.usage().held == sizes[shard]     # this shard alone
        remote.detach_local(shard)
        cache.release()                               # its reader has done with it
    assert len(_whole_gets(site)) == 12
    assert cache.usage().peak == max(sizes)


def test_a_shard_dropped_while_its_download_runs_is_accounted_back(site, tmp_path):
    from servers import Hold

    index, sizes = _index_bytes(site), _shard_bytes(site.local)
    keys = f"{site.url}/d.tar.fastdata.keys.json"
    keys_bytes = os.path.getsize(os.path.join(os.path.dirname(site.local), keys.rsplit("/")[-1]))
    # Stored order: shard 0's records are all in chunk 0, which never waits for
    # a download; its download (one of two: read_ahead=1 downloads two at a
    # time, shards 0 and 1) is held half-way at the server meanwhile, and so
    # is shard 1's.
    hold = site.hold["d-000000.tar"] = Hold()
    hold1 = site.hold["d-000001.tar"] = Hold()
    ds = fastdata.ShardedIterableDataset(site.manifest, order=fastdata.Order(), read_ahead=1)
    got, samples = [], iter(ds)   # kept: a failed check releases the hold before it closes
    try:
        for x, y in samples:
            if not got:
                # Chunk 0 was read by range and let go of shard 0 (its last
                # use), whose download runs on.
                assert hold.reached.wait(60), "shard 0 was never downloaded whole"
                assert hold1.reached.wait(60), "shard 1 was never downloaded whole"
                assert len([n for n in _cached(tmp_path) if "d-000000.tar.partial-" in n]) == 1
                # Reserved whole from their start.
                assert _usage().held == index + sizes[0] + sizes[1]
                # Another cache's download meanwhile counts those under way whole too.
                other = ShardCache()
                copy = other.local(keys)
                assert other.usage().held == index + sizes[0] + sizes[1] + keys_bytes
                other.discard(copy)
                hold.release()
                hold1.release()
            got.append((int(y), bytes(np.asarray(x).tobytes())))
    finally:
        hold.release()
        hold1.release()
    assert got == _samples(fastdata.ShardedIterableDataset(site.local, order=fastdata.Order()))
    assert _whole_gets(site).count("d-000000.tar") == 1
    # The copy landed after its last use and was dropped: nothing left, all counted back.
    assert _cached(tmp_path) == INDEX_FILES
    assert _usage().held == index


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pass_left_early_leaves_only_the_index(site, tmp_path, workers):
    import torch
    from worker_pids import CollatedIn, assert_workers_did_it

    log = tmp_path / "collated"
    # One chunk ahead: each worker stops with most of its pass's shards still to use.
    ds = fastdata.ShardedIterableDataset(site.manifest, order=replace(ORDER, batch_size=32),
                                         read_ahead=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=workers,
                                         collate_fn=CollatedIn(log, fastdata.collate))
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    assert _whole_gets(site), "nothing was downloaded whole"
    del batches, loader, ds    # the workers stop; each one's pass closes
    gc.collect()
    assert_workers_did_it(log, workers)
    assert _cached(tmp_path) == INDEX_FILES
    assert _usage().held == _index_bytes(site)


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
        fastdata.ShardedIterableDataset(site.manifest, order=replace(ORDER, batch_size=32)),
        batch_size=32, num_workers=2, collate_fn=fastdata.collate)
    local = torch.utils.data.DataLoader(
        fastdata.ShardedIterableDataset(site.local, order=replace(ORDER, batch_size=32)),
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

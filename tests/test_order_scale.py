"""The order computed per position (fastdata.order.bijection, EpochOrder):
a bijection for every size, shuffle mode and key; windows that stay within
their blocks; datasets of up to 10^12 records planned without an array of
their size; resume states of the earlier order algorithm refused."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import optional
import pytest

import fastdata
from fastdata.order.bijection import ALGORITHM, Bijection
from fastdata.order.epochs import Shuffle, epoch_order
from fastdata.order.slices import Slice

optional.require("hypothesis")  # the test extra: without it, this module skips
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 3000), key=st.integers(0, 2**64 - 1))
def test_a_bijection_is_a_permutation_of_its_domain(n, key):
    values = Bijection(n, key).at(np.arange(n))
    assert sorted(values.tolist()) == list(range(n))


def test_keys_per_position_give_each_its_own_permutation():
    keys = np.repeat(np.arange(4, dtype=np.uint64), 50)
    values = Bijection(50, keys).at(np.tile(np.arange(50), 4)).reshape(4, 50)
    for row, key in zip(values, range(4)):
        assert row.tolist() == Bijection(50, key).at(np.arange(50)).tolist()
    assert len({tuple(r) for r in values.tolist()}) == 4


MODES = st.one_of(
    st.builds(lambda: ("full", 1, None)),
    st.tuples(st.just("blocks"), st.integers(1, 64), st.integers(1, 20000)),
)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10**12), mode=MODES, seed=st.integers(0, 2**32),
       epoch=st.integers(0, 10**6), data=st.data())
def test_positions_of_a_huge_order_map_to_distinct_records(n, mode, seed, epoch, data):
    """Any positions of an order of up to 10^12 records: records in range,
    distinct for distinct positions, and the same when asked again in
    another grouping (what a rank or worker computes alone)."""
    _, block, window = mode
    order = epoch_order(n, Shuffle(True, seed, block, n if window is None else window), epoch)
    positions = np.unique(np.asarray(data.draw(st.lists(st.integers(0, n - 1), min_size=1,
                                                        max_size=300)), dtype=np.int64))
    records = order[positions]
    assert records.min() >= 0 and records.max() < n
    assert len(set(records.tolist())) == len(positions)
    half = len(positions) // 2
    assert np.concatenate([order[positions[:half]], order[positions[half:]]]).tolist() == \
        records.tolist()


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 10**12), world=st.integers(1, 4096), batch=st.integers(1, 512),
       policy=st.sampled_from(["pad", "drop"]), data=st.data())
def test_ranks_of_a_huge_epoch_get_equal_slices_of_distinct_records(n, world, batch, policy,
                                                                      data):
    ranks = sorted(set(data.draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=4))))
    order = epoch_order(n, Shuffle(True, 3, 16, 8192), 1)
    plans = [Slice(n, 0, world, r, batch, policy) for r in ranks]
    assert len({(p.per_rank, p.batches()) for p in plans}) == 1
    if not plans[0].batches():
        return
    t = data.draw(st.integers(0, plans[0].batches() - 1))
    firsts = [p.record_indices(order, np.arange(p.batch_positions(t).start,
                                                p.batch_positions(t).stop)) for p in plans]
    everything = np.concatenate(firsts).tolist()
    wraps = policy == "pad" and (t + 1) * batch * world > n  # padding repeats the start
    assert wraps or len(set(everything)) == len(everything)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 5000), block=st.integers(1, 40), window=st.integers(1, 600),
       seed=st.integers(0, 2**32))
def test_a_window_of_positions_reads_only_its_own_blocks(n, block, window, seed):
    """Positions of one window come from the window's blocks alone, whole
    blocks: a stream reads a bounded set of shards at a time."""
    order = epoch_order(n, Shuffle(True, seed, block, window), 0)[:]
    assert sorted(order.tolist()) == list(range(n))
    per_window = max(1, window // block) * block
    for w in range(0, n, per_window):
        blocks = order[w:w + per_window] // block
        assert len(set(blocks.tolist())) <= per_window // block
        # Each block present is present whole (the short last block too).
        for b in set(blocks.tolist()):
            assert (blocks == b).sum() == min(block, n - b * block)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=40),
       window=st.integers(1, 400), seed=st.integers(0, 2**32), epoch=st.integers(0, 3))
def test_whole_shards_as_blocks(lengths, window, seed, epoch):
    firsts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    n = int(sum(lengths))
    order = epoch_order(n, Shuffle(True, seed, "shard", window), epoch, firsts)[:]
    assert sorted(order.tolist()) == list(range(n))
    shard_of = np.searchsorted(firsts, order, side="right") - 1
    per_window = max(1, round(window / max(1.0, n / len(lengths))))
    # Windows are runs of whole shards: the position spans of the shards,
    # merged where they overlap, each hold at most a window's shards.
    spans = sorted((int(np.flatnonzero(shard_of == s).min()),
                    int(np.flatnonzero(shard_of == s).max())) for s in set(shard_of.tolist()))
    group_end, in_group = -1, 0
    for lo, hi in spans:
        if lo > group_end:
            group_end, in_group = hi, 0
        group_end = max(group_end, hi)
        in_group += 1
        assert in_group <= per_window


def test_epoch_batches_of_ten_billion_records_start_small():
    """A fresh process plans rank 4095 of 4096's first batch of 10^10
    records (the stream mode too) within 300 MB at its peak, torch's import
    included."""
    code = """
import json
import fastdata
out = []
for extra in ({}, {"block": 16, "window": 8192}):
    order = fastdata.Order(shuffle=True, batch_size=256, rank=4095, world_size=4096, **extra)
    batch = next(iter(fastdata.EpochBatches(10**10, order=order)))
    out.append(batch)
# VmHWM is this program's peak; ru_maxrss would also count the pytest
# process this one was forked from (Linux keeps it across exec).
with open("/proc/self/status") as status:
    rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
print(json.dumps({"batches": out, "rss": rss}))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    got = json.loads(run.stdout)
    for batch in got["batches"]:
        assert len(batch) == 256 and len(set(batch)) == 256
        assert all(0 <= i < 10**10 for i in batch)
    assert got["rss"] < 300 * 2**20


def test_a_state_of_the_earlier_order_algorithm_is_refused():
    sampler = fastdata.EpochBatches(1000, order=fastdata.Order(shuffle=True, batch_size=10))
    state = sampler.state_dict()
    assert state["order"]["algorithm"] == ALGORITHM
    old = json.loads(json.dumps(state))
    del old["order"]["algorithm"]  # what the permutation-per-epoch releases saved
    with pytest.raises(ValueError, match="order algorithm 1.*start of epoch 0"):
        fastdata.EpochBatches(1000, order=fastdata.Order(shuffle=True, batch_size=10)
                              ).load_state_dict(old)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.floats(0.05, 5.0)), min_size=1, max_size=5),
       st.integers(1, 400), st.integers(0, 3), st.integers(1, 40), st.integers(0, 2**31))
def test_a_mixtures_epoch_per_position_is_the_sorted_one(sources, per_epoch, epoch, chunk,
                                                         seed):
    """Chunks of any size give the epoch that sorting every sample's key gives."""
    from fastdata.order import interleave
    from fastdata.order.epochs import stable_seed
    from fastdata.order.mixture import Mixture, MixSource

    mixture = Mixture([MixSource(f"s{k}", n, weight=w) for k, (n, w) in enumerate(sources)],
                      samples_per_epoch=per_epoch, seed=seed)
    counts = mixture.counts(epoch)
    phases = np.random.Generator(np.random.PCG64(stable_seed("mix", seed, epoch))).random(
        len(sources))
    keys = np.concatenate([(np.arange(c) + phases[s]) / c for s, c in enumerate(counts)])
    owner = np.concatenate([np.full(c, s) for s, c in enumerate(counts)])
    expected = owner[np.lexsort((owner, keys))]
    saved = interleave.CHUNK
    interleave.CHUNK = chunk
    try:
        source, _, _ = Mixture([MixSource(f"s{k}", n, weight=w) for k, (n, w)
                                in enumerate(sources)], samples_per_epoch=per_epoch,
                               seed=seed).epoch_at(epoch, np.arange(per_epoch))
    finally:
        interleave.CHUNK = saved
    assert source.tolist() == expected.tolist()


def test_a_mixture_of_a_billion_samples_is_read_per_position():
    from fastdata.order.mixture import Mixture, MixSource

    mixture = Mixture([MixSource("a", 10**9, weight=3), MixSource("b", 5 * 10**8, weight=1)],
                      samples_per_epoch=10**9, seed=1)
    positions = np.arange(7 * 10**8, 7 * 10**8 + 256)
    source, record, cycle = mixture.epoch_at(2, positions)
    assert len(set(zip(source.tolist(), record.tolist()))) == 256
    assert abs(int((source == 0).sum()) - 192) < 1  # its share, to within 1 + (k-2) f
    taken = mixture.taken_at(2, 7 * 10**8)
    assert taken["a"] + taken["b"] == 2 * 10**9 + 7 * 10**8  # epochs 0 and 1, then 7e8
    assert cycle.max() <= 4

"""Statistical tests of independence: every part of an order that should have
a permutation of its own gets one, not a shared or shifted copy.

- the windows of a streamed epoch (records in blocks, windows of blocks, or
  whole shards): the records' places inside their blocks or shards, window
  by window, agree in about 1 place in the block's size, and their rank
  correlation is near 0;
- the epochs of one seed;
- the sources of a mixture of the same size, and the cycles of a repeated
  source: never in lockstep;
- the classes of a stratified subset (``fastdata.subset(fraction=,
  stratify=True)``): each class's picks drawn apart from the others'.

The seeds are fixed, so every figure here is a fixed number; the bounds are
at least five standard deviations from what independent permutations give
(so another keying of the same quality passes too), and far from the 100%
agreement (or correlation 1) of a shared permutation.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from conftest import build_tree, no_hang, uniform_spec

from fastdata.order.epochs import Shuffle, epoch_order
from fastdata.order.mixture import MixSource, Mixture


@pytest.fixture(autouse=True)
def _time_limit():
    with no_hang(120):
        yield


def ranks(a) -> np.ndarray:
    """Each value's rank, tied values sharing their average rank."""
    a = np.asarray(a)
    out = np.empty(len(a))
    out[np.argsort(a, kind="stable")] = np.arange(len(a))
    _, where = np.unique(a, return_inverse=True)
    return (np.bincount(where, weights=out) / np.bincount(where))[where]


def spearman(a, b) -> float:
    """The rank correlation of two equally long sequences (Spearman's rho:
    about normal, standard deviation 1/sqrt(n - 1), for independent ones)."""
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def agreement(a, b) -> float:
    """The fraction of places where two sequences hold the same value."""
    return float(np.mean(np.asarray(a) == np.asarray(b)))


# -- windows ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_each_window_of_a_stream_has_its_own_permutation(seed):
    """The stream's default order (blocks of 16, windows of 8192 records): a
    record's place in its block, position by position, agrees between two
    windows in about 1/16 of the positions, and is uncorrelated."""
    window, block, windows = 8192, 16, 4
    order = epoch_order(window * windows, Shuffle(True, seed, block, window), 0)[:]
    within = order.reshape(windows, window) % block
    for a, b in itertools.combinations(range(windows), 2):
        assert agreement(within[a], within[b]) < 0.10, (a, b)  # 1/16 expected, not 1
        assert abs(spearman(within[a], within[b])) < 0.06, (a, b)  # 5.4 sigma
    # The windows' blocks are whole blocks, each read within its window.
    assert sorted(set((order[:window] // block).tolist())) == \
        sorted(set((np.sort(order[:window]) // block).tolist()))


@pytest.mark.parametrize("seed", [0, 3])
def test_each_window_of_whole_shards_has_its_own_permutation(seed):
    """Ten shards of 300 records, three to a window: a record's place in its
    shard agrees between windows about once in 300."""
    shards, size = 10, 300
    starts = np.arange(shards) * size
    order = epoch_order(shards * size, Shuffle(True, seed, "shard", 3 * size), 0, starts)[:]
    offsets = (order[:9 * size] % size).reshape(3, 3 * size)  # three whole windows
    for a, b in itertools.combinations(range(3), 2):
        assert agreement(offsets[a], offsets[b]) < 0.02, (a, b)  # 1/300 expected
        assert abs(spearman(offsets[a], offsets[b])) < 0.17, (a, b)  # 5 sigma


# -- epochs -------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [Shuffle(True, 5, 1, 10**9), Shuffle(True, 5, 16, 8192)],
                         ids=["map-style", "stream"])
def test_epochs_are_independent_permutations(shuffle):
    n = 20_000
    epochs = [epoch_order(n, shuffle, e)[:] for e in range(4)]
    for a, b in itertools.combinations(range(4), 2):
        assert agreement(epochs[a], epochs[b]) < 0.01, (a, b)  # 1/n expected
        assert abs(spearman(epochs[a], epochs[b])) < 0.05, (a, b)


# -- mixtures -----------------------------------------------------------------------------


def _by_source(m: Mixture, epoch: int) -> list[np.ndarray]:
    source, record = m.epoch(epoch)
    return [record[source == s] for s in range(len(m.sources))]


@pytest.mark.parametrize("seed", [0, 11])
def test_sources_of_the_same_size_are_not_in_lockstep(seed):
    """Three sources of 2000 records, equal shares: each reads its own
    permutation (the sources' seeds differ by name), in every epoch."""
    m = Mixture([MixSource(name, 2000, weight=1) for name in ("a", "b", "c")],
                samples_per_epoch=6000, seed=seed)
    for epoch in (0, 1):
        records = _by_source(m, epoch)
        assert [len(r) for r in records] == [2000, 2000, 2000]
        for a, b in itertools.combinations(range(3), 2):
            assert agreement(records[a], records[b]) < 0.01, (epoch, a, b)
            assert abs(spearman(records[a], records[b])) < 0.12, (epoch, a, b)
    # Blocked sources of one size: their records' places in a block differ too.
    blocked = Mixture([MixSource(name, 4096, weight=1, block=8, window=512)
                       for name in ("x", "y")], samples_per_epoch=8192, seed=seed)
    x, y = _by_source(blocked, 0)
    assert agreement(x % 8, y % 8) < 0.2 and agreement(x, y) < 0.01


def test_each_cycle_of_a_repeated_source_is_a_fresh_permutation():
    """A source of 500 records read 4 times an epoch: each cycle is the whole
    source, in an order of its own."""
    m = Mixture([MixSource("small", 500, count=2000), MixSource("other", 50, count=10)],
                seed=2)
    source, record, cycle = m.epoch_with_cycles(0)
    small = record[source == 0]
    assert cycle[source == 0].tolist() == sorted(cycle[source == 0].tolist())
    cycles = small.reshape(4, 500)
    for a, b in itertools.combinations(range(4), 2):
        assert sorted(cycles[a].tolist()) == list(range(500))
        assert agreement(cycles[a], cycles[b]) < 0.02, (a, b)
        assert abs(spearman(cycles[a], cycles[b])) < 0.25, (a, b)


# -- stratified subsets -------------------------------------------------------------------


CLASSES, PER_CLASS = ("a", "b", "c", "d"), 60


@pytest.fixture(scope="module")
def four_classes(tmp_path_factory):
    import fastdata

    root = tmp_path_factory.mktemp("strata")
    tree = build_tree(root / "src", uniform_spec(CLASSES, PER_CLASS, (".png",)), size=(8, 8))
    return fastdata.pack(tree.root, root / "d.lmdb", progress=False).output


def _picks(dataset, seed: int) -> np.ndarray:
    """Which records of each class (in their order) a stratified half keeps:
    a (classes, per class) boolean array."""
    import fastdata
    from fastdata.dataset.resolve import open_reader

    out = os.path.join(os.path.dirname(dataset), f"half-{seed}.fastdata.json")
    fastdata.subset(dataset, out, fraction=0.5, seed=seed, stratify=True, overwrite=True)
    with open_reader(dataset) as parent, open_reader(out) as view:
        keys, labels = list(parent.keys), np.asarray(parent.labels)
        kept = set(view.keys)
    picked = np.asarray([k in kept for k in keys])
    return np.stack([picked[labels == c] for c in range(len(CLASSES))])


@pytest.mark.parametrize("seed", [0, 5])
def test_each_class_of_a_stratified_subset_is_drawn_apart(four_classes, seed):
    picks = _picks(four_classes, seed)
    assert picks.sum(axis=1).tolist() == [PER_CLASS // 2] * len(CLASSES)  # exact per class
    for a, b in itertools.combinations(range(len(CLASSES)), 2):
        # Independent halves agree in about half the places; a shared key in all.
        assert 0.15 < agreement(picks[a], picks[b]) < 0.85, (a, b)
    # Another seed, other picks in every class.
    other = _picks(four_classes, seed + 100)
    assert all(agreement(picks[c], other[c]) < 0.85 for c in range(len(CLASSES)))

"""fastdata.loader(...).state_dict(): the training loop's point, whatever runs ahead.

A loader made by fastdata.loader() decodes batches ahead of the loop (a
background thread, worker processes), so what made the batches is ahead of
the step; the loader's own state counts the batches the loop was handed.
Resuming from it must give exactly the batches an uninterrupted pass gives
after that point, for map-style datasets and streams alike: the same records
in the same order (every record has a class of its own, so a batch's labels
are its record indices).
"""

from __future__ import annotations

import json

import pytest
import torch

import fastdata
from fastdata.demo import synthesize

ORDER = fastdata.Order(shuffle=True, seed=3, batch_size=8)


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loop")
    # One image per class: a label names its record (record i has label i).
    synthesize(tmp / "src", kind="tiny", n=100, classes=100, seed=2)
    lmdb = fastdata.pack(tmp / "src", tmp / "d.lmdb", progress=False).output
    fastdata.pack(tmp / "src", tmp / "d-%06d.tar",
                  options=fastdata.PackOptions(shard_size=30), progress=False)
    out = {"map": str(lmdb), "stream": str(tmp / "d.tar.fastdata.json")}
    for kind in out:
        assert _open(out, kind).targets == list(range(100))
    return out


def _open(packs, kind):
    return fastdata.open_dataset(packs[kind], streaming=kind == "stream",
                                 decode=fastdata.Decode(size=(16, 16)), order=ORDER)


def _loader(ds, workers):
    return fastdata.loader(ds) if workers is None else fastdata.loader(ds, num_workers=workers)


def _batches(loader):
    """The record indices of each batch (a record's label is its index)."""
    return [labels.tolist() for _, labels in loader]


@pytest.mark.parametrize("kind", ["map", "stream"])
@pytest.mark.parametrize("workers", [None, 0, 2])
@pytest.mark.parametrize("stop", [0, 1, 6])
def test_resume_from_the_loaders_state_gives_the_rest_of_the_pass(packs, kind, workers, stop):
    whole = _batches(_loader(_open(packs, kind), workers))
    assert len(whole) == 13  # 100 records in batches of 8
    assert sorted(sum(whole, [])) == list(range(100)) != sum(whole, [])  # each once, shuffled

    first = _loader(_open(packs, kind), workers)
    taken = []
    for _, labels in first:    # a step on each batch, then a checkpoint after `stop`
        taken.append(labels.tolist())
        if len(taken) >= stop:
            break
    taken = taken[:stop] if stop else []
    state = first.state_dict() if stop else _loader(_open(packs, kind), workers).state_dict()
    # The position of the loop, not of the batches made ahead of it.
    assert state["epoch"] == 0 and state["consumed"] == 8 * stop
    json.dumps(state)  # a checkpoint can hold it as it is

    again = _loader(_open(packs, kind), workers)
    again.load_state_dict(state)
    rest = _batches(again)
    assert len(rest) == 13 - stop and taken + rest == whole


@pytest.mark.parametrize("kind", ["map", "stream"])
def test_after_a_whole_pass_the_state_is_the_next_epochs_start(packs, kind):
    loader = _loader(_open(packs, kind), 0)
    before = loader.state_dict()
    assert (before["epoch"], before["consumed"]) == (0, 0)
    _batches(loader)
    after = loader.state_dict()
    assert (after["epoch"], after["consumed"]) == (1, 0)
    second = _batches(loader)  # epoch 1 itself

    assert len(second) == 13 and second != _batches(_loader(_open(packs, kind), 0))

    resumed = _loader(_open(packs, kind), 0)
    resumed.load_state_dict(after)
    assert _batches(resumed) == second


@pytest.mark.parametrize("kind", ["map", "stream"])
def test_every_batch_taken_is_the_next_epochs_start_without_asking_once_more(packs, kind):
    # A loop that stops at the length it knows (Lightning does) never asks the
    # loader for the end of the pass: its state is still the next epoch's start.
    loader = _loader(_open(packs, kind), 0)
    it = iter(loader)
    whole = [labels.tolist() for _, (_, labels) in zip(range(len(loader)), it)]
    assert len(whole) == 13
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 0)
    resumed = _loader(_open(packs, kind), 0)
    resumed.load_state_dict(state)
    assert len(_batches(resumed)) == 13
    it.close()


def test_a_resume_point_loads_with_other_workers(packs):
    first = _loader(_open(packs, "map"), 2)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    del it
    whole = _batches(_loader(_open(packs, "map"), 0))
    assert len(whole) == 13
    again = _loader(_open(packs, "map"), 0)
    again.load_state_dict(state)
    rest = _batches(again)
    assert len(rest) == 9 and rest == whole[4:]


def test_a_loader_fastdata_does_not_order_says_so(packs):
    ds = _open(packs, "map")  # batches of 8, from its order
    loader = fastdata.loader(ds, num_workers=0, sampler=torch.utils.data.RandomSampler(ds))
    with pytest.raises(TypeError, match="no position to save"):
        loader.state_dict()
    foreign = fastdata.CUDAPrefetcher(torch.utils.data.DataLoader(ds, batch_size=8),
                                      device="cpu")
    with pytest.raises(TypeError, match="no position to save"):
        foreign.load_state_dict({})


def test_another_datasets_state_is_refused(packs, tmp_path):
    synthesize(tmp_path / "other", kind="tiny", n=40, classes=2, seed=9)
    other = fastdata.pack(tmp_path / "other", tmp_path / "o.lmdb", progress=False).output
    state = _loader(fastdata.open_dataset(other, decode=fastdata.Decode(size=(16, 16)),
                                          order=ORDER), 0).state_dict()
    with pytest.raises(ValueError):
        _loader(_open(packs, "map"), 0).load_state_dict(state)


def test_a_batch_sampler_of_ones_own_is_taken_with_a_shuffled_order(packs):
    ds = _open(packs, "map")
    own = fastdata.loader(ds, num_workers=0, batch_sampler=fastdata.EpochBatches(ds))
    assert _batches(own) == _batches(_loader(_open(packs, "map"), 0))
    assert own.state_dict()["epoch"] == 1  # the sampler is fastdata's: it has a position

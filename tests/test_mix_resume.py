"""A mixture's resume states describe everything that shapes its order, and
its resumes are exact where a run can stop: the blocks and windows of its
sources, a weight schedule across epochs, the end of an epoch, drop_last,
DataLoader workers that persist across epochs.

Samples are named by (source, record index) from their metadata, never by
label, so a reorder within a class is seen.
"""

from __future__ import annotations

import re
from dataclasses import replace

import optional
import pytest
from conftest import build_tree, uniform_spec
from worker_pids import CollatedIn, assert_other_processes

import fastdata
from fastdata import Decode, Order
from fastdata.order.mixture import MixOrder, MixSource, Mixture
from fastdata.order.state import StreamPoint, order_description, parse_state

StatefulDataLoader = optional.require("torchdata").StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
BATCH = 5
DECODE = Decode(size=(8, 8))
BLOCKED = Order(shuffle=True, seed=3, batch_size=BATCH, block=4, window=8)


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """'pets': 12 images, LMDB; 'zoo': 21 images, tar shards of 8."""
    root = tmp_path_factory.mktemp("mixres")
    pets = build_tree(root / "pets", uniform_spec(("cat", "dog"), 6), size=(12, 12))
    zoo = build_tree(root / "zoo", uniform_spec(("cat", "dog", "eel"), 7), size=(14, 10))
    out = {"pets": str(root / "pets.lmdb"), "zoo": str(root / "zoo.tar")}
    fastdata.pack(pets.root, out["pets"], options=fastdata.PackOptions(workers=1),
                  progress=False)
    fastdata.pack(zoo.root, out["zoo"], options=fastdata.PackOptions(workers=1, shard_size=8),
                  progress=False)
    return out


def _mix(packs, order=BLOCKED, schedule=None, decode=DECODE, samples=30):
    sources = {"pets": {"path": packs["pets"]}, "zoo": {"path": packs["zoo"]}}
    if schedule is None:
        sources["pets"]["weight"], sources["zoo"]["weight"] = 1, 2
    return fastdata.mix(sources, samples_per_epoch=samples, decode=decode, order=order,
                        schedule=schedule, with_metadata=True)


def _loader(ds, **options):
    return fastdata.loader(ds, device="cpu", **{"num_workers": 0, **options})


def _names(batches) -> list[tuple[str, int]]:
    return [(m["source"], m["index"]) for _, _, metas in batches for m in metas]


def _passes(loader, count: int) -> list[list[tuple[str, int]]]:
    """``count`` whole passes of ``loader``, each its samples' names."""
    return [_names(loader) for _ in range(count)]


def _epoch(ds, epoch: int) -> list[tuple[str, int]]:
    ds.set_epoch(epoch)
    return [ds.locate(i) for i in range(len(ds))]


# -- what a state describes ------------------------------------------------------


def test_block_and_window_change_a_mixtures_order(packs):
    plain = _mix(packs, Order(shuffle=True, seed=3, batch_size=BATCH))
    blocked = _mix(packs)
    assert _epoch(plain, 0) != _epoch(blocked, 0)
    assert plain.mixture.describe(0) != blocked.mixture.describe(0)
    assert blocked.mixture.describe(0)["mixture"][0] == {
        "name": "pets", "size": 12, "count": None, "weight": 1, "block": 4, "window": 8}


@pytest.mark.parametrize("other, named", [
    (Order(shuffle=True, seed=3, batch_size=BATCH), "mixture['pets'].block 4 now 1"),
    (Order(shuffle=True, seed=3, batch_size=BATCH, block=4, window=12),
     "mixture['pets'].window 8 now 12"),
    (Order(shuffle=True, seed=3, batch_size=BATCH, block=2, window=8),
     "mixture['zoo'].block 4 now 2"),
])
def test_a_state_under_another_block_or_window_is_refused(packs, other, named):
    loader = _loader(_mix(packs))
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="another order.*" + re.escape(named)):
        _loader(_mix(packs, other)).load_state_dict(state)
    # A StatefulDataLoader's whole state too.
    ds = _mix(packs)
    stateful = StatefulDataLoader(ds, batch_sampler=fastdata.EpochBatches(ds),
                                  collate_fn=fastdata.collate)
    it = iter(stateful)
    next(it)
    saved = stateful.state_dict()
    refused = _mix(packs, other)
    with pytest.raises(ValueError, match=re.escape(named)):
        fastdata.EpochBatches(refused).load_state_dict(saved)
    # Under the same order, the same state resumes: the rest of the epoch.
    again = _loader(_mix(packs))
    again.load_state_dict(state)
    assert _names(again) == _epoch(_mix(packs), 0)[2 * BATCH:]


def test_whole_shards_as_blocks_are_refused_by_name_in_a_mixture(packs):
    with pytest.raises(ValueError, match=re.escape("Order(block='shard')")):
        _mix(packs, Order(shuffle=True, block="shard"))
    with pytest.raises(ValueError, match="block must be a record count"):
        MixSource("a", 10, weight=1, block="shard")


def test_a_state_under_another_random_crop_is_refused(packs):
    crop = fastdata.RandomResizedCrop(8, scale=(0.5, 1.0))
    loader = _loader(_mix(packs, decode=Decode(crop=crop)))
    next(iter(loader))
    state = loader.state_dict()
    assert state["order"]["samples"]["crop"] == {"scale": [0.5, 1.0], "ratio": [0.75, 4 / 3],
                                      "hflip": 0.5, "seed": 3}
    other = Decode(crop=fastdata.RandomResizedCrop(8, scale=(0.25, 1.0)))
    with pytest.raises(ValueError,
                       match=re.escape("samples.crop.scale [0.5, 1.0] now [0.25, 1.0]")):
        _loader(_mix(packs, decode=other)).load_state_dict(state)
    # The output size draws nothing: another one resumes.
    bigger = Decode(crop=fastdata.RandomResizedCrop(10, scale=(0.5, 1.0)))
    _loader(_mix(packs, decode=bigger)).load_state_dict(state)


# -- weight schedules ------------------------------------------------------------------


def _curriculum(epoch: int) -> dict[str, float]:
    return {"pets": 1.0, "zoo": float(epoch)}


def test_a_weight_schedule_resumes_exactly_across_an_epoch_boundary(packs):
    whole = _passes(_loader(_mix(packs, schedule=_curriculum)), 3)
    assert [len(p) for p in whole] == [30, 30, 30]
    assert [sum(s == "zoo" for s, _ in p) for p in whole] == [0, 15, 20]
    # Stopped after 2 batches of epoch 0: the rest of it, then epochs 1 and 2.
    first = _loader(_mix(packs, schedule=_curriculum))
    it = iter(first)
    got = _names([next(it), next(it)])
    state = first.state_dict()
    resumed = _loader(_mix(packs, schedule=_curriculum))
    resumed.load_state_dict(state)
    rest = _passes(resumed, 3)
    assert got + rest[0] == whole[0]
    assert rest[1:] == whole[1:]


def test_a_state_taken_at_an_epoch_end_resumes_into_the_next_epoch(packs):
    whole = _passes(_loader(_mix(packs, schedule=_curriculum)), 3)
    first = _loader(_mix(packs, schedule=_curriculum))
    it = iter(first)
    got = _names([next(it) for _ in range(30 // BATCH)])  # the last batch of epoch 0
    assert got == whole[0]
    state = first.state_dict()                               # before the pass ends
    # Every batch of the pass taken: its end, saved as the next epoch's start.
    assert (state["epoch"], state["consumed"]) == (1, 0)
    ended = list(it)                                         # the pass ends
    assert ended == [] and first.state_dict()["epoch"] == 1
    for saved in (state, first.state_dict()):
        resumed = _loader(_mix(packs, schedule=_curriculum))
        resumed.load_state_dict(saved)
        # A pass that stopped after its last batch has nothing left: the next is epoch 1.
        passes = [p for p in _passes(resumed, 3) if p]
        assert passes[:2] == whole[1:]


def test_schedules_that_differ_in_a_later_epoch_are_told_apart_there():
    def schedule(changed_at: int):
        return lambda epoch: {"a": 1.0, "b": 2.0 if epoch == changed_at else 1.0}

    sources = [MixSource("a", 7, weight=1), MixSource("b", 9, weight=1)]
    one, other = (MixOrder(Mixture(sources, schedule=schedule(at))) for at in (150, 10**6))
    # A state of epoch 160 has read epoch 150 under one schedule: refused by the other.
    state = StreamPoint(160, 4, 16, order_description(one, 160)).to_dict()
    with pytest.raises(ValueError, match="schedule.counts"):
        parse_state(state, records=16, describe=lambda e: order_description(other, e))
    parse_state(state, records=16, describe=lambda e: order_description(one, e))
    # A state of epoch 149 has read nothing the two schedules disagree on.
    early = StreamPoint(149, 4, 16, order_description(one, 149)).to_dict()
    parse_state(early, records=16, describe=lambda e: order_description(other, e))


# -- drop_last, workers --------------------------------------------------------------


def test_drop_last_gives_every_rank_full_equal_batches_of_the_epochs_prefix(packs):
    order = Order(shuffle=True, seed=3, batch_size=4, drop_last=True)
    sequence = _epoch(_mix(packs, order), 0)
    per_rank = []
    for rank in range(3):
        ds = _mix(packs, replace(order, rank=rank, world_size=3))
        per_rank.append([[(m["source"], m["index"]) for m in metas]
                         for _, _, metas in _loader(ds)])
    # 30 samples, 3 ranks: 10 each, 2 full batches of 4; the rest left out.
    assert [[len(b) for b in batches] for batches in per_rank] == [[4, 4]] * 3
    rounds = [s for t in range(2) for r in range(3) for s in per_rank[r][t]]
    assert rounds == sequence[:24]
    # Resumed after the first round on 2 ranks: 18 left, 9 each, 2 full batches.
    sampler = fastdata.EpochBatches(_mix(packs, replace(order, rank=0, world_size=3)))
    it = iter(sampler)
    next(it)
    state = sampler.state_dict()
    assert state["consumed"] == 12
    parts = []
    for rank in range(2):
        ds = _mix(packs, replace(order, rank=rank, world_size=2))
        loader = _loader(ds)
        loader.load_state_dict(state)
        parts.append([[(m["source"], m["index"]) for m in metas] for _, _, metas in loader])
    assert [[len(b) for b in p] for p in parts] == [[4, 4]] * 2
    assert [s for t in range(2) for r in range(2) for s in parts[r][t]] == sequence[12:28]


def test_persistent_workers_read_the_single_process_epochs(packs, tmp_path):
    single = _passes(_loader(_mix(packs, schedule=_curriculum)), 3)
    log = tmp_path / "collated"
    loader = _loader(_mix(packs, schedule=_curriculum), num_workers=2,
                     collate_fn=CollatedIn(log, fastdata.collate),
                     multiprocessing_context="fork")
    assert loader.loader.persistent_workers
    passes = _passes(loader, 3)
    assert [len(p) for p in passes] == [30, 30, 30]
    assert passes == single
    assert_other_processes(log, count=2)
    # The same two processes made all three epochs' batches.
    assert len(log.read_text().split()) == 3 * 30 // BATCH


def test_a_mixture_read_with_persistent_workers_resumes_exactly(packs):
    single = _passes(_loader(_mix(packs)), 2)
    loader = _loader(_mix(packs), num_workers=2, multiprocessing_context="fork")
    it = iter(loader)
    got = _names([next(it) for _ in range(3)])
    state = loader.state_dict()
    del it
    resumed = _loader(_mix(packs), num_workers=2, multiprocessing_context="fork")
    resumed.load_state_dict(state)
    rest = _passes(resumed, 2)
    assert got + rest[0] == single[0] and rest[1] == single[1]
    assert len(rest[0]) == 30 - 3 * BATCH

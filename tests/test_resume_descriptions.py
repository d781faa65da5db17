"""A resume state names everything that shapes the samples still to come, on
every way of reading that saves one (streams, map-style batches, loader()),
and a state taken under other values is refused with the field named:
whole shards as blocks (their bounds), a random crop's draws.

Records are named by their keys, so a reorder within a class is seen.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fastdata
from conftest import build_tree, uniform_spec
from fastdata import Decode, Order, RandomResizedCrop
from fastdata.order.epochs import epoch_order

SHARDED = Order(shuffle=True, seed=5, batch_size=4, block="shard", window=16)


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """One folder of 30 images packed as tar shards of 8 and of 6, and as LMDB."""
    root = tmp_path_factory.mktemp("described")
    tree = build_tree(root / "img", uniform_spec(("cat", "dog", "eel"), 10), size=(12, 10))
    out = {"tar8": str(root / "a.tar"), "tar6": str(root / "b.tar"),
           "lmdb": str(root / "c.lmdb")}
    for name, size in (("tar8", 8), ("tar6", 6)):
        fastdata.pack(tree.root, out[name],
                      options=fastdata.PackOptions(workers=1, shard_size=size), progress=False)
    fastdata.pack(tree.root, out["lmdb"], options=fastdata.PackOptions(workers=1),
                  progress=False)
    return {k: v if k == "lmdb" else v.replace(".tar", ".tar.fastdata.json")
            for k, v in out.items()}


def _keys(ds, batches) -> list[str]:
    keys = ds.keys
    return [keys[i] for batch in batches for i in batch]


def test_whole_shards_as_blocks_read_by_index_give_the_streams_order(packs):
    ds = fastdata.open_dataset(packs["tar8"], order=SHARDED)
    mapped = _keys(ds, fastdata.EpochBatches(ds))
    # A stream's sample named by its payload, which each record has its own.
    key_of = {bytes(ds.reader.read(i)): key for i, key in enumerate(ds.keys)}
    assert len(key_of) == 30
    stream = fastdata.open_dataset(packs["tar8"], streaming=True, order=SHARDED,
                                   decode=Decode(output="bytes"))
    streamed = [key_of[bytes(payload)] for payload, _ in stream]
    assert len(mapped) == 30 and mapped == streamed
    # The engine's order of whole-shard blocks (the pack's shards of 8, 8, 8, 6).
    starts = [0, 8, 16, 24]
    order = epoch_order(30, ds.order.shuffle_of(30, stream=False), 0, np.asarray(starts))
    assert _keys(ds, [order[:].tolist()]) == mapped


def test_whole_shards_as_blocks_are_refused_by_name_without_shards(packs):
    ds = fastdata.open_dataset(packs["lmdb"], order=SHARDED)
    with pytest.raises(ValueError, match=r"Order\(block='shard'\).*c\.lmdb is not sharded"):
        fastdata.EpochBatches(ds)
    with pytest.raises(ValueError, match=r"Order\(block='shard'\)"):
        fastdata.EpochBatches(30, SHARDED)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_state_of_other_shard_bounds_is_refused(packs, streaming):
    """Two packs of the same 30 records in shards of 8 and of 6: under
    block="shard" their orders differ, and so do their states."""
    def loader(name):
        ds = fastdata.open_dataset(packs[name], streaming=streaming, order=SHARDED,
                                   decode=Decode(size=(8, 8)))
        return fastdata.loader(ds, num_workers=0, device="cpu")

    first = loader("tar8")
    next(iter(first))
    state = first.state_dict()
    assert state["order"]["shards"]["count"] == 4
    with pytest.raises(ValueError, match=r"another order \(shards\.count 4 now 5; "
                                         r"shards\.digest '[0-9a-f]+' now '[0-9a-f]+'\)"):
        loader("tar6").load_state_dict(state)
    loader("tar8").load_state_dict(state)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_state_under_another_random_crop_is_refused(packs, streaming):
    def loader(crop):
        ds = fastdata.open_dataset(packs["tar8"], streaming=streaming, decode=Decode(crop=crop),
                                   order=Order(shuffle=True, seed=2, batch_size=4))
        return fastdata.loader(ds, num_workers=0, device="cpu")

    first = loader(RandomResizedCrop(8, hflip=0.5))
    next(iter(first))
    state = first.state_dict()
    assert state["order"]["samples"]["crop"] == {"scale": [0.08, 1.0], "ratio": [0.75, 4 / 3],
                                      "hflip": 0.5, "seed": 2}
    with pytest.raises(ValueError, match=re.escape("samples.crop.hflip 0.5 now 0.0")):
        loader(RandomResizedCrop(8, hflip=0.0)).load_state_dict(state)
    with pytest.raises(ValueError, match=re.escape(
            "samples.crop.ratio [0.75, 1.3333333333333333] now [1.0, 1.0]")):
        loader(RandomResizedCrop(8, ratio=(1, 1))).load_state_dict(state)
    # Without a crop, or with a centre crop, nothing is drawn: no crop in the state.
    plain = loader(None)
    assert "samples" not in plain.state_dict()["order"]
    with pytest.raises(ValueError, match=re.escape("samples {'crop': {'scale'")):
        plain.load_state_dict(state)
    # The output size draws nothing: the same state resumes at another size.
    loader(RandomResizedCrop(10, hflip=0.5)).load_state_dict(state)
    if not streaming:  # a sampler of record indices alone draws no crops
        walk = fastdata.EpochBatches(30, Order(shuffle=True, seed=2, batch_size=4))
        walk.load_state_dict(state)
        assert walk.state_dict()["consumed"] == 4

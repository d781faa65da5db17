"""One set of read options: fastdata.Decode and fastdata.Order mean the same to
map-style Datasets, streams, fastdata.loader() and DALI; open_dataset opens
either way of reading."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import fastdata
from conftest import build_tree, uniform_spec
from fastdata import CenterCrop, Decode, Order, RandomResizedCrop

N = 23


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """23 images (22x30) as LMDB and as tar shards of 5, each image a class of its
    own: a sample's label is its record index, so labels compared in order are
    records compared in order."""
    root = tmp_path_factory.mktemp("read_options")
    tree = build_tree(root / "src", uniform_spec(tuple(f"c{k:02d}" for k in range(N)), 1),
                      size=(22, 30))
    out = {}
    for fmt, name, shards in (("lmdb", "ds.lmdb", None), ("tar", "ds.tar", 5)):
        out[fmt] = str(root / name)
        fastdata.pack(tree.root, out[fmt],
                      options=fastdata.PackOptions(workers=1, shard_size=shards), progress=False)
        assert fastdata.open_dataset(out[fmt]).targets == list(range(N))
    return out


def _labels(batches) -> list[int]:
    """The record indices of the batches' samples, in order (a label is its record)."""
    return [int(x) for _, labels in batches for x in labels]


def test_decode_is_checked_once_when_made():
    with pytest.raises(ValueError, match="not both"):
        Decode(size=32, crop=RandomResizedCrop(16))
    with pytest.raises(ValueError, match=r"fastdata.CenterCrop\(24\)"):
        Decode(crop=24)  # the old DALI int crop says how to write it now
    with pytest.raises(ValueError, match="decoded output"):
        Decode(crop=CenterCrop(8), output="bytes")
    with pytest.raises(ValueError, match="output must be one of"):
        Decode(output="jpeg")
    with pytest.raises(fastdata.FastDataError, match="unknown decoder"):
        Decode(decoder="magic")
    with pytest.raises(ValueError, match="max_pixels"):
        Decode(max_pixels=0)
    with pytest.raises(ValueError, match="size must be positive"):
        Decode(size=0)
    assert Decode(size=[20, 10]).size == (20, 10)
    assert CenterCrop(7).size == (7, 7)


def test_order_is_checked_once_when_made():
    for bad, name in (({"seed": -1}, "seed"), ({"batch_size": 0}, "batch_size"),
                      ({"block": 0}, "block"), ({"window": 0}, "window"),
                      ({"world_size": 0}, "world_size"), ({"rank": 2, "world_size": 2}, "rank")):
        with pytest.raises(ValueError, match=name):
            Order(**bad)
    assert Order(block="shard").block == "shard"
    assert Order().loader_batch == 64 and Order(batch_size=3).loader_batch == 3


def test_every_option_of_a_way_of_reading_is_documented():
    from fastdata.dali import DALILoader, build_pipeline

    for fn in (fastdata.open_dataset, fastdata.PackedDataset, fastdata.ShardedIterableDataset,
               fastdata.loader, fastdata.EpochBatches, build_pipeline, Decode, Order):
        doc = inspect.getdoc(fn) or ""
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.name not in ("self", "path", "dataset")]
        undocumented = [name for name in params if f"{name}:" not in doc]
        assert not undocumented, (fn, undocumented)
    # DALILoader takes build_pipeline's arguments, and says so.
    assert list(inspect.signature(DALILoader).parameters) == \
        list(inspect.signature(build_pipeline).parameters)
    assert "build_pipeline" in inspect.getdoc(DALILoader)


def test_open_dataset_opens_either_way_of_reading(packs):
    order = Order(shuffle=True, seed=4, batch_size=5, block=2, window=8)
    mapped = fastdata.open_dataset(packs["tar"], decode=Decode(size=(8, 8)), order=order)
    stream = fastdata.open_dataset(packs["tar"], streaming=True, decode=Decode(size=(8, 8)),
                                   order=order)
    assert isinstance(mapped, fastdata.PackedDataset)
    assert isinstance(stream, fastdata.ShardedIterableDataset)
    assert stream.order is order and mapped.order is order
    # The same order value gives the same order, read either way.
    from_map = _labels(torch.utils.data.DataLoader(
        mapped, batch_sampler=fastdata.EpochBatches(mapped), collate_fn=fastdata.collate))
    from_stream = _labels(fastdata.loader(stream, num_workers=0, device="cpu"))
    assert from_map == from_stream and sorted(from_map) == sorted(mapped.targets)
    assert from_map != mapped.targets  # shuffled
    with pytest.raises(ValueError, match="cache= is not an option of a stream"):
        fastdata.open_dataset(packs["tar"], streaming=True, cache="ram")
    with pytest.raises(TypeError, match="fastdata.Order"):
        fastdata.open_dataset(packs["lmdb"], order={"shuffle": True})


def test_the_loader_reads_in_the_datasets_order(packs):
    ds = fastdata.open_dataset(packs["lmdb"], decode=Decode(size=(8, 8)),
                               order=Order(shuffle=True, seed=9, batch_size=5))
    batches = list(fastdata.loader(ds, num_workers=0, device="cpu"))
    assert [len(labels) for _, labels in batches] == [5, 5, 5, 5, 3]
    sampler = fastdata.EpochBatches(ds)
    want = [i for batch in sampler for i in batch]
    assert _labels(batches) == want and len(want) == N
    # A map-style dataset opened without an order is read in its stored order,
    # in batches of 64.
    plain = fastdata.open_dataset(packs["lmdb"], decode=Decode(size=(8, 8)))
    stored = list(fastdata.loader(plain, num_workers=0, device="cpu"))
    assert [len(labels) for _, labels in stored] == [N]
    assert _labels(stored) == plain.targets == list(range(N))


def test_a_center_crop_is_the_middle_of_the_resized_image(packs):
    whole = fastdata.open_dataset(packs["lmdb"], decode=Decode(size=12, output="numpy"))
    crop = fastdata.open_dataset(packs["lmdb"],
                                 decode=Decode(size=12, crop=CenterCrop((10, 8)),
                                               output="numpy"))
    for i in range(N):
        full, cut = whole[i][0], crop[i][0]
        h, w = full.shape[:2]  # 12 x 16: the shorter side resized to 12
        top, left = (h - 10) // 2, (w - 8) // 2
        assert cut.shape == (10, 8, 3)
        np.testing.assert_array_equal(cut, full[top:top + 10, left:left + 8])
    # Batched (one stacked tensor) too.
    batch = fastdata.open_dataset(packs["lmdb"], decode=Decode(size=12, crop=CenterCrop(8)))
    images, _ = fastdata.collate(batch.__getitems__(list(range(6))))
    assert images.shape == (6, 3, 8, 8)
    too_big = fastdata.open_dataset(packs["lmdb"], decode=Decode(crop=CenterCrop(64)))
    with pytest.raises(fastdata.DecodeError, match="smaller than the 64x64 CenterCrop"):
        too_big[0]


def test_epoch_batches_take_the_datasets_order_or_their_own(packs):
    order = Order(shuffle=True, seed=2, batch_size=4)
    ds = fastdata.open_dataset(packs["lmdb"], order=order)
    want = list(fastdata.EpochBatches(ds))
    assert [len(b) for b in want] == [4] * 5 + [3]
    assert sorted(i for b in want for i in b) == list(range(N))
    plain = fastdata.open_dataset(packs["lmdb"])
    assert list(fastdata.EpochBatches(plain, order)) == want
    with pytest.raises(TypeError, match="unexpected keyword"):
        fastdata.EpochBatches(ds, colour=True)


def test_the_loader_moves_a_stream_to_the_next_epoch_after_a_pass(packs):
    def stream():
        return fastdata.open_dataset(packs["tar"], streaming=True, decode=Decode(size=(8, 8)),
                                     order=Order(shuffle=True, seed=1, batch_size=4, block=1))

    ds = stream()
    batches = fastdata.loader(ds, num_workers=0, device="cpu")
    first, second = _labels(batches), _labels(batches)
    assert ds.epoch == 2 and first != second
    again = stream()
    again.set_epoch(1)
    assert _labels(fastdata.loader(again, num_workers=0, device="cpu")) == second
    # A pass left early stays in its epoch.
    third = stream()
    loader = fastdata.loader(third, num_workers=0, device="cpu")
    for _ in zip(range(2), loader):
        pass
    assert third.epoch == 0


@pytest.mark.parametrize("cores", [1, 4])
def test_a_stream_decodes_on_threads_and_close_stops_them(packs, cores, monkeypatch):
    # The cores the decode pool sizes itself by, whatever this machine has:
    # one core decodes in the calling thread, more on a pool of threads.
    from fastdata.loaders import decode_pool

    monkeypatch.setattr(decode_pool, "usable_cores", lambda: cores)
    stream = fastdata.open_dataset(packs["tar"], streaming=True, decode=Decode(size=(8, 8)),
                                   order=Order(shuffle=True, seed=5, batch_size=4))
    first = [label for _, label in stream]
    assert sorted(first) == list(range(N)) != first
    executor = stream._decoders._executor
    if cores == 1:
        assert executor is None and stream._decoders.threads_here() == 1
        threads = set()
    else:
        assert executor is not None  # the stream decoded on its pool
        threads = set(executor._threads)
        assert threads and all(t.name.startswith("fastdata-decode") for t in threads)
    stream.close()
    assert stream._decoders._executor is None
    assert not any(t.is_alive() for t in threads)
    assert [label for _, label in stream] == first  # threads come back, same records in order
    assert (stream._decoders._executor is None) == (cores == 1)

"""Map-style reading in the order engine's batches (fastdata.EpochBatches):
exact resume with StatefulDataLoader (random crops included, without calling
set_epoch again), resume with other ranks, the next epoch after each pass, a
state of another order refused, and fastdata.loader() reading this way."""

from __future__ import annotations

import optional
import pytest
import torch
from torch.utils.data import DataLoader

import fastdata
from fastdata import Order
from conftest import build_tree, uniform_spec
from worker_pids import CollatedIn, assert_workers_did_it

StatefulDataLoader = optional.require("torchdata").StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
BATCH = 4


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """21 images of 3 classes (an odd count), packed into LMDB."""
    root = tmp_path_factory.mktemp("sampler")
    tree = build_tree(root / "src", uniform_spec(("a", "b", "c"), 7), size=(12, 12))
    out = root / "ds.lmdb"
    fastdata.pack(tree.root, out, options=fastdata.PackOptions(workers=1), progress=False)
    return tree, str(out)


def _numbers(tree):
    number = {s.data: i for i, s in enumerate(tree.samples)}
    return lambda batch: [number[bytes(data)] for data, _ in batch]


def _records_of(ds):
    """The record indices of a batch of ``ds``'s decoded images (uint8, or the
    floats in [0, 1] fastdata.loader() gives), found by their pixels."""
    table = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    assert len(table) == len(ds)  # every image differs

    def records(images: torch.Tensor) -> list[int]:
        if images.dtype != torch.uint8:
            images = (images * 255).round().to(torch.uint8)
        return [table[image.numpy().tobytes()] for image in images]
    return records


def test_every_rank_gets_equal_batches_and_the_epoch_is_the_dataset(packed):
    tree, path = packed
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
    for world in (1, 2, 4, 5):
        per_rank = [list(DataLoader(ds, batch_sampler=fastdata.EpochBatches(
            ds, Order(batch_size=BATCH, shuffle=True, seed=2, rank=r, world_size=world)),
            collate_fn=_numbers(tree))) for r in range(world)]
        assert len({len(b) for b in per_rank}) == 1
        seen = [i for b in per_rank for batch in b for i in batch]
        assert set(seen) == set(range(len(ds))) and len(seen) - len(ds) < world


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_gives_the_uninterrupted_pixels_with_its_crops(packed, workers):
    _, path = packed
    def loader():
        # The crops draw from the order's seed.
        ds = fastdata.open_dataset(path, decode=fastdata.Decode(crop=fastdata.RandomResizedCrop(6)),
                                   order=Order(batch_size=BATCH, shuffle=True, seed=7))
        sampler = fastdata.EpochBatches(ds)
        return StatefulDataLoader(ds, batch_sampler=sampler, num_workers=workers,
                                  multiprocessing_context="fork" if workers else None)

    full = loader()
    full.batch_sampler.set_epoch(1)
    expected = [images for images, _ in full]
    first = loader()
    first.batch_sampler.set_epoch(1)
    it = iter(first)
    got = [next(it)[0] for _ in range(2)]
    state = first.state_dict()
    resumed = loader()  # a new process: nothing says "epoch 1" but the state
    resumed.load_state_dict(state)
    got += [images for images, _ in resumed]
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert resumed.batch_sampler.epoch == 2  # the pass ended: the next epoch follows


def test_a_resume_with_other_ranks_reads_the_rest_once(packed):
    tree, path = packed
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
    numbers = _numbers(tree)
    two = [fastdata.EpochBatches(ds, Order(batch_size=BATCH, shuffle=True, rank=r, world_size=2))
           for r in range(2)]
    whole = [i for batch in DataLoader(ds, batch_sampler=fastdata.EpochBatches(
        ds, Order(batch_size=BATCH, shuffle=True)), collate_fn=numbers) for i in batch]
    assert sorted(whole) == list(range(len(ds))) != whole  # one process's shuffled epoch
    its = [iter(DataLoader(ds, batch_sampler=s, collate_fn=numbers)) for s in two]
    done = [i for _ in range(2) for it in its for i in next(it)]  # 2 steps of both ranks
    assert done == whole[:16]  # round by round, the epoch's first 16
    state = two[0].state_dict()
    three = [fastdata.EpochBatches(ds, Order(batch_size=BATCH, shuffle=True, rank=r, world_size=3))
             for r in range(3)]
    per_rank = []
    for sampler in three:
        sampler.load_state_dict(state)
        per_rank.append(list(DataLoader(ds, batch_sampler=sampler, collate_fn=numbers)))
    # 5 left for 3 ranks: 2 each, in one batch each, the sixth a repeat of the
    # first of them (the padding); round by round, the rest of the epoch.
    assert [[len(b) for b in batches] for batches in per_rank] == [[2]] * 3
    rounds = [i for batches in per_rank for i in batches[0]]
    assert rounds == whole[16:] + whole[16:17]


def test_each_pass_reads_the_next_epoch(packed):
    tree, path = packed
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
    sampler = fastdata.EpochBatches(ds, Order(batch_size=BATCH, shuffle=True))
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=_numbers(tree))
    first, second = list(loader), list(loader)
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, []))
    again = fastdata.EpochBatches(ds, Order(batch_size=BATCH, shuffle=True))
    again.set_epoch(1)
    assert list(DataLoader(ds, batch_sampler=again, collate_fn=_numbers(tree))) == second


def test_a_state_of_another_order_or_dataset_is_refused(packed, tmp_path):
    _, path = packed
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
    def order(seed):
        return Order(batch_size=BATCH, shuffle=True, seed=seed)

    state = fastdata.EpochBatches(ds, order(1)).state_dict()
    with pytest.raises(ValueError, match="another order.*seed 1 now 2"):
        fastdata.EpochBatches(ds, order(2)).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset of 21 records"):
        fastdata.EpochBatches(20, order(1)).load_state_dict(state)


def test_the_loader_reads_in_the_engines_batches(packed, tmp_path):
    tree, path = packed
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(12, 12)),
                               order=fastdata.Order(shuffle=True, batch_size=BATCH, seed=3))
    records = _records_of(ds)
    orders = []
    for workers in (0, 2):
        fork = {"multiprocessing_context": "fork"} if workers else {}
        log = tmp_path / f"collated-{workers}.pids"  # the process collating each batch
        loader = fastdata.loader(ds, num_workers=workers, device="cpu",
                                 collate_fn=CollatedIn(log, fastdata.collate), **fork)
        assert isinstance(loader.loader.batch_sampler, fastdata.EpochBatches)
        orders.append([records(images) for images, _ in loader])
        assert_workers_did_it(log, workers)
    # One order whatever the workers: the engine's batches, record by record.
    assert orders[0] == orders[1] == [list(b) for b in fastdata.EpochBatches(ds)]
    assert [len(b) for b in orders[0]] == [BATCH] * 5 + [1]

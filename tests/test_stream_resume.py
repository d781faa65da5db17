"""Resuming a ShardedIterableDataset epoch: exactly with torchdata's
StatefulDataLoader (same ranks and workers), elastically with other ranks and
workers, and with a plain DataLoader from ``resume_point(batches=k)``.

Ranks are simulated with ``Order(rank=, world_size=)`` in one process (no
process group is needed for that); workers are real forked DataLoader
workers. A sample is identified by its payload bytes (every image differs).
"""

from __future__ import annotations

import gc
import json
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import optional
import pytest
from conftest import UNEVEN_COUNTS, build_tree, uneven_spec
from torch.utils.data import DataLoader
from worker_pids import CollatedIn, assert_workers_did_it

import fastdata
from fastdata.errors import CorruptDataError
from fastdata.order.epochs import Shuffle, epoch_order

# In the test extra; the plain-DataLoader resume needs no torchdata, but most tests do.
StatefulDataLoader = optional.require("torchdata").StatefulDataLoader

pytestmark = pytest.mark.filterwarnings(
    "ignore:'set_vital' is deprecated:UserWarning",
    "ignore:This DataLoader will create:UserWarning")

#: 47 records (uneven classes) over 10 tar shards of 5 (the last has 2).
RECORDS = sum(UNEVEN_COUNTS)
BATCH = 4
STEPS = -(-RECORDS // BATCH)  # batches of an epoch in one process: 12, the last of 3
ORDER = fastdata.Order(seed=9, block=2, window=10, batch_size=BATCH)
BYTES = fastdata.Decode(output="bytes")  # the stored payloads


def _pack(root: Path, counts=UNEVEN_COUNTS):
    tree = build_tree(root / "src", uneven_spec(counts), size=(8, 8))
    summary = fastdata.pack(tree.root, root / "packed" / "ds.tar",
                            options=fastdata.PackOptions(shard_size=5), progress=False)
    return tree, summary.output


@pytest.fixture(scope="module")
def packed_stream(tmp_path_factory):
    """(tree, manifest) of the 47-record pack, shared by the tests that only read it."""
    return _pack(tmp_path_factory.mktemp("stream"))


class Numbers:
    """collate_fn: a batch of (bytes, label) -> the record numbers (stored order)."""

    def __init__(self, tree) -> None:
        self.number = {s.data: i for i, s in enumerate(tree.samples)}
        self.labels = tree.labels

    def __call__(self, samples) -> list[int]:
        out = [self.number[bytes(data)] for data, _ in samples]
        assert [label for _, label in samples] == [self.labels[i] for i in out]
        return out


def _stream(manifest, decode=BYTES, on_error="raise", **order) -> fastdata.ShardedIterableDataset:
    """The pack as a stream read in ORDER with the fields ``order`` changed."""
    return fastdata.ShardedIterableDataset(manifest, decode=decode, order=replace(ORDER, **order),
                                           on_error=on_error)


def _stateful(ds, tree, workers: int) -> StatefulDataLoader:
    return StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=Numbers(tree),
                              multiprocessing_context="fork" if workers else None)


def _plain(ds, tree, workers: int, log=None) -> DataLoader:
    """``log``: a file to record the process collating each batch in."""
    return DataLoader(ds, batch_size=BATCH, num_workers=workers,
                      collate_fn=CollatedIn(log, Numbers(tree)),
                      multiprocessing_context="fork" if workers else None)


def _take(loader, k: int) -> tuple[list, dict]:
    """The first k batches of a fresh pass, and the loader's state after them."""
    it = iter(loader)
    batches = [next(it) for _ in range(k)]
    return batches, loader.state_dict()


def _epoch(manifest, tree, epoch: int = 0, workers: int = 0, log=None,
           **options) -> list[list[int]]:
    ds = _stream(manifest, **options)
    ds.set_epoch(epoch)
    return list(_plain(ds, tree, workers, log))


def _flat(batches) -> list[int]:
    return [i for batch in batches for i in batch]


# -- exact resume (StatefulDataLoader, same ranks and workers) -------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_draws_the_crops_of_the_saved_epoch(packed_stream, workers):
    """A state saved in epoch 1 resumes with epoch 1's crops, without set_epoch()."""
    import torch

    tree, manifest = packed_stream
    crop = fastdata.Decode(output="numpy", crop=fastdata.RandomResizedCrop(4))

    def loader(ds):
        return StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers,
                                  multiprocessing_context="fork" if workers else None)

    ds = _stream(manifest, crop, shuffle=True)
    ds.set_epoch(1)
    full = [images for images, _ in loader(ds)]
    first_loader = loader(_stream(manifest, crop, shuffle=True))
    first_loader.dataset.set_epoch(1)
    it = iter(first_loader)
    first = [next(it)[0] for _ in range(3)]
    state = first_loader.state_dict()
    resumed = loader(_stream(manifest, crop, shuffle=True))  # a new process: no set_epoch()
    resumed.load_state_dict(state)
    rest = [images for images, _ in resumed]
    assert len(first) + len(rest) == len(full)
    assert all(torch.equal(a, b) for a, b in zip(first + rest, full))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_twice_equals_the_uninterrupted_epoch(packed_stream, workers, shuffle):
    tree, manifest = packed_stream
    full = list(_stateful(_stream(manifest, shuffle=shuffle), tree, workers))
    assert len(full) == STEPS and sorted(_flat(full)) == list(range(RECORDS))
    assert (_flat(full) == list(range(RECORDS))) == (not shuffle)

    # 3 batches, save; a new loader and dataset (a new process) load it: 4 more,
    # save; again: the rest. An odd count: the next batch is worker 1's.
    got, state = _take(_stateful(_stream(manifest, shuffle=shuffle), tree, workers), 3)
    loader = _stateful(_stream(manifest, shuffle=shuffle), tree, workers)
    loader.load_state_dict(state)
    more, state = _take(loader, 4)
    loader = _stateful(_stream(manifest, shuffle=shuffle), tree, workers)
    loader.load_state_dict(state)
    rest = list(loader)
    assert got + more + rest == full  # batch by batch


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_after_the_last_batch_then_the_next_epoch(packed_stream, workers):
    tree, manifest = packed_stream
    first, second = _epoch(manifest, tree, 0, shuffle=True), _epoch(manifest, tree, 1, shuffle=True)
    assert first != second and sorted(_flat(second)) == list(range(RECORDS))

    # A checkpoint right after the last step (the loop has not seen StopIteration).
    batches, state = _take(_stateful(_stream(manifest, shuffle=True), tree, workers), STEPS)
    assert batches == first
    ds = _stream(manifest, shuffle=True)
    loader = _stateful(ds, tree, workers)
    loader.load_state_dict(state)
    assert list(loader) == []  # nothing left of epoch 0
    ds.set_epoch(1)
    assert list(loader) == second

    # The same point, elastically: nothing left of epoch 0.
    ds = _stream(manifest, shuffle=True)
    assert ds.resume_point(state)["consumed"] == RECORDS
    ds.load_state_dict(state)
    assert len(ds) == 0 and list(_plain(ds, tree, 3)) == []


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_after_the_epoch_ended_starts_the_next_epoch(packed_stream, workers):
    # A checkpoint taken after the loop ended: StatefulDataLoader starts a new
    # pass, at the epoch set on the dataset.
    tree, manifest = packed_stream
    second = _epoch(manifest, tree, 1, shuffle=True)
    loader = _stateful(_stream(manifest, shuffle=True), tree, workers)
    assert len(list(loader)) == STEPS
    state = loader.state_dict()

    ds = _stream(manifest, shuffle=True)
    loader = _stateful(ds, tree, workers)
    loader.load_state_dict(state)
    ds.set_epoch(1)
    assert list(loader) == second


# -- elastic resume (other ranks and workers) -------------------------------------------


@pytest.mark.parametrize("steps", [3, 4])
@pytest.mark.parametrize("world, workers", [(1, 3), (3, 1)])
def test_elastic_resume_with_other_ranks_and_workers(packed_stream, world, workers, steps):
    tree, manifest = packed_stream
    order = _flat(_epoch(manifest, tree, 0, shuffle=True))

    # 2 ranks x 2 workers, `steps` batches each.
    consumed, states = [], []
    for rank in range(2):
        loader = _stateful(_stream(manifest, shuffle=True, rank=rank, world_size=2), tree, 2)
        batches, state = _take(loader, steps)
        consumed += _flat(batches)
        states.append(state)
    done = 2 * steps * BATCH
    assert sorted(consumed) == sorted(order[:done])  # the job consumed a prefix of the order
    points = [_stream(manifest, shuffle=True).resume_point(s) for s in states]
    assert points[0] == points[1] and points[0]["consumed"] == done  # any rank's state tells it

    # world x workers resume from one saved state (any rank's), in new loaders.
    left = RECORDS - done
    per = -(-left // world)
    rest = []
    for rank in range(world):
        ds = _stream(manifest, shuffle=True, rank=rank, world_size=world)
        ds.load_state_dict(json.loads(json.dumps(states[rank % 2])))
        assert len(ds) == per
        rest.append(list(_stateful(ds, tree, workers)))
    assert [len(r) for r in rest] == [-(-per // BATCH)] * world
    flat_rest = [i for r in rest for i in _flat(r)]
    repeats = per * world - left
    assert repeats == (0 if left % world == 0 else world - left % world) < world
    assert Counter(flat_rest) == Counter(order[done:]) + Counter(order[done:][:repeats])
    assert sorted(set(consumed) | set(flat_rest)) == list(range(RECORDS))
    if repeats == 0:
        assert not set(consumed) & set(flat_rest)  # the rest exactly once
    # Round by round, the new ranks continue the same order.
    rounds = [i for t in range(len(rest[0])) for r in rest for i in r[t]]
    assert rounds == order[done:] + order[done:][:repeats]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_point_with_a_plain_dataloader(packed_stream, workers):
    tree, manifest = packed_stream
    full = _epoch(manifest, tree, 2, workers, shuffle=True)
    ds = _stream(manifest, shuffle=True)
    ds.set_epoch(2)
    got = []
    for batch in _plain(ds, tree, workers):
        got.append(batch)
        if len(got) == 5:
            break
    checkpoint = json.dumps(ds.resume_point(batches=5))  # plain JSON

    ds = _stream(manifest, shuffle=True)
    ds.load_state_dict(json.loads(checkpoint))
    assert ds.epoch == 2 and len(ds) == RECORDS - 5 * BATCH
    assert got + list(_plain(ds, tree, workers)) == full
    ds.set_epoch(3)  # the point was for epoch 2: a whole epoch follows
    assert list(_plain(ds, tree, workers)) == _epoch(manifest, tree, 3, shuffle=True)


def test_resume_point_counts_the_steps_of_all_ranks(packed_stream):
    _, manifest = packed_stream
    ds = _stream(manifest, shuffle=True, rank=1, world_size=3)
    assert ds.resume_point(batches=2)["consumed"] == 3 * 2 * BATCH
    assert ds.resume_point(batches=len(ds))["consumed"] == RECORDS  # the epoch is done


# -- the one order ------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_same_order_for_any_number_of_workers(packed_stream, shuffle, tmp_path):
    tree, manifest = packed_stream
    logs = {workers: tmp_path / f"collated-{workers}.pids" for workers in (0, 1, 2, 3)}
    runs = [_epoch(manifest, tree, 1, workers, logs[workers], shuffle=shuffle)
            for workers in (0, 1, 2, 3)]
    for workers, log in logs.items():  # each of the workers made some of the batches
        assert_workers_did_it(log, workers)
    assert all(run == runs[0] for run in runs[1:])  # batch by batch
    expected = epoch_order(RECORDS, Shuffle(shuffle, ORDER.seed, ORDER.block, ORDER.window),
                           1)[:].tolist()
    assert _flat(runs[0]) == expected
    if shuffle:
        assert _epoch(manifest, tree, 2, 2, shuffle=True) != runs[0]
        assert _epoch(manifest, tree, 1, 2, shuffle=True, seed=10) != runs[0]


# -- refusals -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(packed_stream):
    """States after 3 shuffled batches (1 rank): a 2-worker StatefulDataLoader's,
    a worker-less one's, and a ``resume_point(batches=3)``."""
    tree, manifest = packed_stream
    states = {"two workers": _take(_stateful(_stream(manifest, shuffle=True), tree, 2), 3)[1],
              "no workers": _take(_stateful(_stream(manifest, shuffle=True), tree, 0), 3)[1],
              "point": _stream(manifest, shuffle=True).resume_point(batches=3)}
    return states


def _refused(manifest, tree, saved, match: str, **options) -> None:
    """Every saved state is refused, with ``match`` in the message, by a dataset
    made with ``options``: loaded directly, and by a worker-less StatefulDataLoader.
    (A loader with workers refuses the same way, in its workers; a worker that
    fails while starting costs torchdata seconds to shut down, see the slow test.)"""
    for name, state in saved.items():
        with pytest.raises(ValueError, match=match):
            _stream(manifest, **options).load_state_dict(state)
        if name != "point":
            with pytest.raises(ValueError, match=match):
                _stream(manifest, **options).resume_point(state)
    loader = _stateful(_stream(manifest, **options), tree, 0)
    loader.load_state_dict(saved["no workers"])
    with pytest.raises(ValueError, match=match):
        list(loader)


def test_refuses_a_state_of_another_dataset(saved, tmp_path):
    counts = (*UNEVEN_COUNTS[:-1], UNEVEN_COUNTS[-1] - 1)  # 46 records
    tree, other = _pack(tmp_path, counts)
    _refused(other, tree, saved, "dataset of 47 records; this one has 46", shuffle=True)


@pytest.mark.parametrize("options, named", [
    (dict(seed=10), "seed 9 now 10"),
    (dict(shuffle=False), "shuffle True now False"),
    (dict(block=3), "block 2 now 3"),
    (dict(window=20), "window 10 now 20"),
])
def test_refuses_a_state_of_another_order(packed_stream, saved, options, named):
    tree, manifest = packed_stream
    _refused(manifest, tree, saved, f"another order.*{named}", **{"shuffle": True, **options})


@pytest.mark.slow
def test_refuses_worker_states_in_a_loader_with_other_workers(packed_stream, saved):
    tree, manifest = packed_stream
    loader = _stateful(_stream(manifest, shuffle=True), tree, 3)
    loader.load_state_dict(saved["two workers"])
    with pytest.raises(ValueError, match="workers 2 now 3.*ds.load_state_dict"):
        list(loader)
    # Slow: the refusing workers fail while starting, and torchdata waits 5 s
    # for each at shutdown; collected here, that wait is not another test's.
    gc.collect()


def test_torchdata_refuses_worker_states_without_workers(packed_stream, saved):
    tree, manifest = packed_stream
    loader = _stateful(_stream(manifest, shuffle=True), tree, 0)
    loader.load_state_dict(saved["two workers"])
    with pytest.raises(AssertionError, match="single process dataloader"):
        list(loader)


def test_elastic_resume_needs_batch_size_with_several_workers(packed_stream):
    tree, manifest = packed_stream
    full = list(_stateful(_stream(manifest, shuffle=True, batch_size=None), tree, 2))
    got, state = _take(_stateful(_stream(manifest, shuffle=True, batch_size=None), tree, 2), 3)
    with pytest.raises(ValueError, match="batch_size=None and several workers.*batch_size="):
        _stream(manifest, shuffle=True, batch_size=None).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        _stream(manifest, shuffle=True).resume_point(state)
    # The same loader layout still resumes exactly.
    loader = _stateful(_stream(manifest, shuffle=True, batch_size=None), tree, 2)
    loader.load_state_dict(state)
    assert got + list(loader) == full


# -- skipping ahead reads nothing that was skipped ------------------------------------------


def _damage_records(manifest: str, records: list[int]) -> None:
    """Overwrite the payload bytes of ``records`` in their shard files (read with
    numpy and json from the on-disk index and manifest, not through fastdata)."""
    manifest = Path(manifest)
    prefix = manifest.name[:-len(".fastdata.json")]
    index = np.load(manifest.parent / f"{prefix}.fastdata.index.npy")
    shards = json.loads(manifest.read_text())["shards"]
    for i in records:
        row = index[i]
        with open(manifest.parent / shards[int(row["shard"])]["path"], "r+b") as f:
            f.seek(int(row["offset"]))
            f.write(b"\xa5" * int(row["size"]))


@pytest.mark.parametrize("how", ["exact", "elastic"])
def test_resume_does_not_read_the_consumed_records(packed_stream, tmp_path, how):
    tree, original = packed_stream
    shutil.copytree(Path(original).parent, tmp_path / "copy")
    manifest = str(tmp_path / "copy" / Path(original).name)
    full = list(_stateful(_stream(manifest, shuffle=True), tree, 2))
    got, state = _take(_stateful(_stream(manifest, shuffle=True), tree, 2), 5)
    consumed = _flat(got)
    assert len(consumed) == 5 * BATCH

    _damage_records(manifest, consumed)
    with pytest.raises(CorruptDataError, match="checksum|crc|CRC"):
        list(_stream(manifest, shuffle=True, on_error="raise"))  # the damage is seen when read

    ds = _stream(manifest, shuffle=True, on_error="raise")
    if how == "exact":
        loader = _stateful(ds, tree, 2)
        loader.load_state_dict(state)
        assert list(loader) == full[5:]
    else:
        ds.load_state_dict(state)
        assert _flat(_plain(ds, tree, 3)) == _flat(full[5:])
    assert ds.skipped == 0


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(packed_stream, context):
    tree, manifest = packed_stream

    def epochs(persistent: bool, ctx: str) -> list[list[int]]:
        ds = _stream(manifest, shuffle=True)
        loader = DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=Numbers(tree),
                            persistent_workers=persistent, multiprocessing_context=ctx)
        out = []
        for epoch in range(3):
            ds.set_epoch(epoch)
            out.append([i for batch in loader for i in batch])
        return out

    fresh = epochs(False, "fork")
    assert fresh[0] != fresh[1] != fresh[2]
    assert all(sorted(e) == list(range(RECORDS)) for e in fresh)
    assert epochs(True, context) == fresh


def test_fastdata_loader_gives_the_stream_its_batch_size(packed_stream):
    _, manifest = packed_stream
    ds = fastdata.ShardedIterableDataset(manifest, decode=BYTES)
    assert ds.batch_size is None
    fastdata.loader(ds, num_workers=0)
    assert ds.batch_size == 64  # the loader's, as the order names none


def test_whole_shard_blocks_bound_the_shards_of_a_window(packed_stream):
    tree, manifest = packed_stream
    ds = fastdata.ShardedIterableDataset(manifest, decode=BYTES, order=fastdata.Order(
        shuffle=True, seed=4, block="shard", window=10, batch_size=BATCH))
    seen = [n for batch in _plain(ds, tree, 2) for n in batch]
    assert sorted(seen) == list(range(RECORDS))
    shard_of = ds.reader.shards_of
    # Shards of 5 records (the last of 2), windows of 10 records: each window is
    # 2 whole shards read together, so the job's samples fall into consecutive
    # runs of 2 shards each: the position spans of the shards, merged where
    # they overlap, hold at most 2 shards.
    firsts = [first for first, _ in ds.reader.shard_ranges()]
    order = epoch_order(RECORDS, ds.shuffle_mode, 0, np.asarray(firsts))
    assert [int(i) for i in order] == seen
    shards = [shard_of([i])[0] for i in seen]
    spans = sorted((shards.index(s), len(shards) - 1 - shards[::-1].index(s))
                   for s in set(shards))
    end, held = -1, 0
    for lo, hi in spans:
        end, held = (hi, 1) if lo > end else (max(end, hi), held + 1)
        assert held <= 2
    assert ds.state_dict()["order"]["block"] == "shard"
    with pytest.raises(ValueError, match="block must be"):
        fastdata.Order(block="shards")

"""Golden orders: the first positions of fixed seeds, sizes, ranks and worker
counts, pinned as digests (the SHA-256 of their little-endian int64 bytes,
first 16 hex digits), for every order fastdata computes: the keyed
bijection itself, map-style reading (``EpochBatches``, the order engine's
``batch_records``) and streams (``ShardedIterableDataset``: blocks, windows,
whole shards, each rank's and worker's slice), mixtures (``Mixture``: which
source, which record, which cycle) and the pack-time shuffle.

A change to an order must bump the order algorithm's version
(``fastdata.order.bijection.ALGORITHM``): a resume state records it, and a
state saved under another algorithm is refused (see the tests at the end),
never continued in a different order. Digests are kept per algorithm: after
a deliberate change and its bump, run ``python tests/test_order_golden.py``
and add what it prints under the new number; the old numbers' digests stay,
as the record of what earlier releases read.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pytest
from conftest import build_tree, no_hang, uneven_spec

from fastdata.order import Order, batch_records
from fastdata.order.bijection import ALGORITHM, Bijection
from fastdata.order.epochs import Shuffle, epoch_order, permutation
from fastdata.order.mixture import MixSource, Mixture
from fastdata.order.slices import Slice
from fastdata.order.state import (
    WorkerPosition,
    order_description,
    parse_state,
    worker_positions,
)


@pytest.fixture(autouse=True)
def _time_limit():
    with no_hang(120):
        yield


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a), dtype="<i8").tobytes())
    return h.hexdigest()[:16]


# -- the cases ----------------------------------------------------------------------------


def _bijection(n: int, key: int, count: int = 4096):
    return Bijection(n, key).at(np.arange(min(n, count)))


def _map_style(n: int, seed: int, epoch: int, count: int = 2048):
    """The order map-style reading takes by default: a permutation of every record."""
    shuffle = Order(shuffle=True, seed=seed).shuffle_of(n, stream=False)
    return epoch_order(n, shuffle, epoch)[:min(n, count)]


def _stream(n: int, seed: int, epoch: int, positions=None):
    """A stream's default order: blocks of 16 records, windows of 8192."""
    shuffle = Order(shuffle=True, seed=seed).shuffle_of(n, stream=True)
    order = epoch_order(n, shuffle, epoch)
    return order[:min(n, 2048)] if positions is None else order[np.asarray(positions)]


def _slices(n, shuffle, epoch, world, batch, workers, policy):
    """Every rank's workers' records, rank by rank, worker by worker."""
    order = epoch_order(n, shuffle, epoch)
    out = []
    for rank in range(world):
        plan = Slice(n, 0, world, rank, batch, policy)
        for w in range(workers):
            out.append(plan.record_indices(order, np.asarray(worker_positions(plan, w, workers))))
    return np.concatenate(out)


def _plan(n, order, epoch, stream):
    batches = Slice(n, 0, order.world_size, order.rank, order.loader_batch,
                    order.policy).batches()
    return np.concatenate([batch_records(n, order, epoch=epoch, step=t, stream=stream)
                           for t in range(batches)])


def _mixture(mixture: Mixture, epochs):
    return [part for e in epochs for part in mixture.epoch_with_cycles(e)]


SHARDS = np.asarray([0, 100, 250, 300, 600, 900])
MIXED = [MixSource("web", 50, weight=2), MixSource("books", 30, weight=1),
         MixSource("tiny", 7, weight=0.5)]
BLOCKED = [MixSource("big", 5000, weight=1, block=4, window=64),
           MixSource("small", 13, weight=1)]

CASES = {
    "bijection 2 key 0": lambda: _bijection(2, 0),
    "bijection 10 key 7": lambda: _bijection(10, 7),
    "bijection 1000 key 1": lambda: _bijection(1000, 1),
    "bijection 12345 key 2**63+5": lambda: _bijection(12345, 2**63 + 5),
    "bijection 10**12 key 42": lambda: _bijection(10**12, 42),
    "map 10 seed 0 epoch 0": lambda: _map_style(10, 0, 0),
    "map 1000 seed 1 epoch 0": lambda: _map_style(1000, 1, 0),
    "map 1000 seed 1 epoch 1": lambda: _map_style(1000, 1, 1),
    "map 3000000 seed 5 epoch 2": lambda: _map_style(3_000_000, 5, 2),
    "map 10**10 seed 3 epoch 0": lambda: _map_style(10**10, 3, 0),
    "stream 1000 seed 0 epoch 0": lambda: _stream(1000, 0, 0),
    "stream 50000 seed 2 epoch 1": lambda: _stream(50_000, 2, 1),
    "stream 50000 seed 2 windows 0-6": lambda: _stream(
        50_000, 2, 1, [w * 8192 + k for w in range(7) for k in range(0, 8192, 97)
                       if w * 8192 + k < 50_000]),
    "stream 10**9 seed 4 window 3": lambda: _stream(10**9, 4, 0, 3 * 8192 + np.arange(512)),
    "blocks 4 window 40 of 1003": lambda: epoch_order(1003, Shuffle(True, 9, 4, 40), 0)[:],
    "whole shards window 300": lambda: epoch_order(1000, Shuffle(True, 6, "shard", 300), 3,
                                                   SHARDS)[:],
    "unshuffled 20": lambda: epoch_order(20, Shuffle(False, 5), 4)[:],
    "stream slices world 3 batch 7 workers 2 pad": lambda: _slices(
        1000, Shuffle(True, 8, 16, 8192), 0, 3, 7, 2, "pad"),
    "stream slices world 4 batch 5 workers 3 drop": lambda: _slices(
        1001, Shuffle(True, 8, 16, 8192), 1, 4, 5, 3, "drop"),
    "batch_records map rank 1 of 4": lambda: _plan(
        103, Order(shuffle=True, seed=11, batch_size=5, rank=1, world_size=4), 0, False),
    "batch_records stream rank 2 of 3 drop": lambda: _plan(
        1000, Order(shuffle=True, seed=12, batch_size=8, rank=2, world_size=3, drop_last=True),
        2, True),
    "mixture by weight epochs 0-2": lambda: _mixture(Mixture(MIXED, samples_per_epoch=120,
                                                             seed=3), range(3)),
    "mixture by count epoch 0-1": lambda: _mixture(Mixture(
        [MixSource("a", 10, count=4), MixSource("b", 3, count=5)], seed=1), range(2)),
    "mixture blocks and windows epoch 0": lambda: _mixture(Mixture(
        BLOCKED, samples_per_epoch=400, seed=7), [0]),
    "mixture unshuffled epoch 1": lambda: _mixture(Mixture(
        MIXED, samples_per_epoch=50, seed=3, shuffle=False), [1]),
    "pack-time permutation 1000 seed 7": lambda: permutation(1000, 7),
}

#: Digests by order algorithm (ALGORITHM): add a new number's, never edit an old one.
GOLDEN = {
    2: {
        "bijection 2 key 0": "4cbbd8ca5215b8d1",
        "bijection 10 key 7": "9082590a909885be",
        "bijection 1000 key 1": "afb2a972edf2ebb1",
        "bijection 12345 key 2**63+5": "3342f840b1ad3c90",
        "bijection 10**12 key 42": "c43229bcb0c3c813",
        "map 10 seed 0 epoch 0": "29aaa52cace5765e",
        "map 1000 seed 1 epoch 0": "5ab00e4a95ace919",
        "map 1000 seed 1 epoch 1": "526c621f0d7abe98",
        "map 3000000 seed 5 epoch 2": "f68670eb5066a86f",
        "map 10**10 seed 3 epoch 0": "2f6625197831ed86",
        "stream 1000 seed 0 epoch 0": "6616aea200cfae4f",
        "stream 50000 seed 2 epoch 1": "3cac745e8aed1189",
        "stream 50000 seed 2 windows 0-6": "1cc301adff1b1e98",
        "stream 10**9 seed 4 window 3": "cb9eed94c5c4f489",
        "blocks 4 window 40 of 1003": "5d567973cf9ae0fa",
        "whole shards window 300": "8f5cfe0d5516f88f",
        "unshuffled 20": "f5c4cb24f4c9b43e",
        "stream slices world 3 batch 7 workers 2 pad": "eeba2a4d7fb70a66",
        "stream slices world 4 batch 5 workers 3 drop": "4e0f9c5b55923329",
        "batch_records map rank 1 of 4": "617f2c86b6c468e5",
        "batch_records stream rank 2 of 3 drop": "d871169ce7c0e27f",
        "mixture by weight epochs 0-2": "5e53166625f94538",
        "mixture by count epoch 0-1": "989b831e5c42bda9",
        "mixture blocks and windows epoch 0": "a41d972ffc1b9352",
        "mixture unshuffled epoch 1": "7f451ca5574989fc",
        "pack-time permutation 1000 seed 7": "409ef9fa85de8cfd",
    },
}


def test_the_digests_are_of_this_algorithm():
    assert ALGORITHM in GOLDEN, (
        f"order algorithm {ALGORITHM} has no golden digests: run python "
        f"tests/test_order_golden.py and add them under {ALGORITHM}")
    assert sorted(GOLDEN[ALGORITHM]) == sorted(CASES)


@pytest.mark.parametrize("name", list(CASES), ids=[n.replace(" ", "-") for n in CASES])
def test_golden_order(name):
    got = digest(*_parts(CASES[name]()))
    assert got == GOLDEN[ALGORITHM][name], (
        f"the order {name!r} changed under algorithm {ALGORITHM}: if on purpose, bump "
        f"ALGORITHM in fastdata/order/bijection.py (a state of the old order is then "
        f"refused) and record the new digests under it")


def _parts(value):
    return value if isinstance(value, list) else [value]


def test_mixture_counts_by_largest_remainder():
    """The digests' counts, spelled out: a weight of 2 to 1 in 10 samples is
    6.67 and 3.33, so 7 and 3; three equal weights in 10 give the extra one
    to the earliest source."""
    two = Mixture([MixSource("a", 5, weight=2), MixSource("b", 5, weight=1)],
                  samples_per_epoch=10)
    assert two.counts(0).tolist() == [7, 3]
    three = Mixture([MixSource(n, 5, weight=1) for n in "xyz"], samples_per_epoch=10)
    assert three.counts(0).tolist() == [4, 3, 3]
    assert Mixture(MIXED, samples_per_epoch=120).counts(0).tolist() == [69, 34, 17]


# -- reading a real pack: the orders above are the ones the datasets read -------------------


@pytest.fixture(scope="module")
def tar_pack(tmp_path_factory):
    import fastdata

    root = tmp_path_factory.mktemp("golden")
    tree = build_tree(root / "src", uneven_spec(), size=(8, 8))
    out = fastdata.pack(tree.root, root / "packed" / "ds.tar",
                        options=fastdata.PackOptions(shard_size=5), progress=False).output
    return out


def test_a_stream_and_a_map_style_loader_read_the_golden_orders(tar_pack):
    from torch.utils.data import DataLoader

    import fastdata
    from fastdata.dataset.resolve import open_reader

    with open_reader(tar_pack) as reader:
        n = len(reader)
        index = {bytes(d): i for i, d in enumerate(reader.read_many(list(range(n))))}
    order = fastdata.Order(shuffle=True, seed=9, block=2, window=10, batch_size=4)
    stream = fastdata.open_dataset(tar_pack, streaming=True, order=order,
                                   decode=fastdata.Decode(output="bytes"))
    alone = [index[bytes(x)] for x, _ in stream]
    loader = DataLoader(stream, batch_size=4, num_workers=2, multiprocessing_context="fork")
    with no_hang(60):
        workers = [index[bytes(x)] for batch, _ in loader for x in batch]
    assert alone == workers == epoch_order(n, Shuffle(True, 9, 2, 10), 0)[:].tolist()
    assert digest(alone) == "931e11cd2513a601"
    ranks = [fastdata.EpochBatches(fastdata.open_dataset(tar_pack), order=fastdata.Order(
        shuffle=True, seed=3, batch_size=8, rank=rank, world_size=2)) for rank in (0, 1)]
    # Two passes of each rank: a pass moves on to the next epoch.
    epochs = [[i for batch in sampler for i in batch] for sampler in ranks for _ in range(2)]
    assert digest(*epochs) == "057920fc4e6eb3af"
    plan = Order(shuffle=True, seed=3, batch_size=8, rank=1, world_size=2)
    assert epochs[3] == _plan(n, plan, 1, False).tolist()


# -- states of another algorithm -----------------------------------------------------------


def _sampler_state(**changes):
    import fastdata

    sampler = fastdata.EpochBatches(1000, order=fastdata.Order(shuffle=True, batch_size=10))
    next(iter(sampler))
    state = json.loads(json.dumps(sampler.state_dict()))
    state["order"].update(changes)
    return state


@pytest.mark.parametrize("other", [1, ALGORITHM + 1])
def test_a_state_of_another_algorithm_is_refused(other):
    """An older algorithm's state (1: a permutation of every record per epoch),
    or a newer one's: refused, naming where to resume from."""
    import fastdata

    state = _sampler_state(algorithm=other)
    sampler = fastdata.EpochBatches(1000, order=fastdata.Order(shuffle=True, batch_size=10))
    with pytest.raises(ValueError) as err:
        sampler.load_state_dict(state)
    assert str(err.value) == (
        f"this state was saved with order algorithm {other!r} (a fastdata that made each "
        f"epoch's order as a permutation of every record); this one computes orders with "
        f"algorithm {ALGORITHM}, in which the rest of the epoch is other samples. Resume "
        f"from the start of epoch 0: load no state and call set_epoch(0)")
    sampler.load_state_dict(_sampler_state())  # the same state of this algorithm: taken
    assert sampler._start == 10


# -- what a resume state must hold ---------------------------------------------------------


def _worker(worker: int, workers: int = 2, taken: int = 8, records: int = 100) -> dict:
    desc = order_description(Shuffle(True, 1, 16, 8192), 0)
    return WorkerPosition(epoch=0, start=0, records=records, order=desc, world=1, rank=0,
                          workers=workers, worker=worker, batch_size=4, drop_last=False,
                          taken=taken).to_dict()


def _parse(state, records: int = 100):
    return parse_state(state, records=records,
                       describe=lambda e: order_description(Shuffle(True, 1, 16, 8192), e))


def test_a_loader_state_missing_a_workers_position_is_refused():
    whole = {"workers": {"0": {"ds": _worker(0)}, "1": {"ds": _worker(1)}}}
    point = _parse(whole)
    assert (point.epoch, point.consumed, point.records) == (0, 16, 100)
    for kept in (0, 1):
        with pytest.raises(ValueError) as err:
            _parse({"workers": {str(kept): {"ds": _worker(kept)}}})
        assert str(err.value) == ("this state holds 1 of the 2 workers' positions of one "
                                  "epoch; it cannot be resumed")
    with pytest.raises(ValueError, match="holds 2 of the 3 workers' positions"):
        _parse({"w": [_worker(0, 3), _worker(2, 3)]})


def test_a_stream_state_of_another_record_count_is_refused():
    """A stream's order description does not name the record count (its
    window is 8192, not the dataset): the count in the state refuses it."""
    with pytest.raises(ValueError) as err:
        _parse({"w": [_worker(0), _worker(1)]}, records=120)
    assert str(err.value) == (
        "this state was saved for a dataset of 100 records; this one has 120 (if records "
        "were appended since, open the version it was saved with: fastdata info --history)")


if __name__ == "__main__":  # print this algorithm's digests, to record them above
    print(f"    {ALGORITHM}: {{")
    for name, case in CASES.items():
        print(f"        {json.dumps(name)}: {json.dumps(digest(*_parts(case())))},")
    print("    },")
    sys.exit(0)

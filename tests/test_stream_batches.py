"""A stream read a batch at a time (``stream.batches()``, what fastdata.loader()
uses) gives the batches per-sample reading gives: same pixels, labels, order,
epochs and resume points."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import fastdata
from fastdata.demo import synthesize


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stream_batches")
    synthesize(tmp / "src", kind="tiny", n=230, seed=2)
    return fastdata.pack(tmp / "src", tmp / "d-%06d.tar",
                         options=fastdata.PackOptions(shard_size=60), progress=False).output


def _open(path, **order):
    return fastdata.open_dataset(path, streaming=True, with_metadata=order.pop("meta", False),
                                 decode=fastdata.Decode(size=order.pop("size", None)),
                                 order=fastdata.Order(shuffle=True, seed=7, batch_size=32,
                                                      **order))


def _per_sample(ds, workers, drop_last=False):
    loader = DataLoader(ds, batch_size=32, num_workers=workers, drop_last=drop_last,
                        collate_fn=fastdata.collate)
    return [(b[0].numpy().tobytes(), b[1].tolist(), *b[2:]) for b in loader]


def _batched(ds, workers):
    loader = DataLoader(ds.batches(), batch_size=None, num_workers=workers,
                        collate_fn=fastdata.collate)
    return [(b[0].numpy().tobytes(), b[1].tolist(), *b[2:]) for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("size", [None, (20, 24)])
def test_batches_equal_per_sample_reading(shards, workers, drop_last, size):
    want = _per_sample(_open(shards, drop_last=drop_last, size=size), workers, drop_last)
    got = _batched(_open(shards, drop_last=drop_last, size=size), workers)
    assert got == want and len(got) == (7 if drop_last else 8)


def test_batches_carry_metadata_and_advance_epochs(shards):
    ds = _open(shards, meta=True)
    first = _batched(ds, 0)
    assert all(isinstance(b[2], list) and len(b[2]) == len(b[1]) for b in first)
    assert first == _per_sample(_open(shards, meta=True), 0)
    ds.set_epoch(1)
    assert _batched(ds, 0) != first


def test_loader_reads_a_stream_in_batches(shards):
    ds = _open(shards)
    loader = fastdata.loader(ds, device="cpu", num_workers=0)
    assert type(loader.loader.dataset).__name__ == "StreamBatches"
    assert len(loader) == 8 == len(loader.loader.dataset)
    got = [((x * 255).round().to(torch.uint8).numpy().tobytes(), y.tolist()) for x, y in loader]
    assert got == [b[:2] for b in _per_sample(_open(shards), 0)]
    assert ds.epoch == 1  # a whole pass moves the stream on


def test_a_batched_stream_resumes_exactly(shards):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(ds):
        return StatefulDataLoader(ds.batches(), batch_size=None, num_workers=2,
                                  collate_fn=fastdata.collate)

    first = loader(_open(shards))
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    del it
    resumed = loader(_open(shards))
    resumed.load_state_dict(state)
    whole = [(x.numpy().tobytes(), y.tolist()) for x, y in head + list(resumed)]
    assert whole == [b[:2] for b in _per_sample(_open(shards), 2)]


def test_batches_need_a_batch_size(shards):
    ds = fastdata.open_dataset(shards, streaming=True)
    with pytest.raises(ValueError, match="batch_size"):
        ds.batches()


@pytest.mark.parametrize("stop_after", [0, 3, 7])
def test_loader_runs_a_stream_ahead_and_its_state_is_the_loops(shards, stop_after):
    """loader() makes batches ahead on a thread; ds.state_dict() is still the
    point after the batches the loop took, and resumes exactly there."""
    def uint8(x):
        return (x * 255).round().to(torch.uint8).numpy().tobytes()

    want = [b[:2] for b in _per_sample(_open(shards), 0)]
    ds = _open(shards)
    loader = fastdata.loader(ds, device="cpu", num_workers=0, run_ahead=3)
    assert loader.run_ahead == 3
    head, it = [], iter(loader)
    for _ in range(stop_after):
        x, y = next(it)
        head.append((uint8(x), y.tolist()))
    state = ds.state_dict()
    it.close()
    again = _open(shards)
    again.load_state_dict(state)
    rest = [(uint8(x), y.tolist()) for x, y in fastdata.loader(again, device="cpu",
                                                               num_workers=0)]
    assert head + rest == want

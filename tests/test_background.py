"""BackgroundBatches: a loader run in a thread ahead of the training loop, and
fastdata.loader using it without worker processes."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import fastdata
from fastdata import Decode, Order
from fastdata.loaders.background import BackgroundBatches
from conftest import build_tree, uniform_spec


def _batch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fastdata-batches"]


class Counting(torch.utils.data.Dataset):
    """Records which batches were made, in which thread; can fail at one."""

    def __init__(self, n: int = 40, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at
        self.made: list[int] = []
        self.threads: set[str] = set()
        self.second_made = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.fail_at:
            raise ValueError(f"record {i} is damaged")
        return i

    def __getitems__(self, indices: list[int]) -> list[int]:
        items = [self[i] for i in indices]
        self.made.append(indices[0])
        self.threads.add(threading.current_thread().name)
        if len(self.made) == 2:
            self.second_made.set()
        return items


def _loader(ds, batch_size: int = 4):
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, collate_fn=torch.tensor)


def test_same_batches_in_the_same_order_made_in_another_thread():
    ds = Counting()
    got = [b.tolist() for b in BackgroundBatches(_loader(ds))]
    assert got == [b.tolist() for b in _loader(Counting())]
    assert ds.threads == {"fastdata-batches"}
    assert len(BackgroundBatches(_loader(ds))) == 10
    assert not _batch_threads()


def test_the_next_batch_is_made_while_the_loop_holds_this_one():
    ds = Counting()
    it = iter(BackgroundBatches(_loader(ds), depth=1))
    first = next(it)
    # The loop has not asked for the second batch: it is being made anyway.
    assert ds.second_made.wait(timeout=30)
    assert first.tolist() == [0, 1, 2, 3]
    assert next(it).tolist() == [4, 5, 6, 7]
    it.close()


def test_it_runs_at_most_depth_batches_ahead():
    ds = Counting(n=400)
    it = iter(BackgroundBatches(_loader(ds), depth=2))
    next(it)
    time.sleep(0.5)
    # One taken, two waiting in the queue, one made and waiting to be queued.
    assert len(ds.made) <= 1 + 2 + 1
    it.close()


def test_an_error_reaches_the_loop_after_the_batches_before_it():
    ds = Counting(fail_at=9)
    got = []
    with pytest.raises(ValueError, match="record 9 is damaged"):
        for batch in BackgroundBatches(_loader(ds)):
            got.append(batch.tolist())
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert not _batch_threads()


def test_leaving_the_loop_early_stops_the_thread():
    ds = Counting(n=400)
    for k, _ in enumerate(BackgroundBatches(_loader(ds), depth=2)):
        if k == 1:
            break
    assert not _batch_threads()
    made = len(ds.made)
    time.sleep(0.2)
    assert len(ds.made) == made  # nothing is made after the loop left
    assert made < 100


def test_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="depth must be at least 1"):
        BackgroundBatches([], depth=0)


@pytest.fixture(scope="module")
def lmdb_photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("background")
    tree = build_tree(root / "src", uniform_spec(classes=("a", "b"), per_class=20))
    out = root / "photos.lmdb"
    fastdata.pack(tree.root, out, progress=False)
    return out


def test_loader_without_workers_makes_batches_ahead_with_the_same_crops(lmdb_photos):
    def epochs(**options):
        ds = fastdata.open_dataset(lmdb_photos,
                                   decode=fastdata.Decode(crop=fastdata.RandomResizedCrop(32)),
                                   order=fastdata.Order(shuffle=True, batch_size=8, seed=5))
        loader = fastdata.loader(ds, num_workers=0, device="cpu", **options)
        out = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            out += [(images.clone(), labels.clone()) for images, labels in loader]
        return loader, out

    ahead, batches = epochs()
    assert ahead.run_ahead == 2
    assert isinstance(ahead.loader, torch.utils.data.DataLoader)
    plain, expected = epochs(run_ahead=0)
    assert plain.run_ahead == 0
    assert len(batches) == len(expected) == 10
    for (images, labels), (want_images, want_labels) in zip(batches, expected):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_loader_with_workers_leaves_them_to_run_ahead(lmdb_photos):
    ds = fastdata.open_dataset(lmdb_photos, decode=Decode(size=(16, 16)),
                               order=Order(shuffle=True, batch_size=8))
    loader = fastdata.loader(ds, num_workers=1, device="cpu", persistent_workers=False)
    assert loader.run_ahead == 0
    assert sum(len(labels) for _, labels in loader) == len(ds)


def test_a_negative_run_ahead_is_refused(lmdb_photos):
    ds = fastdata.open_dataset(lmdb_photos)
    with pytest.raises(ValueError, match="run_ahead must be 0 or more"):
        fastdata.loader(ds, num_workers=0, device="cpu", run_ahead=-1)


def test_the_overlap_benchmark_prints_every_row(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "bench" / "train_step_overlap.py"
    result = subprocess.run(
        [sys.executable, str(script), "--n", "16", "--batch", "8", "--size", "32", "--epochs", "1",
         "--steps-ms", "0,1", "--workers", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    names = ("0 workers ", "0 workers + background", "1 workers")
    assert len(rows) == 6 and all(any(n in row for row in rows) for n in names)
    assert "(the step alone allows 8,000)" in rows[-1]


class Stuck(Counting):
    """Its second batch never finishes until released (a read that hangs)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def __getitems__(self, indices):
        if indices[0] == 4:
            self.release.wait(timeout=60)
        return super().__getitems__(indices)


def test_an_interrupted_wait_is_raised_even_when_the_loader_hangs(monkeypatch):
    from conftest import no_hang

    from fastdata.loaders import background

    monkeypatch.setattr(background, "_INTERRUPTED_JOIN_S", 0.2)  # 5 s by default
    ds = Stuck()
    got = []
    try:
        with pytest.raises(TimeoutError, match="no result within 1s"):
            with no_hang(1):
                for batch in BackgroundBatches(_loader(ds)):
                    got.append(batch.tolist())
        assert got == [[0, 1, 2, 3]]
    finally:
        ds.release.set()
    for thread in _batch_threads():
        thread.join(timeout=30)
    assert not _batch_threads()


def test_a_stream_run_ahead_still_has_the_position_of_what_the_loop_took(tmp_path):
    # 16 classes of one image each: a sample's label names its record.
    tree = build_tree(tmp_path / "src",
                      uniform_spec(classes=tuple(f"c{k:02d}" for k in range(16)), per_class=1))
    fastdata.pack(tree.root, tmp_path / "s.tar", options=fastdata.PackOptions(shard_size=4),
                  progress=False)

    def stream():
        return fastdata.ShardedIterableDataset(
            tmp_path / "s.tar.fastdata.json", decode=fastdata.Decode(size=(16, 16)),
            order=fastdata.Order(shuffle=True, seed=2, batch_size=4, block=1))

    def records(loader) -> list[list[int]]:
        return [labels.tolist() for _, labels in loader]

    ds = stream()
    assert ds.targets == list(range(16))
    whole = records(fastdata.loader(stream(), num_workers=0, device="cpu"))
    assert len(whole) == 4 and sorted(sum(whole, [])) == list(range(16))
    loader = fastdata.loader(ds, num_workers=0, device="cpu")
    assert loader.run_ahead == 2   # batches made ahead on a thread, a batch at a time
    it = iter(loader)
    taken = next(it)[1].tolist()
    state = ds.state_dict()  # after the one batch the loop took, not later ones
    again = stream()
    again.load_state_dict(state)
    rest = records(fastdata.loader(again, num_workers=0, device="cpu"))
    # The uninterrupted pass's records after the first batch, in its order.
    assert taken == whole[0] and rest == whole[1:] and len(sum(rest, [])) == 12


def test_a_loader_that_keeps_a_resume_state_is_refused(lmdb_photos):
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = fastdata.open_dataset(lmdb_photos, decode=Decode(size=(16, 16)))
    stateful = StatefulDataLoader(ds, batch_size=4, collate_fn=fastdata.collate)
    with pytest.raises(ValueError, match="StatefulDataLoader keeps a state_dict"):
        BackgroundBatches(stateful)
    with pytest.raises(ValueError, match="StatefulDataLoader keeps a state_dict"):
        fastdata.CUDAPrefetcher(stateful, "cpu", run_ahead=2)
    assert len(list(fastdata.CUDAPrefetcher(stateful, "cpu"))) == 10  # without: as before

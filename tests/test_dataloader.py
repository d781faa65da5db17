"""LMDB datasets in torch DataLoader workers, under fork and spawn."""

from __future__ import annotations

import multiprocessing as mp
import random
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import (
    IMAGE_FILE_EXTENSIONS,
    build_tree,
    expected_rgb,
    pixel_digest,
    uniform_spec,
)
from torch.utils.data import DataLoader

import fastdata
from fastdata import Decode
from fastdata.loaders.datasets import LMDBDataset

SIZE = (12, 10)  # (width, height): every image the same size, so default collate works

needs_fork = pytest.mark.skipif("fork" not in mp.get_all_start_methods(),
                                reason="no fork start method here")


@pytest.fixture(scope="module")
def packed_equal(tmp_path_factory):
    base = tmp_path_factory.mktemp("dl")
    # Lossless formats only, so decoded pixels identify each sample exactly.
    tree = build_tree(base / "src", uniform_spec(classes=("ant", "Bee", "cow"), per_class=7,
                                                 exts=(".png", ".bmp", ".ppm", ".gif", ".tif")),
                      size=SIZE, extensions=IMAGE_FILE_EXTENSIONS)
    out = base / "equal.lmdb"
    fastdata.pack(tree.root, out, options=fastdata.PackOptions(extensions="+gif"),
                  progress=False)
    expected = Counter((s.label, pixel_digest(expected_rgb(s.data))) for s in tree.samples)
    assert len(expected) == len(tree.samples)  # every sample distinguishable
    return tree, out, expected


def _collect(loader, *, chw: bool) -> Counter:
    got: Counter = Counter()
    for images, labels in loader:
        assert images.dtype == torch.uint8
        assert images.ndim == 4 and images.shape[0] == labels.shape[0] <= loader.batch_size
        for img, label in zip(images, labels.tolist()):
            arr = img.permute(1, 2, 0).numpy() if chw else img.numpy()
            got[(label, pixel_digest(arr))] += 1
    return got


def _loader(ds, ctx, shuffle):
    return DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=ctx,
                      shuffle=shuffle, timeout=120)


@needs_fork
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_every_sample_once_fork(packed_equal, shuffle):
    tree, out, expected = packed_equal
    ds = LMDBDataset(out, decode=Decode(output="numpy"))
    got = _collect(_loader(ds, "fork", shuffle), chw=False)
    assert got == expected
    assert sum(got.values()) == len(tree.samples)


class _OrderedThenShuffled(torch.utils.data.Sampler):
    """Epoch 0 in order, later epochs shuffled: one set of persistent spawned
    workers covers both cases (starting spawn workers is the slow part)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = list(range(self.n))
        if self.epoch:
            random.Random(self.epoch).shuffle(order)
        self.epoch += 1
        return iter(order)


@pytest.mark.slow
def test_every_sample_once_spawn(packed_equal):
    tree, out, expected = packed_equal
    ds = LMDBDataset(out, decode=Decode(output="numpy"))
    assert ds[0][1] == tree.samples[0].label  # the parent has the environment open too
    sampler = _OrderedThenShuffled(len(ds))
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn",
                        sampler=sampler, persistent_workers=True, timeout=120)
    labels = []
    for images, lbl in loader:  # epoch 0: in order
        labels += lbl.tolist()
    assert labels == tree.labels
    assert _collect(loader, chw=False) == expected  # epoch 1: shuffled
    assert sampler.epoch == 2
    assert ds[1][1] == tree.samples[1].label


@needs_fork
def test_order_without_shuffle(packed_equal):
    tree, out, _ = packed_equal
    loader = DataLoader(LMDBDataset(out, decode=Decode(output="numpy")), batch_size=4,
                        num_workers=2, multiprocessing_context="fork", timeout=120)
    labels = torch.cat([lbl for _, lbl in loader]).tolist()
    assert labels == tree.labels


@needs_fork
def test_tensor_output_fork(packed_equal):
    _, out, expected = packed_equal
    ds = fastdata.open_dataset(out)  # default: uint8 CHW tensors
    assert _collect(_loader(ds, "fork", True), chw=True) == expected


@needs_fork
def test_parent_read_before_fork(packed_equal):
    tree, out, expected = packed_equal
    ds = LMDBDataset(out, decode=Decode(output="numpy"))
    img, label = ds[0]  # the environment is now open in the parent
    assert label == tree.samples[0].label
    assert np.array_equal(img, expected_rgb(tree.samples[0].data))
    other = LMDBDataset(out, decode=Decode(output="bytes"))  # a second view on the same path
    assert other[1][0] == tree.samples[1].data
    for epoch in range(2):
        assert _collect(_loader(ds, "fork", shuffle=bool(epoch)), chw=False) == expected
    # The parent's environment still works after its children closed their copies.
    for i in (0, len(ds) - 1, 3):
        img, label = ds[i]
        assert label == tree.samples[i].label
        assert np.array_equal(img, expected_rgb(tree.samples[i].data))
    assert other[2][0] == tree.samples[2].data


@needs_fork
def test_persistent_workers_two_epochs(packed_equal):
    _, out, expected = packed_equal
    ds = LMDBDataset(out, decode=Decode(output="numpy"))
    loader = DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork",
                        shuffle=True, persistent_workers=True, timeout=120)
    for _ in range(2):
        assert _collect(loader, chw=False) == expected


@needs_fork
def test_skip_corrupt_record_in_workers(tmp_path):
    import lmdb

    tree = build_tree(tmp_path / "src", uniform_spec(per_class=3, exts=(".png",)), size=SIZE)
    out = tmp_path / "bad.lmdb"
    fastdata.pack(tree.root, out, progress=False)
    env = lmdb.open(str(out), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"0000000004", b"\x89PNG garbage")
    env.close()
    # (on_error="raise" across workers is torch's business, and torch takes ~10 s
    # to shut down workers after one raised; the error pickling is tested in
    # test_lmdb.py.)
    skip = LMDBDataset(out, decode=Decode(output="numpy"), on_error="skip")
    labels = []
    # (The skip warnings are issued inside the workers.)
    for _, lbl in DataLoader(skip, batch_size=4, num_workers=2,
                             multiprocessing_context="fork", timeout=120):
        labels += lbl.tolist()
    assert labels == [s.label for i, s in enumerate(tree.samples) if i != 4]

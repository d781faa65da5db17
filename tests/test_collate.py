"""Batches stacked once in __getitems__, and fastdata.collate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate

import fastdata
from fastdata import Decode, Order
from fastdata.loaders.collate import Batch
from fastdata.packers.pack import PackOptions
from fastdata.packers.preprocess import Preprocess


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    src = tmp_path_factory.mktemp("collate") / "src"
    rng = np.random.default_rng(1)
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(10):
            size = (16, 16) if i % 3 else (12, 20)
            Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(
                src / f"c{c}" / f"{i}.png")
    return src


def _pack(tree, tmp_path, name, **pre):
    out = str(tmp_path / f"{name}.lmdb")
    fastdata.pack(str(tree), out, options=PackOptions(workers=1, preprocess=Preprocess(**pre)),
                  progress=False)
    return out


@pytest.mark.parametrize("variant", ["encoded", "raw"])
def test_same_size_batch_is_stacked_once(tree, tmp_path, variant):
    pre = {"resize": (16, 16)} if variant == "encoded" else {"resize": (16, 16), "encoding": "raw"}
    ds = fastdata.open_dataset(_pack(tree, tmp_path, variant, **pre))
    indices = [5, 0, 19, 3]
    batch = ds.__getitems__(indices)
    assert isinstance(batch, Batch) and len(batch) == 4
    assert batch.images.shape == (4, 3, 16, 16) and batch.images.dtype == torch.uint8
    assert batch.images.is_contiguous(memory_format=torch.channels_last)
    for k, i in enumerate(indices):
        image, label = ds[i]
        assert torch.equal(batch.images[k], image) and int(batch.labels[k]) == label
    batch.images[0, 0, 0, 0] = 1  # writable memory, not a view of the stored bytes
    images, labels = fastdata.collate(batch)
    assert images is batch.images
    dc_images, dc_labels = default_collate(batch)  # torch's collate still works on it
    assert torch.equal(dc_images, batch.images) and torch.equal(dc_labels, batch.labels)


def test_mixed_sizes_fall_back_to_samples(tree, tmp_path):
    ds = fastdata.open_dataset(_pack(tree, tmp_path, "mixed"))
    batch = ds.__getitems__([0, 1, 2])
    assert isinstance(batch, list) and {tuple(b[0].shape) for b in batch} == \
        {(3, 16, 16), (3, 12, 20)}
    # Where torch's default collate would stack them, the warning says why it fails.
    with pytest.warns(fastdata.MixedSizeWarning, match="differ in size"):
        with pytest.raises(RuntimeError):
            next(iter(DataLoader(ds, batch_size=3)))
    sized = fastdata.open_dataset(ds.path, decode=Decode(size=(8, 8)))
    assert isinstance(sized.__getitems__([0, 1, 2]), Batch)


def test_transform_or_other_outputs_keep_per_sample_path(tree, tmp_path):
    path = _pack(tree, tmp_path, "t", resize=(16, 16))
    assert isinstance(fastdata.open_dataset(path, transform=lambda x: x).__getitems__([0, 1]),
                      list)
    as_numpy = fastdata.open_dataset(path, decode=Decode(output="numpy"))
    assert isinstance(as_numpy.__getitems__([0, 1]), list)


def test_dataloader_with_fastdata_collate(tree, tmp_path):
    ds = fastdata.open_dataset(_pack(tree, tmp_path, "dl", resize=(16, 16), encoding="raw"))
    loader = DataLoader(ds, batch_size=6, num_workers=2, collate_fn=fastdata.collate)
    batches = list(loader)
    assert [len(y) for _, y in batches] == [6, 6, 6, 2]
    # Every record, in the stored order: its pixels (every noise image differs)
    # and its label.
    assert torch.equal(torch.cat([x for x, _ in batches]),
                       torch.stack([ds[i][0] for i in range(len(ds))]))
    assert torch.cat([y for _, y in batches]).tolist() == ds.targets


def test_mixed_sizes_get_an_error_that_says_what_to_do(tree, tmp_path):
    ds = fastdata.open_dataset(_pack(tree, tmp_path, "mixed"),
                               order=Order(shuffle=True, batch_size=6))
    with pytest.warns(fastdata.MixedSizeWarning, match=r"size=\(h, w\)") as caught:
        # torch's own collate fails with a message that does not say why; the
        # warning before it does, once per process.
        with pytest.raises(RuntimeError):
            for _ in DataLoader(ds, batch_size=6):
                pass
        with pytest.raises(RuntimeError):
            for _ in DataLoader(ds, batch_size=6):
                pass
    assert len([w for w in caught if w.category is fastdata.MixedSizeWarning]) == 1
    assert "3x16x16" in str(caught[0].message) and "3x12x20" in str(caught[0].message)
    with pytest.raises(fastdata.FastDataError, match=r"differ in size .*size=\(h, w\).*"
                                                     r"collate_fn that keeps a list"):
        for _ in DataLoader(ds, batch_size=6, collate_fn=fastdata.collate):
            pass
    with pytest.raises(fastdata.FastDataError, match="differ in size"):
        for _ in fastdata.loader(ds, num_workers=0):
            pass


def test_mixed_sizes_are_fine_where_nothing_stacks_them(tree, tmp_path):
    import warnings

    ds = fastdata.open_dataset(_pack(tree, tmp_path, "mixed"))
    out = str(tmp_path / "mixed-stream.tar")
    fastdata.pack(str(tree), out, options=PackOptions(workers=1), progress=False)
    stream = fastdata.ShardedIterableDataset(out)
    keep_lists = dict(batch_size=6, collate_fn=lambda b: tuple(zip(*b)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastdata.MixedSizeWarning)  # no warning is given
        batches = list(DataLoader(ds, **keep_lists))
        streamed = list(DataLoader(stream, **keep_lists))
        looped = list(fastdata.ShardedIterableDataset(out, decode=Decode(output="numpy")))
        got = ds.__getitems__(list(range(6)))  # asked for directly: a list of samples
    assert sum(len(images) for images, _ in batches) == len(ds) == len(looped)
    assert sum(len(images) for images, _ in streamed) == len(ds) and len(got) == 6
    # One size: no warning, stacked.
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastdata.MixedSizeWarning)
        sized = fastdata.open_dataset(ds.path, decode=Decode(size=(16, 16)))
        images, _ = next(iter(DataLoader(sized, batch_size=6)))
    assert images.shape == (6, 3, 16, 16)


def test_streamed_mixed_sizes_warn(tree, tmp_path):
    out = str(tmp_path / "mixed.tar")
    fastdata.pack(str(tree), out, options=PackOptions(workers=1), progress=False)
    ds = fastdata.ShardedIterableDataset(out)
    with pytest.warns(fastdata.MixedSizeWarning, match="differ in size"):
        with pytest.raises(RuntimeError):
            for _ in DataLoader(ds, batch_size=6):
                pass
    sized = fastdata.ShardedIterableDataset(out, decode=Decode(size=(16, 16)))
    assert sum(len(y) for _, y in DataLoader(sized, batch_size=6)) == 20


@pytest.mark.parametrize("threads", [1, 2])
def test_fixed_size_batch_filled_by_decode_threads_equals_samples(tree, tmp_path, threads):
    # Decode(size=(h, w)) and Decode(crop=) fix every image's shape: the decode
    # threads copy each image into the batch tensor; the batch must equal the samples.
    path = _pack(tree, tmp_path, f"fill{threads}")  # mixed stored sizes
    for decode in (Decode(size=(10, 14)), Decode(crop=fastdata.RandomResizedCrop((9, 7)))):
        ds = fastdata.open_dataset(path, decode_threads=threads, decode=decode)
        indices = list(range(len(ds)))[::-1]
        batch = ds.__getitems__(indices)
        assert isinstance(batch, Batch)
        h, w = decode.size or decode.crop.size
        assert batch.images.shape == (len(indices), 3, h, w)
        for k, i in enumerate(indices):
            assert torch.equal(batch.images[k], ds[i][0])


def test_fixed_size_batch_with_a_failed_record_skips_it(tmp_path):
    src = tmp_path / "src" / "c0"
    src.mkdir(parents=True)
    rng = np.random.default_rng(2)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(src / f"{i}.png")
    out = str(tmp_path / "bad.lmdb")
    fastdata.pack(str(tmp_path / "src"), out, options=PackOptions(workers=1), progress=False)
    # Every 12x12 image is over the limit.
    ds = fastdata.open_dataset(out, decode=Decode(size=(8, 8), max_pixels=100), on_error="skip",
                               decode_threads=2)
    with pytest.warns(RuntimeWarning, match="skipping undecodable record"):
        assert ds.__getitems__([0, 1, 2]) == []
    ok = fastdata.open_dataset(out, decode=Decode(size=(8, 8)), decode_threads=2)
    batch = ok.__getitems__([3, 0])
    assert isinstance(batch, Batch) and torch.equal(batch.images[0], ok[3][0])

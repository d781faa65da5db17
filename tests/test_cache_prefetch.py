"""RAM cache shared by DataLoader workers, CUDA prefetcher (CPU path), loader()."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata import Decode, Order
from fastdata.errors import FastDataError
from fastdata.loaders import cache as cache_mod
from fastdata.packers.pack import PackOptions


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    src = root / "src"
    rng = np.random.default_rng(0)
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(60):
            # Noise PNGs do not compress: ~12 KB each, ~1.5 MB in all.
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
                src / f"c{c}" / f"{i:03d}.png")
    out = str(root / "data.lmdb")
    fastdata.pack(str(src), out, options=PackOptions(workers=1), progress=False)
    return out


def _shm_pss(pid: int, name: str) -> int:
    """PSS bytes of the shared-memory mapping ``name`` in process ``pid``."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and len(parts) >= 5:
                inside = line.rstrip().endswith("/" + name)
            elif inside and parts and parts[0] == "Pss:":
                total += int(parts[1]) * 1024
    return total


def test_cached_results_equal_uncached(packed):
    plain = fastdata.open_dataset(packed)
    cached = fastdata.open_dataset(packed, cache="ram")
    assert cached.cache.nbytes == plain.manifest.bytes["payload"]
    for i in (0, 5, len(plain) - 1, -1):
        a, b = plain[i], cached[i]
        assert a[1] == b[1] and bool((a[0] == b[0]).all())
    batch = cached.__getitems__([3, 1, 2])
    assert [s[1] for s in batch] == [plain[3][1], plain[1][1], plain[2][1]]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_workers_share_one_copy(packed, ctx):
    ds = fastdata.open_dataset(packed, cache="ram", decode=Decode(output="bytes"))
    name = ds.cache.name
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, shuffle=True,
                                         persistent_workers=True, multiprocessing_context=ctx,
                                         collate_fn=_as_list)
    it = iter(loader)
    seen = sum(len(b) for b in it)
    assert seen == len(ds)
    pids = [os.getpid()] + [w.pid for w in it._workers]
    per_process = [_shm_pss(pid, name) for pid in pids]
    total = sum(per_process)
    # Every worker read its share through the mapping, yet the pages are
    # counted once in total: one copy, not one per worker.
    assert all(p > 0 for p in per_process[1:]), per_process
    assert total <= 1.2 * ds.cache.nbytes + 64 * 1024, (per_process, ds.cache.nbytes)
    del it, loader


def test_memory_check_refuses_with_needed_and_available(packed, monkeypatch):
    monkeypatch.setattr(cache_mod, "available_memory", lambda: 1000)
    with pytest.raises(FastDataError, match=r"needs .* but only .* available"):
        fastdata.open_dataset(packed, cache="ram")


def test_cache_is_freed_with_the_dataset(packed):
    ds = fastdata.open_dataset(packed, cache="ram")
    path = "/dev/shm/" + ds.cache.name
    assert os.path.exists(path)
    ds.cache.close()
    assert not os.path.exists(path)


def test_bad_cache_option(packed):
    with pytest.raises(ValueError, match="cache must be"):
        fastdata.open_dataset(packed, cache="disk")


def test_prefetcher_on_cpu_normalises_and_warns(packed):
    ds = fastdata.open_dataset(packed)
    dl = torch.utils.data.DataLoader(ds, batch_size=4)
    with pytest.warns(RuntimeWarning, match="CUDA is not available") if not \
            torch.cuda.is_available() else _null():
        import fastdata.loaders.prefetch as P

        P._warned_no_cuda = False
        pf = fastdata.CUDAPrefetcher(dl, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    images, labels = next(iter(pf))
    raw, raw_labels = next(iter(dl))
    expected = (raw.float() - 127.5) / 63.75
    assert torch.allclose(images.cpu(), expected, atol=1e-4)
    assert torch.equal(labels.cpu(), raw_labels)
    assert len(pf) == len(dl)
    half = fastdata.CUDAPrefetcher(dl, dtype=torch.float16, channels_last=True)
    images = next(iter(half))[0]
    assert images.dtype == torch.float16 and float(images.max()) <= 1.0
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_prefetcher_handles_dicts_and_needs_both_mean_and_std():
    batches = [{"image": torch.full((2, 3, 4, 4), 255, dtype=torch.uint8), "label": torch.ones(2)}]
    out = next(iter(fastdata.CUDAPrefetcher(batches, device="cpu")))
    assert out["image"].dtype == torch.float32 and float(out["image"].max()) == 1.0
    with pytest.raises(ValueError, match="mean and std"):
        fastdata.CUDAPrefetcher(batches, device="cpu", mean=(0.5,))


def _normalised(images: torch.Tensor, mean, std) -> torch.Tensor:
    """(x / 255 - mean) / std per channel, in float64 on the CPU."""
    m = torch.tensor(mean, dtype=torch.float64).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(1, -1, 1, 1)
    return (images.cpu().double() / 255 - m) / s


_CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                      reason="needs CUDA"))


@pytest.mark.parametrize("device", ["cpu", _CUDA])
def test_prefetcher_normalises_every_batch_on_its_device(packed, device):
    # The CPU is the prefetcher's own path without a GPU (the same loader call):
    # both must give (x / 255 - mean) / std of the batch the dataset holds.
    ds = fastdata.open_dataset(packed, order=fastdata.Order(batch_size=16))  # stored order
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    pf = fastdata.loader(ds, num_workers=2, device=device, mean=mean, std=std)
    n = 0
    for images, labels in pf:
        assert images.device.type == device and images.dtype == torch.float32
        assert images.shape == (len(labels), 3, 64, 64)
        raw = torch.stack([ds[i][0] for i in range(n, n + len(labels))])
        assert labels.cpu().tolist() == [ds[i][1] for i in range(n, n + len(labels))]
        # float32 arithmetic on values within about +-2.7 is off by a few 1e-7;
        # a wrong channel, mean or scale is off by more than 0.01.
        error = float((images.cpu().double() - _normalised(raw, mean, std)).abs().max())
        assert error < 1e-5, (n, error)
        n += len(labels)
    assert n == len(ds)


def test_loader_defaults(packed):
    ds = fastdata.open_dataset(packed, order=fastdata.Order(shuffle=True, seed=3, batch_size=8))
    dl = fastdata.loader(ds, num_workers=0, device="cpu")
    assert isinstance(dl, fastdata.CUDAPrefetcher)
    assert isinstance(dl.loader, torch.utils.data.DataLoader)
    # Each sample's record, found by its pixels (every noise image differs).
    number = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    assert len(number) == len(ds) == 120

    def records(workers: int) -> list[list[int]]:
        return [[number[(x * 255).round().to(torch.uint8).numpy().tobytes()] for x in images]
                for images, _ in fastdata.loader(ds, num_workers=workers, device="cpu")]

    a, b = records(0), records(2)
    # Same seed, same records in the same order, whatever the number of workers:
    # the order engine's batches.
    assert a == b == [list(batch) for batch in fastdata.EpochBatches(ds)]
    assert len(a) == 15 and sorted(sum(a, [])) == list(range(120)) != sum(a, [])


def _as_list(batch):
    return batch


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_decoded_cache_equals_decoding(packed):
    plain = fastdata.open_dataset(packed, decode=Decode(size=(32, 32)))
    cached = fastdata.open_dataset(packed, decode=Decode(size=(32, 32)), cache="decoded")
    assert cached.cache.pixels.shape == (len(plain), 32, 32, 3)
    for i in (0, 7, -1):
        assert torch.equal(plain[i][0], cached[i][0]) and plain[i][1] == cached[i][1]
    batch = cached.__getitems__([4, 2, 9])
    assert torch.equal(batch.images[1], plain[2][0])
    assert [int(x) for x in batch.labels] == [plain[4][1], plain[2][1], plain[9][1]]
    numpy_ds = fastdata.open_dataset(packed, decode=Decode(size=(32, 32), output="numpy"),
                                     cache="decoded")
    assert numpy_ds[3][0].shape == (32, 32, 3)
    loader = torch.utils.data.DataLoader(cached, batch_size=16, num_workers=2,
                                         multiprocessing_context="spawn",
                                         collate_fn=fastdata.collate)
    assert sorted(torch.cat([y for _, y in loader]).tolist()) == sorted(plain.targets)
    cached.cache.close()


def test_decoded_cache_needs_one_size(packed):
    with pytest.raises(FastDataError, match=r"needs one image size"):
        fastdata.open_dataset(packed, cache="decoded")
    with pytest.raises(FastDataError, match="keep_gray"):
        fastdata.open_dataset(packed, decode=Decode(size=(8, 8), keep_gray=True),
                              cache="decoded")


@pytest.mark.parametrize("fmt", ["lmdb", "h5", "tar"])
def test_ram_cache_with_skip_leaves_out_a_corrupt_record(image_tree, tmp_path, fmt):
    from fastdata.errors import CorruptDataError

    out = tmp_path / f"d.{fmt}"
    fastdata.pack(image_tree.root, out, options=PackOptions(workers=1), progress=False)
    path = fastdata.open_dataset(out).path
    bad = 3
    with fastdata.formats.open_reader(path) as reader:
        payload = reader.read(bad)
    # Flip one byte inside record 3's stored bytes, wherever the format keeps them.
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".mdb", ".h5", ".tar")]
    for f in files:
        data = bytearray(f.read_bytes())
        at = data.find(payload)
        if at >= 0:
            data[at + len(payload) // 2] ^= 0xFF
            f.write_bytes(bytes(data))
            break
    else:
        raise AssertionError("record bytes not found")
    with pytest.raises(CorruptDataError):
        fastdata.open_dataset(path, cache="ram", decode=Decode(output="bytes"), progress=False)
    with pytest.warns(RuntimeWarning, match="skipping corrupt record 3"):
        ds = fastdata.open_dataset(path, cache="ram", decode=Decode(output="bytes"),
                                   on_error="skip", progress=False)
        got = [ds[i] for i in range(len(ds))]
        batch = ds.__getitems__(list(range(len(ds))))
    want = [(s.data, s.label) for i, s in enumerate(image_tree.samples) if i != bad]
    assert [(bytes(img), label) for img, label in batch] == want
    assert (bytes(got[bad][0]), got[bad][1]) == want[bad]  # ds[3] moves to the next record
    assert ds.skipped >= 2
    with pytest.raises(CorruptDataError) as info:
        ds.cache.read_many([bad])
    assert f"record {bad} was left out of the RAM cache: it " in str(info.value)
    assert str(info.value).count(f"record {bad}") == 1, str(info.value)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_loader_gives_the_same_kind_of_batch_on_every_machine(packed, device, recwarn):
    # Without a GPU, the call a training script makes still returns normalised
    # float16 batches (on the CPU), with no warning about CUDA.
    ds = fastdata.open_dataset(packed, decode=Decode(size=(16, 16)), order=Order(batch_size=8))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    images, labels = next(iter(fastdata.loader(ds, num_workers=0, device=device, mean=mean,
                                               std=std, dtype=torch.float16)))
    raw = torch.stack([ds[i][0] for i in range(8)]).float()
    expected = (raw - torch.tensor(mean).view(1, 3, 1, 1) * 255) / (
        torch.tensor(std).view(1, 3, 1, 1) * 255)
    assert images.dtype == torch.float16 and images.shape == (8, 3, 16, 16)
    assert torch.allclose(images.float().cpu(), expected, atol=2e-2)
    if not torch.cuda.is_available():
        assert not [w for w in recwarn if "CUDA" in str(w.message)]

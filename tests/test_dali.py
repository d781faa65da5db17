"""Tests of fastdata.dali: DALI pipelines over every format, CPU-only here.

The pipelines run with ``device="cpu"`` (``device_id=None``, DALI's CPU
decoders); the GPU test skips without CUDA. Pixels are compared with
``fastdata.open_dataset(path, decode=Decode(size=...))``: DALI's resize (linear with
antialiasing) and its JPEG decoder differ from fastdata's (DCT-scaled decode,
OpenCV bilinear/area), so they agree within a tolerance, not exactly.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import optional
import pytest
import torch
from PIL import Image

import fastdata
from fastdata import CenterCrop, Decode, Order
from fastdata.errors import FastDataError
from fastdata.packers.preprocess import Preprocess

needs_dali = optional.skip_unless("dali")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

#: Mean absolute difference (0-255 levels) allowed between DALI's and fastdata's
#: pixels at 32x32. Measured on these images (DALI 2.4, CPU): 1.91 over the
#: dataset, 1.30-2.50 per image, single pixels up to 18 (edges); at 48x48 0.61
#: (0.01-1.13 per image).
MEAN_TOLERANCE = 3.0
IMAGE_TOLERANCE = 6.0

SIZE = (32, 32)
BATCH = 5
N = 24

# Output extension and pack options of every format; sharded formats get 3 shards.
FORMATS = {
    "lmdb": (".lmdb", {}),
    "hdf5": (".h5", {}),
    "tfrecord": (".tfrecord", {"shard_size": 10}),
    "tar": (".tar", {"shard_size": 10}),
}


def photo(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    """A photo-like image: smooth colour regions plus sensor-like noise."""
    base = rng.integers(0, 256, size=(5, 5, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(base).resize((w, h), Image.BICUBIC), dtype=np.float32)
    noisy = smooth + rng.normal(0, 10, size=smooth.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def make_tree(root: Path, *, classes: int = 3, per_class: int = 8, seed: int = 0,
              exts=(".jpg",), size: tuple[int, int] | None = None) -> Path:
    """``classes`` folders of ``per_class`` images (JPEG, 40-64 px unless told)."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class_{c:02d}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            w, h = size or (int(rng.integers(40, 65)), int(rng.integers(40, 65)))
            img = photo(rng, w, h)
            ext = exts[(c + i) % len(exts)]
            buf = io.BytesIO()
            if ext == ".jpg":
                img.save(buf, "JPEG", quality=90)
            elif ext == ".gif":
                img.convert("P", palette=Image.Palette.ADAPTIVE).save(buf, "GIF")
            else:
                img.save(buf, ext[1:].upper())
            (folder / f"img_{i:03d}{ext}").write_bytes(buf.getvalue())
    return root


def pack(src: Path, out: Path, **options) -> str:
    summary = fastdata.pack(src, out, options=fastdata.PackOptions(**options), progress=False)
    return summary.output if options.get("shard_size") else str(out)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("dali") / "src")


@pytest.fixture(scope="module")
def datasets(tree, tmp_path_factory) -> dict[str, str]:
    """The tree packed into every format: name -> path to open."""
    out = tmp_path_factory.mktemp("packed")
    return {name: pack(tree, out / f"ds_{name}{ext}", **opts)
            for name, (ext, opts) in FORMATS.items()}


@pytest.fixture
def index_dir(tmp_path, monkeypatch) -> Path:
    """Generated DALI index files go here, never into the user's cache."""
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "dali-index"


def reference(path: str, size=SIZE) -> tuple[torch.Tensor, list[int]]:
    ds = fastdata.open_dataset(path, decode=Decode(size=size))
    return torch.stack([ds[i][0] for i in range(len(ds))]), ds.targets


def one_epoch(loader) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    images, labels, sizes = [], [], []
    for x, y in loader:
        images.append(x)
        labels.append(y)
        sizes.append(len(y))
    return torch.cat(images), torch.cat(labels), sizes


def diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference per image."""
    return (a.int() - b.int()).abs().float().mean(dim=(1, 2, 3))


def nearest(images: torch.Tensor, ref: torch.Tensor) -> list[int]:
    """Index of the reference image closest to each image."""
    d = (images.float()[:, None] - ref.float()[None]).abs().mean(dim=(2, 3, 4))
    return d.argmin(dim=1).tolist()


# -- every format, CPU-only ---------------------------------------------------------------


@needs_dali
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_cpu_pipeline_matches_fastdata(fmt, datasets, index_dir):
    from fastdata.dali import DALILoader

    path = datasets[fmt]
    loader = DALILoader(path, decode=Decode(size=SIZE), order=Order(batch_size=BATCH),
                        device="cpu")
    assert loader.plan.device == "cpu" and loader.plan.device_id is None
    assert loader.plan.reader == {"tfrecord": "tfrecord", "tar": "webdataset"}.get(fmt,
                                                                                   "external")
    assert len(loader) == 5
    ref, targets = reference(path)
    for _ in range(2):  # the second epoch is whole too
        images, labels, sizes = one_epoch(loader)
        assert sizes == [5, 5, 5, 5, 4]  # the epoch ends with the partial batch
        assert images.shape == (N, 3, *SIZE) and images.dtype == torch.uint8
        assert labels.dtype == torch.int64 and labels.tolist() == targets
        per_image = diff(images, ref)
        assert float(per_image.mean()) <= MEAN_TOLERANCE, per_image
        assert float(per_image.max()) <= IMAGE_TOLERANCE, per_image
    assert loader.classes == ["class_00", "class_01", "class_02"]


@needs_dali
@pytest.mark.parametrize("fmt", ["tfrecord", "tar"])
def test_external_source_reads_sharded_formats_too(fmt, datasets, index_dir):
    from fastdata.dali import DALILoader

    loader = DALILoader(datasets[fmt], decode=Decode(size=SIZE),
                        order=Order(batch_size=BATCH), device="cpu", reader="external")
    assert loader.plan.reader == "external"
    native = DALILoader(datasets[fmt], decode=Decode(size=SIZE), order=Order(batch_size=BATCH),
                        device="cpu")
    a, la, _ = one_epoch(loader)
    b, lb, _ = one_epoch(native)
    assert la.tolist() == lb.tolist()
    assert torch.equal(a, b)  # same bytes, same decoder: the same pixels


@needs_dali
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("shuffle", [False, True])
def test_two_shards_cover_every_sample_once(fmt, shuffle, datasets, index_dir):
    from fastdata.dali import DALILoader

    path = datasets[fmt]
    ref, targets = reference(path)
    seen = []
    for shard in (0, 1):
        loader = DALILoader(path, decode=Decode(size=SIZE),
                            order=Order(batch_size=BATCH, rank=shard, world_size=2,
                                        shuffle=shuffle, seed=11), device="cpu")
        assert len(loader) == 3
        images, labels, sizes = one_epoch(loader)
        assert sizes == [5, 5, 2]
        found = nearest(images, ref)
        assert labels.tolist() == [targets[i] for i in found]
        if not shuffle and loader.plan.reader == "external":
            # The order engine's slices: rank r's batch t, round by round.
            assert found == _engine_positions(N, shard, 2)
        elif not shuffle:  # DALI's own readers split into contiguous halves
            assert found == list(range(shard * 12, shard * 12 + 12))
        seen += found
    assert sorted(seen) == list(range(N))


def _engine_positions(count: int, shard: int, shards: int) -> list[int]:
    """Records of pipeline shard ``shard`` in the stored order, as the order
    engine slices an epoch (the external source's share)."""
    from fastdata.dali.external import external_slice

    plan = external_slice(count, shard, shards, BATCH)
    return [p for t in range(plan.batches()) for p in plan.batch_positions(t)]


@needs_dali
def test_external_shuffle_is_seeded_and_global(datasets):
    from fastdata.dali import DALILoader

    path = datasets["lmdb"]
    ref, _ = reference(path)
    order = Order(batch_size=BATCH, shuffle=True, seed=3)
    loader = DALILoader(path, decode=Decode(size=SIZE), order=order, device="cpu")
    first = nearest(one_epoch(loader)[0], ref)
    second = nearest(one_epoch(loader)[0], ref)
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != list(range(N)) and first != second  # reshuffled every epoch
    again = DALILoader(path, decode=Decode(size=SIZE), order=order, device="cpu")
    assert nearest(one_epoch(again)[0], ref) == first
    # The order engine's: a map-style Dataset read with the same seed reads it too.
    batches = fastdata.EpochBatches(fastdata.open_dataset(path), order)
    assert [i for batch in batches for i in batch] == first


@needs_dali
@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord"])
def test_drop_last(fmt, datasets, index_dir):
    from fastdata.dali import DALILoader

    loader = DALILoader(datasets[fmt], decode=Decode(size=SIZE),
                        order=Order(batch_size=BATCH, drop_last=True), device="cpu")
    assert len(loader) == 4
    ref, targets = reference(datasets[fmt])
    for _ in range(2):
        images, labels, sizes = one_epoch(loader)
        assert sizes == [5, 5, 5, 5]
        # The first 20 records, in the stored order (each found by its pixels).
        assert nearest(images, ref) == list(range(20))
        assert labels.tolist() == targets[:20]


@needs_dali
def test_parallel_external_source_workers(datasets):
    from fastdata.dali import DALILoader

    path = datasets["hdf5"]
    decode, order = Decode(size=SIZE), Order(batch_size=BATCH)
    loader = DALILoader(path, decode=decode, order=order, device="cpu", py_workers=2)
    plain = DALILoader(path, decode=decode, order=order, device="cpu")
    for _ in range(2):
        a, la, sizes = one_epoch(loader)
        b, lb, _ = one_epoch(plain)
        assert sizes == [5, 5, 5, 5, 4]
        assert la.tolist() == lb.tolist() and torch.equal(a, b)


@needs_dali
def test_normalize_crop_and_layout(datasets):
    from fastdata.dali import DALILoader

    path = datasets["lmdb"]
    order = Order(batch_size=8)
    plain, _, _ = one_epoch(DALILoader(path, decode=Decode(size=SIZE), order=order,
                                       device="cpu"))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    norm, _, _ = one_epoch(DALILoader(path, decode=Decode(size=SIZE), order=order,
                                      device="cpu", mean=mean, std=std))
    assert norm.dtype == torch.float32 and norm.shape == plain.shape
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(norm, (plain.float() / 255 - m) / s, atol=1e-3, rtol=1e-4)
    crop, _, _ = one_epoch(DALILoader(path, decode=Decode(size=SIZE,
                                                          crop=CenterCrop((20, 24))),
                                      order=order, device="cpu"))
    assert torch.equal(crop, plain[:, :, 6:26, 4:28])
    hwc, _, _ = one_epoch(DALILoader(path, decode=Decode(size=SIZE), order=order,
                                     layout="HWC", device="cpu"))
    assert torch.equal(hwc, plain.permute(0, 2, 3, 1))


@needs_dali
@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord"])
def test_random_resized_crops(fmt, datasets, index_dir):
    """Decode(crop=RandomResizedCrop): DALI's random crop of the decode, resized and
    flipped; new crops every epoch, the same ones again from the same seed."""
    from fastdata.dali import DALILoader

    path = datasets[fmt]
    crop = fastdata.RandomResizedCrop(16, hflip=0.0)
    order = Order(batch_size=BATCH)
    loader = DALILoader(path, decode=Decode(crop=crop), order=order, device="cpu")
    first, labels, sizes = one_epoch(loader)
    assert first.shape == (N, 3, 16, 16) and first.dtype == torch.uint8
    assert labels.tolist() == reference(path)[1] and sizes == [5, 5, 5, 5, 4]
    second, _, _ = one_epoch(loader)
    assert not torch.equal(first, second)  # new crops every epoch
    again, _, _ = one_epoch(DALILoader(path, decode=Decode(crop=crop), order=order,
                                       device="cpu"))
    assert torch.equal(again, first)  # seeded
    # Flips come from their own draws: the same crops, mirrored as drawn.
    flipped, _, _ = one_epoch(DALILoader(
        path, decode=Decode(crop=fastdata.RandomResizedCrop(16, hflip=1.0)), order=order,
        device="cpu"))
    assert torch.equal(flipped, first.flip(-1))
    half, _, _ = one_epoch(DALILoader(
        path, decode=Decode(crop=fastdata.RandomResizedCrop(16, hflip=0.5)), order=order,
        device="cpu"))
    assert half.shape == first.shape
    mirrored = [torch.equal(h, f.flip(-1)) for h, f in zip(half, first)]
    assert all(m or torch.equal(h, f) for m, h, f in zip(mirrored, half, first))
    assert 0 < sum(mirrored) < N
    # Crops of each record's own image: mostly closer to it than to the others.
    whole = reference(path, size=(16, 16))[0]
    assert sum(a == b for a, b in zip(nearest(first, whole), range(N))) >= N // 2


@needs_dali
def test_random_resized_crops_of_raw_records(tree, tmp_path):
    from fastdata.dali import DALILoader

    path = pack(tree, tmp_path / "raw.lmdb", preprocess=Preprocess(resize=(40, 48),
                                                                   encoding="raw"))
    loader = DALILoader(path, decode=Decode(crop=fastdata.RandomResizedCrop((12, 20))),
                        order=Order(batch_size=BATCH), device="cpu")
    assert loader.plan.mode == "raw"
    images, labels, _ = one_epoch(loader)
    assert images.shape == (N, 3, 12, 20) and labels.tolist() == reference(path, size=None)[1]


@needs_dali
def test_shorter_side_resize_then_crop(datasets):
    from fastdata.dali import DALILoader

    loader = DALILoader(datasets["tfrecord"], decode=Decode(size=36, crop=CenterCrop(32)),
                        order=Order(batch_size=BATCH), device="cpu")
    images, labels, _ = one_epoch(loader)
    assert images.shape == (N, 3, 32, 32) and len(labels) == N


@needs_dali
@pytest.mark.parametrize("ext", [".lmdb", ".tar"])
def test_raw_datasets_skip_decoding(ext, tree, tmp_path):
    from fastdata.dali import DALILoader

    path = pack(tree, tmp_path / f"raw{ext}", preprocess=Preprocess(resize=(40, 48),
                                                                     encoding="raw"))
    loader = DALILoader(path, order=Order(batch_size=BATCH), device="cpu")
    assert loader.plan.mode == "raw" and loader.plan.reader == "external"
    images, labels, sizes = one_epoch(loader)
    ref, targets = reference(path, size=None)
    assert sizes == [5, 5, 5, 5, 4] and labels.tolist() == targets
    assert torch.equal(images, ref)  # the stored pixels, untouched
    resized, _, _ = one_epoch(DALILoader(path, decode=Decode(size=SIZE),
                                         order=Order(batch_size=BATCH), device="cpu"))
    assert float(diff(resized, reference(path)[0]).max()) <= IMAGE_TOLERANCE


@needs_dali
@pytest.mark.parametrize("ext", [".lmdb", ".tar"])
def test_gif_records_are_transcoded_for_dali(ext, tmp_path, index_dir):
    from fastdata.dali import DALILoader

    src = make_tree(tmp_path / "src", classes=2, per_class=3, exts=(".gif", ".png"),
                    size=(44, 36))
    path = pack(src, tmp_path / f"gif{ext}", extensions="+gif")
    loader = DALILoader(path, order=Order(batch_size=4), device="cpu")
    assert loader.plan.transcode and loader.plan.reader == "external"
    images, labels, _ = one_epoch(loader)
    ref, targets = reference(path, size=None)
    assert labels.tolist() == targets
    assert torch.equal(images, ref)  # lossless encodings: exact


@needs_dali
def test_tar_labels_of_many_digits_and_cached_index(tmp_path, index_dir):
    from fastdata.dali import DALILoader

    src = make_tree(tmp_path / "src", classes=12, per_class=1, size=(40, 40))
    path = pack(src, tmp_path / "many.tar", shard_size=5)
    loader = DALILoader(path, decode=Decode(size=SIZE), order=Order(batch_size=4),
                        device="cpu")
    assert loader.plan.reader == "webdataset"
    assert one_epoch(loader)[1].tolist() == list(range(12))  # "10" and "11" parsed whole
    written = sorted(index_dir.glob("*.wds.idx"))
    assert len(written) == 3
    assert written[0].read_text().startswith("v1.2 5\nimg ")
    stamps = [p.stat().st_mtime_ns for p in written]
    again = DALILoader(path, decode=Decode(size=SIZE), order=Order(batch_size=4),
                       device="cpu")
    assert one_epoch(again)[1].tolist() == list(range(12))
    assert [p.stat().st_mtime_ns for p in written] == stamps  # reused, not rewritten


@needs_dali
def test_tfrecord_without_idx_files_gets_generated_ones(tree, tmp_path, index_dir):
    from fastdata.dali import DALILoader

    path = pack(tree, tmp_path / "noidx.tfrecord", shard_size=10)
    for idx in tmp_path.glob("*.tfrecord.idx"):
        idx.unlink()
    loader = DALILoader(path, decode=Decode(size=SIZE), order=Order(batch_size=BATCH),
                        device="cpu")
    assert loader.plan.reader == "tfrecord"
    images, labels, sizes = one_epoch(loader)
    assert sizes == [5, 5, 5, 5, 4]
    ref, targets = reference(path)
    assert nearest(images, ref) == list(range(N))  # every record, in the stored order
    assert labels.tolist() == targets
    assert len(list(index_dir.glob("*.tfrecord.idx"))) == 3


@needs_dali
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")
def test_tar_shards_written_by_webdataset(tmp_path, index_dir):
    """Shards of another tool (PAX headers, no fastdata manifest) get a DALI index too."""
    import webdataset as wds

    from fastdata.dali import DALILoader

    rng = np.random.default_rng(5)
    expected = []
    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=4, verbose=0) as sink:
        for i in range(10):
            buf = io.BytesIO()
            photo(rng, 30, 30).save(buf, "PNG")
            sink.write({"__key__": f"s{i:04d}", "png": buf.getvalue(), "cls": 5 + i})
            expected.append(5 + i)
    loader = DALILoader(pattern, order=Order(batch_size=4), device="cpu")
    assert loader.plan.reader == "webdataset"
    images, labels, sizes = one_epoch(loader)
    assert sizes == [4, 4, 2] and labels.tolist() == expected
    assert torch.equal(images, reference(pattern, size=None)[0])


@needs_dali
def test_default_shard_is_the_distributed_rank(datasets, monkeypatch):
    import torch.distributed as dist

    from fastdata.dali import DALILoader

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    loader = DALILoader(datasets["lmdb"], decode=Decode(size=SIZE),
                        order=Order(batch_size=BATCH), device="cpu")
    assert (loader.plan.shard_id, loader.plan.num_shards) == (1, 3)
    images, labels, sizes = one_epoch(loader)
    assert sizes == [5, 3]
    ref, targets = reference(datasets["lmdb"])
    # Rank 1's records of the order engine's slices (each found by its pixels).
    assert nearest(images, ref) == _engine_positions(N, 1, 3)
    assert labels.tolist() == [targets[i] for i in _engine_positions(N, 1, 3)]


@needs_dali
def test_build_pipeline_returns_a_runnable_pipeline(datasets, index_dir):
    from fastdata.dali import READER_NAME, build_pipeline

    pipe = build_pipeline(datasets["tar"], decode=Decode(size=SIZE),
                          order=Order(batch_size=BATCH), device="cpu")
    images, labels = pipe.run()
    assert len(images) == BATCH
    assert images.as_array().shape == (BATCH, 3, *SIZE)
    assert labels.as_array().tolist() == [0] * BATCH
    assert pipe.reader_meta(READER_NAME)["epoch_size"] == N


@needs_dali
def test_option_errors(datasets):
    from fastdata.dali import DALILoader, build_pipeline

    path = datasets["lmdb"]
    with pytest.raises(ValueError, match="batch_size"):
        build_pipeline(path, order=Order(batch_size=0), device="cpu")
    with pytest.raises(ValueError, match="rank must be"):
        build_pipeline(path, order=Order(batch_size=4, rank=2, world_size=2), device="cpu")
    with pytest.raises(ValueError, match="mean and std"):
        build_pipeline(path, device="cpu", mean=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="device"):
        build_pipeline(path, device="tpu")
    with pytest.raises(FastDataError, match="no reader"):
        build_pipeline(path, device="cpu", reader="dali")
    with pytest.raises(FastDataError, match="no full batch"):
        DALILoader(path, order=Order(batch_size=64, drop_last=True), device="cpu")
    with pytest.raises(ValueError, match="not both"):
        build_pipeline(path, decode=Decode(size=32, crop=fastdata.RandomResizedCrop(16)),
                       device="cpu")
    # The torch Datasets' decode options DALI does not have are refused, by name.
    for decode, name in ((Decode(output="numpy"), "output"), (Decode(keep_gray=True), "keep_gray"),
                         (Decode(max_pixels=10), "max_pixels")):
        with pytest.raises(ValueError, match=name):
            build_pipeline(path, decode=decode, device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword.*colour"):
        build_pipeline(path, device="cpu", colour=True)


@needs_dali
def test_ragged_batches_get_a_clear_error(datasets):
    from fastdata.dali import DALILoader, build_pipeline

    with pytest.raises(FastDataError, match=r"size=\(height, width\)"):
        list(DALILoader(datasets["lmdb"], order=Order(batch_size=BATCH), device="cpu"))
    images, _ = build_pipeline(datasets["lmdb"], order=Order(batch_size=BATCH), device="cpu",
                               layout="HWC").run()
    assert len({tuple(images[i].shape()) for i in range(BATCH)}) > 1  # ragged is fine here


@needs_dali
@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord"])
def test_leaving_an_epoch_early_continues_it(fmt, datasets, index_dir):
    from fastdata.dali import DALILoader

    loader = DALILoader(datasets[fmt], decode=Decode(size=SIZE), order=Order(batch_size=BATCH),
                        device="cpu")
    for _ in loader:
        break
    assert one_epoch(loader)[2] == [5, 5, 5, 4]  # the rest of the first epoch
    assert one_epoch(loader)[2] == [5, 5, 5, 5, 4]


# -- devices --------------------------------------------------------------------------------


@needs_dali
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_auto_is_cpu_and_gpu_is_refused(datasets):
    from fastdata.dali import DALILoader, build_pipeline

    decode, order = Decode(size=SIZE), Order(batch_size=BATCH)
    loader = DALILoader(datasets["lmdb"], decode=decode, order=order)  # device="auto"
    assert loader.plan.device == "cpu" and loader.plan.device_id is None
    with pytest.raises(FastDataError, match="device='cpu'"):
        build_pipeline(datasets["lmdb"], decode=decode, order=order, device="gpu")


@needs_dali
@needs_cuda
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gpu_pipeline(fmt, datasets, index_dir):
    from fastdata.dali import DALILoader

    path = datasets[fmt]
    loader = DALILoader(path, decode=Decode(size=SIZE), order=Order(batch_size=BATCH),
                        device="gpu", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert loader.plan.device == "gpu" and loader.plan.device_id is not None
    images, labels, sizes = one_epoch(loader)
    assert images.is_cuda and labels.is_cuda and images.dtype == torch.float32
    assert sizes == [5, 5, 5, 5, 4]
    ref, targets = reference(path)
    assert labels.tolist() == targets
    pixels = (images.cpu() * 127.5 + 127.5).round().clamp(0, 255).to(torch.uint8)
    # nvJPEG's IDCT differs a little from libjpeg-turbo's too.
    assert float(diff(pixels, ref).mean()) <= MEAN_TOLERANCE + 1


# -- without DALI -----------------------------------------------------------------------------


def test_clear_error_without_dali(tmp_path):
    """``import fastdata.dali`` works without DALI; building says how to install it."""
    code = textwrap.dedent("""
        import sys
        sys.modules["nvidia"] = None          # as if nothing of NVIDIA's were installed
        sys.modules["nvidia.dali"] = None
        import fastdata.dali
        from fastdata.errors import FastDataError
        order = fastdata.Order(batch_size=2)
        for call in (lambda: fastdata.dali.build_pipeline("x.lmdb", order=order),
                     lambda: fastdata.dali.DALILoader("x.lmdb", order=order)):
            try:
                call()
            except FastDataError as exc:
                print(exc)
            else:
                raise SystemExit("no error")
        print("torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=str(Path(__file__).resolve().parent.parent))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    hint = "NVIDIA DALI is not installed: pip install nvidia-dali-cuda130"
    assert lines[:2] == [hint, hint]
    assert lines[2] == "False"  # and building did not even import torch


def test_missing_dali_is_reported_in_process(monkeypatch):
    import fastdata.dali as fd

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    with pytest.raises(FastDataError) as info:
        fd.build_pipeline("anything.lmdb", order=Order(batch_size=2))
    assert str(info.value) == fd.INSTALL_HINT

"""RandomResizedCrop: boxes drawn by torchvision's rules from (seed, epoch,
index), and Datasets that decode, crop, flip and resize with them the same
way in any worker, after a restart and in the streaming dataset."""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from conftest import pixel_digest
from PIL import Image
from torch.utils.data import DataLoader, default_collate
from worker_pids import CollatedIn, assert_workers_did_it

import fastdata
from fastdata.decoding.record_rng import RecordRNG
from fastdata.packers.preprocess import Preprocess

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

CROP = fastdata.RandomResizedCrop((24, 32))
SEED = 5
CROPPED = fastdata.Decode(crop=CROP)
SEEDED = fastdata.Order(seed=SEED)


# -- the boxes -----------------------------------------------------------------


def torchvision_box(width, height, scale, ratio, hflip, seed, epoch, index):
    """torchvision's ``RandomResizedCrop.get_params`` (v0.20), transcribed with
    the record's draws in the same order, then the flip: ``(box, fell_back)``."""
    rng = RecordRNG(seed, epoch, index)
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    found = None
    fell_back = False
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            found = i, j, h, w
            break
    if found is None:
        fell_back = True
        in_ratio = float(width) / float(height)
        if in_ratio < min(ratio):
            w = width
            h = int(round(w / min(ratio)))
        elif in_ratio > max(ratio):
            h = height
            w = int(round(h * max(ratio)))
        else:
            w = width
            h = height
        found = (height - h) // 2, (width - w) // 2, h, w
    flip = hflip > 0 and rng.random() < hflip
    i, j, h, w = found
    return (j, i, w, h, bool(flip)), fell_back


SIZES = [(640, 480), (480, 640), (1000, 3), (3, 1000), (1, 1), (2, 1), (1, 2), (5, 5),
         (37, 11), (11, 37), (224, 224), (4000, 7)]
CROPS = [fastdata.RandomResizedCrop(8),
         fastdata.RandomResizedCrop(8, scale=(0.9, 1.0), ratio=(1.0, 1.0), hflip=0.0),
         fastdata.RandomResizedCrop((4, 6), scale=(0.5, 1.0), ratio=(0.5, 2.0), hflip=1.0),
         fastdata.RandomResizedCrop(8, scale=(0.99, 1.0), ratio=(3 / 4, 4 / 3))]


def test_boxes_follow_torchvision_get_params():
    fallbacks = compared = 0
    for crop in CROPS:
        for width, height in SIZES:
            for seed in (0, 1, 123456789):
                for epoch in (0, 3):
                    for index in range(0, 400, 7):
                        want, fell_back = torchvision_box(width, height, crop.scale,
                                                          crop.ratio, crop.hflip, seed,
                                                          epoch, index)
                        got = crop.box(width, height, seed, epoch, index)
                        assert got == want, (crop, width, height, seed, epoch, index)
                        left, top, w, h, _flip = got
                        assert 0 <= left and left + w <= width and 0 <= top \
                            and top + h <= height and w > 0 and h > 0
                        fallbacks += fell_back
                        compared += 1
    assert compared > 10_000
    assert fallbacks > 500  # the degenerate sizes and narrow scales hit the fallback


def test_fallback_is_the_central_crop_clamped_to_the_ratio():
    crop = fastdata.RandomResizedCrop(8, scale=(0.99, 1.0), hflip=0.0)
    # Far too wide for 4/3: every try is rejected.
    assert crop.box(1000, 3, 0, 0, 0) == ((1000 - 4) // 2, 0, 4, 3, False)
    assert crop.box(3, 1000, 0, 0, 0) == (0, (1000 - 4) // 2, 3, 4, False)


def test_area_and_ratio_distributions_and_flip_rate():
    crop = fastdata.RandomResizedCrop(8)
    width, height = 500, 500
    boxes = [crop.box(width, height, 11, 0, i) for i in range(6000)]
    areas = np.array([w * h / (width * height) for _, _, w, h, _ in boxes])
    ratios = np.log(np.array([w / h for _, _, w, h, _ in boxes]))
    assert areas.min() >= 0.079 and areas.max() <= 1.0
    assert ratios.min() >= math.log(3 / 4) - 0.01 and ratios.max() <= math.log(4 / 3) + 0.01
    # Area uniform on [0.08, 1]: flat up to 0.7 of the image (above it, boxes
    # of extreme ratio do not fit and torchvision draws again).
    counts, _ = np.histogram(areas, bins=8, range=(0.08, 1.0))
    share = counts[:6].mean()
    assert all(0.9 * share < c < 1.1 * share for c in counts[:6]), counts
    assert counts[6] > counts[7] > 0
    # Ratio log-uniform, where every ratio fits (areas up to half the image).
    small = ratios[areas < 0.5]
    counts, _ = np.histogram(small, bins=6, range=(math.log(3 / 4), math.log(4 / 3)))
    assert all(0.8 * len(small) / 6 < c < 1.2 * len(small) / 6 for c in counts), counts
    for hflip in (0.0, 0.2, 0.5, 1.0):
        flips = [fastdata.RandomResizedCrop(8, hflip=hflip).box(64, 48, 2, 1, i)[4]
                 for i in range(4000)]
        assert abs(np.mean(flips) - hflip) < 0.03, hflip


def test_boxes_depend_on_seed_epoch_and_index_only():
    crop = fastdata.RandomResizedCrop(8)
    base = [crop.box(300, 200, 1, 2, i) for i in range(50)]
    assert base == [fastdata.RandomResizedCrop(8).box(300, 200, 1, 2, i) for i in range(50)]
    assert base != [crop.box(300, 200, 2, 2, i) for i in range(50)]
    assert base != [crop.box(300, 200, 1, 3, i) for i in range(50)]
    assert len(set(base)) > 40


@pytest.mark.parametrize("kwargs", [dict(size=0), dict(size=(3, 4, 5)),
                                    dict(size=8, scale=(0.9, 0.1)),
                                    dict(size=8, ratio=(0.0, 1.0)), dict(size=8, hflip=1.5)])
def test_bad_options_are_refused(kwargs):
    with pytest.raises(ValueError):
        fastdata.RandomResizedCrop(**kwargs)


def test_import_loads_no_torch():
    from conftest import run_python

    out = run_python("import sys, fastdata.decoding.random_crop as m\n"
                     "m.RandomResizedCrop(8).box(10, 10, 0, 0, 0)\n"
                     "print('torch' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# -- Datasets --------------------------------------------------------------------


def _smooth_tree(root, count=12):
    """JPEG and PNG gradients of varied sizes (smooth, so resizes agree)."""
    rng = np.random.default_rng(3)
    for k in range(count):
        h, w = int(rng.integers(40, 120)), int(rng.integers(40, 120))
        y, x = np.mgrid[0:h, 0:w]
        px = np.stack([(x * 255 // w), (y * 255 // h), ((x + y + 17 * k) * 2) % 256],
                      -1).astype(np.uint8)
        folder = os.path.join(root, f"c{k % 2}")
        os.makedirs(folder, exist_ok=True)
        fmt, ext = ("JPEG", "jpg") if k % 3 else ("PNG", "png")
        Image.fromarray(px).save(os.path.join(folder, f"{k}.{ext}"), fmt, **(
            {"quality": 95} if fmt == "JPEG" else {}))
    return root


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    base = tmp_path_factory.mktemp("crop")
    src = _smooth_tree(str(base / "src"))
    lmdb = fastdata.pack(src, base / "ds.lmdb", progress=False).output
    tar = fastdata.pack(src, base / "ds.tar", options=fastdata.PackOptions(shard_size=5),
                        progress=False).output
    return lmdb, tar


def _manual(payload: bytes, crop, seed: int, epoch: int, index: int) -> np.ndarray:
    """Full decode with Pillow, the box, the flip and a bilinear resize."""
    img = Image.open(__import__("io").BytesIO(payload)).convert("RGB")
    left, top, w, h, flip = crop.box(img.width, img.height, seed, epoch, index)
    img = img.crop((left, top, left + w, top + h))
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img.resize((crop.size[1], crop.size[0]), Image.BILINEAR))


def _images(ds) -> list[np.ndarray]:
    return [ds[i][0].numpy() for i in range(len(ds))]


def test_crop_pixels_equal_a_manual_decode_crop_flip_resize(packs):
    raw = fastdata.open_dataset(packs[0], decode=fastdata.Decode(output="bytes"))
    ds = fastdata.open_dataset(packs[0], decode=CROPPED, order=SEEDED)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            image, label = ds[i]
            assert tuple(image.shape) == (3, 24, 32) and str(image.dtype) == "torch.uint8"
            want = _manual(raw[i][0], CROP, SEED, epoch, i)
            diff = np.abs(image.permute(1, 2, 0).numpy().astype(int) - want.astype(int))
            assert diff.mean() <= 3.0, (epoch, i, diff.mean())
            assert label == raw[i][1]
    numpy_ds = fastdata.open_dataset(packs[0], decode=replace(CROPPED, output="numpy"),
                                     order=SEEDED)
    assert numpy_ds[0][0].shape == (24, 32, 3)
    pil_ds = fastdata.open_dataset(packs[0], decode=replace(CROPPED, output="pil"), order=SEEDED)
    assert pil_ds[0][0].size == (32, 24)


def test_epochs_and_seeds_change_the_crops_and_a_new_dataset_repeats_them(packs):
    ds = fastdata.open_dataset(packs[0], decode=CROPPED, order=SEEDED)
    first = [pixel_digest(a) for a in _images(ds)]
    ds.set_epoch(1)
    second = [pixel_digest(a) for a in _images(ds)]
    assert first != second
    again = fastdata.open_dataset(packs[0], decode=CROPPED, order=SEEDED)
    again.set_epoch(1)
    assert [pixel_digest(a) for a in _images(again)] == second
    other = fastdata.open_dataset(packs[0], decode=CROPPED, order=fastdata.Order(seed=SEED + 1))
    assert [pixel_digest(a) for a in _images(other)] != first


def _loader_digests(ds, workers: int, epochs=(0, 1), log=None) -> list[list[str]]:
    """``log``: a file to record the process collating each batch in."""
    loader = DataLoader(ds, batch_size=4, num_workers=workers, timeout=120 if workers else 0,
                        persistent_workers=workers > 0,
                        collate_fn=CollatedIn(log, default_collate))
    runs = []
    for epoch in epochs:
        ds.set_epoch(epoch)
        runs.append([pixel_digest(img.permute(1, 2, 0).numpy())
                     for images, _ in loader for img in images])
    return runs


def test_map_style_crops_do_not_depend_on_workers(packs, tmp_path):
    ds = fastdata.open_dataset(packs[0], decode=CROPPED, order=SEEDED)
    expected = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        expected.append([pixel_digest(ds[i][0].permute(1, 2, 0).numpy())
                         for i in range(len(ds))])
    for workers in (0, 1, 2):
        # Persistent workers see set_epoch() made after they started.
        log = tmp_path / f"collated-{workers}.pids"
        got = _loader_digests(fastdata.open_dataset(packs[0], decode=CROPPED, order=SEEDED),
                              workers, log=log)
        assert got == expected, workers
        assert_workers_did_it(log, workers)


def _stream(tar, **kwargs):
    return fastdata.ShardedIterableDataset(tar, decode=CROPPED, order=replace(SEEDED,
        shuffle=True, window=6, batch_size=4), **kwargs)


def test_streaming_crops_match_map_style_and_do_not_depend_on_workers(packs, tmp_path):
    tar = packs[1]
    mapped = fastdata.open_dataset(tar, decode=CROPPED, order=SEEDED)
    for epoch in (0, 2):
        mapped.set_epoch(epoch)
        expected = Counter(pixel_digest(a.transpose(1, 2, 0)) for a in _images(mapped))
        orders = []
        for workers in (0, 1, 2):
            ds = _stream(tar)
            ds.set_epoch(epoch)
            log = tmp_path / f"collated-{epoch}-{workers}.pids"
            order = _loader_digests(ds, workers, epochs=(epoch,), log=log)[0]
            assert Counter(order) == expected, (epoch, workers)
            assert_workers_did_it(log, workers)
            orders.append(order)
        assert orders[0] == orders[1] == orders[2]


def test_resumed_stream_gives_the_same_crops(packs):
    ds = _stream(packs[1])
    ds.set_epoch(1)
    full = _loader_digests(ds, 0, epochs=(1,))[0]
    point = ds.resume_point(batches=1)
    resumed = _stream(packs[1])
    resumed.load_state_dict(point)
    rest = [pixel_digest(img.permute(1, 2, 0).numpy())
            for images, _ in DataLoader(resumed, batch_size=4) for img in images]
    assert rest == full[4:]


def test_raw_records_take_the_same_path(tmp_path):
    src = _smooth_tree(str(tmp_path / "src"), count=4)
    out = fastdata.pack(src, tmp_path / "raw.lmdb", progress=False, options=fastdata.PackOptions(
        preprocess=Preprocess(resize=48, center_crop=True, encoding="raw"))).output
    stored = fastdata.open_dataset(out, decode=fastdata.Decode(output="numpy"))
    ds = fastdata.open_dataset(out, decode=CROPPED, order=SEEDED)
    assert ds.manifest.encoding["storage"] == "raw"
    for i in range(len(ds)):
        pixels = stored[i][0]
        left, top, w, h, flip = CROP.box(48, 48, SEED, 0, i)
        region = pixels[top:top + h, left:left + w]
        want = np.asarray(Image.fromarray(region[:, ::-1] if flip else region).resize(
            (32, 24), Image.BILINEAR))
        got = ds[i][0].permute(1, 2, 0).numpy()
        assert np.abs(got.astype(int) - want.astype(int)).mean() <= 3.0
    batch = next(iter(DataLoader(ds, batch_size=4)))[0]
    assert tuple(batch.shape) == (4, 3, 24, 32)


def test_crop_option_conflicts_are_refused(packs):
    with pytest.raises(ValueError, match="size= or crop="):
        fastdata.Decode(crop=CROP, size=(24, 32))
    with pytest.raises(ValueError, match="cache='ram'"):
        fastdata.open_dataset(packs[0], decode=CROPPED, cache="decoded")
    with pytest.raises(ValueError, match="decoded output"):
        fastdata.Decode(crop=CROP, output="bytes")
    with pytest.raises(ValueError, match="RandomResizedCrop"):
        fastdata.Decode(crop=(24, 32))

"""Training crops on the GPU against the CPU: RandomResizedCrop(S) with flips, per pipeline.

Rows, each over the same packed demo photos, in images/s after one warm-up epoch:

- ``fastdata fused (CPU)``: ``open_dataset(decode=Decode(crop=RandomResizedCrop(S)))`` through a
  DataLoader at 0 workers (the Dataset's decode threads), the CPU path of
  bench/RESULTS.md's "Training crops";
- ``DALI image_random_crop (gpu|cpu)``: ``DALILoader(decode=Decode(crop=RandomResizedCrop(S)))``,
  nvJPEG decoding only the crop's region on the GPU (libjpeg-turbo on the CPU);
- ``torchvision decode_jpeg (cuda|cpu)``: batches of stored JPEG bytes decoded
  whole by ``torchvision.io.decode_jpeg`` (nvJPEG on the GPU, libjpeg-turbo
  on the CPU), then cropped, resized and flipped on the same device with
  fastdata's boxes (``crop.box``), so the same crops as the fastdata row.
  On the CPU this is torchvision's own unfused pipeline, in the main thread.

Every row checks its output: (B, 3, S, S) uint8 on its device, every sample
once per epoch. Rows that need what the machine lacks (CUDA, DALI,
torchvision) are reported as skipped, with the reason.

    python bench/gpu_train_check.py [--n 256] [--batch 64] [--size 224] [--epochs 3] [--cpu]

``bench/gpu_check.py`` runs it after its own checks when CUDA is there;
``--cpu`` runs the rows a machine without CUDA can (a smoke test of this script).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def _timed(epochs: int, one_epoch) -> tuple[float, int, tuple | None]:
    """images/s over ``epochs`` after a warm-up one; samples per epoch; the
    first batch's (device, dtype, shape)."""
    import torch

    first = None
    rate, per_epoch = 0.0, 0
    for epoch in range(epochs + 1):
        if epoch == 1:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start, seen = time.perf_counter(), 0
        count = 0
        for images in one_epoch(epoch):
            if first is None:
                first = (str(images.device), str(images.dtype), tuple(images.shape))
            count += len(images)
        if epoch >= 1:
            seen += count
        per_epoch = count
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    rate = seen / (time.perf_counter() - start)
    return rate, per_epoch, first


def fastdata_rows(path: str, size: int, batch: int, epochs: int) -> dict:
    import torch

    import fastdata

    ds = fastdata.open_dataset(path, decode=fastdata.Decode(crop=fastdata.RandomResizedCrop(size)),
                               order=fastdata.Order(seed=0))
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True,
                                         collate_fn=fastdata.collate)

    def one_epoch(epoch):
        ds.set_epoch(epoch)
        for images, _ in loader:
            yield images

    return _row("fastdata fused (CPU)", len(ds), size, *_timed(epochs, one_epoch))


def dali_row(path: str, device: str, size: int, batch: int, epochs: int) -> dict:
    import fastdata

    name = f"DALI image_random_crop ({device})"
    try:
        from fastdata.dali import DALILoader

        loader = DALILoader(path, decode=fastdata.Decode(crop=fastdata.RandomResizedCrop(size)),
                            order=fastdata.Order(shuffle=True, batch_size=batch), device=device)
    except Exception as exc:  # no DALI, no GPU for DALI: say so, go on
        return {"row": name, "skipped": f"{type(exc).__name__}: {exc}"}

    def one_epoch(epoch):
        for images, _ in loader:
            yield images

    return _row(name, _count(path), size, *_timed(epochs, one_epoch))


def torchvision_row(path: str, device: str, size: int, batch: int, epochs: int) -> dict:
    name = f"torchvision decode_jpeg ({device})"
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return {"row": name, "skipped": "no CUDA"}
    try:
        import torchvision
        from torchvision.transforms.v2 import functional as F
    except ImportError:
        return {"row": name, "skipped": "torchvision is not installed"}

    import fastdata
    from fastdata.formats import open_reader
    from fastdata.image_header import image_size

    crop = fastdata.RandomResizedCrop(size)
    with open_reader(path) as reader:
        payloads = reader.read_many(list(range(len(reader))))
    sizes = [image_size(p) for p in payloads]  # (height, width) from the headers
    tensors = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in payloads]
    order = torch.Generator().manual_seed(0)

    def one_epoch(epoch):
        perm = torch.randperm(len(tensors), generator=order).tolist()
        for start in range(0, len(perm), batch):
            part = perm[start:start + batch]
            decoded = torchvision.io.decode_jpeg([tensors[i] for i in part], device=device,
                                                 mode=torchvision.io.ImageReadMode.RGB)
            out = []
            for i, image in zip(part, decoded):
                height, width = sizes[i]
                left, top, w, h, flip = crop.box(width, height, 0, epoch, i)
                image = F.resized_crop(image, top, left, h, w, list(crop.size), antialias=True)
                out.append(image.flip(-1) if flip else image)
            yield torch.stack(out)

    return _row(name, len(tensors), size, *_timed(epochs, one_epoch))


def _count(path: str) -> int:
    from fastdata.formats import open_reader

    with open_reader(path) as reader:
        return len(reader)


def _row(name: str, expected: int, size: int, rate: float, per_epoch: int,
         first: tuple | None) -> dict:
    ok = per_epoch == expected and first is not None and first[1] == "torch.uint8" \
        and first[2][1:] == (3, size, size)
    return {"row": name, "images_per_s": round(rate, 1), "samples_per_epoch": per_epoch,
            "first_batch": first, "ok": ok}


def run_rows(lmdb: str, tfrecord: str, *, size: int, batch: int, epochs: int,
             gpu: bool) -> list[dict]:
    """Every row over the packed photos (``gpu``: also the rows that need CUDA)."""
    rows = [fastdata_rows(lmdb, size, batch, epochs)]
    for device in ("gpu", "cpu") if gpu else ("cpu",):
        rows.append(dali_row(tfrecord, device, size, batch, epochs))
    for device in ("cuda", "cpu") if gpu else ("cpu",):
        rows.append(torchvision_row(lmdb, device, size, batch, epochs))
    return rows


def describe(row: dict) -> str:
    if "skipped" in row:
        return f"{row['row']:34s} skipped: {row['skipped']}"
    device, dtype, shape = row["first_batch"] or ("?", "?", ())
    return (f"{row['row']:34s} {row['images_per_s']:8.1f} img/s; {device} {dtype} "
            f"{list(shape)}; every sample once per epoch and the right shape: {row['ok']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=256, help="synthetic photos")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224, help="output height and width")
    parser.add_argument("--epochs", type=int, default=3, help="measured epochs")
    parser.add_argument("--cpu", action="store_true", help="only the rows that need no CUDA")
    args = parser.parse_args(argv)

    import torch

    import fastdata
    from fastdata.demo import synthesize

    gpu = torch.cuda.is_available() and not args.cpu
    if not gpu and not args.cpu:
        print("no CUDA GPU on this machine: the GPU rows need one (--cpu runs the others)")
        return 0
    with tempfile.TemporaryDirectory(prefix="fastdata-gpu-train-") as tmp:
        os.environ.setdefault("FASTDATA_CACHE_DIR", os.path.join(tmp, "cache"))
        src = os.path.join(tmp, "photos")
        synthesize(src, kind="photos", n=args.n, classes=8, progress=False)
        lmdb, tfrecord = os.path.join(tmp, "photos.lmdb"), os.path.join(tmp, "photos.tfrecord")
        fastdata.pack(src, lmdb, progress=False)
        fastdata.pack(src, tfrecord, progress=False)
        rows = run_rows(lmdb, tfrecord, size=args.size, batch=args.batch,
                        epochs=args.epochs, gpu=gpu)
    for row in rows:
        print(describe(row))
    return 0 if all(row.get("ok", True) for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

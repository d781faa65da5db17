"""The GPU paths: CUDAPrefetcher and DALI, a short check to run on a machine with CUDA.

First the CUDA prefetcher: ``fastdata.loader(..., device="cuda")`` over an
LMDB of the same photos, checking that batches arrive on the GPU, float16,
channels-last, normalised like the CPU path, every sample once. Then DALI:
synthesises 256 ImageNet-like JPEGs (``fastdata.demo.synthesize(kind="photos")``),
packs them to TFRecord (read by DALI's own reader) and LMDB (read through
fastdata's reader in an external source), and runs ``fastdata.dali.DALILoader``
with ``device="gpu"`` (nvJPEG decoding, resize and normalisation on the GPU).
For each it prints images/s over a few epochs (after the pipeline is built;
256 images are few, so this is a smoke test with a rough rate, not a
benchmark), the device, dtype and shape of
the image and label tensors, and whether the labels equal fastdata's. The same
loop on the CPU pipeline gives the baseline. Last, the training-crop rows of
``bench/gpu_train_check.py`` (RandomResizedCrop on the GPU by DALI and by
torchvision's decode_jpeg, against fastdata's fused CPU crops).

    python bench/gpu_check.py [--n 256] [--batch 64] [--size 224] [--epochs 5] [--json]

Without CUDA, or without DALI, it says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import gpu_train_check  # bench/, beside this script


def _run(path: str, device: str, args) -> dict:
    import torch

    import fastdata
    from fastdata.dali import DALILoader

    started = time.perf_counter()
    loader = DALILoader(path, decode=fastdata.Decode(size=(args.size, args.size)),
                        order=fastdata.Order(batch_size=args.batch), device=device,
                        num_threads=args.threads, mean=(0.485, 0.456, 0.406),
                        std=(0.229, 0.224, 0.225))
    build_s = time.perf_counter() - started
    first = None
    labels: list[int] = []
    total = 0
    for epoch in range(args.epochs):
        epoch_labels = []
        for images, y in loader:
            if first is None:
                first = images, y
            total += len(y)
            epoch_labels += y.tolist()
        if epoch == 0:
            labels = epoch_labels
    if device == "gpu":
        torch.cuda.synchronize()
    # DALI's iterator decodes batches ahead, from its construction on and across
    # epoch ends, so per-epoch timings would mislead: time everything after the build
    # (and report the build, which includes the first prefetched batches, apart).
    rate = total / (time.perf_counter() - started - build_s)
    images, y = first
    return {
        "path": os.path.basename(path), "device": device, "reader": loader.plan.reader,
        "batches": len(loader), "build_s": round(build_s, 2),
        "images_per_s": round(rate, 1),
        "images": {"device": str(images.device), "dtype": str(images.dtype),
                   "shape": list(images.shape)},
        "labels": {"device": str(y.device), "dtype": str(y.dtype), "shape": list(y.shape)},
        "labels_match_fastdata": labels == _targets(path),
    }


def _targets(path: str) -> list[int]:
    import fastdata

    with fastdata.formats.open_reader(path) as reader:
        return reader.labels.tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=256, help="synthetic images")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224, help="output height and width")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4, help="DALI CPU threads")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU baseline")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU on this machine: the GPU checks need one; nothing to check")
        return 0
    prefetch_ok = _check_prefetcher(args)
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        print("NVIDIA DALI is not installed (pip install nvidia-dali-cuda130); DALI not checked")
        train_ok = gpu_train_check.main(_train_argv(args)) == 0
        return 0 if prefetch_ok and train_ok else 1

    import fastdata
    from fastdata.dali import cuda_devices
    from fastdata.demo import synthesize

    results = {"gpu": torch.cuda.get_device_name(0), "dali_gpus": cuda_devices(),
               "dali": nvidia.dali.__version__, "runs": []}
    with tempfile.TemporaryDirectory(prefix="fastdata-gpu-check-") as tmp:
        os.environ.setdefault("FASTDATA_CACHE_DIR", os.path.join(tmp, "cache"))
        src = os.path.join(tmp, "photos")
        synthesize(src, kind="photos", n=args.n, classes=8, progress=False)
        paths = []
        for name in ("photos.tfrecord", "photos.lmdb"):
            out = os.path.join(tmp, name)
            fastdata.pack(src, out, progress=False)
            paths.append(out)
        for path in paths:
            for device in ("gpu",) if args.no_cpu else ("gpu", "cpu"):
                run = _run(path, device, args)
                results["runs"].append(run)
                if not args.json:
                    print(f"{run['path']:18s} {device}: {run['reader']:9s} "
                          f"{run['images_per_s']:8.1f} img/s over {args.epochs} epochs "
                          f"(build {run['build_s']} s); "
                          f"images {run['images']['device']} {run['images']['dtype']} "
                          f"{run['images']['shape']}; labels {run['labels']['device']} "
                          f"{run['labels']['dtype']} {run['labels']['shape']}; labels match "
                          f"fastdata: {run['labels_match_fastdata']}")
        # Training crops (issue: RandomResizedCrop on the GPU against the CPU path).
        results["train"] = gpu_train_check.run_rows(
            paths[1], paths[0], size=args.size, batch=args.batch, epochs=args.epochs, gpu=True)
        if not args.json:
            for row in results["train"]:
                print(gpu_train_check.describe(row))
    if args.json:
        print(json.dumps(results, indent=2))
    ok = all(r["labels_match_fastdata"] for r in results["runs"]) and \
        all(row.get("ok", True) for row in results["train"])
    return 0 if ok and prefetch_ok else 1


def _train_argv(args) -> list[str]:
    return ["--n", str(args.n), "--batch", str(args.batch), "--size", str(args.size),
            "--epochs", str(args.epochs)]


def _check_prefetcher(args) -> bool:
    """CUDAPrefetcher through fastdata.loader: batches on the GPU, normalised
    like the CPU path, every sample once; prints img/s."""
    import time

    import torch

    import fastdata
    from fastdata.demo import synthesize

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    with tempfile.TemporaryDirectory(prefix="fastdata-prefetch-check-") as tmp:
        src = os.path.join(tmp, "photos")
        synthesize(src, kind="photos", n=args.n, classes=8, progress=False)
        out = os.path.join(tmp, "photos.lmdb")
        fastdata.pack(src, out, progress=False)
        ds = fastdata.open_dataset(out, decode=fastdata.Decode(size=(args.size, args.size)),
                                   order=fastdata.Order(batch_size=args.batch))
        cpu_images, _ = next(iter(torch.utils.data.DataLoader(
            ds, batch_size=args.batch, collate_fn=fastdata.collate)))
        m = torch.tensor(mean).view(1, 3, 1, 1) * 255
        s = torch.tensor(std).view(1, 3, 1, 1) * 255
        expected = (cpu_images.float() - m) / s
        ok = True
        # 2 workers, then none: batches made ahead in a thread (BackgroundBatches),
        # pinned there on this thread's device.
        for workers in (2, 0):
            loader = fastdata.loader(ds, num_workers=workers, device="cuda", mean=mean, std=std,
                                     dtype=torch.float16, channels_last=True)
            seen, start, first = 0, None, None
            for epoch in range(args.epochs + 1):
                if epoch == 1:
                    sync()
                    start, seen = time.perf_counter(), 0
                for images, labels in loader:
                    if first is None:
                        first = (images.device, images.dtype, tuple(images.shape),
                                 images.is_contiguous(memory_format=torch.channels_last),
                                 float((images.float().cpu() - expected).abs().max()))
                    seen += len(labels)
            sync()
            rate = seen / (time.perf_counter() - start)
            once = seen == len(ds) * args.epochs
            # The stall meter on a GPU: the copy stage is measured (CUDA events).
            figures = fastdata.stats(loader)
            copy = figures["stages"].get("copy", {}).get("seconds", 0.0)
            print(f"  stall meter: {figures['advice']}; copy stage {copy * 1e3:.1f} ms")
            ok = ok and once and first[0].type == "cuda" and first[4] < 0.05 and copy > 0
            print(f"CUDAPrefetcher, {workers} workers (run_ahead={loader.run_ahead}): "
                  f"{rate:8.1f} img/s over {args.epochs} epochs; images {first[0]} {first[1]} "
                  f"{first[2]} channels_last={first[3]}; max |gpu - cpu normalise| "
                  f"{first[4]:.4f}; every sample once per epoch: {once}")
    return ok


if __name__ == "__main__":
    sys.exit(main())

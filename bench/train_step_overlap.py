"""Loading beside a training step: batches made in a thread ahead of the loop, against none and against workers.

A loader benchmark times loading alone. In training each batch is followed by
a step, and a DataLoader with ``num_workers=0`` makes the next batch only when
the step is over. This times training-crop batches (``RandomResizedCrop(S)``
with flips, LMDB of demo photos re-encoded at quality 90 with restart markers)
followed by a stand-in step of STEP ms per batch, for:

- ``0 workers``: a plain DataLoader;
- ``0 workers + background``: the same DataLoader in
  ``fastdata.BackgroundBatches`` (what ``fastdata.loader`` does without workers);
- ``N workers``: a DataLoader with worker processes (``prefetch_factor=4``,
  persistent).

``--step-kind sleep`` stands for a GPU-bound step (the host waits on the GPU,
the GIL released); ``spin`` for a step that keeps the host's Python busy.
Prints the median images/s over the epochs after a warm-up one.

    python bench/train_step_overlap.py [--n 512] [--steps-ms 0,20] [--step-kind sleep] [--workers 2] [--epochs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def _step(ms: float, kind: str) -> None:
    if ms <= 0:
        return
    if kind == "sleep":
        time.sleep(ms / 1e3)
        return
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:  # Python work, holding the GIL
        pass


def measure(path: str, workers: int, background: bool, step_ms: float, kind: str,
            batch: int, epochs: int, size: int) -> float:
    import torch

    import fastdata

    ds = fastdata.open_dataset(path, decode=fastdata.Decode(crop=fastdata.RandomResizedCrop(size)),
                               order=fastdata.Order(seed=0))
    loader = torch.utils.data.DataLoader(
        ds, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=fastdata.collate,
        persistent_workers=workers > 0, prefetch_factor=4 if workers else None,
        generator=torch.Generator().manual_seed(0))
    batches = fastdata.BackgroundBatches(loader) if background else loader
    rates = []
    for epoch in range(epochs + 1):
        ds.set_epoch(epoch)
        start, seen = time.perf_counter(), 0
        for images, _ in batches:
            seen += len(images)
            _step(step_ms, kind)
        if epoch:  # the first epoch starts workers and warms caches
            rates.append(seen / (time.perf_counter() - start))
        if seen != len(ds):
            raise RuntimeError(f"epoch {epoch} gave {seen} samples, not {len(ds)}")
    del batches, loader
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512, help="demo photos")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--steps-ms", default="0,20", help="stand-in step times, ms per batch")
    parser.add_argument("--step-kind", choices=("sleep", "spin"), default="sleep")
    parser.add_argument("--workers", default="2", help="worker counts for the worker rows")
    parser.add_argument("--epochs", type=int, default=3, help="measured epochs")
    args = parser.parse_args(argv)

    import fastdata
    from fastdata.demo import synthesize
    from fastdata.packers.options import PackOptions
    from fastdata.packers.preprocess import Preprocess

    steps = [float(s) for s in args.steps_ms.split(",")]
    worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    with tempfile.TemporaryDirectory(prefix="fastdata-overlap-") as tmp:
        src, path = os.path.join(tmp, "photos"), os.path.join(tmp, "photos.lmdb")
        synthesize(src, kind="photos", n=args.n, classes=8, progress=False)
        fastdata.pack(src, path, progress=False, options=PackOptions(
            preprocess=Preprocess(encoding="jpeg", quality=90, restarts=True)))
        print(f"{args.n} photos, RandomResizedCrop({args.size}), batches of {args.batch}, "
              f"step: {args.step_kind}; images/s, median of {args.epochs} epochs")
        for step_ms in steps:
            rows = [("0 workers", 0, False), ("0 workers + background", 0, True)]
            rows += [(f"{w} workers", w, False) for w in worker_counts]
            for name, workers, background in rows:
                rate = measure(path, workers, background, step_ms, args.step_kind, args.batch,
                               args.epochs, args.size)
                limit = f" (the step alone allows {args.batch * 1e3 / step_ms:,.0f})" \
                    if step_ms > 0 else ""
                print(f"step {step_ms:5.1f} ms  {name:24s} {rate:8,.0f}{limit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""RAM cache on a cold page cache: fill time, then epoch times, against no cache.

Needs root on Linux to drop the page cache (otherwise it says so and runs warm).

    python bench/cache_cold.py [DATASET] [--workers 2] [--size 224] [--epochs 3]

Without DATASET it packs the demo photos (fastdata synth, 512 images) to LMDB
in a temporary folder. Every epoch reads every record once through a shuffled
DataLoader and decodes to SIZE x SIZE.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

import torch

import fastdata
from fastdata.demo import synthesize


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def epochs(ds, workers: int, n: int) -> list[float]:
    times = []
    for e in range(n):
        g = torch.Generator()
        g.manual_seed(e)
        loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, generator=g,
                                             num_workers=workers, collate_fn=fastdata.collate)
        start = time.perf_counter()
        seen = sum(len(labels) for _images, labels in loader)
        times.append(time.perf_counter() - start)
        assert seen == len(ds)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", nargs="?")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.dataset
        if path is None:
            src = os.path.join(tmp, "photos")
            synthesize(src, kind="photos", progress=False)
            path = os.path.join(tmp, "photos.lmdb")
            fastdata.pack(src, path, progress=False)
        size = (args.size, args.size)
        for cache in (None, "ram"):
            cold = drop_caches()
            start = time.perf_counter()
            ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=size), cache=cache,
                                       progress=False)
            opened = time.perf_counter() - start
            times = epochs(ds, args.workers, args.epochs)
            n = len(ds)
            label = "cold" if cold else "warm (cannot drop caches: not root)"
            print(f"cache={cache or 'none':<4} page cache {label}: open {opened:.2f} s"
                  + (f" (filled {ds.cache.nbytes / 1e6:.1f} MB)" if cache else "")
                  + "; epochs " + ", ".join(f"{t:.2f} s ({n / t:,.0f}/s)" for t in times))
            if cache:
                ds.cache.close()


if __name__ == "__main__":
    main()

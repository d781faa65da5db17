"""Samples/s of ``fastdata.loader()`` over one packed dataset, as a user opens
it: shuffled, 224x224, batch 64, on the CPU; best of three epochs after one
warm-up. For a before/after of the loader path, run it alternately under two
trees: ``PYTHONPATH=TREE python bench/loader_rate.py DATASET``.
"""

from __future__ import annotations

import sys
import time

import fastdata


def main(path: str) -> None:
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(224, 224)),
                               order=fastdata.Order(shuffle=True, seed=0, batch_size=64))
    batches = fastdata.loader(ds, device="cpu")
    for _ in batches:  # warm-up: page cache, decoder pools
        pass
    best = 0.0
    for _ in range(3):
        start, seen = time.perf_counter(), 0
        for _, labels in batches:
            seen += len(labels)
        best = max(best, seen / (time.perf_counter() - start))
    print(f"{best:.0f} samples/s")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/loader_rate.py DATASET  (a packed dataset: a tar "
                 "manifest from `fastdata bench --demo --out-dir DIR`, an .lmdb, ...)")
    main(sys.argv[1])

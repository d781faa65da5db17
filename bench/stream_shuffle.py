"""How well ShardedIterableDataset's shuffle mixes a class-sorted pack, and what it costs.

    python bench/stream_shuffle.py                       # quality tables + throughput
    python bench/stream_shuffle.py --old-tree DIR        # also time an older fastdata checkout

Quality: packs are written class by class, so a shard holds one or two
classes. For a batch of B samples the class entropy (bits) of its labels is
compared with what a uniformly random permutation gives (the mean over its
batches, measured the same way): 1.00 means batches look like random draws.
It is computed from the order the job reads (fastdata.order),
which is the same for any number of workers and ranks, on label arrays of
class-sorted datasets: the 2,400-sample, 10-class case of the project's
notes, CIFAR-like and ImageNet-like sizes. "previous" is the scheme before
the block shuffle (shard order shuffled, then a 1000-sample buffer per
worker, 2 workers interleaved), re-implemented here for the comparison.

Throughput: samples/s of one epoch through a DataLoader over tar shards of
generated photos (224x224 output), shuffled and not, at 0 and 2 workers, the
best of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastdata.order.epochs import DEFAULT_BLOCK, DEFAULT_WINDOW, Shuffle, epoch_order  # noqa: E402


def batch_entropy(labels: np.ndarray, batch: int) -> float:
    """Mean Shannon entropy (bits) of the class histogram of consecutive batches."""
    full = len(labels) // batch * batch
    out = []
    for start in range(0, full, batch):
        _, counts = np.unique(labels[start:start + batch], return_counts=True)
        p = counts / counts.sum()
        out.append(float(-(p * np.log2(p)).sum()))
    return float(np.mean(out))


def sorted_labels(classes: int, per_class: int) -> np.ndarray:
    return np.repeat(np.arange(classes), per_class)


def previous_order(n: int, shard: int, seed: int, batch: int, workers: int = 2,
                   buffer: int = 1000) -> np.ndarray:
    """The earlier streaming shuffle: shards shuffled, dealt to workers, a
    per-worker shuffle buffer, the DataLoader taking a batch from each worker in turn."""
    shards = list(range(-(-n // shard)))
    random.Random(seed).shuffle(shards)
    streams = []
    for w in range(workers):
        records = [i for s in shards[w::workers] for i in range(s * shard, min(n, (s + 1) * shard))]
        rng, buf, out = random.Random(seed + w), [], []
        for r in records:
            if len(buf) < buffer:
                buf.append(r)
                continue
            j = rng.randrange(buffer)
            buf[j], r = r, buf[j]
            out.append(r)
        rng.shuffle(buf)
        streams.append(out + buf)
    order = []
    for k in range(0, max(map(len, streams)), batch):
        for s in streams:
            order += s[k:k + batch]
    return np.asarray(order)


def quality_rows(batch: int) -> list[dict]:
    cases = [("2,400 in 10 classes, shards of 240", 10, 240, 240),
             ("50,000 in 10 classes (CIFAR-like), shards of 5,000", 10, 5000, 5000),
             ("128,000 in 1,000 classes (ImageNet-like, 1/10), shards of 1,280", 1000, 128, 1280),
             ("1,281,000 in 1,000 classes (ImageNet-like), shards of 1,281", 1000, 1281, 1281)]
    rows = []
    for name, classes, per_class, shard in cases:
        labels = sorted_labels(classes, per_class)
        n = len(labels)
        rng = np.random.default_rng(0)
        reference = np.mean([batch_entropy(labels[rng.permutation(n)], batch) for _ in range(3)])
        row = {"case": name, "random_bits": round(float(reference), 3)}
        row["stored order"] = batch_entropy(labels, batch) / reference
        row["previous (2 workers)"] = batch_entropy(labels[previous_order(n, shard, 0, batch)],
                                                    batch) / reference
        for window in (DEFAULT_WINDOW, 65536):
            order = epoch_order(n, Shuffle(True, 0, DEFAULT_BLOCK, window), 0)
            row[f"block {DEFAULT_BLOCK}, window {window}"] = \
                batch_entropy(labels[order], batch) / reference
        # Whole shards as blocks (Order(block="shard"), for remote_read="shards").
        firsts = np.arange(0, n, shard, dtype=np.int64)
        order = epoch_order(n, Shuffle(True, 0, "shard", DEFAULT_WINDOW), 0, firsts)
        row[f"whole shards, window {DEFAULT_WINDOW}"] = \
            batch_entropy(labels[order], batch) / reference
        rows.append(row)
    return rows


THROUGHPUT = r"""
import json, sys, time, torch, fastdata
path, workers, shuffle, new_api = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
if new_api:  # this tree: the read options as fastdata.Decode and fastdata.Order
    ds = fastdata.ShardedIterableDataset(path, decode=fastdata.Decode(size=(224, 224)),
                                         order=fastdata.Order(shuffle=shuffle, seed=1,
                                                              batch_size=64))
else:  # an older checkout (--old-tree): its flat keywords, without batch_size
    ds = fastdata.ShardedIterableDataset(path, shuffle=shuffle, seed=1, size=(224, 224))
loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=workers,
                                     collate_fn=fastdata.collate)
n = sum(len(y) for _, y in loader)          # warm-up epoch
start = time.perf_counter()
n = sum(len(y) for _, y in loader)
print(json.dumps({"samples": n, "seconds": time.perf_counter() - start}))
"""


def throughput(path: str, tree: str, workers: int, shuffle: bool, new_api: bool,
               repeat: int) -> float:
    best = 0.0
    env = dict(os.environ, PYTHONPATH=tree)
    for _ in range(repeat):
        # Run from the tree measured: `python -c` puts the working folder first on
        # sys.path, ahead of PYTHONPATH.
        out = subprocess.run([sys.executable, "-c", THROUGHPUT, path, str(workers),
                              "1" if shuffle else "0", "1" if new_api else "0"],
                             capture_output=True, text=True, env=env, check=True, cwd=tree)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        best = max(best, got["samples"] / got["seconds"])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--photos", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old-tree", help="a checkout of an earlier fastdata to time too")
    parser.add_argument("--no-throughput", action="store_true")
    args = parser.parse_args()

    print(f"class entropy of {args.batch}-sample batches, as a fraction of a random "
          f"permutation's (class-sorted packs)")
    for row in quality_rows(args.batch):
        print(f"\n  {row.pop('case')} (random: {row.pop('random_bits')} bits)")
        for name, value in row.items():
            print(f"    {name:32s} {value:.3f}")
    if args.no_throughput:
        return

    import fastdata
    from fastdata.demo import synthesize

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        synthesize(os.path.join(tmp, "src"), kind="photos", n=args.photos, seed=0)
        out = os.path.join(tmp, "d-%06d.tar")
        fastdata.pack(os.path.join(tmp, "src"), out,
                      options=fastdata.PackOptions(shard_size=args.photos // 8), progress=False)
        manifest = out
        print(f"\nthroughput, {args.photos} generated photos in 8 tar shards, 224x224, "
              f"batch 64, samples/s (best of {args.repeat})")
        trees = [("this tree", here, True)]
        if args.old_tree:
            trees.append(("previous", os.path.abspath(args.old_tree), False))
            # Earlier versions named the sidecars after the prefix alone.
            for suffix in ("fastdata.json", "fastdata.index.npy", "fastdata.keys.json"):
                src = os.path.join(tmp, f"d.tar.{suffix}")
                if os.path.exists(src):
                    shutil.copyfile(src, os.path.join(tmp, f"d.{suffix}"))
        for label, tree, new_api in trees:
            for shuffle in (False, True):
                rates = [throughput(manifest, tree, w, shuffle, new_api, args.repeat)
                         for w in (0, 2)]
                print(f"  {label:10s} shuffle={str(shuffle):5s}  0 workers {rates[0]:7.0f}   "
                      f"2 workers {rates[1]:7.0f}")


if __name__ == "__main__":
    main()

"""How random the per-position orders are, next to the orders they replaced.

    python bench/order_quality.py                 # 10^5 and 10^6 records
    python bench/order_quality.py --sizes 100000 --json

Order algorithm 2 (fastdata.order.bijection: Feistel bijections, computed
per position) against algorithm 1, which made each epoch's order as a whole
array: a numpy permutation of every record (``numpy.random.Generator(PCG64)
.permutation``) and, for streams, a numpy block shuffle (re-implemented
below as it was). Same sizes, same number of seeds. Figures, per mode:

- displacement: ``|order[p] - p| / n``. A uniform permutation gives a mean
  of 1/3 and quantiles 0.051, 0.293, 0.684 (10%, 50%, 90%); ``ks`` is the
  Kolmogorov-Smirnov distance to that law (0: the same law).
- neighbours: the correlation of the records at positions p and p+1, and
  of p and p+B (B the batch); 0 for an order with no memory.
- classes per batch: a class-sorted pack (``--classes`` classes, record i
  of class ``i * classes // n``), the mean entropy (bits) of each batch's
  labels over the entropy of i.i.d. draws' batches (1.000: as mixed).
- streams (block/window mode, shards of ``--shard`` records): distinct
  shards per batch, and the read-ahead working set: distinct shards per
  window of 8,192 consecutive positions (what a reader reads from at once).

Each figure is the mean over ``--seeds`` seeds, with its standard deviation
over them (the noise against which the two columns compare).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastdata.order.epochs import (  # noqa: E402
    DEFAULT_BLOCK, DEFAULT_WINDOW, Shuffle, epoch_order, stable_seed)


def algorithm_1(n: int, shuffle: Shuffle, epoch: int) -> np.ndarray:
    """Algorithm 1's epoch order (fastdata before per-position orders)."""
    seed = stable_seed("order", shuffle.seed, epoch)
    rng = np.random.Generator(np.random.PCG64(seed))
    if shuffle.block == 1 and shuffle.window >= n:
        return rng.permutation(n).astype(np.int64)
    block = int(shuffle.block)
    blocks = -(-n // block)
    starts = rng.permutation(blocks).astype(np.int64) * block
    lengths = np.minimum(block, n - starts)
    order = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(n)
    per_window = max(1, int(shuffle.window) // block) * block
    window_of = np.arange(n, dtype=np.int64) // per_window
    return order[np.lexsort((rng.random(n), window_of))]


def displacement(order: np.ndarray) -> dict:
    n = len(order)
    d = np.abs(order - np.arange(n)) / n
    q = np.quantile(d, [0.1, 0.5, 0.9])
    # Uniform permutation: |U - V| for independent uniforms, CDF 1 - (1 - x)^2.
    xs = np.sort(d)
    ks = float(np.max(np.abs(np.arange(1, n + 1) / n - (1 - (1 - xs) ** 2))))
    return {"mean": float(d.mean()), "q10": float(q[0]), "q50": float(q[1]),
            "q90": float(q[2]), "ks": ks}


def neighbours(order: np.ndarray, batch: int) -> dict:
    x = order.astype(np.float64)
    return {"lag1": float(np.corrcoef(x[:-1], x[1:])[0, 1]),
            "lagB": float(np.corrcoef(x[:-batch], x[batch:])[0, 1])}


def batch_entropy(labels: np.ndarray, batch: int) -> float:
    full = len(labels) // batch * batch
    rows = labels[:full].reshape(-1, batch)
    out = []
    for row in rows:
        counts = np.bincount(row)
        p = counts[counts > 0] / batch
        out.append(float(-(p * np.log2(p)).sum()))
    return float(np.mean(out))


def class_mixing(order: np.ndarray, classes: int, batch: int, iid: float) -> float:
    labels = order * classes // len(order)
    return batch_entropy(labels, batch) / iid


def stream_figures(order: np.ndarray, shard: int, batch: int) -> dict:
    shards = order // shard
    full = len(shards) // batch * batch
    per_batch = [len(np.unique(r)) for r in shards[:full].reshape(-1, batch)]
    span = DEFAULT_WINDOW
    per_window = [len(np.unique(shards[k:k + span])) for k in range(0, len(shards), span)]
    return {"shards_per_batch": float(np.mean(per_batch)),
            "working_set": float(np.mean(per_window))}


def measure(n: int, mode: str, seeds: int, classes: int, shard: int, batch: int) -> dict:
    if mode == "full":
        shuffle = Shuffle(True, 0, 1, n)
    else:
        shuffle = Shuffle(True, 0, DEFAULT_BLOCK, DEFAULT_WINDOW)
    rng = np.random.default_rng(0)
    iid = batch_entropy(rng.integers(0, classes, n), batch)
    out: dict = {}
    for name, make in (("algorithm 1", algorithm_1),
                       ("algorithm 2", lambda n, s, e: epoch_order(n, s, e)[:])):
        rows = []
        seconds = 0.0
        for seed in range(seeds):
            mode_s = Shuffle(True, seed, shuffle.block, shuffle.window)
            t = time.perf_counter()
            order = make(n, mode_s, 0)
            seconds += time.perf_counter() - t
            row = {**{f"displacement_{k}": v for k, v in displacement(order).items()},
                   **{f"corr_{k}": v for k, v in neighbours(order, batch).items()},
                   "class_mixing": class_mixing(order, classes, batch, iid)}
            if mode == "stream":
                row.update(stream_figures(order, shard, batch))
            rows.append(row)
        out[name] = {k: (float(np.mean([r[k] for r in rows])),
                         float(np.std([r[k] for r in rows]))) for k in rows[0]}
        out[name]["seconds_whole_order"] = (seconds / seeds, 0.0)
    return out


def show(n: int, mode: str, result: dict) -> None:
    names = list(result)
    keys = list(result[names[0]])
    print(f"\n{mode} order, n = {n:,}")
    print(f"{'figure':<26}" + "".join(f"{name + ' (sd)':>22}" for name in names))
    for k in keys:
        print(f"{k:<26}" + "".join(f"{result[name][k][0]:>14.4f} ({result[name][k][1]:.4f})"
                                   for name in names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--shard", type=int, default=1000, help="records per shard (streams)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    for n in map(int, args.sizes.split(",")):
        for mode in ("full", "stream"):
            result = measure(n, mode, args.seeds, args.classes, args.shard, args.batch)
            results[f"{mode} {n}"] = result
            if not args.json:
                show(n, mode, result)
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

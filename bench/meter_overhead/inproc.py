"""In one process (the tree with the meter): batches of 64 through the bench's Dataset
(__getitems__ + fastdata.collate, 0 workers), blocks of 20 batches alternating the real
meter calls and no-op ones (StageTable.add/made/count replaced), ABBA; per-batch times."""
import sys
import statistics, time, random
import numpy as np
import fastdata
from fastdata.loaders.collate import collate
from fastdata.meter import table as T

ds = fastdata.open_dataset(sys.argv[1], decode=fastdata.Decode(size=(32, 32)),
                           order=fastdata.Order(seed=0))
real = {n: getattr(T.StageTable, n) for n in ("add", "made", "count")}
noop = {n: (lambda self, *a, **k: None) for n in real}
rng = random.Random(0)
n = len(ds)
batches = [[rng.randrange(n) for _ in range(64)] for _ in range(20)]

def block(meter):
    for name, fn in (real if meter else noop).items():
        setattr(T.StageTable, name, fn)
    t0 = time.perf_counter()
    for b in batches:
        collate(ds.__getitems__(b))
    return (time.perf_counter() - t0) / len(batches)

for _ in range(20):
    block(True); block(False)
on, off, ratios = [], [], []
for k in range(600):
    order = (True, False) if k % 2 == 0 else (False, True)
    got = {m: block(m) for m in order}
    on.append(got[True]); off.append(got[False]); ratios.append(got[True] / got[False])
print(f"per batch: meter on min {min(on)*1e6:.1f} us, median {statistics.median(on)*1e6:.1f}; "
      f"no-op min {min(off)*1e6:.1f} us, median {statistics.median(off)*1e6:.1f}")
print(f"min difference {(min(on)-min(off))*1e6:+.2f} us ({(min(on)/min(off)-1)*100:+.2f}%); "
      f"median paired ratio {statistics.median(ratios):.4f} "
      f"(quartiles {[round(q, 4) for q in statistics.quantiles(ratios, n=4)]}, {len(ratios)} pairs)")

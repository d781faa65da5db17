"""One tree's bench row, kept open: each line on stdin runs one epoch and prints samples/s.
The same Dataset and DataLoader settings as `fastdata bench PATH --size 32` (batch 64,
shuffled, persistent workers, fastdata.collate)."""
import sys, time
import torch
from torch.utils.data import DataLoader
import fastdata
from fastdata.loaders.collate import collate
from fastdata.bench.cpu import cpu_seconds, children_cpu_seconds

path, workers = sys.argv[1], int(sys.argv[2])
ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(32, 32)), order=fastdata.Order(seed=0))
g = torch.Generator(); g.manual_seed(0)
dl = DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers,
                persistent_workers=workers > 0, generator=g, collate_fn=collate,
                timeout=600 if workers else 0)
print(fastdata.__file__, flush=True)
for line in sys.stdin:
    c0 = cpu_seconds() + children_cpu_seconds()
    t0 = time.perf_counter(); n = 0
    for images, labels in dl:
        n += len(images)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() + children_cpu_seconds() - c0
    print(n / wall, n / cpu, flush=True)

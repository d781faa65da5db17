"""Per-batch cost of the stall meter's calls (what one batch makes them do)."""
import timeit, sys
from fastdata.meter.table import StageTable, clock
from fastdata.meter.loop import LoopMeter

def dataset_calls(t):
    # PackedDataset.__getitems__ + _timed_read + SamplePipeline decode (a local dataset, no transform)
    start = clock()
    s = clock(); t.add("read", clock() - s)
    s = clock(); t.add("decode", clock() - s)
    t.made(start, 64)

def collate_call(t):   # TimedCollate
    s = clock(); t.add("collate", clock() - s, busy=True)

def convert_call(t):   # CUDAPrefetcher._converted without CUDA
    s = clock(); t.add("convert", clock() - s, busy=True)

def bare_clocks():
    start = clock(); s = clock(); clock(); s = clock(); clock(); clock()

def run(label, fn, n=200000):
    best = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
    print(f"{label:55s} {best:6.2f} us")
    return best

for shared in (False, True):
    t = StageTable(2, shared=shared)
    kind = "shared table" if shared else "own table"
    a = run(f"dataset: 2 add + made + 6 clock ({kind})", lambda: dataset_calls(t))
    run(f"  of which 6 bare clock() calls", bare_clocks)
    run(f"  row() alone ({kind})", t.row)
    run(f"  add('read', 1e-3) alone ({kind})", lambda: t.add("read", 1e-3))
    run(f"  made(start, 64) alone ({kind})", lambda: t.made(0.5, 64))
    b = run(f"TimedCollate's: 2 clock + add(busy) ({kind})", lambda: collate_call(t))
    c = run(f"_converted's: 2 clock + add(busy) ({kind})", lambda: convert_call(t))
    print(f"{'  per batch, fastdata.loader() path (dataset+collate+convert)':55s} {a+b+c:6.2f} us")
    t.close()

# LoopMeter.wrap: a generator layer, 2 clock calls and took() per batch
m = LoopMeter()
items = list(range(100000))
def plain(): 
    for _ in iter(items): pass
def wrapped():
    for _ in m.wrap(items): pass
p = min(timeit.repeat(plain, number=1, repeat=5)) / len(items) * 1e6
w = min(timeit.repeat(wrapped, number=1, repeat=5)) / len(items) * 1e6
print(f"{'LoopMeter.wrap, per batch (minus a bare loop)':55s} {w - p:6.2f} us")

"""What fastdata costs per process as a dataset grows, measured past this machine.

    python bench/scale.py plan                  # 10^9 and 10^10 samples, 4,096 ranks x 8 workers
    python bench/scale.py open --sizes 200000,2000000   # pack tiny records, open, first batch
    python bench/scale.py open --format lmdb,hdf5       # the same for other formats
    python bench/scale.py startup               # open 10^9 records in 10^5 shards (sparse)
    python bench/scale.py startup --url         # the same at an http:// URL
    python bench/scale.py write                 # memory of writing and packing 10^6 records
    python bench/scale.py pages                 # LMDB pages a batch maps, by page cache state
    python bench/scale.py jobs                  # dedup, verify, info, pack at 10^6 and 10^7

``plan`` needs no data: for each size and order mode (a permutation of every
record, as map-style reading has it; blocks of 16 in windows of 8192, as a
stream has it) a fresh process plans the first batch of every worker of every
rank (the rank's steps 0-7) with the torch-free engine
(``fastdata.order.batch_records``), and prints the time and peak memory of
one rank's plan, the time of all ranks', rank 0's and rank 4095's first
records, and whether all those positions map to distinct records.

``startup`` makes a dataset of 10^9 records in 10^5 TFRecord shards
without writing its data: the manifest of a real pack rewritten to name
10^5 empty shard files, a sparse index file whose rows are zeros (each an
empty record of shard 0), and the index's piece checksums. A fresh process
then opens it shuffled, plans its first batch and locates the batch's
records in the index (their shards, sizes and labels): time and memory of
the start-up, payload reads left out (the records are empty). With
``--url`` it is served by a local HTTP server honouring Range, opened twice
with one cache folder (a fresh machine, then the machine's second process),
and the requests and bytes each open asked for are printed per file.

``open`` packs ``N`` tiny records (1x1 raw pixels; TFRecord by default,
``--format lmdb,hdf5,tar,tfrecord`` for others; tar and TFRecord in
``N / 10,000`` shards) and, in a fresh process per size, opens the dataset
shuffled and reads its first batch: the memory (RSS) after import, after
open and after the batch, and the growth per record between the sizes. Each
figure is split into what the process allocated (RssAnon) and the pages of
files it maps (RssFile: LMDB's memory map, HDF5 columns read in place; page
cache that every process of the machine shares). Each size is opened twice:
with the files in the page cache as the pack left them (warm: a mapped page
brings its whole folio of the cache along, up to megabytes), then dropped
from it (cold: only the pages read come in).

``pages`` packs ``--records`` tiny records into LMDB once and, in a fresh
process per case, gets what opening and a shuffled batch of 256 get with
plain ``lmdb``: the ``Rss`` and ``FilePmdMapped`` of ``data.mdb``'s mapping
(``/proc/self/smaps``) with the page cache as the pack left it (readahead
off and on, and with ``MADV_NOHUGEPAGE``), filled by reading the file
whole, dropped, and holding only what the cold run read.

``jobs`` runs whole-dataset jobs over tiny records on this machine's
processes, a local Dask and a local Ray cluster: see ``bench/scale_jobs.py``.

``write`` writes ``N`` tiny records (the same records, TFRecord, 10,000
per shard) in a fresh process per size, two ways: the format's writer alone
(``Writer.write`` then ``finish``), and a whole ``fastdata.pack`` (its plan
of the source included). It prints records per second and the peak memory
(VmHWM) of each, and the growth per record between the sizes.

It imports the ``fastdata`` Python finds: ``PYTHONPATH=OTHER_TREE python
bench/scale.py open`` measures another checkout (the ``plan`` part needs
``fastdata.order.batch_records``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


PLAN = r"""
import json, sys, time
import numpy as np
from fastdata.order import batch_records
def peak():  # VmHWM: this program's own peak (ru_maxrss keeps a forking parent's)
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
from fastdata.order.options import Order
n, block, window, ranks, workers, batch = map(int, sys.argv[1:7])
extra = {} if block == 0 else {"block": block, "window": window}
def plan(rank):  # a rank's worker k reads the rank's step k first
    order = Order(shuffle=True, batch_size=batch, rank=rank, world_size=ranks, **extra)
    return [batch_records(n, order, epoch=0, step=k, stream=block != 0) for k in range(workers)]
start = time.perf_counter()
last = plan(ranks - 1)  # one rank alone, in this fresh process: its time and memory
one_rank_s, one_rank_peak = time.perf_counter() - start, peak()
start = time.perf_counter()
every = [plan(rank) for rank in range(ranks)]
seconds = time.perf_counter() - start
firsts = {r: every[r][0][:6].tolist() for r in (0, ranks - 1)}
every = np.concatenate([b for rank in every for b in rank])
print(json.dumps({"seconds": seconds, "one_rank_s": one_rank_s, "one_rank_peak": one_rank_peak,
                  "positions": int(every.size), "distinct": int(np.unique(every).size),
                  "firsts": firsts}))
"""

class TinySource:
    """``n`` records of 1x``width`` raw RGB pixels in 10 classes (a fastdata
    Source); the first pixel numbers the record, the rest are zeros."""

    def __init__(self, n: int, width: int = 1) -> None:
        self.n, self.width = n, width
        self.classes = [f"c{k}" for k in range(10)]

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        from fastdata.packers.source import SourceEntry

        rest = bytes(3 * (self.width - 1))
        for i in range(self.n):
            yield SourceEntry(key=f"{i:010d}", label=i % 10,
                              data=bytes((i & 255, (i >> 8) & 255, (i >> 16) & 255)) + rest,
                              raw_shape=(1, self.width, 3))

    def describe(self) -> dict:
        return {"root": None, "files": self.n, "kind": "bench/scale.py tiny records"}

    def warnings(self) -> list[str]:
        return []


WRITE = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[4])
from scale import TinySource
def peak():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
import fastdata
from fastdata.formats import get_format
from fastdata.packers.options import PackOptions
from fastdata.records import Manifest, Record
n, how, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sharded = out.endswith((".tfrecord", ".tar"))
source = TinySource(n)
base = peak()
start = time.perf_counter()
if how == "writer":
    writer = get_format("tfrecord").load_writer()(out, shard_size=10_000)
    for e in source:
        writer.write(Record(writer.count, e.key, e.label, e.data, "raw"))
    writer.finish(Manifest("tfrecord", n, source.classes, [n // 10] * 10, {}, {}, {}, [], {},
                           {}, "", ""))
else:
    fastdata.pack(source, out, options=PackOptions(shard_size=10_000 if sharded else None),
                  progress=False)
print(json.dumps({"seconds": time.perf_counter() - start, "base": base, "peak": peak()}))
"""

STARTUP = r"""
import json, sys, time
def rss(field="VmRSS:"):
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith(field))
import fastdata, torch
base = rss()
start = time.perf_counter()
ds = fastdata.open_dataset(sys.argv[1], decode=fastdata.Decode(output="bytes"),
                           order=fastdata.Order(shuffle=True, batch_size=256, rank=4095,
                                                world_size=4096))
opened = time.perf_counter() - start
batch = next(iter(fastdata.EpochBatches(ds)))
shards, sizes = ds.reader.placement(batch)
labels = ds.reader.labels[batch]
total = time.perf_counter() - start
print(json.dumps({"records": len(ds), "shards": len(ds.reader.shard_paths), "open_s": opened,
                  "first_batch_s": total, "grown": rss() - base, "peak": rss("VmHWM:"),
                  "distinct": len(set(batch)), "sizes": int(sizes.sum())}))
"""


def make_synthetic(folder: str, records: int, shards: int) -> str:
    """A dataset of ``records`` empty records in ``shards`` empty TFRecord
    shards, from a tiny real pack's manifest (see the module docstring)."""
    import hashlib
    import zlib

    import numpy as np

    import fastdata
    from fastdata.formats.sharded.index_rows import PIECE_ROWS
    from fastdata.formats.sharded.layout import INDEX_DTYPE
    from fastdata.packers.options import PackOptions

    out = os.path.join(folder, "syn.tfrecord")
    fastdata.pack(TinySource(10), out, progress=False, options=PackOptions(shard_size=10))
    manifest_path = out + ".fastdata.json"
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    per = records // shards
    manifest["count"] = per * shards
    manifest["class_counts"] = [per * shards] + [0] * (len(manifest["classes"]) - 1)
    manifest["shards"] = [{"path": f"syn-{n:06d}.tfrecord", "count": per, "bytes": 0,
                           "first": n * per} for n in range(shards)]
    for entry in manifest["shards"]:
        open(os.path.join(folder, entry["path"]), "wb").close()
    extra = manifest["extra"]
    index = os.path.join(folder, extra["index"])
    count = per * shards
    header = {"descr": np.lib.format.dtype_to_descr(INDEX_DTYPE), "fortran_order": False,
              "shape": (count,)}
    with open(index, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.truncate(f.tell() + count * INDEX_DTYPE.itemsize)  # sparse: rows of zeros
    zero = zlib.crc32(np.zeros(PIECE_ROWS, dtype=INDEX_DTYPE).tobytes())
    crcs = os.path.join(folder, extra["index_pieces"]["file"])
    np.save(crcs, np.full(-(-count // PIECE_ROWS), zero, dtype="<u4"))
    sums = manifest["checksums"]["metadata_sha256"]
    with open(crcs, "rb") as f:
        sums[os.path.basename(crcs)] = hashlib.sha256(f.read()).hexdigest()
    sums.pop(extra["index"], None)  # never read whole
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    return manifest_path


def serve(folder: str):
    """An HTTP server on 127.0.0.1 for ``folder``'s files, honouring Range
    with seeks (the index is tens of GB, mostly holes), counting requests and
    body bytes per file."""
    import http.server
    import re
    import threading
    from collections import Counter

    asked: Counter = Counter()
    sent: Counter = Counter()

    class Ranged(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def do_GET(self) -> None:
            name = os.path.basename(self.path.split("?", 1)[0])
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                self.send_error(404)
                return
            size = os.path.getsize(path)
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
            start, end = (int(m.group(1)), min(int(m.group(2)), size - 1)) if m else (0, size - 1)
            self.send_response(206 if m else 200)
            self.send_header("Content-Length", str(end - start + 1))
            if m:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            with open(path, "rb") as f:
                f.seek(start)
                self.wfile.write(f.read(end - start + 1))
            asked[name] += 1
            sent[name] += end - start + 1

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ranged)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, asked, sent


def run_startup(args) -> None:
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        t = time.perf_counter()
        manifest = make_synthetic(folder, int(float(args.records)), int(float(args.shards)))
        print(f"made in {time.perf_counter() - t:.0f} s")
        env = dict(os.environ)
        if args.url:
            server, asked, sent = serve(folder)
            manifest = f"http://127.0.0.1:{server.server_address[1]}/" \
                       f"{os.path.basename(manifest)}"
            env["FASTDATA_CACHE_DIR"] = os.path.join(folder, "cache")
        for run in range(2 if args.url else 1):
            result = subprocess.run([sys.executable, "-c", STARTUP, manifest],
                                    capture_output=True, text=True, check=True, env=env)
            r = json.loads(result.stdout)
            where = ["", "at a URL, a fresh machine: ", "at a URL, the machine's second process: "]
            print(f"{where[run + bool(args.url)]}{r['records']:,} records in {r['shards']:,} "
                  f"shards: open {r['open_s']:.2f} s, open + first batch planned and located "
                  f"{r['first_batch_s']:.2f} s, +{r['grown'] / 2**20:.0f} MB after torch's "
                  f"import (peak {r['peak'] / 2**20:.0f} MB); {r['distinct']} distinct records")
            if args.url:
                print("  requests (bytes): " + ", ".join(
                    f"{name.split('.', 1)[1]} {asked[name]} ({sent[name]:,})"
                    for name in sorted(asked)))
                asked.clear()
                sent.clear()
        if args.url:
            server.shutdown()


def run_plan(args) -> None:
    print(f"one rank: its {args.workers} workers' first batches of {args.batch}, planned in a "
          f"fresh process (peak: VmHWM, imports included); all ranks: every rank's, and "
          f"whether those {args.ranks * args.workers * args.batch:,} positions give distinct "
          f"records")
    print(f"{'records':>16} {'mode':<18} {'rank ms':>8} {'rank MB':>8} {'all s':>7} "
          f"{'distinct':>9}  rank 0 | rank {args.ranks - 1} first records")
    for n in map(int, args.sizes.split(",")):
        for block, window, mode in ((0, 0, "permutation"), (16, 8192, "block 16, win 8192")):
            out = subprocess.run([sys.executable, "-c", PLAN, str(n), str(block), str(window),
                                  str(args.ranks), str(args.workers), str(args.batch)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout)
            ok = "yes" if r["distinct"] == r["positions"] else "NO"
            firsts = r["firsts"]
            print(f"{n:>16,} {mode:<18} {r['one_rank_s'] * 1e3:>8.1f} "
                  f"{r['one_rank_peak'] / 2**20:>8.0f} {r['seconds']:>7.1f} {ok:>9}  "
                  f"{firsts['0'][:3]} | {firsts[str(args.ranks - 1)][:3]}")


def run_write(args) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    print("peak: VmHWM of a fresh process, less its peak before writing (imports)")
    ext = {"tfrecord": ".tfrecord", "tar": ".tar", "lmdb": ".lmdb", "hdf5": ".h5"}.get(args.format)
    if ext is None:
        raise SystemExit(f"--format: unknown {args.format} (tfrecord, tar, lmdb or hdf5)")
    # The writer alone: TFRecord's; a pack into the format asked for.
    rows: dict[str, list] = {"writer": [], "pack": []} if args.format == "tfrecord" \
        else {"pack": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for n in map(int, args.sizes.split(",")):
            for how in rows:
                out = os.path.join(folder, f"{how}{n}{ext if how == 'pack' else '.tfrecord'}")
                result = subprocess.run([sys.executable, "-c", WRITE, str(n), how, out, here],
                                        capture_output=True, text=True, check=True)
                r = json.loads(result.stdout)
                rows[how].append((n, r["peak"] - r["base"]))
                print(f"{n:>12,} records, {how:<6}: {n / r['seconds']:>9,.0f} records/s, "
                      f"peak +{(r['peak'] - r['base']) / 2**20:.1f} MB")
    for how, sizes in rows.items():
        for (a, pa), (b, pb) in zip(sizes, sizes[1:]):
            print(f"{how} growth {a:,} -> {b:,} records: {(pb - pa) / 2**20:+.1f} MB, "
                  f"{(pb - pa) / (b - a):.1f} bytes per record")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    plan = sub.add_parser("plan", help="plan epochs of huge datasets, without data")
    plan.add_argument("--sizes", default=f"{10**9},{10**10}")
    plan.add_argument("--ranks", type=int, default=4096)
    plan.add_argument("--workers", type=int, default=8)
    plan.add_argument("--batch", type=int, default=256)
    startup = sub.add_parser("startup", help="open a synthetic 10^9-record dataset")
    startup.add_argument("--records", default="1e9")
    startup.add_argument("--shards", default="1e5")
    startup.add_argument("--dir", default=None, help="where to make it (sparse files)")
    startup.add_argument("--url", action="store_true",
                         help="open it at a URL (a local HTTP server), twice: a fresh "
                              "machine's cache, then a second process of the same machine")
    write = sub.add_parser("write", help="write and pack tiny records: memory per record")
    write.add_argument("--sizes", default="200000,1000000")
    write.add_argument("--dir", default=None, help="where to write (default: the temp folder)")
    write.add_argument("--format", default="tfrecord",
                       help="what the pack writes: tfrecord (also its writer alone), tar, "
                            "lmdb or hdf5")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import scale_jobs  # jobs on local, Dask and Ray executors
    import scale_open  # open and the first batch, per format; LMDB's pages

    scale_jobs.add_parser(sub)
    scale_open.add_parser(sub)
    args = parser.parse_args()
    {"plan": run_plan, "open": scale_open.run_open, "startup": run_startup,
     "write": run_write, "jobs": scale_jobs.run_jobs,
     "pages": scale_open.run_pages}[args.what](args)


if __name__ == "__main__":
    main()

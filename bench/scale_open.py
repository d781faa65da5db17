"""``python bench/scale.py open``: tiny records packed in each format, then
opened in a fresh process and the first shuffled batch read, warm and cold;
memory at each stage and its growth per record between sizes.

``python bench/scale.py pages``: the pages of an LMDB file's ``data.mdb``
that one shuffled batch maps into a process, by the state of the page cache
before it and the advice on the mapping (plain ``lmdb``, no fastdata): what
the ``open`` measurement's "mapped" part of LMDB is made of.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

from scale import TinySource

OPEN = r"""
import json, os, sys
def rss():  # all of it, what the process allocated, the files' pages it maps
    with open("/proc/self/status") as f:
        fields = dict(x.split(":", 1) for x in f)
    return [int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon", "RssFile")]
import fastdata, torch
after_import = rss()
path = sys.argv[1]
ds = fastdata.open_dataset(path, order=fastdata.Order(shuffle=True, batch_size=256))
after_open = rss()
batch = next(iter(fastdata.loader(ds, device="cpu")))
after_batch = rss()
print(json.dumps({"records": len(ds), "after_import": after_import, "after_open": after_open,
                  "after_batch": after_batch}))
"""


#: The file name ``open`` packs to, per format, and whether it is sharded.
OPEN_FORMATS = {"tfrecord": (".tfrecord", True), "tar": (".tar", True),
                "lmdb": (".lmdb", False), "hdf5": (".h5", False)}


def run_open(args) -> None:
    formats = args.format.split(",")
    unknown = sorted(set(formats) - set(OPEN_FORMATS))
    if unknown:
        raise SystemExit(f"--format: unknown {', '.join(unknown)} (choose from "
                         f"{', '.join(OPEN_FORMATS)})")
    for name in formats:
        open_one(args, name)


def open_one(args, name: str) -> None:
    """``open`` for one format: pack each size, open it in a fresh process
    with its files in the page cache as the pack left them (warm), then
    dropped from it (cold)."""
    import fastdata
    from fastdata.packers.options import PackOptions

    ext, sharded = OPEN_FORMATS[name]
    rows: dict[str, list] = {"warm": [], "cold": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for n in map(int, args.sizes.split(",")):
            out = os.path.join(folder, f"tiny{n}{ext}")
            options = PackOptions(shard_size=max(1, n // max(1, n // 10_000))) if sharded \
                else PackOptions()
            t = time.perf_counter()
            fastdata.pack(TinySource(n), out, options=options, progress=False)
            packed = time.perf_counter() - t
            target = f"{out}.fastdata.json" if sharded else out
            for cache, r in rows.items():
                if cache == "cold":
                    drop_from_cache(folder)
                result = subprocess.run([sys.executable, "-c", OPEN, target],
                                        capture_output=True, text=True, check=True)
                r.append(json.loads(result.stdout))
                print(f"{name:>8} {n:>10,} records, {cache} (packed in {packed:.0f} s): "
                      f"{_stages(r[-1])}")
    for cache, sizes in rows.items():
        for a, b in itertools.pairwise(sizes):
            per = b["records"] - a["records"]
            grow = [(b["after_batch"][k] - b["after_import"][k])
                    - (a["after_batch"][k] - a["after_import"][k]) for k in range(3)]
            print(f"{name:>8} {cache} growth {a['records']:,} -> {b['records']:,} records: "
                  f"{grow[0] / 2**20:+.1f} MB, {grow[0] / per:.1f} bytes per record "
                  f"(allocated {grow[1] / per:.1f}, file pages mapped {grow[2] / per:.1f})")


def _stages(r: dict) -> str:
    """Memory after import, and what open and the first batch added (RSS,
    then its allocated and file-mapped parts)."""
    def part(a: str, b: str) -> str:
        d = [(r[b][k] - r[a][k]) / 2**20 for k in range(3)]
        return f"+{d[0]:.1f} MB ({d[1]:+.1f} allocated, {d[2]:+.1f} mapped)"

    return (f"after import {r['after_import'][0] / 2**20:.0f} MB, open "
            f"{part('after_import', 'after_open')}, first batch "
            f"{part('after_open', 'after_batch')}")


def drop_from_cache(folder: str) -> None:
    """Write the files under ``folder`` out and drop them from the page
    cache, as on a machine that has not read them yet."""
    for root, _, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


PAGES = r"""
import ctypes, json, random, sys
import lmdb
def mapped():  # data.mdb's Rss and FilePmdMapped, kB, from /proc/self/smaps
    out, ours, lines = {}, False, open("/proc/self/smaps").read().splitlines()
    for line in lines:
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            ours = line.endswith("/data.mdb")
        elif ours and head[0] in ("Rss:", "FilePmdMapped:"):
            out[head[0][:-1]] = out.get(head[0][:-1], 0) + int(head[1])
    return out
path, readahead, advice = sys.argv[1], sys.argv[2] == "on", sys.argv[3]
env = lmdb.open(path, readonly=True, lock=False, readahead=readahead)
if advice == "nohuge":  # MADV_NOHUGEPAGE (15) on the mapping
    start, end = next(line.split()[0].split("-") for line in open("/proc/self/maps")
                      if line.rstrip().endswith("/data.mdb"))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(int(start, 16), int(end, 16) - int(start, 16), 15):
        raise OSError(ctypes.get_errno(), "madvise")
with env.begin(buffers=True) as txn:  # what open and a batch of 256 get
    n = json.loads(bytes(txn.get(b"__manifest__")))["count"]
    txn.get(b"__labels_pieces__"), txn.get(b"__crc32_pieces__")
    for i in random.Random(0).sample(range(n), 256):
        txn.get(b"%010d" % i)
        txn.get(b"__labels__/%010d" % (i // 128)), txn.get(b"__crc32__/%010d" % (i // 128))
print(json.dumps(mapped()))
"""

#: ``pages``: (page cache before, readahead, advice on the mapping), in order.
PAGES_RUNS = [("as packed", "off", "none"), ("as packed", "on", "none"),
              ("as packed", "off", "nohuge"), ("read whole", "off", "none"),
              ("dropped", "off", "none"), ("what the run before read", "off", "none")]


def run_pages(args) -> None:
    """The pages of ``data.mdb`` that a batch's LMDB gets map, by the page
    cache's state and the mapping's advice (plain ``lmdb``, no fastdata),
    for each size in ``--records``; records ``--width`` pixels wide."""
    for n in map(int, args.records.split(",")):
        pages_one(args, n)


def pages_one(args, n: int) -> None:
    import fastdata
    from fastdata.packers.options import PackOptions

    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        out = os.path.join(folder, f"tiny{n}.lmdb")
        fastdata.pack(TinySource(n, args.width), out, options=PackOptions(), progress=False)
        size = os.path.getsize(os.path.join(out, "data.mdb"))
        print(f"{n:,} records of {3 * args.width} B: data.mdb {size / 2**20:.1f} MB")
        for cache, readahead, advice in PAGES_RUNS:  # "as packed" first
            if cache in ("read whole", "dropped"):
                drop_from_cache(out)
                if cache == "read whole":
                    with open(os.path.join(out, "data.mdb"), "rb") as f:
                        while f.read(1 << 20):
                            pass
            result = subprocess.run([sys.executable, "-c", PAGES, out, readahead, advice],
                                    capture_output=True, text=True, check=True)
            r = json.loads(result.stdout)
            print(f"page cache {cache}, readahead {readahead}, advice {advice}: Rss "
                  f"{r.get('Rss', 0) / 1024:.1f} MB, PMD-mapped "
                  f"{r.get('FilePmdMapped', 0) / 1024:.1f} MB")


def add_parser(sub) -> None:
    opened = sub.add_parser("open", help="pack tiny records, open, read the first batch")
    opened.add_argument("--sizes", default="200000,2000000")
    opened.add_argument("--format", default="tfrecord",
                        help=f"formats, comma-separated ({', '.join(OPEN_FORMATS)})")
    opened.add_argument("--dir", default=None, help="where to pack (default: the temp folder)")
    pages = sub.add_parser("pages", help="LMDB pages a batch maps, by page cache state")
    pages.add_argument("--records", default="2000000", help="sizes, comma-separated")
    pages.add_argument("--width", type=int, default=1,
                       help="pixels per record (3 bytes each; default 1)")
    pages.add_argument("--dir", default=None, help="where to pack (default: the temp folder)")

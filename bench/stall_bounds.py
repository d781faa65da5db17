"""Runs made to be bound by one stage each: the stall meter's figures, then its advice applied.

Each run reads a dataset made so that one stage of loading limits it, beside a
stand-in training step (``time.sleep(STEP ms)`` after each batch), and prints
what ``fastdata.stats(loader)`` says of the measured epochs: the share of the
loop's time spent waiting for batches, the batch-ready p95, each stage's share,
how busy the producers were, the bound it names and its line of advice. Then it
does what that line names and measures again:

- fetch: the photos as 64x64 JPEGs (4 times as many records as the other
  runs) in tar shards of 16, served on 127.0.0.1 by bench/slow_server.py, which
  holds each request DELAY ms (Range honoured; its own process), read as a
  stream (``open_dataset(url, streaming=True)``) with the loader's defaults;
  after: ``read_ahead=16`` (the default is 4);
- decode: generated photos (``fastdata synth --kind photos``) in LMDB, decoded
  to 224x224 on one decode thread (``decode_threads=1``, ``num_workers=0``);
  after: the same photos packed with ``fastdata pack --resize 224 --center-crop``;
- collate: 224x224 raw records (``--encoding raw``: nothing to decode), a
  per-sample transform that makes float32 tensors, one worker process, so
  torch's collate stacks floats into shared memory; after: no transform,
  mean/std given to ``fastdata.loader()``, which normalises whole batches, at
  the loader's own choice of workers (none: a background thread), and again
  with the one worker process kept ("kept": the normalising then runs in the
  loop's thread);
- read: the same raw records, their file's pages dropped from the page cache
  (``posix_fadvise(DONTNEED)`` on this file only; no root needed) just before
  the open, one epoch; after: ``cache="ram"`` (filled at the open, from the
  cold file: the open's time is printed).

Every (run, variant) runs in a fresh process with ``torch.set_num_threads(1)``
(``--torch-threads``): with torch's two intra-op threads on a busy 2-core
machine, a batch's float conversion on the CPU stalls for milliseconds and the
meter rightly names ``convert``, which is not what these runs are about. One
warm-up epoch (none for read), then the stats are reset and ``--epochs``
epochs measured. Batches of 32, shuffled, seed 0.

    python bench/stall_bounds.py [--quick] [--runs fetch,decode,collate,read]
                                 [--photos 256] [--copies 4] [--delay-ms 100]
                                 [--epochs 2] [--step-ms RUN=MS,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time

from slow_server import start_server  # bench/, beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
BATCH = 32
#: Each run: the training step's stand-in (ms per batch) and what the fix is.
RUNS = {
    "fetch": {"step_ms": 5, "fix": "read_ahead=16 (default 4)"},
    "decode": {"step_ms": 25, "fix": "fastdata pack --resize 224 --center-crop"},
    "collate": {"step_ms": 12, "fix": "no float transform; mean/std to fastdata.loader()"},
    "read": {"step_ms": 12, "fix": "cache='ram'"},
}
#: Measured besides before and after: (run, variant) -> what it is.
EXTRA = {("collate", "kept"): "the same fix, num_workers=1 kept"}
#: The fetch run: records per tar shard, and its records per photo against the others'.
FETCH_SHARD = 16
FETCH_COPIES = 4
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# --- the page cache (the read run) --------------------------------------------------------

def _files(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "*"))) if os.path.isdir(path) else [path]


def drop_pages(path: str) -> None:
    """Drop this dataset's pages from the page cache (its files only; no root)."""
    for name in _files(path):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_share(path: str) -> float | None:
    """The share of the dataset's pages in the page cache (mincore), None where unknown."""
    libc, resident, total = ctypes.CDLL(None, use_errno=True), 0, 0
    for name in _files(path):
        size = os.path.getsize(name)
        if size == 0:
            continue
        pages = -(-size // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(pages)
        with open(name, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
            start = ctypes.c_char.from_buffer(mm)        # a copy-on-write map: nothing written
            failed = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)),
                                  ctypes.c_size_t(size), vec)
            del start
        if failed:
            return None
        resident += sum(b & 1 for b in vec.raw)
        total += pages
    return resident / total if total else None


# --- one run, in its own process ------------------------------------------------------------

def to_float(image):
    """The per-sample transform of the collate run: a float32 tensor in [0, 1]."""
    return image.float().div_(255)


def open_run(run: str, variant: str, data: str, url: str | None):
    """(dataset, loader keywords, what was done before opening) of one run."""
    import fastdata

    order = fastdata.Order(shuffle=True, seed=0, batch_size=BATCH)
    after = variant == "after"
    notes: dict = {}
    if run == "fetch":
        options = {"read_ahead": 16} if after else {}          # the default: 4
        return fastdata.open_dataset(url, streaming=True, order=order, **options), {}, notes
    if run == "decode":
        path = os.path.join(data, "resized.lmdb" if after else "photos.lmdb")
        ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(224, 224)),
                                   decode_threads=1, order=order)
        return ds, {"num_workers": 0}, notes
    path = os.path.join(data, "raw.lmdb")
    if run == "collate":
        if variant == "before":
            return fastdata.open_dataset(path, transform=to_float, order=order), \
                {"num_workers": 1}, notes
        # After: the loader's own choice of workers ("kept": the 1 worker of before).
        return (fastdata.open_dataset(path, order=order),
                {"mean": MEAN, "std": STD, **({"num_workers": 1} if variant == "kept" else {})},
                notes)
    drop_pages(path)                                          # read: a cold page cache
    notes["resident_before_open"] = resident_share(path)
    start = time.perf_counter()
    ds = fastdata.open_dataset(path, order=order, progress=False,
                               **({"cache": "ram"} if after else {}))
    notes["open_s"] = time.perf_counter() - start
    return ds, {"num_workers": 0}, notes


def child(run: str, variant: str, data: str, url: str | None, epochs: int,
          threads: int) -> dict:
    """One (run, variant): the meter's figures over the measured epochs."""
    import torch

    import fastdata

    if threads:
        torch.set_num_threads(threads)
    if url:
        os.environ["FASTDATA_CACHE_DIR"] = tempfile.mkdtemp(prefix="stall-bounds-cache-")
    step = RUNS[run]["step_ms"] / 1000
    ds, options, notes = open_run(run, variant, data, url)
    loader = fastdata.loader(ds, **options)
    warmup = 0 if run == "read" else 1
    start, batches = time.perf_counter(), 0
    for epoch in range(warmup + epochs):
        if epoch == warmup:
            fastdata.stats(loader, reset=True)
            start, batches = time.perf_counter(), 0
        for _images, _labels in loader:
            time.sleep(step)
            batches += epoch >= warmup
    seconds = time.perf_counter() - start
    s = fastdata.stats(loader)
    out = {"run": run, "variant": variant, "step_ms": RUNS[run]["step_ms"],
           "choice": str(getattr(loader, "choice", "")), "epochs": epochs,
           "batches": batches, "seconds": seconds, **notes}
    out.update({k: s[k] for k in ("data_wait", "wait_s", "batch_ready_ms", "stages", "workers",
                                  "requests", "cache", "bound", "advice")})
    if url:
        shutil.rmtree(os.environ["FASTDATA_CACHE_DIR"], ignore_errors=True)
    return out


# --- the data -------------------------------------------------------------------------------

def child_env() -> dict:
    """This checkout importable, and loopback never through an HTTP proxy."""
    return dict(os.environ,
                PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH")))),
                NO_PROXY=",".join(filter(None, (os.environ.get("NO_PROXY"), "127.0.0.1"))))


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "fastdata.cli", *args, "--no-progress"],
                   check=True, env=child_env(), stdout=subprocess.DEVNULL)


def linked(folder: str, out: str, copies: int) -> None:
    """``out``: the class folders of ``folder``, each file ``copies`` times (hard links)."""
    for cls in sorted(os.listdir(folder)):
        os.makedirs(os.path.join(out, cls))
        for name in sorted(os.listdir(os.path.join(folder, cls))):
            for k in range(copies):
                os.link(os.path.join(folder, cls, name), os.path.join(out, cls, f"{k}-{name}"))


def thumbnails(folder: str, out: str, side: int = 64) -> None:
    """Each photo of ``folder`` cut to its centre square and shrunk to ``side`` px
    (JPEG, quality 90): the fetch run's small records."""
    from PIL import Image, ImageOps

    for cls in sorted(os.listdir(folder)):
        os.makedirs(os.path.join(out, cls))
        for name in sorted(os.listdir(os.path.join(folder, cls))):
            with Image.open(os.path.join(folder, cls, name)) as im:
                im.draft("RGB", (2 * side, 2 * side))
                small = ImageOps.fit(im.convert("RGB"), (side, side))
            small.save(os.path.join(out, cls, name), quality=90)


def make_data(tmp: str, photos: int, copies: int, runs: list[str]) -> dict:
    """The packs the runs read: the photos ``copies`` times each (the fetch
    run's thumbnails ``FETCH_COPIES`` times as many)."""
    from fastdata.demo import synthesize

    start = time.perf_counter()
    synth = os.path.join(tmp, "synth")
    synthesize(synth, kind="photos", n=photos, seed=0, progress=False)
    made = {"synth_s": time.perf_counter() - start, "records": photos * copies,
            "fetch_records": photos * copies * FETCH_COPIES}
    start = time.perf_counter()
    if set(runs) & {"decode", "collate", "read"}:
        src = os.path.join(tmp, "src")
        linked(synth, src, copies)
        if "decode" in runs:
            cli("pack", src, os.path.join(tmp, "photos.lmdb"))
        # The decode run's fix, and the 224x224 pixels of the raw records.
        cli("pack", src, os.path.join(tmp, "resized.lmdb"), "--resize", "224", "--center-crop")
        if "collate" in runs or "read" in runs:
            cli("convert", os.path.join(tmp, "resized.lmdb"), os.path.join(tmp, "raw.lmdb"),
                "--encoding", "raw")
    if "fetch" in runs:
        thumbnails(synth, os.path.join(tmp, "thumbs"))
        linked(os.path.join(tmp, "thumbs"), os.path.join(tmp, "thumbs-src"),
               copies * FETCH_COPIES)
        os.makedirs(os.path.join(tmp, "www"))
        cli("pack", os.path.join(tmp, "thumbs-src"), os.path.join(tmp, "www", "d-%06d.tar"),
            "--shard-size", str(FETCH_SHARD))
    made["pack_s"] = time.perf_counter() - start
    return made


# --- the parent: runs, figures, table -------------------------------------------------------

def run_child(run: str, variant: str, args, tmp: str, url: str | None) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", run, variant,
               "--data", tmp, "--epochs", str(args.epochs),
               "--torch-threads", str(args.torch_threads), "--step-ms", args.step_ms]
    if url:
        command += ["--url", url]
    done = subprocess.run(command, check=False, capture_output=True, text=True,
                          env=child_env(), timeout=600)
    if done.returncode != 0:
        sys.exit(f"stall_bounds: {run} {variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(runs: list[str], args, tmp: str, url: str | None) -> dict:
    """Each run's variants, each in a process of its own, printed as they end."""
    results: dict = {}
    for run in runs:
        print(f"\n{run}: step {RUNS[run]['step_ms']:g} ms per batch"
              + (f", server delay {args.delay_ms:g} ms per request" if run == "fetch" else "")
              + f"; fix: {RUNS[run]['fix']}", flush=True)
        results[run] = {}
        for variant in ("before", "after", *(v for name, v in EXTRA if name == run)):
            r = run_child(run, variant, args, tmp, url if run == "fetch" else None)
            print(describe(r), flush=True)
            results[run][variant] = r
    return results


def describe(r: dict) -> str:
    """A run's figures in three lines."""
    stages = ", ".join(f"{name} {v['share']:.0%} ({v['seconds']:.2f} s)" for name, v in
                       sorted(r["stages"].items(), key=lambda kv: -kv[1]["seconds"]))
    ready = r["batch_ready_ms"] or {}
    workers = r["workers"]
    busy = "-" if workers["utilisation"] is None else f"{workers['utilisation']:.0%}"
    line = (f"  {r['variant']:6} data wait {r['data_wait']:.0%} ({r['wait_s']:.2f} s), "
            f"batch ready p50/p95/p99 "
            f"{ready.get('p50', 0):.1f}/{ready.get('p95', 0):.1f}/{ready.get('p99', 0):.1f} ms, "
            f"{r['batches']} batches in {r['seconds']:.2f} s; stages: {stages}; producers "
            f"{workers['count']} ({busy} busy); bound: {r['bound']}")
    extra = []
    if r["requests"]["count"]:
        extra.append(f"requests {r['requests']['count']} "
                     f"({r['requests']['bytes'] / 1e6:.1f} MB)")
    if r["cache"]["ram_records"]:
        extra.append(f"records from the RAM cache {r['cache']['ram_records']}")
    if "open_s" in r:
        resident = r.get("resident_before_open")
        extra.append(f"open {r['open_s']:.2f} s, pages in the page cache before it "
                     f"{'unknown' if resident is None else f'{resident:.0%}'}")
    if extra:
        line += "\n         " + "; ".join(extra)
    return line + f"\n         advice: {r['advice']}"


def print_table(results: dict) -> None:
    """One row per fix: the bound, data wait and p95 before -> after, the advice before."""
    print("\n| run | bound before -> after | data wait before -> after "
          "| p95 batch ready (ms) before -> after | measured s before -> after "
          "| fix applied | advice before |")
    print("|---|---|---|---|---|---|---|")
    for run, variants in results.items():
        before = variants["before"]
        advice = before["advice"].split(": ", 1)[-1] if before["bound"] else before["advice"]
        for variant, after in variants.items():
            if variant == "before":
                continue
            name, fix = (run, RUNS[run]["fix"]) if variant == "after" else \
                (f"{run} ({variant})", EXTRA[(run, variant)])
            p95 = [r["batch_ready_ms"]["p95"] for r in (before, after)]
            print(f"| {name} | {before['bound']} -> {after['bound']} | "
                  f"{before['data_wait']:.0%} -> {after['data_wait']:.0%} | "
                  f"{p95[0]:.1f} -> {p95[1]:.1f} | "
                  f"{before['seconds']:.2f} -> {after['seconds']:.2f} | {fix} | {advice} |")


def machine() -> str:
    model = "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                     model)
    return f"{os.cpu_count()} cores, {model}, load average {os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Runs: " + "; ".join(f"{k}: step {v['step_ms']} ms, fix {v['fix']}"
                                    for k, v in RUNS.items()))
    parser.add_argument("--quick", action="store_true",
                        help="64 photos (8 records each) and one measured epoch (about 40 s)")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help="which runs, comma-separated (default: all)")
    parser.add_argument("--photos", type=int, default=256, help="generated photos")
    parser.add_argument("--copies", type=int, default=4,
                        help="records per photo (hard links in the source folder)")
    parser.add_argument("--delay-ms", type=float, default=100,
                        help="the HTTP server's delay per request (fetch)")
    parser.add_argument("--epochs", type=int, default=2, help="measured epochs per run")
    parser.add_argument("--step-ms", default="",
                        help="other steps than the runs' own, e.g. fetch=10,read=20")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch.set_num_threads in each run (0: torch's default)")
    parser.add_argument("--json", help="write every run's figures to this file")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        for part in filter(None, (p.strip() for p in args.step_ms.split(","))):
            run, ms = part.split("=")
            RUNS[run.strip()]["step_ms"] = float(ms)
    except (ValueError, KeyError):
        parser.error(f"--step-ms takes RUN=MS pairs of the runs {', '.join(RUNS)}, "
                     f"not {args.step_ms!r}")
    if args.child:
        print(json.dumps(child(*args.child, args.data, args.url, args.epochs,
                               args.torch_threads)))
        return
    if args.quick:
        args.photos, args.copies, args.epochs = 64, 8, 1
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        parser.error(f"unknown runs: {', '.join(unknown)} (choose from {', '.join(RUNS)})")
    began = time.perf_counter()
    print(f"machine: {machine()}; torch threads per run: {args.torch_threads or 'default'}")
    server = None
    with tempfile.TemporaryDirectory(prefix="stall-bounds-") as tmp:
        made = make_data(tmp, args.photos, args.copies, runs)
        print(f"data: {args.photos} generated photos x {args.copies} = {made['records']} "
              f"records (fetch: {made['fetch_records']} of 64x64 in tar shards of "
              f"{FETCH_SHARD}); synth {made['synth_s']:.1f} s, packs {made['pack_s']:.1f} s; "
              f"batch {BATCH}, shuffled; {args.epochs} measured epoch(s) per run")
        url = None
        try:
            if "fetch" in runs:
                server, port = start_server(os.path.join(tmp, "www"), args.delay_ms)
                url = f"http://127.0.0.1:{port}/d.tar.fastdata.json"
            results = measure(runs, args, tmp, url)
        finally:
            if server is not None:
                server.kill()
                server.wait()
    print_table(results)
    print(f"\n{time.perf_counter() - began:.0f} s in all")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": machine(), "args": vars(args), "data": made,
                       "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()

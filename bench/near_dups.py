"""Near-duplicates (``fastdata dedup --near``): how well planted copies are
found, and what the hash index costs at 10^5-10^7 records.

    python bench/near_dups.py planted              # precision/recall per threshold
    python bench/near_dups.py planted --flip       # mirrored copies counted too
    python bench/near_dups.py index --sizes 100000,1000000
    python bench/near_dups.py scale --sizes 1000000,10000000 --repeat 3

``planted`` makes ``--n`` photo-like JPEGs (fastdata's demo generator), then
for ``--originals`` of them one copy of each kind: resized to half, re-encoded
at quality 40, cropped by 3% per side, and mirrored; packs everything into
LMDB and runs ``fastdata.dedup(near=True)`` at several thresholds. A pair
reported is right when both records come from one original; recall is per
kind of copy (found in its original's group). The hashing rate is printed.

``index`` times the index alone (``fastdata.near_duplicates.near_pairs``) on
synthetic hashes: uniformly random 63-bit values, 1% of them near copies of
another (0 to the threshold's bits changed), and checks that every planted
pair is found. Real hashes cluster more than uniform ones, so real buckets
are fuller: these are the index's best case, the planted run its real one.

``scale`` runs the job as a job runner does, one fresh process per size and
run: synthetic hashes (the same kind, 1% planted copies, each hash a function
of its position, so nothing of size n is held) written as pieces of
``--piece`` records, then ``fastdata.near_duplicates.near_pairs_from_runs``
on ``--workers`` local processes. It prints the wall time, the wall and CPU
time per record (the job's process and its workers), the peak resident
memory (VmHWM) of the job's process and of its largest worker, the ball rows
and the pairs of rows checked per record, and whether every planted pair was
found; then each size against the first: time per record and peak memory per
added record. With ``--repeat``, the fastest of several runs per size (on a
shared machine the wall time varies by 2x). Disk: the index runs take 16
bytes per record and table (0.5 GB at 10^7 records, threshold 8).
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

KINDS = ("resized", "reencoded", "cropped", "mirrored")


def _copies(path: str) -> dict[str, bytes]:
    from PIL import Image

    image = Image.open(path).convert("RGB")
    w, h = image.size

    def jpeg(im, quality=90):
        out = io.BytesIO()
        im.save(out, "JPEG", quality=quality)
        return out.getvalue()

    cut = (int(w * .03), int(h * .03), w - int(w * .03), h - int(h * .03))
    return {"resized": jpeg(image.resize((w // 2, h // 2), Image.BILINEAR)),
            "reencoded": jpeg(image, 40), "cropped": jpeg(image.crop(cut)),
            "mirrored": jpeg(image.transpose(Image.FLIP_LEFT_RIGHT))}


def planted(args) -> None:
    import fastdata
    from fastdata.demo import synthesize

    work = tempfile.mkdtemp(prefix="near-")
    try:
        src = os.path.join(work, "src")
        synthesize(src, kind="photos", n=args.n, seed=1, progress=False)
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs)
        rng = np.random.default_rng(0)
        originals = sorted(rng.choice(len(files), args.originals, replace=False).tolist())
        origin = {}  # key -> original key (itself for originals)
        for f in files:
            origin[os.path.relpath(f, src)] = os.path.relpath(f, src)
        for k in originals:
            for kind, data in _copies(files[k]).items():
                key = os.path.relpath(files[k], src).replace(".jpg", f"-{kind}.jpg")
                with open(os.path.join(src, key), "wb") as out:
                    out.write(data)
                origin[key] = os.path.relpath(files[k], src)
        out = os.path.join(work, "d.lmdb")
        fastdata.pack(src, out, progress=False)
        n = len(origin)
        print(f"{n} images: {len(files)} photos, {args.originals} of them copied 4 ways "
              f"({', '.join(KINDS)}); flip={args.flip}")
        print("threshold  pairs  precision  " + "  ".join(f"{k:>9}" for k in KINDS))
        for threshold in args.thresholds:
            start = time.perf_counter()
            report = fastdata.dedup(out, near=True, threshold=threshold, flip=args.flip,
                                    progress=False)
            seconds = time.perf_counter() - start
            pairs = right = 0
            group_of = {}
            for number, g in enumerate(report.groups):
                keys = [m.key for m in g.members]
                for a, b in itertools.combinations(keys, 2):
                    pairs += 1
                    right += origin[a] == origin[b]
                group_of.update((key, number) for key in keys)
            recall = []
            for kind in KINDS:
                copies = [k for k in origin if k.endswith(f"-{kind}.jpg")]
                found = sum(k in group_of and group_of.get(origin[k]) == group_of[k]
                            for k in copies)
                recall.append(found / len(copies))
            precision = right / pairs if pairs else 1.0
            print(f"{threshold:>9}  {pairs:>5}  {precision:>9.3f}  "
                  + "  ".join(f"{r:>9.3f}" for r in recall)
                  + f"   ({seconds:.1f} s, {n / seconds:,.0f} img/s with the pass)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def index(args) -> None:
    from fastdata.near_duplicates import near_pairs

    rng = np.random.default_rng(0)
    for n in args.sizes:
        hashes = rng.integers(0, 1 << 63, n, dtype=np.uint64)
        planted = n // 100
        a = rng.choice(n, planted, replace=False)
        b = rng.choice(np.setdiff1d(np.arange(n), a), planted, replace=False)
        for i, j in zip(a.tolist(), b.tolist()):
            flips = rng.choice(63, int(rng.integers(0, args.threshold + 1)), replace=False)
            value = int(hashes[i])
            for bit in flips.tolist():
                value ^= 1 << bit
            hashes[j] = value
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        pairs = near_pairs(hashes, args.threshold)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        found = {(int(x), int(y)) for x, y in pairs[:, :2].tolist()}
        missed = sum((min(i, j), max(i, j)) not in found for i, j in zip(a.tolist(), b.tolist()))
        print(f"{n:>9,} records, threshold {args.threshold}: {seconds:6.2f} s, "
              f"{len(pairs):,} pairs ({planted:,} planted, {missed} missed), "
              f"peak RSS {peak / 1024:,.0f} MB (+{(peak - before) / 1024:,.0f} MB)")


_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9),
        np.uint64(0x94D049BB133111EB))
_SALT = {"hash": np.uint64(1), "copy": np.uint64(2), "source": np.uint64(3),
         "bits": np.uint64(4)}


def _mix(x: np.ndarray, salt: str) -> np.ndarray:
    """splitmix64 of each value (a uniformly random uint64 per position)."""
    x = (x ^ (_SALT[salt] << np.uint64(40))) + _MIX[0]
    x = (x ^ (x >> np.uint64(30))) * _MIX[1]
    x = (x ^ (x >> np.uint64(27))) * _MIX[2]
    return x ^ (x >> np.uint64(31))


def synthetic(start: int, count: int, n: int, threshold: int):
    """The hashes of records ``start`` .. ``start + count`` of ``n``: uniform
    63-bit values, and for 1% of the records a copy of another record's
    (one that is no copy) with 0 to ``threshold`` bits changed. Returns the
    hashes and the planted pairs (i, j) with i < j."""
    position = np.arange(start, start + count, dtype=np.uint64)
    hashes = _mix(position, "hash") >> np.uint64(1)
    source = _mix(position, "source") % np.uint64(n)
    copy = (_mix(position, "copy") % np.uint64(100) == 0) & \
        (_mix(source, "copy") % np.uint64(100) != 0)
    rng = np.random.default_rng(start)
    k = int(copy.sum())
    changed = (_mix(position[copy], "bits") % np.uint64(threshold + 1)).astype(np.int64)
    bits = np.argsort(rng.random((k, 63)), axis=1)  # distinct bits, random order
    chosen = np.arange(63)[None, :] < changed[:, None]
    flips = np.bitwise_or.reduce(np.where(chosen, np.uint64(1) << bits.astype(np.uint64),
                                          np.uint64(0)), axis=1) if k else np.zeros(0, np.uint64)
    hashes[copy] = (_mix(source[copy], "hash") >> np.uint64(1)) ^ flips
    a, b = source[copy].astype(np.int64), position[copy].astype(np.int64)
    return hashes, np.stack([np.minimum(a, b), np.maximum(a, b)], 1)


def _peak_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _children() -> list[int]:
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        found.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def scale_write(args) -> None:
    """The pieces of hashes of one size, and the planted pairs, into ``--work``."""
    from fastdata.near_groups import write_hashes

    for k, at in enumerate(range(0, args.n, args.piece)):
        hashes, pairs = synthetic(at, min(args.piece, args.n - at), args.n, args.threshold)
        write_hashes(os.path.join(args.work, f"hashes-{k:06d}.npy"), hashes, start=at)
        np.save(os.path.join(args.work, f"planted-{k:06d}.npy"), pairs)


def scale_one(args) -> None:
    """One size: the pieces written by another process, then the job in this
    fresh one (so its peak memory is the job's); prints one JSON line."""
    from fastdata.jobs.local_executor import LocalExecutor
    from fastdata.near_duplicates import near_pairs_from_runs

    n = args.n
    work = tempfile.mkdtemp(prefix="near-scale-", dir=args.work)
    start = time.perf_counter()
    subprocess.run([sys.executable, os.path.abspath(__file__), "scale-write", "--n", str(n),
                    "--threshold", str(args.threshold), "--piece", str(args.piece),
                    "--work", work], check=True)
    written = time.perf_counter() - start
    files = sorted(os.path.join(work, f) for f in os.listdir(work) if f.startswith("hashes-"))
    executor = LocalExecutor(args.workers)
    try:
        # CPU time so far (the writer process is a reaped child too).
        before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                      resource.RUSAGE_CHILDREN)]
        start = time.perf_counter()
        found = near_pairs_from_runs(files, os.path.join(work, "job"), args.threshold,
                                     executor=executor)
        seconds = time.perf_counter() - start
        peaks = [_peak_mb()] + [_peak_mb(pid) for pid in _children()]
    finally:
        executor.close()
    # The job's CPU time: this process's, and its workers' (reaped at close).
    cpu = sum(getattr(resource.getrusage(who), field) - getattr(base, field)
              for who, base in zip((resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN), before)
              for field in ("ru_utime", "ru_stime"))
    pairs = np.load(found.path, allow_pickle=False)
    planted = np.concatenate([np.load(os.path.join(work, f)) for f in sorted(os.listdir(work))
                              if f.startswith("planted-")])
    keys = pairs["i"] * n + pairs["j"]
    missed = int((~np.isin(planted[:, 0] * n + planted[:, 1], keys)).sum())
    scheme = found.scheme
    widths = sorted({scheme.width(t) for t in range(len(scheme.tables))})
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({
        "n": n, "seconds": seconds, "cpu": cpu, "written": written, "main_mb": peaks[0],
        "worker_mb": max(peaks[1:], default=0.0), "rows": found.rows, "checked": found.checked,
        "pairs": found.pairs, "planted": len(planted), "missed": missed,
        "scheme": f"{len(scheme.tables)} tables of {'-'.join(map(str, widths))} bits, "
                  f"radius {scheme.radius}"}))


def scale(args) -> None:
    print(f"near_pairs_from_runs, threshold {args.threshold}, {args.workers} worker "
          f"process(es), pieces of {args.piece:,} records; a fresh process per size and "
          f"run, the fastest of {args.repeat} (CPU: the least)")
    print(f"{'records':>12}  {'wall s':>7}  {'us/record':>9}  {'CPU us/rec':>10}  "
          f"{'peak MB job/worker':>18}  {'rows/rec':>8}  {'checked/rec':>11}  {'planted':>8}  "
          f"missed  scheme")
    done = []
    for n in args.sizes:
        command = [sys.executable, os.path.abspath(__file__), "scale-one", "--n", str(n),
                   "--threshold", str(args.threshold), "--workers", str(args.workers),
                   "--piece", str(args.piece)] + (["--work", args.work] if args.work else [])
        runs = [json.loads(subprocess.run(command, check=True, capture_output=True, text=True)
                           .stdout.strip().splitlines()[-1]) for _ in range(args.repeat)]
        r = min(runs, key=lambda run: run["seconds"])  # the least disturbed run
        r["cpu"] = min(run["cpu"] for run in runs)
        done.append(r)
        print(f"{n:>12,}  {r['seconds']:>7.1f}  {r['seconds'] / n * 1e6:>9.2f}  "
              f"{r['cpu'] / n * 1e6:>10.2f}  "
              f"{r['main_mb']:>8.0f} / {r['worker_mb']:>7.0f}  {r['rows'] / n:>8.1f}  "
              f"{r['checked'] / n:>11.1f}  {r['planted']:>8,}  {r['missed']:>6}  {r['scheme']}",
              flush=True)
    first = done[0]
    for r in done[1:]:
        ratio = (r["seconds"] / r["n"]) / (first["seconds"] / first["n"])
        cpu = (r["cpu"] / r["n"]) / (first["cpu"] / first["n"])
        peak = max(r["main_mb"], r["worker_mb"]) - max(first["main_mb"], first["worker_mb"])
        print(f"{r['n']:,} vs {first['n']:,}: time per record x{ratio:.2f} (CPU x{cpu:.2f}); "
              f"peak memory {peak:+.0f} MB, {peak * 2**20 / (r['n'] - first['n']):+.2f} B per "
              "added record")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("planted")
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--originals", type=int, default=50)
    p.add_argument("--flip", action="store_true")
    p.add_argument("--thresholds", type=lambda s: [int(x) for x in s.split(",")],
                   default=[4, 6, 8, 10, 12])
    p.set_defaults(run=planted)
    q = sub.add_parser("index")
    q.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[100_000, 1_000_000])
    q.add_argument("--threshold", type=int, default=8)
    q.set_defaults(run=index)
    for name, run in (("scale", scale), ("scale-one", scale_one), ("scale-write", scale_write)):
        r = sub.add_parser(name)
        r.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                       default=[1_000_000, 10_000_000])
        r.add_argument("--n", type=int, default=1_000_000)
        r.add_argument("--threshold", type=int, default=8)
        r.add_argument("--workers", type=int, default=2)
        r.add_argument("--piece", type=int, default=1 << 18)
        r.add_argument("--repeat", type=int, default=1, help="runs per size (the fastest "
                                                               "is shown)")
        r.add_argument("--work", default=None, help="a folder for the runs (default: the "
                                                     "system's temporary folder)")
        r.set_defaults(run=run)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())

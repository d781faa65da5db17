"""What ``pack --resume`` saves: a pack killed (SIGKILL) at a given fraction of
its pieces, then resumed, against the same pack uninterrupted.

    python bench/pack_resume.py [--photos 1200] [--format tar] [--at 0.6] [--resize 256]

Generates ImageNet-like photos, packs them with ``--resize`` (the CPU-bound
case a resume is for) into the format (tar/tfrecord: shards of --shard-size;
lmdb/hdf5: pieces of 1000 images or 64 MB of source bytes), once uninterrupted, then again killed with
SIGKILL once the journal holds --at of the pieces, then ``--resume``. Prints
each time and the resume's cost as a fraction of the full pack, and checks the
resumed output against the uninterrupted one.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import signal
import subprocess
import sys
import tempfile
import time

OUTPUTS = {"tar": "out-%06d.tar", "tfrecord": "out-%05d.tfrecord", "lmdb": "out.lmdb",
           "hdf5": "out.h5"}


def _pack_command(src: str, out: str, args, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "fastdata.cli", "pack", src, out, "--resize", str(args.resize),
               "--no-progress"]
    if args.format in ("tar", "tfrecord"):
        command += ["--shard-size", str(args.shard_size)]
    if args.workers:
        command += ["--workers", str(args.workers)]
    return command + list(extra)


def _state(folder: str) -> str | None:
    return next((os.path.join(folder, n) for n in os.listdir(folder)
                 if n.endswith(".pack-state")), None)


def _journaled(folder: str) -> int:
    state = _state(folder)
    try:
        with open(os.path.join(state, "journal.jsonl"), encoding="utf-8") as f:
            return sum(1 for line in f if line.endswith("\n"))
    except (TypeError, FileNotFoundError):
        return 0


def _planned(folder: str) -> int | None:
    """The number of pieces in the plan the pack saved (None: not saved yet)."""
    import json

    state = _state(folder)
    try:
        with open(os.path.join(state, "plan.json"), encoding="utf-8") as f:
            return len(json.load(f)["pieces"])
    except (TypeError, FileNotFoundError, ValueError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=1200)
    parser.add_argument("--format", choices=sorted(OUTPUTS), default="tar")
    parser.add_argument("--shard-size", type=int, default=50)
    parser.add_argument("--resize", type=int, default=256)
    parser.add_argument("--at", type=float, default=0.6, help="fraction of pieces done at the kill")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()

    from fastdata.demo import synthesize

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        synthesize(src, kind="photos", n=args.photos, seed=0)
        full_dir, resumed_dir = os.path.join(tmp, "full"), os.path.join(tmp, "resumed")
        os.makedirs(full_dir)
        os.makedirs(resumed_dir)
        name = OUTPUTS[args.format]

        start = time.perf_counter()
        subprocess.run(_pack_command(src, os.path.join(full_dir, name), args), check=True,
                       stdout=subprocess.DEVNULL)
        full = time.perf_counter() - start
        start = time.perf_counter()
        proc = subprocess.Popen(_pack_command(src, os.path.join(resumed_dir, name), args),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pieces = None
        while proc.poll() is None and pieces is None:
            pieces = _planned(resumed_dir)
            time.sleep(0.005)
        kill_at = max(1, round(args.at * (pieces or 1)))
        while proc.poll() is None and _journaled(resumed_dir) < kill_at:
            time.sleep(0.01)
        if proc.poll() is not None:
            sys.exit(f"the pack ended before {kill_at} of {pieces} pieces were journaled; "
                     "use more --photos")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_after = time.perf_counter() - start
        done = _journaled(resumed_dir)

        start = time.perf_counter()
        subprocess.run(_pack_command(src, os.path.join(resumed_dir, name), args, "--resume"),
                       check=True, stdout=subprocess.DEVNULL)
        resumed = time.perf_counter() - start

        same = same_output(full_dir, resumed_dir)
        print(f"{args.photos} photos, --resize {args.resize}, {args.format}, {pieces} pieces")
        print(f"  full pack               {full:6.2f} s")
        print(f"  killed after            {killed_after:6.2f} s with {done} of {pieces} pieces "
              f"journaled ({done / pieces:.0%})")
        print(f"  --resume                {resumed:6.2f} s = {resumed / full:.2f} of the full "
              f"pack")
        print(f"  resumed output identical to the uninterrupted one: {same}")


def same_output(a: str, b: str) -> bool:
    """Every file equal, the manifests apart from their time of creation
    (LMDB and HDF5 hold that time inside: their records, keys and manifests)."""
    import json

    import fastdata

    single = [n for n in os.listdir(a) if n.endswith((".lmdb", ".h5"))]
    if single:
        x, y = (fastdata.open_dataset(os.path.join(d, single[0]),
                                      decode=fastdata.Decode(output="bytes")) for d in (a, b))
        mx, my = x.manifest.to_dict(), y.manifest.to_dict()
        mx.pop("created_at")
        my.pop("created_at")
        return (mx == my and x.keys == y.keys
                and all(x[i] == y[i] for i in range(len(x))))

    names = sorted(n for n in os.listdir(a) if not n.startswith("."))
    if names != sorted(n for n in os.listdir(b) if not n.startswith(".")):
        return False
    for name in names:
        pa, pb = os.path.join(a, name), os.path.join(b, name)
        if name.endswith("fastdata.json"):
            ma, mb = (json.load(open(p, encoding="utf-8")) for p in (pa, pb))
            ma.pop("created_at")
            mb.pop("created_at")
            if ma != mb:
                return False
        elif os.path.isdir(pa):
            if not all(filecmp.cmp(os.path.join(pa, f), os.path.join(pb, f), shallow=False)
                       for f in os.listdir(pa) if f != "lock.mdb"):
                return False
        elif not filecmp.cmp(pa, pb, shallow=False):
            return False
    return True


if __name__ == "__main__":
    main()

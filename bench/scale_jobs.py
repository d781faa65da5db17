"""Whole-dataset jobs as the record count grows: wall time and peak memory
per process, on this machine's processes, a local Dask cluster and a local
Ray cluster (2 workers each, started here). Run through ``bench/scale.py
jobs``::

    python bench/scale.py jobs --sizes 1000000,10000000
    python bench/scale.py jobs --sizes 100000,1000000 --executors local,ray --jobs dedup

For each size, a TFRecord dataset of tiny records (12 bytes each, 10,000 per
shard, one record in every 100,003 a copy of the one before it: planted
duplicates) is written once by the format's writer. Then for each executor
a fresh cluster is started, and each job runs in a fresh driver process:

- ``dedup``: ``fastdata.dedup`` (exact), its group count checked against
  the planted copies;
- ``verify``: ``fastdata.ops.verify.verify_dataset``, every record checked;
- ``info``: ``fastdata info --json`` (this machine only: it reads the
  manifest);
- ``pack``: ``fastdata.pack`` of the same records (a Source in memory) into
  TFRecord, its shards' SHA-256 compared across executors.

Peak memory is VmHWM: the driver's own, and the largest of the workers'
(their peaks are reset before each job through ``/proc/PID/clear_refs``;
local workers are the driver's children, read with ``RUSAGE_CHILDREN``).
The growth per record between two sizes is printed for each.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from scale import TinySource  # noqa: E402 (beside this file)
REPO = os.path.dirname(HERE)
#: One record in this many is a copy of the one before it.
PLANT_EVERY = 100_003
JOBS = ("dedup", "verify", "info", "pack")
EXECUTORS = ("local", "dask", "ray")


class PlantedSource(TinySource):
    """``n`` records of 12 bytes (the record's number, with planted copies);
    the rest as ``bench/scale.py``'s TinySource."""

    def __iter__(self):
        from fastdata.packers.source import SourceEntry

        for i in range(self.n):
            yield SourceEntry(key=f"{i:010d}", label=i % 10, data=record_bytes(i),
                              raw_shape=(1, 4, 3))

    def describe(self) -> dict:
        return {"root": None, "files": self.n, "kind": "bench/scale_jobs.py records"}


def record_bytes(i: int) -> bytes:
    if i % PLANT_EVERY == PLANT_EVERY - 1:
        i -= 1  # a copy of the record before it
    return i.to_bytes(12, "little")


def planted_groups(n: int) -> int:
    return n // PLANT_EVERY


def write_dataset(folder: str, n: int) -> str:
    """The dataset of ``n`` records, written by the TFRecord writer alone."""
    from fastdata.formats import get_format
    from fastdata.records import Manifest, Record

    out = os.path.join(folder, f"records{n}.tfrecord")
    if os.path.exists(out + ".fastdata.json"):
        return out  # written by an earlier run into the same --dir
    source = PlantedSource(n)
    writer = get_format("tfrecord").load_writer()(out, shard_size=10_000)
    for i, entry in enumerate(source):
        writer.write(Record(i, entry.key, entry.label, entry.data, "raw"))
    writer.finish(Manifest("tfrecord", n, source.classes, [n // 10] * 10, {}, {}, {}, [],
                           {}, {}, "", ""))
    return out


def _peak(pid: str | int = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))


def _reset_peak(pid: int) -> None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


DRIVER = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
from scale_jobs import PlantedSource, _peak
import fastdata
job, path, n, out = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
cluster = json.loads(sys.argv[6])
base = _peak()
start = time.perf_counter()
if job == "dedup":
    report = fastdata.dedup(path, progress=False, **cluster)
    result = {"groups": len(report.groups)}
elif job == "verify":
    from fastdata.ops.verify import verify_dataset
    checked = verify_dataset(path, progress=False, **cluster)
    result = {"ok": checked.ok, "checked": checked.checked}
elif job == "info":
    import contextlib, io
    from fastdata.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        main(["info", path, "--json"], standalone_mode=False)
    result = {}
else:
    options = fastdata.PackOptions(shard_size=10_000, workers=cluster.pop("workers", None))
    fastdata.pack(PlantedSource(n), out, options=options, progress=False, **cluster)
    result = {}
seconds = time.perf_counter() - start
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "base": base, "peak": _peak(), "children": children,
                  **result}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def cluster(kind: str, staging: str):
    """(options for the job, the workers' pids) of a fresh cluster of ``kind``."""
    env_before = dict(os.environ)
    os.environ["FASTDATA_STAGING_DIR"] = staging
    try:
        if kind == "local":
            yield {"workers": 2}, lambda: []
        elif kind == "dask":
            import distributed as dd

            with dd.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                 host="127.0.0.1", dashboard_address=":0") as c, \
                    dd.Client(c) as client:
                yield ({"scheduler": c.scheduler_address},
                       lambda: list(client.run(os.getpid).values()))
        else:
            sys.path.insert(0, os.path.join(REPO, "tests"))
            from clusters import ray_cluster

            with ray_cluster(_free_port()) as address:
                yield {"ray": address}, _ray_workers
    finally:
        os.environ.clear()
        os.environ.update(env_before)


def _ray_workers() -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any("ray::" in part for part in (p.info.get("cmdline") or ()))]


def run_job(job: str, path: str, n: int, options: dict, workers, out: str) -> dict:
    for pid in workers():
        _reset_peak(pid)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    done = subprocess.run([sys.executable, "-c", DRIVER, HERE, job, path, str(n), out,
                           json.dumps(options)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{job} failed: {done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    peaks = [_peak(pid) for pid in workers() if os.path.exists(f"/proc/{pid}")]
    result["worker_peak"] = max(peaks) if peaks else result["children"]
    return result


def _shards_digest(out: str) -> str:
    folder, stem = os.path.split(out)
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.startswith(os.path.basename(stem).split(".")[0] + "-"):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:16]


def run(sizes: list[int], executors: list[str], jobs: list[str], base: str | None) -> None:
    rows = []
    # With --dir the datasets stay there and a later run takes them again.
    with (contextlib.nullcontext(base) if base else tempfile.TemporaryDirectory()) as folder:
        for n in sizes:
            started = time.perf_counter()
            path = write_dataset(folder, n)
            print(f"{n:,} records written in {time.perf_counter() - started:.0f} s",
                  flush=True)
            for kind in executors:
                staging = tempfile.mkdtemp(dir=folder, prefix=f"staging-{kind}-")
                cleanup = contextlib.ExitStack()
                cleanup.callback(subprocess.run, ["rm", "-rf", staging])
                with cleanup, cluster(kind, staging) as (options, workers):
                    for job in jobs:
                        if job == "info" and kind != "local":
                            continue  # no pieces: nothing runs on a cluster
                        out = os.path.join(folder, f"pack-{kind}-{n}", "out.tfrecord")
                        os.makedirs(os.path.dirname(out), exist_ok=True)
                        r = run_job(job, path, n, options, workers, out)
                        if job == "verify" and not (r["ok"] and r["checked"] == n):
                            raise RuntimeError(f"verify: {r}")
                        if job == "dedup" and r["groups"] != planted_groups(n):
                            raise RuntimeError(f"dedup found {r['groups']} groups, "
                                               f"{planted_groups(n)} planted")
                        if job == "pack":
                            r["shards"] = _shards_digest(out)
                            subprocess.run(["rm", "-rf", os.path.dirname(out)])
                        rows.append({"records": n, "executor": kind, "job": job, **r})
                        print(_line(rows[-1]), flush=True)
    _growth(rows)
    print(json.dumps(rows))


def _line(r: dict) -> str:
    extra = f", groups {r['groups']}" if "groups" in r else \
        f", checked {r['checked']:,}" if "checked" in r else \
        f", shards {r['shards']}" if "shards" in r else ""
    return (f"{r['records']:>12,} {r['executor']:<5} {r['job']:<5} {r['seconds']:7.1f} s, "
            f"{r['records'] / r['seconds']:9,.0f} rec/s, driver peak "
            f"{r['peak'] / 2**20:6.1f} MB (+{(r['peak'] - r['base']) / 2**20:.1f}), worker "
            f"peak {r['worker_peak'] / 2**20:6.1f} MB{extra}")


def _growth(rows: list[dict]) -> None:
    print("growth per record between sizes (driver; worker):")
    keyed = {}
    for r in rows:
        keyed.setdefault((r["executor"], r["job"]), []).append(r)
    for (kind, job), runs in keyed.items():
        for a, b in zip(runs, runs[1:]):
            span = b["records"] - a["records"]
            print(f"  {kind:<5} {job:<5} {a['records']:,} -> {b['records']:,}: "
                  f"{(b['peak'] - a['peak']) / span:+.2f} B; "
                  f"{(b['worker_peak'] - a['worker_peak']) / span:+.2f} B")


def add_parser(sub) -> None:
    """``bench/scale.py jobs``'s options."""
    jobs = sub.add_parser("jobs", help="whole-dataset jobs: time and memory per process")
    jobs.add_argument("--sizes", default="1000000,10000000")
    jobs.add_argument("--executors", default=",".join(EXECUTORS))
    jobs.add_argument("--jobs", default=",".join(JOBS))
    jobs.add_argument("--dir", default=None,
                      help="where to write the datasets, kept for the next run (default: "
                           "a temporary folder, removed)")


def run_jobs(args) -> None:
    run([int(float(n)) for n in args.sizes.split(",")], args.executors.split(","),
        args.jobs.split(","), args.dir)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_parser(parser.add_subparsers(dest="what", required=True))
    run_jobs(parser.parse_args())

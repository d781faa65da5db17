"""Whole-dataset jobs as the record count grows: wall time and peak memory
per process, on this machine's processes, a local Dask cluster and a local
Ray cluster (2 workers each, started here; Dask's without its profiler).
Run through ``bench/scale.py jobs``::

    python bench/scale.py jobs --sizes 1000000,10000000
    python bench/scale.py jobs --sizes 100000,1000000 --executors local,ray --jobs dedup
    python bench/scale.py jobs --sizes 100000,1000000 --executors local --jobs join
    python bench/scale.py jobs --sizes 100000,1000000 --jobs subset,append

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
  TFRecord, its shards' SHA-256 compared across executors;
- ``convert``: ``fastdata.convert`` of the dataset ``append`` takes (its
  records are raw pixels, as a pack writes them) into TFRecord: read here,
  prepared and written by the workers; its shards compared as ``pack``'s;
- ``join``: ``fastdata.join`` of a planted JSON Lines table of the records'
  keys (written once beside the dataset: a text and a float column, no row
  for one record in ``JOIN_SKIP_EVERY``, one key in 1,000 the dataset
  lacks) to a copy of the dataset, its matches checked against the plant
  and its column files' SHA-256 compared across executors;
- ``subset``: ``fastdata.subset`` of a copy of the dataset, ``SUBSET_WHERE``
  (a label and a key test) then half of what passes (``fraction=0.5``),
  its count checked and its view file compared across executors;
- ``append``: ``fastdata.append`` (``skip_existing``) of ``n // 10`` new
  records, the first ``n // 1000`` of them keys the dataset holds, to a
  copy of the dataset packed by ``fastdata.pack`` (written once beside the
  other: an append takes the pack's encoding), its counts checked and its
  new part's shards compared across executors.

Peak memory is VmHWM: the driver's own, and the largest of the workers'
(their peaks are reset before each job through ``/proc/PID/clear_refs``,
and read every 0.2 s while it runs: a Ray job's workers are processes of
its own, ended with its driver; local workers are the driver's children,
read with ``RUSAGE_CHILDREN``).
The growth per record between two sizes is printed for each.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from scale_jobs_data import (  # noqa: E402 (beside this file)
    copy_dataset,
    joined_records,
    planted_groups,
    subset_selected,
    write_dataset,
    write_packed,
    write_table,
)
REPO = os.path.dirname(HERE)
JOBS = ("dedup", "verify", "info", "pack", "convert", "join", "subset", "append")
EXECUTORS = ("local", "dask", "ray")


def _peak(pid: str | int = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))


def _reset_peak(pid: int) -> None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


DRIVER = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
from scale_jobs import _peak
from scale_jobs_data import PlantedSource
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
elif job == "join":
    import hashlib
    from fastdata.dataset import history
    done = fastdata.join(path, out, key="key", progress=False, **cluster)
    files = history.versions(path)[-1].columns[-1]["sha256"]
    result = {"matched": done.matched, "unknown": done.missing_in_dataset,
              "columns": hashlib.sha256(json.dumps(files, sort_keys=True).encode())
              .hexdigest()[:16]}
elif job == "subset":
    import hashlib
    from scale_jobs_data import SUBSET_WHERE
    done = fastdata.subset(path, out, where=SUBSET_WHERE, fraction=0.5, seed=1,
                           progress=False, **cluster)
    with open(out, encoding="utf-8") as f:
        view = {k: v for k, v in json.load(f).items() if k not in ("created_at", "sha256")}
    result = {"selected": done.records, "view": hashlib.sha256(json.dumps(
        view, sort_keys=True).encode()).hexdigest()[:16]}
elif job == "append":
    from scale_jobs_data import AppendedSource
    options = fastdata.PackOptions(shard_size=10_000, workers=cluster.get("workers"))
    done = fastdata.append(AppendedSource(n), path, options=options, skip_existing=True,
                           progress=False, **cluster)
    result = {"added": done.added, "skipped": done.skipped_existing, "total": done.records,
              "part": done.part}
elif job == "convert":
    options = fastdata.PackOptions(shard_size=10_000, workers=cluster.pop("workers", None))
    fastdata.convert(path, out, options=options, progress=False, **cluster)
    result = {}
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
            import dask.config
            import distributed as dd

            # A worker's statistical profiler keeps its last 1,000 seconds of
            # profiles (a worker grew about 1 MB per pack of 2*10^5 records
            # with it, nothing without): growth with the job's time, not its
            # records, so it is off where memory is measured.
            with dask.config.set({"distributed.worker.profile.enabled": False}), \
                    dd.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                    host="127.0.0.1", dashboard_address=":0") as c, \
                    dd.Client(c) as client:
                pids = list(client.run(os.getpid).values())
                yield {"scheduler": c.scheduler_address}, lambda: pids
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
    peaks: dict[int, int] = {}
    with subprocess.Popen([sys.executable, "-c", DRIVER, HERE, job, path, str(n), out,
                           json.dumps(options)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as driver:
        reader = threading.Thread(target=lambda: setattr(driver, "outputs",
                                                         driver.communicate()))
        reader.start()
        while reader.is_alive():  # a worker's last reading before it ends is its peak
            _read_peaks(workers, peaks)
            reader.join(0.2)
    _read_peaks(workers, peaks)
    stdout, stderr = driver.outputs
    if driver.returncode != 0:
        raise RuntimeError(f"{job} failed: {stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["worker_peak"] = max(peaks.values()) if peaks else result["children"]
    result["workers_seen"] = len(peaks)
    return result


def _read_peaks(workers, peaks: dict[int, int]) -> None:
    """Each worker's VmHWM now, into ``peaks`` by pid (one that ended is passed over)."""
    for pid in workers():
        with contextlib.suppress(OSError, StopIteration):
            peaks[pid] = max(peaks.get(pid, 0), _peak(pid))


def copy_job(job: str, path: str, n: int, options: dict, workers, folder: str) -> dict:
    """``subset`` or ``append`` run on a copy of ``path`` in ``folder`` (the
    dataset stays as written), its counts checked."""
    copy = copy_dataset(path, folder)
    try:
        r = run_job(job, copy, n, options, workers, os.path.join(folder, "half.fastdata.json"))
        if job == "append":  # the new part's files, but its manifest (it holds the time)
            r["part"] = _shards_digest(r["part"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if job == "subset" and r["selected"] != subset_selected(n):
        raise RuntimeError(f"subset selected {r['selected']:,}, not {subset_selected(n):,}")
    clashes = n // 1000
    if job == "append" and (r["added"], r["skipped"], r["total"]) != \
            (n // 10 - clashes, clashes, n + n // 10 - clashes):
        raise RuntimeError(f"append: {r}, {clashes:,} of {n // 10:,} keys held")
    return r


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
            table = write_table(folder, n) if "join" in jobs else None
            packed = write_packed(folder, n) if {"append", "convert"} & set(jobs) else None
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
                        if job == "join":  # a version of a copy: the dataset stays as written
                            copy = copy_dataset(path, os.path.dirname(out))
                            r = run_job(job, copy, n, options, workers, table)
                            shutil.rmtree(os.path.dirname(out), ignore_errors=True)
                            if (r["matched"], r["unknown"]) != (joined_records(n), n // 1000):
                                raise RuntimeError(f"join: {r}, {joined_records(n)} "
                                                   f"records and {n // 1000} ghosts planted")
                        elif job in ("subset", "append"):
                            r = copy_job(job, path if job == "subset" else packed, n,
                                         options, workers, os.path.dirname(out))
                        else:
                            r = run_job(job, packed if job == "convert" else path, n, options,
                                        workers, out)
                        if job == "verify" and not (r["ok"] and r["checked"] == n):
                            raise RuntimeError(f"verify: {r}")
                        if job == "dedup" and r["groups"] != planted_groups(n):
                            raise RuntimeError(f"dedup found {r['groups']} groups, "
                                               f"{planted_groups(n)} planted")
                        if job in ("pack", "convert"):
                            r["shards"] = _shards_digest(out)
                            subprocess.run(["rm", "-rf", os.path.dirname(out)])
                        rows.append({"records": n, "executor": kind, "job": job, **r})
                        print(_line(rows[-1]), flush=True)
    _growth(rows)
    print(json.dumps(rows))


def _line(r: dict) -> str:
    extra = f", groups {r['groups']}" if "groups" in r else \
        f", checked {r['checked']:,}" if "checked" in r else \
        f", shards {r['shards']}" if "shards" in r else \
        f", matched {r['matched']:,}, columns {r['columns']}" if "matched" in r else \
        f", selected {r['selected']:,}, view {r['view']}" if "selected" in r else \
        f", added {r['added']:,}, skipped {r['skipped']:,}, part {r['part']}" if "added" in r \
        else ""
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

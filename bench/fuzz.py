"""Fuzz fastdata's readers: random damage to every file of a packed dataset.

    python bench/fuzz.py [--trials N] [--formats lmdb,tar,...] [--kinds shard,...] [--json FILE]
    python bench/fuzz.py --fast                     # the test suite's form (tests/test_fuzz.py)
    python bench/fuzz.py --replay tar/index.npy/17  # one trial again, everything about it
    python bench/fuzz.py --hostile [--json FILE]    # names that lead outside the dataset

A small generated source (48 tiny PNGs in 4 classes) is packed once into every
dataset: ``lmdb``, ``hdf5``, one-shard ``tfrecord`` and ``tar``, three-shard
``tfrecord-sharded`` and ``tar-sharded``. A trial copies one of them, damages
one of its files -- a *file kind*: ``data.mdb``, ``h5``, ``shard`` (one of the
shards), ``idx`` (a TFRecord shard's index), ``index.npy``, ``keys.json``,
``manifest`` -- in one random way: flip 1-4 bytes, zero a run, truncate,
append junk, duplicate a run, or (``index.npy`` / ``idx``) copy one record's row
over another's. Then a forked child with a time limit (``--timeout``) and an
address-space limit (``--mem`` GiB beyond its starting size) opens the copy and
reads every record: map-style
(``open_dataset(path, decode=fastdata.Decode(output="bytes"))``),
streaming for tar and TFRecord (``ShardedIterableDataset``), and
``verify_dataset``. Each trial ends as one of:

- ``detected``: a FastDataError was raised, or verify reported damage;
- ``harmless``: every record's bytes, label and key are the original ones and
  verify found nothing (the damage hit bytes nothing reads);
- ``silent-wrong``: no error, but a record's bytes, label or key differ, a
  record is missing or extra, or the class names changed;
- ``crash``: any other exception, or the child died of a signal;
- ``hang``: the time limit passed;
- ``oom``: MemoryError (or ENOMEM) under the memory limit.

The last four are bugs. The table gives counts per dataset and file kind;
``--json`` writes them with up to 10 failing trials per group (the damage done
and what each way of reading said). The engine is ``tests/fuzzing.py``.

``--hostile`` runs the other campaign: datasets and lists whose names lead
outside them (absolute paths, ``..``, URLs of another host, NULs, escapes,
symbolic links out, HDF5 data stored in other files), opened by every command
(open_dataset, streams, verify, info, convert, the RAM cache, DALI, HTTP; pack
for lists) while inotify watches the files outside and a second HTTP server
counts the requests it gets. It prints the counts by field and by command;
every one must be ``refused``. The engine is ``tests/hostile_names.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import fuzzing  # noqa: E402 (after the path)
from fuzzing import DATASETS, FAILURES, FAST, OUTCOMES, Trial  # noqa: E402


def tally(results: list[dict]) -> dict:
    """dataset -> kind -> outcome -> count."""
    counts: dict = {}
    for r in results:
        row = counts.setdefault(r["dataset"], {}).setdefault(r["kind"], dict.fromkeys(OUTCOMES, 0))
        row[r["outcome"]] += 1
    return counts


def failures(results: list[dict], limit: int = 10) -> list[dict]:
    """Up to ``limit`` failing trials per (dataset, kind, outcome)."""
    seen: dict = {}
    out = []
    for r in results:
        if r["outcome"] in FAILURES:
            group = (r["dataset"], r["kind"], r["outcome"])
            seen[group] = seen.get(group, 0) + 1
            if seen[group] <= limit:
                out.append(r)
    return out


def explain(result: dict) -> str:
    """One line on why a trial ended as it did."""
    if result["outcome"] == "hang":
        return f"still running after {result['seconds']:.0f} s"
    if result["steps"] is None:
        last = result["output"].strip().splitlines()[-1:] or [""]
        return f"the child died (exit code {result['exitcode']}): {last[0][:200]}"
    return next((f"{step}: {detail}" for step, (status, detail) in result["steps"].items()
                 if status == result["outcome"]), "")


def table(counts: dict) -> str:
    """Counts per dataset and file kind, and the totals."""
    head = f"{'dataset':<17} {'file':<10} {'trials':>6} " + " ".join(f"{o:>12}" for o in OUTCOMES)
    lines = [head, "-" * len(head)]
    totals = dict.fromkeys(OUTCOMES, 0)
    for dataset, kinds in counts.items():
        for kind, row in kinds.items():
            lines.append(f"{dataset:<17} {kind:<10} {sum(row.values()):>6} "
                         + " ".join(f"{row[o]:>12}" for o in OUTCOMES))
            for o in OUTCOMES:
                totals[o] += row[o]
    lines += ["-" * len(head), f"{'all':<28} {sum(totals.values()):>6} "
              + " ".join(f"{totals[o]:>12}" for o in OUTCOMES)]
    return "\n".join(lines)


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200, help="trials per file kind (200)")
    ap.add_argument("--formats", default=",".join(DATASETS),
                    help=f"datasets to damage, comma-separated (default: {','.join(DATASETS)})")
    ap.add_argument("--kinds", default=None, help="only these file kinds (e.g. shard,index.npy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="trials run at once (2)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per trial (20)")
    ap.add_argument("--mem", type=float, default=2.0, help="GiB of memory per trial (2)")
    ap.add_argument("--fast", action="store_true",
                    help=f"the test suite's form: {FAST['trials']} trials per file kind, "
                         f"{FAST['timeout']:g} s each")
    ap.add_argument("--replay", metavar="ID", help="run one trial (dataset/kind/number, with "
                    "the same --seed) and print everything about it; its folder is kept")
    ap.add_argument("--hostile", action="store_true",
                    help="run the hostile-names campaign instead (see below)")
    ap.add_argument("--work-dir", help="where datasets and trials go (default: a temporary "
                    "folder, removed at the end)")
    ap.add_argument("--json", metavar="FILE", help="write counts and failing trials as JSON")
    args = ap.parse_args(argv)
    if args.fast:
        args.trials, args.timeout = FAST["trials"], FAST["timeout"]
    names = [args.replay.rsplit("/", 2)[0]] if args.replay else args.formats.split(",")
    unknown = set(names) - set(DATASETS)
    if unknown:
        ap.error(f"unknown dataset {', '.join(sorted(unknown))}; choose from "
                 f"{', '.join(DATASETS)}")
    return args


def main(argv=None) -> int:
    args = _parse(argv)
    work = args.work_dir or tempfile.mkdtemp(prefix="fastdata-fuzz-")
    os.makedirs(work, exist_ok=True)
    try:
        if args.hostile:
            return _hostile(args, work)
        return _replay(args, work) if args.replay else _campaign(args, work)
    finally:
        if args.work_dir is None and not args.replay:
            shutil.rmtree(work, ignore_errors=True)


def _replay(args, work: str) -> int:
    dataset, kind, number = args.replay.rsplit("/", 2)
    pristines = fuzzing.build(work, [dataset])
    if kind not in pristines[dataset].files:
        sys.exit(f"error: {dataset} has no file kind {kind!r} "
                 f"(it has {', '.join(pristines[dataset].files)})")
    result, = fuzzing.run([Trial(dataset, kind, int(number))], pristines, work, seed=args.seed,
                          timeout=args.timeout, mem_bytes=int(args.mem * (1 << 30)), keep=True)
    print(json.dumps(result, indent=2))
    return 0


def _campaign(args, work: str) -> int:
    started = time.monotonic()
    pristines = fuzzing.build(work, args.formats.split(","))
    trials = fuzzing.plan(pristines, args.trials, args.kinds and args.kinds.split(","))
    results = fuzzing.run(trials, pristines, work, seed=args.seed, jobs=args.jobs,
                          timeout=args.timeout, mem_bytes=int(args.mem * (1 << 30)))
    counts = tally(results)
    elapsed = time.monotonic() - started
    print(table(counts))
    print(f"{len(results)} trials in {elapsed:.1f} s (seed {args.seed})")
    for r in failures(results, limit=1):
        print(f"{r['outcome']}: {r['id']} ({r['file']}, {r['damage']}) -- {explain(r)}")
    if args.json:
        report = {"config": {k: v for k, v in vars(args).items() if k != "json"},
                  "seconds": round(elapsed, 1), "counts": counts,
                  "totals": {o: sum(r["outcome"] == o for r in results) for o in OUTCOMES},
                  "failures": failures(results)}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


def _hostile(args, work: str) -> int:
    import hostile_names

    started = time.monotonic()
    world = hostile_names.build(work)
    try:
        rows = hostile_names.run(world)
    finally:
        world.close()
    elapsed = time.monotonic() - started
    outcomes = hostile_names.OUTCOMES
    cases = len({r["case"] for r in rows})
    for title, group in (("kind", lambda r: r["kind"]),
                         ("field", lambda r: f"{r['kind']} {r['field']}"),
                         ("command", lambda r: r["command"])):
        counts: dict = {}
        for r in rows:
            counts.setdefault(group(r), dict.fromkeys(outcomes, 0))[r["outcome"]] += 1
        width = max(len(title), *(len(k) for k in counts)) + 2
        head = f"{title:<{width}}{'runs':>6} " + " ".join(f"{o:>12}" for o in outcomes)
        print(head + "\n" + "-" * len(head))
        for key, row in counts.items():
            print(f"{key:<{width}}{sum(row.values()):>6} "
                  + " ".join(f"{row[o]:>12}" for o in outcomes))
        print()
    totals = {o: sum(r["outcome"] == o for r in rows) for o in outcomes}
    print(f"{cases} hostile cases, {len(rows)} command runs in {elapsed:.1f} s: "
          + ", ".join(f"{totals[o]} {o}" for o in outcomes))
    bad = [r for r in rows if r["outcome"] != "refused"]
    for r in bad[:10]:
        print(f"{r['outcome']}: {r['case']} by {r['command']} -- {r['detail'][:200]!r}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"seconds": round(elapsed, 1), "cases": cases, "totals": totals,
                       "rows": rows}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

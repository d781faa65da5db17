#!/usr/bin/env python3
"""Mutation testing of what the tests pin (issue 49): does a plausible bug in
the order engine, the ``--where`` language, the ranged copy or the version
code make a test fail?

    python tests/mutate.py                    # every mutant, in the working files
    python tests/mutate.py --only where-*     # some (names, globs, comma-separated)
    python tests/mutate.py --copy             # in a scratch copy of the repository
    python tests/mutate.py --list             # the mutants and their tests
    python tests/mutate.py --tests 'tests/test_where_truth.py'   # what one file kills

Each mutant is a source file, a text found in it exactly once, its
replacement, and the tests that cover that code. For each, the script writes
the changed file, runs ``python -m pytest -x -q -p no:cacheprovider TESTS``
(with a time limit), records *killed* (a test failed, or the run passed its
time limit) or *survived* (every test passed), and restores the file, in a
``finally``, whatever happened: a failure, Ctrl-C, SIGTERM. It then prints a
table and a summary line ("N of M killed"), and exits 0 only when every
mutant was killed.

It refuses to start when a target's text does not hold its find-text exactly
once, when a mutant does not compile, or when the covering tests fail on the
unchanged code (the baseline; ``--no-baseline`` skips it). Safety of the
working files:

- before a file is changed, its original text is written to a journal in
  the temporary folder; a run killed outright (SIGKILL, a power cut) is
  repaired by the next run, which restores from the journal first;
- the original bytes and modification time are restored exactly, and the
  tests run with ``PYTHONDONTWRITEBYTECODE=1``, so no stale ``.pyc`` of a
  mutant can outlive it;
- a file changed by someone else while a mutant was in place is not
  overwritten: the script stops and says so (the journal keeps the original).

Mutating the working files in a checkout that others use at the same time
changes what their test runs import: use ``--copy`` there (the repository
copied to a temporary folder, mutated and tested there, then removed).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Seconds a mutant's tests may take before the mutant counts as killed (a hang).
TIMEOUT = 600
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]

ORDER = "tests/test_order_engine.py"
SCALE = "tests/test_order_scale.py"
MIXTURE = "tests/test_mixture_order.py"
GOLDEN = "tests/test_order_golden.py"
INDEPENDENCE = "tests/test_order_independence.py"
WHERE = "tests/test_where_limits.py"
TRUTH = "tests/test_where_truth.py"
RANGED = "tests/test_ranged_copy.py"
MUTANTS_TESTS = "tests/test_mutants.py"
METER, BOUNDS = "tests/test_stall_meter.py", "tests/test_stall_bounds.py"
VERSIONS = "tests/test_versions.py"
VIEWS = "tests/test_views.py"
JOIN = "tests/test_join.py"
STREAM_RESUME = "tests/test_stream_resume.py"
MIX_RESUME = "tests/test_mix_resume.py"
REF = "tests/test_dataset_ref.py"
COMMIT_TESTS = "tests/test_commit.py::"
LANDS_ONCE = COMMIT_TESTS + "test_eight_appends_at_once_each_land_exactly_once"
OLDER_JOIN = COMMIT_TESTS + "test_a_join_to_an_older_version_lands_on_the_current_one"
JOINS_AT_ONCE = COMMIT_TESTS + "test_two_joins_of_different_columns_at_once_both_land"
COLLIDE = COMMIT_TESTS + "test_appends_whose_keys_collide_one_lands_the_other_says_what_to_do"
DAMAGED = COMMIT_TESTS + "test_damaged_version_records_are_refused_naming_the_field"
GRACE = COMMIT_TESTS + "test_gc_never_removes_a_part_younger_than_its_grace"
VIEW_ABOVE = COMMIT_TESTS + "test_gc_keeps_what_a_view_above_the_folder_reads"


@dataclass(frozen=True)
class Mutant:
    """``find`` in ``file`` (exactly once) replaced by ``replace``; ``tests``
    are test files (or node ids) that should fail."""

    name: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]


def M(name, file, find, replace, *tests) -> Mutant:  # a table row: one letter
    return Mutant(name, file, find, replace, tuple(tests))


BIJ, EPOCHS, SLICES = ("fastdata/order/bijection.py", "fastdata/order/epochs.py",
                       "fastdata/order/slices.py")
MIX, STATE = "fastdata/order/mixture.py", "fastdata/order/state.py"
WHERE_PY, RANGED_PY = "fastdata/ops/where.py", "fastdata/formats/ranged_copy.py"
COMMIT, READER, RECORD = ("fastdata/dataset/commit.py", "fastdata/dataset/reader.py",
                          "fastdata/dataset/record.py")
COLUMNS, JOIN_PY, GC_PY = ("fastdata/dataset/columns.py", "fastdata/ops/join.py",
                           "fastdata/ops/gc.py")
SUBSET_MERGE, APPEND_PIECES = "fastdata/ops/subset_merge.py", "fastdata/ops/append_pieces.py"
JOIN_COLUMNS = "fastdata/ops/join_columns.py"
SUBSET_PIECES, DASK_EXECUTOR = "fastdata/ops/subset_pieces.py", "fastdata/jobs/dask_executor.py"
INDEX_CHECK = "fastdata/formats/sharded/integrity.py"
ADVICE, LOOP = "fastdata/meter/advice.py", "fastdata/meter/loop.py"
STATS_PY, SAMPLES_PY = "fastdata/loaders/stats.py", "fastdata/loaders/samples.py"
PREFETCH_PY, SETUP_PY = "fastdata/loaders/prefetch.py", "fastdata/loaders/meter_setup.py"

MUTANTS: list[Mutant] = [
    # -- the order engine ---------------------------------------------------------------
    M("feistel-rounds", BIJ, "ROUNDS = 6\n", "ROUNDS = 5\n", ORDER, SCALE, GOLDEN),
    M("cycle-walk-stops-at-n", BIJ, "todo = todo[x[todo] >= n]", "todo = todo[x[todo] > n]",
      ORDER, SCALE),
    M("window-key-ignores-window", EPOCHS,
      "mix64(np.uint64(self._key) ^ window[here].astype(np.uint64))",
      "mix64(np.uint64(self._key) ^ (window[here] * 0).astype(np.uint64))",
      ORDER, SCALE, GOLDEN, INDEPENDENCE),
    M("shard-window-key-ignores-window", EPOCHS,
      "mix64(np.uint64(self.key) ^ window[here].astype(np.uint64))",
      "mix64(np.uint64(self.key) ^ (window[here] * 0).astype(np.uint64))",
      ORDER, SCALE, GOLDEN, INDEPENDENCE),
    M("epoch-ignored", EPOCHS, 'stable_seed("order", shuffle.seed, epoch)',
      'stable_seed("order", shuffle.seed)', ORDER, SCALE, GOLDEN, INDEPENDENCE),
    M("blocks-keyed-like-records", EPOCHS, "Bijection(self.full_blocks, self._key ^ _BLOCKS)",
      "Bijection(self.full_blocks, self._key)", ORDER, SCALE, GOLDEN),
    M("slice-rank-offset", SLICES, "first = w * t * b + self.rank * size",
      "first = w * t * b + self.rank * b", ORDER, GOLDEN),
    M("pad-rounds-down", SLICES, "return -(-left // self.world)", "return left // self.world",
      ORDER, GOLDEN),
    M("mix-sources-share-seed", MIX, 'stable_seed("mix-source", self.seed, source.name)',
      'stable_seed("mix-source", self.seed)', MIXTURE, GOLDEN, INDEPENDENCE),
    M("mix-phases-ignore-epoch", MIX, 'stable_seed("mix", self.seed, epoch)',
      'stable_seed("mix", self.seed)', MIXTURE, GOLDEN),
    M("mix-remainder-to-smallest", MIX, "np.argsort(-(exact - counts), kind=\"stable\")",
      "np.argsort(exact - counts, kind=\"stable\")", MIXTURE, GOLDEN),
    M("mix-cycles-repeat-one-order", MIX, "epoch_order(n, mode, c)[pos[here]]",
      "epoch_order(n, mode, 0)[pos[here]]", MIXTURE, GOLDEN, INDEPENDENCE),
    # -- resume states -------------------------------------------------------------------
    # A missing worker's position filled in with another worker's: accepted.
    M("state-missing-workers-accepted", STATE,
      "    if sorted(by_worker) != list(range(first.workers)) or \\\n",
      "    by_worker = {k: by_worker.get(k, first) for k in range(first.workers)}\n"
      "    if False or \\\n", STREAM_RESUME, GOLDEN),
    M("state-other-dataset-same-version", STATE,
      'if any(mine.get(k) and theirs.get(k) and mine[k] != theirs[k] for k in ("sha256", "view")):',
      'if any(mine.get(k) and theirs.get(k) and mine[k] != theirs[k] for k in ("view",)):',
      STREAM_RESUME, VERSIONS, REF, MUTANTS_TESTS),
    M("state-source-other-dataset-same-version", STATE,
      'if any(a.get(k) and b.get(k) and a[k] != b[k] for k in ("sha256", "view")):',
      'if any(a.get(k) and b.get(k) and a[k] != b[k] for k in ("view",)):',
      MIX_RESUME, REF, MUTANTS_TESTS),
    M("state-older-algorithm-accepted", STATE, "    if algorithm != ALGORITHM:\n",
      "    if algorithm != ALGORITHM and False:\n", SCALE, GOLDEN),
    M("state-version-unchecked", STATE, "if (saved_version or 1) != (now_version or 1):",
      "if False:", VERSIONS, REF, MUTANTS_TESTS),
    M("state-records-unchecked", STATE, "if entry.records and entry.records != records:",
      "if False:", STREAM_RESUME, VERSIONS, GOLDEN),
    # -- the --where language ------------------------------------------------------------
    M("where-le-as-lt", WHERE_PY, "ast.LtE: operator.le", "ast.LtE: operator.lt", WHERE, TRUTH),
    M("where-gt-as-ge", WHERE_PY, "ast.Gt: operator.gt", "ast.Gt: operator.ge", WHERE, TRUTH),
    M("where-ne-as-eq", WHERE_PY, "ast.NotEq: operator.ne", "ast.NotEq: operator.eq",
      WHERE, TRUTH),
    M("where-not-in-as-in", WHERE_PY, "ast.NotIn: lambda a, b: a not in b",
      "ast.NotIn: lambda a, b: a in b", WHERE, TRUTH),
    M("where-chain-first-link-only", WHERE_PY, "zip(ops, values, values[1:])",
      "zip(ops[:1], values, values[1:])", WHERE, TRUTH),
    M("where-or-as-and", WHERE_PY, "return lambda fields: any(_truth(p, fields) for p in parts)",
      "return lambda fields: all(_truth(p, fields) for p in parts)", WHERE, TRUTH),
    M("where-not-of-incomparable", WHERE_PY, "return lambda fields: not _truth(inner, fields)",
      "return lambda fields: not inner(fields)", WHERE, TRUTH),
    M("where-missing-is-zero", WHERE_PY, "return lambda fields: fields.get(name, _MISSING)",
      "return lambda fields: fields.get(name, 0)", WHERE, TRUTH),
    M("where-type-mismatch-raises", WHERE_PY,
      "except (TypeError, ZeroDivisionError, ValueError, OverflowError, RecursionError):",
      "except (ZeroDivisionError, ValueError, OverflowError, RecursionError):", WHERE, TRUTH),
    M("where-division-by-zero-raises", WHERE_PY,
      "except (TypeError, ZeroDivisionError, ValueError, OverflowError, RecursionError):",
      "except (TypeError, ValueError, OverflowError, RecursionError):", WHERE, TRUTH),
    M("where-neg-as-pos", WHERE_PY, "_apply(operator.neg, inner(fields))",
      "_apply(operator.pos, inner(fields))", WHERE, TRUTH),
    M("where-div-as-floordiv", WHERE_PY, "ast.Div: operator.truediv",
      "ast.Div: operator.floordiv", WHERE, TRUTH),
    M("where-mod-formats-strings", WHERE_PY, "    if isinstance(a, (str, bytes)):\n",
      "    if False:\n", WHERE, TRUTH),
    # -- the ranged copy -----------------------------------------------------------------
    M("ranged-marks-before-bytes", RANGED_PY,
      "        for (start, _), body in zip(spans, bodies):\n"
      "            _write_all(fd, body, start)\n"
      "        for a, z in runs:  # after the bytes: a mark is never ahead of its block\n"
      "            _write_all(fd, b\"\\x01\" * (z - a), self.size + a)\n",
      "        for a, z in runs:\n"
      "            _write_all(fd, b\"\\x01\" * (z - a), self.size + a)\n"
      "        for (start, _), body in zip(spans, bodies):\n"
      "            _write_all(fd, body, start)\n", RANGED),
    M("ranged-short-body-accepted", RANGED_PY, "            if len(body) != length:\n",
      "            if False:\n", RANGED),
    M("ranged-gap-not-merged", RANGED_PY, "if runs and b - runs[-1][1] <= GAP_BLOCKS:",
      "if runs and b - runs[-1][1] < GAP_BLOCKS:", RANGED),
    M("ranged-fresh-ignored", RANGED_PY, "        if fresh:\n            missing = wanted\n",
      "        if False:\n            missing = wanted\n", RANGED),
    # -- versions and views --------------------------------------------------------------
    M("commit-overwrites-record", COMMIT, "    return create_bytes(data, where)\n",
      "    from fastdata.storage import upload_bytes\n"
      "    upload_bytes(data, where)\n    return True\n", VERSIONS, JOIN, LANDS_ONCE, OLDER_JOIN,
      MUTANTS_TESTS),
    M("head-moves-back", COMMIT,
      "    if current is not None and current > number:\n        return\n",
      "    if False:\n        return\n", VERSIONS, JOIN, MUTANTS_TESTS),
    M("reader-part-digest-unchecked", READER,
      "manifest_digest(reader.manifest) != part.manifest_sha256", "False",
      VERSIONS, VIEWS, MUTANTS_TESTS),
    M("reader-labels-not-remapped", READER, "if list(names) == list(classes[:len(names)]):",
      "if True:", VERSIONS, JOIN, LANDS_ONCE, MUTANTS_TESTS),
    M("record-parts-dont-add-up", RECORD,
      "if sum(p.selected for p in record.parts) != record.records:", "if False:",
      VERSIONS, VIEWS, "tests/test_selection_checks.py", DAMAGED, MUTANTS_TESTS),
    M("record-duplicate-parts", RECORD, "        if len(set(seen)) != len(seen):\n",
      "        if False:\n", VERSIONS, VIEWS, DAMAGED, MUTANTS_TESTS),
    M("record-class-counts-exceed", RECORD, "if sum(counts) > record.records:", "if False:",
      VERSIONS, VIEWS, DAMAGED, MUTANTS_TESTS),
    M("record-parent-unchecked", RECORD,
      "if n < 1 or (n == 1) != (record.parent is None) or \\\n",
      "if False and (n < 1 or (n == 1) != (record.parent is None)) and \\\n",
      VERSIONS, DAMAGED, MUTANTS_TESTS),
    M("columns-null-flags-ignored", COLUMNS,
      'if "missing" in files and self.array(files["missing"])[i]:', "if False:",
      JOIN, MUTANTS_TESTS),
    M("columns-null-flags-not-written", JOIN_COLUMNS, "        if aggregate.missing:\n",
      "        if False:\n", JOIN, MUTANTS_TESTS),
    M("columns-digest-unchecked", COLUMNS, 'if _sha256(path) != self.entry["sha256"][file]:',
      "if False:", JOIN),
    M("join-drops-earlier-labels", JOIN_PY,
      "classes, counts, labels = head.classes, head.class_counts, head.labels",
      "classes, counts, labels = head.classes, head.class_counts, None", JOIN, MUTANTS_TESTS),
    M("gc-removes-kept-columns", GC_PY, "for n in kept for c in records[n].columns}",
      "for n in kept for c in records[n].columns if False}", VERSIONS, JOIN, MUTANTS_TESTS),
    M("gc-removes-kept-parts", GC_PY, "for n in kept for p in records[n].parts}",
      "for n in kept for p in records[n].parts if False}", VERSIONS, MUTANTS_TESTS),
    M("gc-forgets-the-versions-views-read", GC_PY,
      "kept = set(numbers[-keep:]) | {v for _, v in views if v in records}",
      "kept = set(numbers[-keep:])", VERSIONS, VIEW_ABOVE),
    M("gc-ignores-grace", GC_PY, "if now - newest < grace:", "if False:",
      VERSIONS, GRACE, MUTANTS_TESTS),
    M("append-keys-unchecked", APPEND_PIECES, "if clashes.count and not skip:",
      "if False:", VERSIONS),
    M("append-rebase-ignores-collisions", APPEND_PIECES, "        count += len(both)\n",
      "        count += 0\n", VERSIONS, COLLIDE, MUTANTS_TESTS),
    M("join-rebase-ignores-same-column", JOIN_PY,
      'taken = sorted({n for c in landed for n in c["columns"] if n in mine})', "taken = []",
      JOIN, JOINS_AT_ONCE),
    M("index-check-forgets-the-chunk-before", INDEX_CHECK,
      "        self.last = (int(shard[-1]), int(end[-1]))\n", "        self.last = None\n",
      "tests/test_index_check.py"),
    M("subset-strata-share-key", SUBSET_MERGE, "Bijection(int(size), base ^ g)",
      "Bijection(int(size), base)", VIEWS, INDEPENDENCE, MUTANTS_TESTS),
    M("subset-fraction-floored", SUBSET_MERGE, "self.keep = np.rint(sizes * fraction)",
      "self.keep = np.floor(sizes * fraction)", VIEWS, MUTANTS_TESTS),
    M("subset-chunk-short", SUBSET_PIECES, "hi = min(end, lo + CHUNK)",
      "hi = min(end, lo + CHUNK - 1)", "tests/test_jobs_subset_append.py"),
    M("dask-task-carries-its-input", DASK_EXECUTOR,
      "held = self._scatter(pickle.dumps(sent[number], protocol=5))",
      "held = pickle.dumps(sent[number], protocol=5)", "tests/test_pack_cluster.py"),
    M("dask-lost-input-not-resent", DASK_EXECUTOR,
      "                submit(number)\n                continue\n",
      "                raise\n", "tests/test_pack_cluster.py"),
    M("spool-block-off-piece-grid", "fastdata/formats/record_spool.py", "BLOCK = 1 << 14\n",
      "BLOCK = (1 << 14) + 64\n",
      "tests/test_streaming_writers.py::test_writing_holds_nothing_per_record"),
    M("hdf5-end-piece-carry-dropped", "fastdata/formats/hdf5/finish.py",
      "        self._carry = data[whole:]\n", "        self._carry = b\"\"\n",
      "tests/test_streaming_writers.py::test_writing_holds_nothing_per_record"),
    M("lmdb-end-columns-one-block", "fastdata/formats/lmdb/writer.py",
      "                values[at:at + len(block)] = block[field]\n",
      "                values[:len(block)] = block[field]\n",
      "tests/test_streaming_writers.py::test_the_end_of_an_lmdb_pack_fills_its_columns_a_block_at_a_time"),
    M("hdf5-end-one-block-of-keys", "fastdata/formats/hdf5/finish.py",
      "        at += len(block)\n", "",
      "tests/test_streaming_writers.py::test_the_end_of_an_hdf5_pack_holds_a_block_not_the_columns"),
    # -- the stall meter --------------------------------------------------------------------
    M("meter-keeps-up-at-half", ADVICE, "KEEPS_UP = 0.05", "KEEPS_UP = 0.5", METER),
    M("meter-keeps-up-inclusive", ADVICE, "wait < KEEPS_UP", "wait <= KEEPS_UP", METER),
    M("meter-saturated-inclusive", ADVICE, "busy < SATURATED and", "busy <= SATURATED and",
      METER),
    M("meter-idle-never", ADVICE, "IDLE = 0.5", "IDLE = 0.0", METER),
    M("meter-handover-share", ADVICE, "HANDOVER_SHARE = 0.5", "HANDOVER_SHARE = 2.0", METER),
    M("meter-slow-rank-points-ignored", ADVICE, "worst - middle < SLOW_RANK_POINTS or ", "",
      METER),
    M("meter-data-wait-over-step", LOOP,
      '"data_wait": self.wait_s / spent if spent > 0', '"data_wait": self.wait_s / '
      '(self.step_s or 1) if spent > 0', METER),
    M("meter-percentiles-over-zeros", LOOP, "self._waits[:min(self.batches, WINDOW)]",
      "self._waits", METER),
    M("meter-step-not-counted", LOOP, "self.step_s += asked - self._handed",
      "self.step_s += 0.0", METER),
    M("meter-reset-ignored", STATS_PY, "total = delta.sum(axis=0)", "total = now.sum(axis=0)",
      METER),
    M("meter-url-read-is-read", SAMPLES_PY, '"fetch" if self.reader.url else "read"', '"read"',
      METER, BOUNDS),
    M("meter-convert-not-timed", PREFETCH_PY,
      'self.meter.table.add("convert", clock() - start, busy=True)', "pass", METER),
    M("meter-collate-not-busy", SETUP_PY, 'self.table.add("collate", clock() - start, busy=True)',
      'self.table.add("collate", clock() - start)', METER),
    # Left out as equivalent (no observable change, so no test can kill them):
    # - gc.py "used |= {path for path, _ in views}" dropped: what a view reads
    #   is its version's parts (with selections) and column sets, and gc keeps
    #   the version a known view was made from (the mutant above); a version
    #   only ever adds parts and column sets to its parent's, so every kept
    #   version names them anyway. (Tried: it survived every test.)
    # - record.py/gc.py: the labels' folder kept by gc: a join writes its labels
    #   into its column folder, which the columns entry keeps anyway.
    # - meter/table.py: a stream's decode groups counted as batches in its row: a
    #   row's batch count only tells producers from other rows, and such a row
    #   has samples. (Tried: it survived every test.)
    # - interleave.py: ties of equal keys to the later source: keys are
    #   (j + u_s) / c_s with random phases u_s, equal across sources with
    #   probability 0 for every seed the tests can name.
]


# -- keeping the working files safe -------------------------------------------------------

def _journal_path(root: str) -> str:
    tag = hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"fastdata-mutate-{tag}.json")


class Guard:
    """Writes one mutant into its file and puts the original back, exactly
    (bytes and modification time), with signals held off while either write
    is under way; a journal on disk lets the next run repair a killed one."""

    SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})

    def __init__(self, root: str) -> None:
        self.root = root
        self.journal = _journal_path(root)

    def recover(self) -> list[str]:
        """Put back the file a killed run left mutated; returns what was done."""
        if not os.path.exists(self.journal):
            return []
        with open(self.journal, encoding="utf-8") as f:
            entry = json.load(f)
        path = entry["path"]
        current = _read(path)
        if current == entry["original"]:
            os.unlink(self.journal)
            return [f"{path}: already the original"]
        if current != entry["mutant"]:
            raise SystemExit(f"mutate.py: {path} holds neither its original text nor the "
                             f"mutant a killed run wrote (someone edited it since); the "
                             f"original is kept in {self.journal}: compare and restore by hand")
        self._write(path, entry["original"], entry["mtime_ns"])
        os.unlink(self.journal)
        return [f"{path}: restored from the journal of a run that was killed"]

    def _write(self, path: str, text: str, mtime_ns: int | None = None) -> None:
        """Write ``text`` to ``path`` whole (a temporary file renamed over it),
        keeping its permissions; ``mtime_ns``: the modification time to set."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        try:
            mode = os.stat(path).st_mode & 0o7777
            folder = os.path.dirname(path)
            fd, tmp = tempfile.mkstemp(prefix=".mutate-", suffix=".py", dir=folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
                os.chmod(tmp, mode)
                if mtime_ns is not None:
                    os.utime(tmp, ns=(mtime_ns, mtime_ns))
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def apply(self, path: str, original: str, mutant: str) -> int:
        """Journal the original, then write the mutant; returns the original's
        modification time (ns)."""
        mtime_ns = os.stat(path).st_mtime_ns
        old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        try:
            with open(self.journal, "w", encoding="utf-8") as f:
                json.dump({"path": path, "original": original, "mutant": mutant,
                           "mtime_ns": mtime_ns}, f)
                f.flush()
                os.fsync(f.fileno())
            # Another second than the original's: no .pyc of it is taken for the mutant.
            self._write(path, mutant, mtime_ns + 2_000_000_000)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return mtime_ns

    def restore(self, path: str, original: str, mutant: str, mtime_ns: int) -> None:
        """Put the original back (refused when the file is no longer our mutant)."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        try:
            self._restore(path, original, mutant, mtime_ns)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _restore(self, path: str, original: str, mutant: str, mtime_ns: int) -> None:
        current = _read(path)
        if current != mutant and current != original:
            raise SystemExit(f"mutate.py: {path} was edited while a mutant was in place; it "
                             f"is left as it is now, the original is kept in {self.journal}")
        if current != original or os.stat(path).st_mtime_ns != mtime_ns:
            self._write(path, original, mtime_ns)
        if _read(path) != original:
            raise SystemExit(f"mutate.py: {path} could not be restored; the original is kept "
                             f"in {self.journal}")
        os.unlink(self.journal)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# -- running ----------------------------------------------------------------------------

@dataclass
class Outcome:
    mutant: Mutant
    result: str      # killed, killed (timeout), survived, error
    seconds: float
    by: str          # the first failing test, or why it is an error


def check_mutants(root: str, mutants: list[Mutant]) -> list[str]:
    """Why the mutants cannot run (empty: they can): a find-text not there
    exactly once, a mutant that does not compile, a test file missing."""
    problems = []
    names = [m.name for m in mutants]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{name}: the name is given twice")
    for m in mutants:
        path = os.path.join(root, m.file)
        if not os.path.isfile(path):
            problems.append(f"{m.name}: no file {m.file}")
            continue
        text = _read(path)
        found = text.count(m.find)
        if found != 1:
            problems.append(f"{m.name}: {m.file} holds its find-text {found} times, not once: "
                            f"{m.find.strip()[:70]!r}")
            continue
        try:
            compile(text.replace(m.find, m.replace), path, "exec")
        except SyntaxError as exc:
            problems.append(f"{m.name}: the mutant does not compile ({exc.msg}, line "
                            f"{exc.lineno})")
        if not existing_tests(root, m):
            problems.append(f"{m.name}: none of its test files is there ({', '.join(m.tests)})")
    return problems


def existing_tests(root: str, m: Mutant) -> list[str]:
    """The mutant's tests whose files exist (a test file not written yet is
    left out, and said so by :func:`main`)."""
    return [t for t in m.tests if os.path.isfile(os.path.join(root, t.split("::", 1)[0]))]


def run_tests(root: str, tests, timeout: float) -> tuple[int | None, str]:
    """(pytest's exit status or None after the time limit, its output)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"))
                                          if p))
    # A session of its own: a hang is killed with whatever the tests started.
    proc = subprocess.Popen([sys.executable, *PYTEST, *tests], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        _kill(proc)
        return None, ""
    except BaseException:  # Ctrl-C: the tests go too, then the file is restored
        _kill(proc)
        raise


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


# "FAILED tests/x.py::test[an id] - AssertionError: ...": the node id may hold spaces.
_FAILED = re.compile(r"^(FAILED|ERROR) (.+?)(?: - |$)", re.MULTILINE)


def first_failure(output: str) -> str:
    found = _FAILED.search(output)
    if found:
        return found.group(2)
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:100] if lines else ""


def run_mutant(guard: Guard, root: str, m: Mutant, timeout: float) -> Outcome:
    path = os.path.join(root, m.file)
    original = _read(path)
    if original.count(m.find) != 1:
        raise SystemExit(f"mutate.py: {m.file} changed during the run: the find-text of "
                         f"{m.name} is there {original.count(m.find)} times")
    mutant = original.replace(m.find, m.replace)
    started = time.monotonic()
    mtime_ns = guard.apply(path, original, mutant)
    try:
        status, output = run_tests(root, existing_tests(root, m), timeout)
    finally:
        guard.restore(path, original, mutant, mtime_ns)
    seconds = time.monotonic() - started
    if status is None:
        return Outcome(m, "killed (timeout)", seconds, f"no result in {timeout:.0f}s")
    if status == 0:
        return Outcome(m, "survived", seconds, "")
    if status in (1, 2):  # tests failed, or collecting them did (an import broke)
        return Outcome(m, "killed", seconds, first_failure(output))
    return Outcome(m, "error", seconds, f"pytest exit status {status}: {first_failure(output)}")


def table(outcomes: list[Outcome]) -> str:
    rows = [("mutant", "file", "result", "time", "killed by")]
    rows += [(o.mutant.name, o.mutant.file.removeprefix("fastdata/"), o.result,
              f"{o.seconds:.0f}s", o.by) for o in outcomes]
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    lines.insert(1, "-" * min(120, sum(widths) + 8 + len(rows[0][4])))
    return "\n".join(line.rstrip() for line in lines)


def select(mutants: list[Mutant], only: str | None) -> list[Mutant]:
    if not only:
        return mutants
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    chosen = [m for m in mutants if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(m.name, p)
                                               for m in mutants)]
    if unmatched:
        raise SystemExit(f"mutate.py: no mutant named {', '.join(unmatched)}; "
                         f"--list shows them")
    return chosen


def restrict(mutants: list[Mutant], tests: str | None) -> list[Mutant]:
    """The mutants with only the covering tests matching ``tests`` (globs);
    those left with none are dropped."""
    if not tests:
        return mutants
    patterns = [p.strip() for p in tests.split(",") if p.strip()]
    out = []
    for m in mutants:
        kept = tuple(t for t in m.tests if any(fnmatch.fnmatchcase(t, p) for p in patterns))
        if kept:
            out.append(Mutant(m.name, m.file, m.find, m.replace, kept))
    if not out:
        raise SystemExit(f"mutate.py: no mutant is covered by {tests}")
    return out


def scratch_copy() -> str:
    """The repository copied to a temporary folder (without .git and caches)."""
    where = tempfile.mkdtemp(prefix="fastdata-mutate-")
    dest = os.path.join(where, os.path.basename(ROOT))
    shutil.copytree(ROOT, dest, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis", "site"))
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="mutant names or globs, comma-separated")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--copy", action="store_true",
                        help="mutate a scratch copy of the repository, not the working files")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip running the covering tests on the unchanged code first")
    parser.add_argument("--tests", metavar="GLOBS",
                        help="run only the covering tests whose file or node id matches "
                             "one of these globs (comma-separated), e.g. to see what the "
                             "tests of one file kill; a mutant left with none is skipped")
    parser.add_argument("--timeout", type=float, default=TIMEOUT,
                        help=f"seconds per mutant's tests (default {TIMEOUT})")
    args = parser.parse_args(argv)
    mutants = restrict(select(MUTANTS, args.only), args.tests)
    if args.list:
        for m in mutants:
            print(f"{m.name:42} {m.file:32} {' '.join(t.removeprefix('tests/') for t in m.tests)}")
        return 0
    for note in Guard(ROOT).recover():
        print(f"mutate.py: {note}")
    problems = check_mutants(ROOT, mutants)
    absent = sorted({t for m in mutants for t in m.tests} -
                    {t for m in mutants for t in existing_tests(ROOT, m)})
    if absent:
        print(f"mutate.py: not there, left out: {', '.join(absent)}", flush=True)
    if problems:
        print("mutate.py: refusing to start:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    root = scratch_copy() if args.copy else ROOT
    handlers = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _run(root, mutants, args)
    except KeyboardInterrupt:
        print("\nmutate.py: interrupted", file=sys.stderr)
        return 130
    finally:
        # A signal between a mutant's tests and its restore: the journal still
        # names the file, and it is put back here.
        for note in Guard(root).recover():
            print(f"mutate.py: {note}", file=sys.stderr)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        if args.copy:
            shutil.rmtree(os.path.dirname(root), ignore_errors=True)


def _run(root: str, mutants: list[Mutant], args) -> int:
    guard = Guard(root)
    if args.copy:
        print(f"mutate.py: mutating a copy of the repository in {root}", flush=True)
    if not args.no_baseline:
        tests = list(dict.fromkeys(t for m in mutants for t in existing_tests(root, m)))
        started = time.monotonic()
        status, output = run_tests(root, tests, args.timeout * 2)
        if status != 0:
            print(f"mutate.py: the covering tests fail on the unchanged code (status {status}); "
                  f"fix that first:\n{output[-3000:]}", file=sys.stderr)
            return 2
        print(f"baseline: {len(tests)} test files pass on the unchanged code "
              f"({time.monotonic() - started:.0f}s)", flush=True)
    outcomes = []
    for k, m in enumerate(mutants, 1):
        outcome = run_mutant(guard, root, m, args.timeout)
        outcomes.append(outcome)
        print(f"[{k}/{len(mutants)}] {m.name}: {outcome.result} ({outcome.seconds:.0f}s) "
              f"{outcome.by}", flush=True)
    print()
    print(table(outcomes))
    killed = sum(o.result.startswith("killed") for o in outcomes)
    print(f"\n{killed} of {len(outcomes)} killed"
          + "".join(f"; {n} {r}" for r, n in sorted(_counts(outcomes).items())
                    if not r.startswith("killed")))
    return 0 if killed == len(outcomes) else 1


def _counts(outcomes: list[Outcome]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes:
        out[o.result] = out.get(o.result, 0) + 1
    return out


if __name__ == "__main__":
    sys.exit(main())

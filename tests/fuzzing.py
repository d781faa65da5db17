"""The fuzz engine: random damage to every file of a packed dataset, each trial
read back in a forked child with a time and a memory limit.

``python bench/fuzz.py`` is the full form (counts per dataset and file kind; its
docstring describes the damage and the outcomes) and ``tests/test_fuzz.py`` the
fast form. A trial copies one pristine packed dataset, damages one file of one
*kind* (``data.mdb``, ``h5``, ``shard``, ``idx``, ``index.npy``, ``keys.json``,
``manifest``) and reads every record back three ways -- map-style
``open_dataset(path, decode=Decode(output="bytes"))``, ``ShardedIterableDataset``
for sharded formats, ``verify_dataset`` -- comparing each with the original
record. A trial
is named ``dataset/kind/number``; the same seed gives the same damage.
"""

from __future__ import annotations

import errno
import io
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import wait

OUTCOMES = ("detected", "harmless", "silent-wrong", "crash", "hang", "oom")
#: Outcomes that are bugs: a reader must raise or read the original records.
FAILURES = ("silent-wrong", "crash", "hang", "oom")
#: Dataset name -> (output name, records per shard or None).
DATASETS = {
    "lmdb": ("x.lmdb", None),
    "hdf5": ("x.h5", None),
    "tfrecord": ("x.tfrecord", None),
    "tar": ("x.tar", None),
    "tfrecord-sharded": ("x.tfrecord", 16),
    "tar-sharded": ("x-%06d.tar", 16),
}
#: The suite's form: trials per file kind, and the seconds after which a trial
#: counts as a hang (a guard against a real hang, not a speed figure).
FAST = {"trials": 30, "timeout": 60.0}


@dataclass(frozen=True)
class Pristine:
    """A packed dataset before damage, and the records it must give back."""

    name: str
    root: str  # the folder holding the dataset's files
    open_path: str  # relative to root: what open_dataset takes
    files: dict  # file kind -> [file paths relative to root]
    streaming: bool
    classes: list
    keys: list
    labels: list
    payloads: list


# -- the datasets -------------------------------------------------------------------------


def build(work: str, names=tuple(DATASETS), *, count: int = 48, classes: int = 4) -> dict:
    """Pack one generated source into every dataset of ``names`` under ``work``."""
    import fastdata
    from fastdata.demo import synthesize

    src = os.path.join(work, "src")
    synthesize(src, kind="tiny", n=count, classes=classes, progress=False)
    out = {}
    for name in names:
        output, shard_size = DATASETS[name]
        root = os.path.join(work, "pristine", name)
        options = fastdata.PackOptions(shard_size=shard_size, workers=1)
        summary = fastdata.pack(src, os.path.join(root, output), options=options, progress=False)
        out[name] = _describe(name, root, output, src, os.path.basename(summary.output))
    return out


def _describe(name: str, root: str, output: str, src: str, opened: str) -> Pristine:
    """``opened``: what the pack said opens it (a sharded dataset's manifest name)."""
    from fastdata.formats import open_reader

    if name == "lmdb":
        open_path, files = output, {"data.mdb": [os.path.join(output, "data.mdb")]}
    elif name == "hdf5":
        open_path, files = output, {"h5": [output]}
    else:
        open_path = opened
        with open(os.path.join(root, open_path), encoding="utf-8") as f:
            manifest = json.load(f)
        shards = [s["path"] for s in manifest["shards"]]
        files = {"shard": shards}
        if name.startswith("tfrecord"):
            files["idx"] = [s + ".idx" for s in shards]
        files.update({"index.npy": [manifest["extra"]["index"]],
                      "keys.json": [manifest["extra"]["keys"]], "manifest": [open_path]})
    with open_reader(os.path.join(root, open_path)) as reader:
        keys, labels = list(reader.keys), [int(x) for x in reader.labels]
        payloads = reader.read_many(range(len(reader)))
        classes = list(reader.classes)
    for key, label, data in zip(keys, labels, payloads):  # the pack itself must be right
        with open(os.path.join(src, key), "rb") as f:
            if f.read() != data or classes[label] != key.split("/")[0]:
                raise AssertionError(f"{name}: record {key} does not match its source file")
    pristine = Pristine(name, root, open_path, files, name not in ("lmdb", "hdf5"), classes,
                        keys, labels, payloads)
    steps = evaluate(pristine, root)
    if classify(steps, 0, False) != "harmless":
        raise AssertionError(f"{name}: the undamaged dataset does not read back: {steps}")
    return pristine


# -- damage ---------------------------------------------------------------------------------


def _flip(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    out = bytearray(data)
    at = sorted(rng.randrange(len(out)) for _ in range(rng.randint(1, 4)))
    for pos in at:
        out[pos] ^= rng.randint(1, 255)
    return bytes(out), f"flip bytes at {at}"


def _zero(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    size = rng.randint(1, min(512, len(data)))
    pos = rng.randrange(len(data) - size + 1)
    return data[:pos] + bytes(size) + data[pos + size:], f"zero {size} bytes at {pos}"


def _truncate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    size = rng.randrange(len(data))
    return data[:size], f"truncate to {size} of {len(data)} bytes"


def _append(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    junk = rng.randbytes(rng.randint(1, 1024))
    return data + junk, f"append {len(junk)} random bytes"


def _duplicate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    size = rng.randint(1, min(1024, len(data)))
    pos = rng.randrange(len(data) - size + 1)
    run = data[pos:pos + size]
    return data[:pos + size] + run + data[pos + size:], f"duplicate {size} bytes at {pos}"


def _copy_row(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """index.npy: one record's row copied over another's."""
    import numpy as np

    rows = np.load(io.BytesIO(data), allow_pickle=False)
    width, start = rows.dtype.itemsize, len(data) - rows.nbytes
    src, dst = rng.sample(range(len(rows)), 2)
    out = bytearray(data)
    out[start + dst * width:start + (dst + 1) * width] = \
        data[start + src * width:start + (src + 1) * width]
    return bytes(out), f"copy index row {src} over row {dst}"


def _copy_line(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """.idx: one record's line copied over another's."""
    lines = data.splitlines(keepends=True)
    src, dst = rng.sample(range(len(lines)), 2)
    lines[dst] = lines[src]
    return b"".join(lines), f"copy .idx line {src} over line {dst}"


MUTATIONS = {"flip": _flip, "zero": _zero, "truncate": _truncate, "append": _append,
             "duplicate": _duplicate}
#: Structured damage for files made of rows.
ROW_MUTATIONS = {"index.npy": ("copy-row", _copy_row), "idx": ("copy-line", _copy_line)}


@dataclass(frozen=True)
class Trial:
    dataset: str
    kind: str
    number: int

    @property
    def id(self) -> str:
        return f"{self.dataset}/{self.kind}/{self.number}"

    def damage(self, pristine: Pristine, seed: int) -> tuple[str, bytes, str]:
        """(file damaged, its new bytes, what was done): the same for the same seed."""
        rng = random.Random(f"{seed}/{self.id}")
        target = rng.choice(pristine.files[self.kind])
        with open(os.path.join(pristine.root, target), "rb") as f:
            data = f.read()
        choices = list(MUTATIONS.items())
        if self.kind in ROW_MUTATIONS:
            choices.append(ROW_MUTATIONS[self.kind])
        name, mutate = rng.choice(choices)
        new, what = mutate(data, rng)
        return target, new, f"{name}: {what}"


def plan(pristines: dict, trials: int, kinds=None) -> list[Trial]:
    """``trials`` per file kind of every dataset, interleaved so that a slow kind
    does not hold one worker slot for the whole run."""
    groups = [(name, kind) for name, p in pristines.items() for kind in p.files
              if kinds is None or kind in kinds]
    return [Trial(name, kind, n) for n in range(trials) for name, kind in groups]


# -- one trial (in the child) ------------------------------------------------------------------


class _Damage(Exception):
    """verify reported damage."""


def _read_map(p: Pristine, path: str) -> str | None:
    from fastdata.decoding.options import Decode
    from fastdata.loaders.opening import open_dataset

    with open_dataset(path, decode=Decode(output="bytes")) as ds:
        if list(ds.classes) != p.classes:
            return f"classes are {list(ds.classes)!r}, not {p.classes!r}"
        if len(ds) != len(p.keys):
            return f"{len(ds)} records, not {len(p.keys)}"
        keys = list(ds.keys)
        for i in range(len(ds)):
            data, label = ds[i]
            wrong = _compare(p, i, data, label, keys[i])
            if wrong:
                return f"map-style {wrong}"
    return None


def _read_stream(p: Pristine, path: str) -> str | None:
    from fastdata.decoding.options import Decode
    from fastdata.loaders.iterable import ShardedIterableDataset

    ds = ShardedIterableDataset(path, decode=Decode(output="bytes"))
    try:
        got = list(ds)
    finally:
        ds.reader.close()
    if len(got) != len(p.keys):
        return f"streaming gave {len(got)} records, not {len(p.keys)}"
    for i, (data, label) in enumerate(got):
        wrong = _compare(p, i, data, label, p.keys[i])
        if wrong:
            return f"streaming {wrong}"
    return None


def _verify(p: Pristine, path: str) -> None:
    from fastdata.ops.verify import verify_dataset

    result = verify_dataset(path, progress=False)
    if not result.ok:
        first = result.problems[0]["reason"] if result.problems else "not every record checked"
        raise _Damage(f"verify: {len(result.problems)} problem(s), first: {first}")


def _compare(p: Pristine, i: int, data: bytes, label, key: str) -> str | None:
    if data != p.payloads[i]:
        return f"record {i}: {len(data)} bytes read, not the original {len(p.payloads[i])}" \
            if len(data) != len(p.payloads[i]) else f"record {i}: bytes differ"
    if label != p.labels[i]:
        return f"record {i}: label {label!r}, not {p.labels[i]}"
    if key != p.keys[i]:
        return f"record {i}: key {key!r}, not {p.keys[i]!r}"
    return None


def _step(fn, p: Pristine, path: str) -> list:
    """[status, detail] of one way of reading: ok, silent-wrong, detected, crash, oom."""
    from fastdata.errors import FastDataError

    try:
        wrong = fn(p, path)
    except MemoryError as exc:
        return ["oom", f"MemoryError: {exc}"]
    except (FastDataError, _Damage) as exc:
        return ["detected", f"{type(exc).__name__}: {str(exc)[:300]}"]
    except Exception as exc:  # anything else is a traceback a user would see
        if getattr(exc, "errno", None) == errno.ENOMEM:
            return ["oom", f"{type(exc).__name__}: {exc}"]
        traceback.print_exc()  # into the trial's output, for --replay
        frames = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in frames if f"{os.sep}fastdata{os.sep}" in f.filename]
        where = (ours or frames)[-1]
        name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        return ["crash", f"{name}: {str(exc)[:300]} ({os.path.basename(where.filename)}:"
                         f"{where.lineno})"]
    return ["silent-wrong", wrong] if wrong else ["ok", None]


def evaluate(p: Pristine, root: str) -> dict:
    """Every way of reading the dataset under ``root``: step name -> [status, detail]."""
    path = os.path.join(root, p.open_path)
    steps = {"map": _step(_read_map, p, path)}
    if p.streaming:
        steps["stream"] = _step(_read_stream, p, path)
    steps["verify"] = _step(_verify, p, path)
    return steps


def classify(steps: dict | None, exitcode: int | None, timed_out: bool) -> str:
    """The trial's outcome from its steps (None: the child left no result)."""
    if timed_out:
        return "hang"
    if steps is None:
        return "oom" if exitcode == -9 else "crash"  # SIGKILL not ours: the OOM killer
    statuses = {status for status, _ in steps.values()}
    for outcome in ("crash", "oom", "silent-wrong", "detected"):
        if outcome in statuses:
            return outcome
    return "harmless"


def _child(p: Pristine, target: str, data: bytes, trial_dir: str, mem_bytes: int,
           check) -> None:
    out = os.open(os.path.join(trial_dir, "output.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    code = 0
    try:
        _limit_memory(mem_bytes)
        root = os.path.join(trial_dir, "data")
        shutil.copytree(p.root, root)
        with open(os.path.join(root, target), "wb") as f:
            f.write(data)
        steps = check(p, root)
        with open(os.path.join(trial_dir, "result.json"), "w", encoding="utf-8") as f:
            json.dump(steps, f)
    except BaseException:  # report it, then leave without the parent's exit handlers
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _limit_memory(mem_bytes: int) -> None:
    """Allow ``mem_bytes`` of address space beyond what the child starts with
    (a forked child inherits its parent's mappings, torch's included)."""
    with open("/proc/self/status", encoding="ascii") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + mem_bytes, vm + mem_bytes))


# -- running many trials ----------------------------------------------------------------------


def preload() -> None:
    """Import what the children use once, in the parent, so no child pays for it."""
    import fastdata.loaders.datasets  # noqa: F401
    import fastdata.loaders.iterable  # noqa: F401
    import fastdata.formats.verify  # noqa: F401
    from fastdata.formats import FORMATS

    for spec in FORMATS.values():
        spec.load_reader()


@dataclass
class _Running:
    """A trial whose child is running."""

    trial: Trial
    process: object
    folder: str
    target: str
    damage: str
    started: float
    deadline: float


def run(trials: list[Trial], pristines: dict, work: str, *, seed: int = 0, jobs: int = 2,
        timeout: float = 20.0, mem_bytes: int = 2 << 30, keep: bool = False,
        check=None) -> list[dict]:
    """Run every trial in its own forked child, ``jobs`` at a time; a result per
    trial, in the order of ``trials``.

    ``check(pristine, root)`` reads the damaged copy (default :func:`evaluate`)."""
    preload()
    pending = list(reversed(trials))
    running: dict = {}  # process sentinel -> _Running
    results = []
    while pending or running:
        while pending and len(running) < jobs:
            one = _start(pending.pop(), pristines, work, seed, timeout, mem_bytes,
                         check or evaluate)
            running[one.process.sentinel] = one
        nearest = min(one.deadline for one in running.values())
        ready = set(wait(list(running), timeout=max(0.0, nearest - time.monotonic())))
        now = time.monotonic()
        for sentinel, one in list(running.items()):
            timed_out = sentinel not in ready and now >= one.deadline
            if sentinel in ready or timed_out:
                del running[sentinel]
                results.append(_finish(one, timed_out, now, keep))
    order = {trial.id: n for n, trial in enumerate(trials)}
    return sorted(results, key=lambda r: order[r["id"]])


def _start(trial: Trial, pristines: dict, work: str, seed: int, timeout: float,
           mem_bytes: int, check) -> _Running:
    p = pristines[trial.dataset]
    target, data, what = trial.damage(p, seed)
    folder = tempfile.mkdtemp(prefix="trial-", dir=work)
    process = get_context("fork").Process(target=_child,
                                          args=(p, target, data, folder, mem_bytes, check))
    process.start()
    now = time.monotonic()
    return _Running(trial, process, folder, target, what, now, now + timeout)


def _finish(one: _Running, timed_out: bool, now: float, keep: bool) -> dict:
    """The trial's result, its child reaped (killed first if it ran out of time)."""
    if timed_out:
        one.process.kill()
    one.process.join()
    steps = None
    try:
        with open(os.path.join(one.folder, "result.json"), encoding="utf-8") as f:
            steps = json.load(f)
    except (OSError, ValueError):
        pass  # the child died before writing it
    try:
        with open(os.path.join(one.folder, "output.txt"), "rb") as f:
            output = f.read()[-2000:].decode("utf-8", "replace")
    except OSError:  # killed before it opened the file
        output = ""
    if not keep:
        shutil.rmtree(one.folder, ignore_errors=True)
    trial, exitcode = one.trial, one.process.exitcode
    return {"id": trial.id, "dataset": trial.dataset, "kind": trial.kind, "file": one.target,
            "damage": one.damage, "outcome": classify(steps, exitcode, timed_out),
            "steps": steps, "exitcode": exitcode, "seconds": round(now - one.started, 3),
            "output": output, "folder": one.folder if keep else None}

"""Where a streaming epoch stands: checkpoints of ``ShardedIterableDataset``.

Two kinds of state, both plain JSON-able dicts tagged ``"fastdata_stream"``:

- a worker's position (``"worker"``): the layout it reads in (ranks, workers,
  batch size, the epoch's order) and how many of its positions it has handed
  on. ``StatefulDataLoader`` stores one per worker and gives it back to the
  same worker on resume: exact, for the same ranks and workers.
- a resume point (``"point"``): the epoch and how many samples of the epoch's
  order the whole job has consumed, which is a prefix (see
  :mod:`fastdata.order.slices`). It is computed from the worker
  positions of any one rank and resumes with any number of ranks and workers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
from fastdata.order.bijection import ALGORITHM
from fastdata.order.slices import Slice, batches_delivered, worker_batches

TAG = "fastdata_stream"
VERSION = 1


@dataclass
class StreamPoint:
    """The job has consumed the first ``consumed`` samples of epoch ``epoch``'s order."""

    epoch: int
    consumed: int
    records: int = 0
    order: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {TAG: "point", "version": VERSION, **asdict(self)}


@dataclass
class WorkerPosition:
    """One worker's place in its share of an epoch."""

    epoch: int
    start: int          # the resume point this epoch's slicing began at
    records: int
    order: dict
    world: int
    rank: int
    workers: int
    worker: int
    batch_size: int     # the dataset's batch_size (0: None, workers take single samples)
    drop_last: bool
    taken: int          # positions of this worker's sequence handed on

    def to_dict(self) -> dict:
        return {TAG: "worker", "version": VERSION, **asdict(self)}

    def slice(self) -> Slice:
        return Slice(self.records, self.start, self.world, self.rank, max(1, self.batch_size),
                     "drop" if self.drop_last else "pad")

    def check_layout(self, *, rank: int, world: int, worker: int, workers: int,
                     batch_size: int, drop_last: bool) -> None:
        here = dict(rank=rank, world=world, worker=worker, workers=workers,
                    batch_size=batch_size, drop_last=drop_last)
        saved = {k: getattr(self, k) for k in here}
        if saved != here:
            diff = ", ".join(f"{k} {saved[k]} now {here[k]}" for k in here if saved[k] != here[k])
            raise ValueError(
                f"this worker state was saved with another layout ({diff}); to resume with "
                f"other ranks or workers, load the loader's whole state_dict() into the "
                f"dataset, ds.load_state_dict(state), and iterate a new DataLoader")

    def batches_done(self) -> int:
        """This worker's batches handed on completely."""
        plan = self.slice()
        done, left = 0, self.taken
        for t in worker_batches(plan.batches(), self.worker, self.workers):
            size = len(plan.batch_positions(t))
            if left < size:
                break
            left -= size
            done += 1
        return done


class WorkerPositions:
    """The positions (counted from ``plan.start`` in the padded order) that
    one worker reads, batch by batch, computed when asked for: ``len()``,
    slices (lazy) and ``numpy.asarray`` (the whole share)."""

    def __init__(self, plan: Slice, worker: int, workers: int,
                 lo: int = 0, hi: int | None = None) -> None:
        self.plan, self.worker, self.workers = plan, worker, workers
        ts = worker_batches(plan.batches(), worker, workers)
        last = plan.batches() - 1
        size = len(ts) * plan.batch_size
        if len(ts) and ts[-1] == last:  # the rank's last batch may be short
            size -= plan.batch_size - len(plan.batch_positions(last))
        self.lo = lo
        self.hi = size if hi is None else min(hi, size)

    def __len__(self) -> int:
        return max(0, self.hi - self.lo)

    def __getitem__(self, where: slice) -> WorkerPositions:
        if not isinstance(where, slice) or where.step not in (None, 1):
            raise TypeError("worker positions are sliced by a contiguous range")
        lo, hi, _ = where.indices(len(self))
        return WorkerPositions(self.plan, self.worker, self.workers, self.lo + lo,
                               self.lo + max(lo, hi))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        k = np.arange(self.lo, self.hi, dtype=np.int64)
        plan = self.plan
        b, world = plan.batch_size, plan.world
        t = self.worker + (k // b) * self.workers
        size = np.minimum(b, plan.per_rank - t * b)
        out = world * t * b + plan.rank * size + k % b
        return out if dtype is None else out.astype(dtype)


def worker_positions(plan: Slice, worker: int, workers: int) -> WorkerPositions:
    """Positions (counted from ``plan.start`` in the padded order) that one
    worker reads, batch by batch (:class:`WorkerPositions`)."""
    return WorkerPositions(plan, worker, workers)


def _found(state, out: list) -> list:
    """Every fastdata state dict nested anywhere in ``state`` (a loader's state
    nests the workers' dataset states a few levels down)."""
    if isinstance(state, dict):
        if TAG in state:
            out.append(state)
            return out
        for value in state.values():
            _found(value, out)
    elif isinstance(state, (list, tuple)):
        for value in state:
            _found(value, out)
    return out


def _load(entry: dict):
    if entry.get("version") != VERSION:
        raise ValueError(f"stream state version {entry.get('version')!r} is not {VERSION}; "
                         f"it was saved by another fastdata version")
    fields = {k: v for k, v in entry.items() if k not in (TAG, "version")}
    try:
        return (StreamPoint if entry[TAG] == "point" else WorkerPosition)(**fields)
    except TypeError as exc:
        raise ValueError(f"not a fastdata stream state: {exc}") from None


def order_description(order, epoch: int, *, shaping: Mapping | None = None,
                      starts: np.ndarray | None = None, dataset: Mapping | None = None
                      ) -> dict:
    """What a resume state records of the order it was taken in, at epoch
    ``epoch``: the order's own description (a ``Shuffle``'s mode, seed, block
    and window, or a mixture's sources, shares and schedule), the shards'
    bounds when whole shards are the blocks (``starts``, as a digest), and
    what else draws from the sample's randomness (``shaping``: a random crop's
    settings, under ``"samples"``), and the order algorithm's version
    (:data:`fastdata.order.bijection.ALGORITHM`), and ``dataset``: the
    version (or view) of a dataset that has them. A state whose description
    differs in any field is refused.
    """
    out = {"algorithm": ALGORITHM, **order.describe(epoch)}
    if dataset:
        out[DATASET] = dict(dataset)
    if starts is not None:
        digest = hashlib.blake2b(np.asarray(starts, dtype="<i8").tobytes(), digest_size=16)
        out["shards"] = {"count": len(starts), "digest": digest.hexdigest()}
    if shaping:
        out[SAMPLES] = dict(shaping)
    return out


#: The description's part naming the dataset's version (or view).
DATASET = "dataset"
#: The description's part that shapes samples, not which records come next
#: (a reader of record indices alone does not compare it).
SAMPLES = "samples"


def parse_state(state: dict, *, records: int, describe: Callable[[int], dict],
                indices_only: bool = False) -> StreamPoint | WorkerPosition:
    """A worker position (given back to one worker) or a resume point (from a
    point, or from a loader's whole state).

    Args:
        state: the state dict.
        records: the reader's records (or a mixture's samples per epoch).
        describe: the reader's order description at an epoch
            (:func:`order_description`), compared with the state's.
        indices_only: the reader gives record indices, not samples: what
            shapes samples (a random crop) is not compared.

    Raises:
        ValueError: the state is of another dataset or order, incomplete, or
            was taken in a way that does not define a resume point.
    """
    if not isinstance(state, dict):
        raise ValueError(f"a stream state is a dict, not {type(state).__name__}")
    entries = [_load(e) for e in _found(state, [])]
    if not entries:
        raise ValueError("no fastdata stream state found in this state dict: was it saved "
                         "from a ShardedIterableDataset or its DataLoader?")
    for entry in entries:
        _check_dataset(entry, records, describe, indices_only)
    if TAG in state:
        return entries[0]
    return _point_of(entries, records)


def saved_point(state: dict) -> StreamPoint:
    """The resume point in ``state`` (a point, or a loader's whole state
    holding one), unchecked: for a caller that continues it under another
    order on purpose (a mixture changed from that point).

    Raises:
        ValueError: ``state`` holds no resume point.
    """
    if not isinstance(state, dict):
        raise ValueError(f"a resume state is a dict, not {type(state).__name__}")
    points = [e for e in map(_load, _found(state, [])) if isinstance(e, StreamPoint)]
    if not points:
        raise ValueError("no resume point in this state: pass an EpochBatches.state_dict() "
                         "or the state_dict() of the StatefulDataLoader that read it")
    return points[0]


def _check_dataset(entry, records: int, describe: Callable[[int], dict],
                   indices_only: bool) -> None:
    described = describe(entry.epoch) if entry.order else {}
    saved_version = (entry.order or {}).get(DATASET, {}).get("version")
    now_version = described.get(DATASET, {}).get("version")
    if (saved_version or 1) != (now_version or 1):  # a dataset never changed is at 1
        raise ValueError(
            f"this state was saved reading version {saved_version or 1} of the dataset; "
            f"this reads version {now_version or 1}. Open version {saved_version or 1} "
            f"(version={saved_version or 1}) to resume exactly, or start the epoch afresh "
            f"on the new version (fastdata info --history lists the versions)")
    if entry.records and entry.records != records:
        raise ValueError(f"this state was saved for a dataset of {entry.records} records; "
                         f"this one has {records} (if records were appended since, open the "
                         f"version it was saved with: fastdata info --history)")
    if not entry.order:
        return
    algorithm = entry.order.get("algorithm", 1)
    if algorithm != ALGORITHM:
        raise ValueError(
            f"this state was saved with order algorithm {algorithm!r} (a fastdata that made "
            f"each epoch's order as a permutation of every record); this one computes orders "
            f"with algorithm {ALGORITHM}, in which the rest of the epoch is other samples. "
            f"Resume from the start of epoch {entry.epoch}: load no state and call "
            f"set_epoch({entry.epoch})")
    # As JSON has them (a state may have been through JSON: tuples become lists).
    saved, now = (json.loads(json.dumps(d)) for d in (entry.order, described))
    # The version was compared above; a digest tells two datasets at one number apart.
    mine, theirs = saved.pop(DATASET, {}), now.pop(DATASET, {})
    _check_sources(mine.get("sources") or {}, theirs.get("sources") or {})
    if any(mine.get(k) and theirs.get(k) and mine[k] != theirs[k] for k in ("sha256", "view")):
        raise ValueError("this state was saved reading another dataset (or another view) at "
                         "this version number; resume it on the dataset it was saved with")
    if indices_only:
        saved.pop(SAMPLES, None), now.pop(SAMPLES, None)
    if saved != now:
        diff = "; ".join(f"{name} {_shown(a)} now {_shown(b)}"
                         for name, a, b in _differences(saved, now))
        raise ValueError(f"this state was saved with another order ({diff}): the rest of the "
                         f"epoch would not be the samples not yet read; use the same options")


def _check_sources(saved: dict, now: dict) -> None:
    """Refuse a mixture's state saved on another version of a source."""
    for name in [*now, *(n for n in saved if n not in now)]:
        a, b = saved.get(name) or {}, now.get(name) or {}
        if (a.get("version") or 1) != (b.get("version") or 1):
            raise ValueError(
                f"mixture source {name!r}: this state was saved reading version "
                f"{a.get('version') or 1} of it; this reads version {b.get('version') or 1}. "
                f"Give that source fastdata.DatasetRef(path, version="
                f"{a.get('version') or 1}) to resume exactly, or start the epoch afresh")
        if any(a.get(k) and b.get(k) and a[k] != b[k] for k in ("sha256", "view")):
            raise ValueError(f"mixture source {name!r}: this state was saved reading another "
                             f"dataset (or view) at this version number; resume it on the "
                             f"one it was saved with")


_ABSENT = object()


def _differences(saved, now, name: str = "") -> list[tuple[str, object, object]]:
    """(field, saved, now) of every field that differs, by its dotted name;
    a mixture's sources named by their names."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out = []
        for key in [*now, *(k for k in saved if k not in now)]:
            out += _differences(saved.get(key, _ABSENT), now.get(key, _ABSENT),
                                f"{name}.{key}" if name else str(key))
        return out
    if isinstance(saved, list) and isinstance(now, list) and len(saved) == len(now) \
            and all(isinstance(x, dict) and "name" in x for x in saved + now):
        out = []
        for a, b in zip(saved, now):
            label = repr(a["name"]) if a["name"] == b["name"] else f"{a['name']!r}/{b['name']!r}"
            out += _differences(a, b, f"{name}[{label}]")
        return out
    return [] if saved == now else [(name, saved, now)]


def _shown(value) -> str:
    return "(none)" if value is _ABSENT else repr(value)


def _point_of(entries: list, records: int) -> StreamPoint:
    """The resume point of one rank's workers' positions (every rank has taken
    the same steps, so one rank's positions tell the whole job's)."""
    points = [e for e in entries if isinstance(e, StreamPoint)]
    workers = [e for e in entries if isinstance(e, WorkerPosition)]
    if not workers:
        return points[0]
    first = workers[0]
    ranks = {w.rank for w in workers}
    if len(ranks) > 1:
        raise ValueError(f"this state holds positions of ranks {sorted(ranks)}; pass one "
                         f"rank's loader state (every rank has taken the same steps)")
    by_worker = {w.worker: w for w in workers}
    if sorted(by_worker) != list(range(first.workers)) or \
            any(w.epoch != first.epoch or w.start != first.start for w in workers):
        raise ValueError(f"this state holds {len(by_worker)} of the {first.workers} workers' "
                         f"positions of one epoch; it cannot be resumed")
    if first.batch_size == 0 and first.workers > 1:
        # Single-sample turns: a DataLoader batch comes from one worker, so the
        # job did not consume a prefix of the order.
        raise ValueError("this state was taken with batch_size=None and several workers: it "
                         "resumes only with the same ranks and workers (StatefulDataLoader."
                         "load_state_dict); pass batch_size= to ShardedIterableDataset for a "
                         "resume with other ranks or workers")
    plan = first.slice()
    done = [by_worker[k].batches_done() for k in range(first.workers)]
    n = batches_delivered(done, plan.batches(), first.workers)
    return StreamPoint(first.epoch, plan.consumed_after(n), records, first.order)

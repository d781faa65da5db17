"""Exact duplicates within a packed dataset, and records it shares with others
(``fastdata dedup``; no torch).

Two records are exact duplicates when their stored bytes are the same: each
record's payload is hashed (BLAKE2b, 16 bytes) as the dataset is read in
stored order, the digests of every dataset are sorted together, and runs of
one digest are the groups. Only the members' keys are looked up. With
``against``, a group that holds records of the first dataset and of another
is content the first shares with it: a validation image in the training set.

The records are hashed in pieces on an executor (this machine's processes,
a Dask or a Ray cluster: see fastdata.ops.dedup_pieces and fastdata.jobs);
each piece writes a sorted run of its digests, and the runs are merged.
What grows with the datasets: 28 bytes per record on disk while the job
runs (its work folder); in memory, a chunk of each run and the groups
found; one read of every record's bytes. Near-duplicates (a resized or
re-encoded copy) are other bytes: ``near=True`` hashes the images in pieces
into files of hashes and finds the pairs from sorted runs on the same
executor (fastdata.near_groups): 16 bytes per record and index table on
disk (twice with ``flip``), in memory a block of index rows per piece and
the pairs found.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdata.dataset.resolve import open_reader
from fastdata.ops.piece_readers import describe
from fastdata.progress import progress_bar


@dataclass(frozen=True)
class Member:
    """One record of a group: its dataset (by position in the report's
    ``datasets``), its index there and its key."""

    dataset: int
    index: int
    key: str | None


@dataclass(frozen=True)
class DuplicateGroup:
    """Records with the same stored bytes: ``digest`` (BLAKE2b-128, hex) and
    the members in dataset, then index order. With ``near``: records whose
    perceptual hashes differ in at most the threshold's bits (``kind``
    ``"near"``, ``distance`` the largest difference of a pair that joined
    them; ``"exact"`` when their bytes are the same too; ``digest`` the
    first member's)."""

    digest: str
    members: list[Member]
    kind: str = "exact"
    distance: int = 0

    def datasets(self) -> set[int]:
        return {m.dataset for m in self.members}


@dataclass(frozen=True)
class DedupReport:
    """What :func:`dedup` found.

    Attributes:
        datasets: the paths, the one checked first, then those of ``against``.
        records: each dataset's record count, in the same order.
        groups: every group of two or more records with the same bytes, across
            all the datasets, ordered by the first member.
    """

    datasets: list[str]
    records: list[int]
    groups: list[DuplicateGroup] = field(default_factory=list)
    near_threshold: int | None = None
    flip: bool = False

    def within(self) -> list[DuplicateGroup]:
        """Groups with two or more records of the first dataset."""
        return [g for g in self.groups if sum(m.dataset == 0 for m in g.members) > 1]

    def shared(self) -> list[DuplicateGroup]:
        """Groups holding records of the first dataset and of another."""
        return [g for g in self.groups if 0 in g.datasets() and len(g.datasets()) > 1]

    def redundant(self) -> int:
        """Records of the first dataset beyond the first of their group: what
        dropping the duplicates would remove."""
        return sum(sum(m.dataset == 0 for m in g.members) - 1 for g in self.within())

    def to_drop(self) -> list[int]:
        """Indices of the first dataset a clean view leaves out: each group's
        records of it beyond the first, and every one of a group it shares
        with another dataset."""
        drop = set()
        for group in self.groups:
            mine = [m.index for m in group.members if m.dataset == 0]
            if len(group.datasets()) > 1:
                drop.update(mine)
            else:
                drop.update(mine[1:])
        return sorted(drop)

    def to_dict(self) -> dict:
        return {
            "near": None if self.near_threshold is None else {
                "threshold": self.near_threshold, "flip": self.flip},
            "datasets": [{"path": p, "records": n} for p, n in zip(self.datasets, self.records)],
            "redundant": self.redundant(),
            "within": len(self.within()),
            "shared": len(self.shared()),
            "groups": [{"digest": g.digest, "kind": g.kind, "distance": g.distance,
                        "members": [{"dataset": self.datasets[m.dataset], "index": m.index,
                                     "key": m.key} for m in g.members]}
                       for g in self.groups],
        }


def dedup(path: str | os.PathLike, *, against: Sequence[str | os.PathLike] = (),
          near: bool = False, threshold: int | None = None, flip: bool = False,
          progress: bool | None = None, allow_outside: bool = False,
          scheduler: Any = None, ray: Any = None, workers: int | None = None,
          resume: bool = False, on_event: Callable[[str], None] | None = None
          ) -> DedupReport:
    """Find the exact duplicates of the packed dataset ``path``, and with
    ``against`` the records it shares with other datasets (any format, local
    or at a URL).

    Every record is read once and checked against its CRC-32 (a damaged one
    raises ``CorruptDataError``, naming it). The records are hashed in
    pieces, in parallel (see fastdata.ops.dedup_pieces): on ``workers``
    processes here, or on a cluster; the report is the same wherever they ran.

    Args:
        near: find near-duplicates instead: images whose perceptual hashes
            differ in at most ``threshold`` of 63 bits (default 8), such as
            resized, re-encoded or lightly cropped copies; every record is
            decoded small (see fastdata.near_duplicates).
        flip: with ``near``, a mirrored copy counts too.
        scheduler: hash on a Dask cluster (its scheduler's address or a
            ``distributed.Client``); ``ray``: on a Ray cluster (its address,
            or True for ``$FASTDATA_RAY``). The workers must see the datasets
            and ``$FASTDATA_STAGING_DIR`` at the same paths.
        workers: processes on this machine (None: one per usable core).
        resume: continue an interrupted run of the same job (its finished
            pieces are kept in its work folder, see fastdata.jobs.journal).
        on_event: called with each note (a run kept or started over).

    Returns:
        a :class:`DedupReport`.
    """
    from fastdata.errors import FastDataError

    given = [name for name, value in (("threshold", threshold is not None), ("flip", flip))
             if value]
    if given and not near:
        raise FastDataError(
            f"{' and '.join(f'{name}=' for name in given)} appl{'y' if len(given) > 1 else 'ies'}"
            " to the near-duplicate search only: pass near=True (CLI: --near) too, or leave "
            f"{'them' if len(given) > 1 else 'it'} out")
    paths = [os.fspath(path)] + [os.fspath(p) for p in against]
    datasets, counts = describe(paths, allow_outside)
    from fastdata.jobs.choose import open_executor
    from fastdata.ops.dedup_pieces import plan_pieces

    threshold = _threshold(threshold) if near else None
    pieces = plan_pieces(counts)
    with contextlib.closing(open_executor(scheduler=scheduler, ray=ray, workers=workers,
                                          on_event=on_event, pieces=len(pieces))) as executor:
        run = _hash_pieces(datasets, counts, pieces, near=near, flip=flip, executor=executor,
                           resume=resume, progress=progress, on_event=on_event)
        with run.merging(executor), contextlib.ExitStack() as readers:
            opened = [readers.enter_context(contextlib.closing(
                open_reader(where, allow_outside=allow_outside))) for where in paths]
            if near:
                groups = _near_groups(run, counts, opened, threshold, executor)
            else:
                groups = _merged_groups(run, opened)
    run.finish()
    return DedupReport(paths, counts, groups, near_threshold=threshold, flip=flip)


def _hash_pieces(datasets: list[dict], counts: list[int], pieces: list[tuple], *, near: bool,
                 flip: bool, executor, resume: bool, progress: bool | None, on_event):
    """Every record hashed, piece by piece, on ``executor``."""
    from fastdata.jobs.runner import Job, run_job
    from fastdata.ops.dedup_pieces import digest_piece, hash_piece, piece_records

    firsts = np.cumsum([0] + counts[:-1]).tolist()
    fingerprint = {"datasets": [dict(d, records=n) for d, n in zip(datasets, counts)],
                   "near": near, "flip": flip, "piece_records": piece_records(sum(counts))}
    if near:
        fingerprint["hashes"] = "near_groups.write_hashes"  # the pieces' file layout
    job = Job("dedup", fingerprint, hash_piece if near else digest_piece, pieces,
              common=(datasets, flip, firsts) if near else (datasets,),
              sizes=[end - start for _, start, end in pieces])
    return run_job(job, executor, resume=resume, progress=progress, on_event=on_event)


def _threshold(threshold: int | None) -> int:
    from fastdata.errors import FastDataError
    from fastdata.near_duplicates import DEFAULT_THRESHOLD, HASH_BITS

    if threshold is None:
        return DEFAULT_THRESHOLD
    if isinstance(threshold, bool) or not isinstance(threshold, int) or \
            not 0 <= threshold <= 24:
        raise FastDataError(f"threshold is 0 to 24 bits (of the hash's {HASH_BITS}), not "
                            f"{threshold!r}")
    return threshold


def _near_groups(run, counts: list[int], readers, threshold: int,
                 executor) -> list[DuplicateGroup]:
    """Groups of records joined by near pairs (every dataset's records in one
    index: fastdata.near_groups, run on ``executor`` from the pieces' hash
    files); a group whose members' bytes are equal is exact. In memory: the
    pairs found and their records, never a value per record."""
    from fastdata.near_duplicates import group_labels, near_pairs_from_runs
    from fastdata.near_groups import open_piece

    files = [os.path.join(run.work, r["hashes"]) for r in run.results]
    if not files:
        return []
    found = near_pairs_from_runs(files, os.path.join(run.work, "near"), threshold,
                                 executor=executor)
    pairs = np.load(found.path, allow_pickle=False)
    if not len(pairs):
        return []
    members, labels = group_labels(np.stack([pairs["i"], pairs["j"]], 1))
    order = np.lexsort((members, labels))
    members, labels = members[order], labels[order]
    # A group's widest pair: the largest distance among the pairs it holds.
    by_member = np.argsort(members)
    pair_label = labels[by_member][np.searchsorted(members[by_member], pairs["i"])]
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    widest = np.zeros(len(starts), np.int64)
    np.maximum.at(widest, np.searchsorted(labels[starts], pair_label), pairs["distance"])
    firsts = np.cumsum([0] + counts[:-1])
    piece_starts = np.cumsum([0] + [r["records"] for r in run.results])
    groups = []
    for k, flat in enumerate(np.split(members, starts[1:])):
        group = []
        for at in flat.tolist():
            number = int(np.searchsorted(firsts, at, side="right")) - 1
            index = at - int(firsts[number])
            group.append(Member(number, index, readers[number].key_of(index)))
        payloads = {digest(readers[m.dataset].read(m.index)).tobytes() for m in group}
        kind = "exact" if len(payloads) == 1 else "near"
        piece = int(np.searchsorted(piece_starts, flat[0], side="right")) - 1
        first_hash = open_piece(files[piece], mmap=True)["hash"][flat[0] - piece_starts[piece]]
        groups.append(DuplicateGroup(f"{int(first_hash):016x}", group, kind, int(widest[k])))
    groups.sort(key=lambda g: (g.members[0].dataset, g.members[0].index))
    return groups


def digest(data) -> np.ndarray:
    """A record's content digest: BLAKE2b-128 of its stored bytes, as two uint64."""
    return np.frombuffer(hashlib.blake2b(data, digest_size=16).digest(), dtype="<u8")


def record_digests(reader, *, progress: bool | None = None) -> np.ndarray:
    """The digest of every record of ``reader`` (``(n, 2)`` uint64), read once
    in stored order and checked against its CRC-32."""
    found = np.empty((len(reader), 2), dtype=np.uint64)
    name = os.path.basename(str(reader.url or reader.path).rstrip("/"))
    with progress_bar(len(reader), f"hashing {name}", enabled=progress) as bar:
        for i, data, _ in reader.records(check=True):
            found[i] = digest(data)
            bar.update()
    return found


def digest_keys(digests: np.ndarray) -> np.ndarray:
    """Digests as one sortable 16-byte value each (numpy ``V16``)."""
    return np.ascontiguousarray(digests).view("V16").ravel()


def _merged_groups(run, readers) -> list[DuplicateGroup]:
    """Runs of equal digests, two records or more, each as a group, from the
    pieces' sorted runs merged in digest order (members in dataset, index
    order); only the duplicates become Python objects."""
    from fastdata.jobs.sorted_runs import (
        MERGE_CHUNK,
        MERGE_FAN_IN,
        combine_runs,
        equal_runs,
        merged,
    )
    from fastdata.ops.dedup_pieces import ORDER

    paths = combine_runs([os.path.join(run.work, r["run"]) for r in run.results], ORDER,
                         run.work, fan_in=MERGE_FAN_IN, chunk_rows=MERGE_CHUNK)
    groups = []
    for rows in equal_runs(merged(paths, ORDER, chunk_rows=MERGE_CHUNK), ("hi", "lo")):
        digest_bytes = np.array([rows["hi"][0], rows["lo"][0]], ">u8").tobytes()
        members = [Member(int(d), int(i), readers[int(d)].key_of(int(i)))
                   for d, i in zip(rows["dataset"].tolist(), rows["index"].tolist())]
        groups.append(DuplicateGroup(digest_bytes.hex(), members))
    groups.sort(key=lambda g: (g.members[0].dataset, g.members[0].index))
    return groups

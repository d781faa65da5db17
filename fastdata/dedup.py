"""Exact duplicates within a packed dataset, and records it shares with others
(``fastdata dedup``; no torch).

Two records are exact duplicates when their stored bytes are the same: each
record's payload is hashed (BLAKE2b, 16 bytes) as the dataset is read in
stored order, the digests of every dataset are sorted together, and runs of
one digest are the groups. Only the members' keys are looked up. With
``against``, a group that holds records of the first dataset and of another
is content the first shares with it: a validation image in the training set.

What grows with the datasets: 24 bytes per record (its digest, dataset and
index) in this process, while the groups are found; one read of every
record's bytes. Near-duplicates (a resized or re-encoded copy) are other
bytes and not found here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fastdata.formats import open_reader
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
    the members in dataset, then index order."""

    digest: str
    members: list[Member]

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

    def to_dict(self) -> dict:
        return {
            "datasets": [{"path": p, "records": n} for p, n in zip(self.datasets, self.records)],
            "redundant": self.redundant(),
            "within": len(self.within()),
            "shared": len(self.shared()),
            "groups": [{"digest": g.digest,
                        "members": [{"dataset": self.datasets[m.dataset], "index": m.index,
                                     "key": m.key} for m in g.members]}
                       for g in self.groups],
        }


def dedup(path: str | os.PathLike, *, against: Sequence[str | os.PathLike] = (),
          progress: bool | None = None, allow_outside: bool = False) -> DedupReport:
    """Find the exact duplicates of the packed dataset ``path``, and with
    ``against`` the records it shares with other datasets (any format, local
    or at a URL).

    Every record is read once and checked against its CRC-32 (a damaged one
    raises ``CorruptDataError``, naming it).

    Returns:
        a :class:`DedupReport`.
    """
    paths = [os.fspath(path)] + [os.fspath(p) for p in against]
    digests, owners, counts, readers = [], [], [], []
    for number, where in enumerate(paths):
        reader = open_reader(where, allow_outside=allow_outside)
        readers.append(reader)
        n = len(reader)
        counts.append(n)
        found = np.empty((n, 2), dtype=np.uint64)
        with progress_bar(n, f"hashing {os.path.basename(where.rstrip('/'))}",
                          enabled=progress) as bar:
            for i, data, _ in reader.records(check=True):
                found[i] = np.frombuffer(hashlib.blake2b(data, digest_size=16).digest(),
                                         dtype="<u8")
                bar.update()
        digests.append(found)
        owners.append(np.stack([np.full(n, number, dtype=np.int64),
                                np.arange(n, dtype=np.int64)], axis=1))
    groups = _groups(np.concatenate(digests) if digests else np.empty((0, 2), np.uint64),
                     np.concatenate(owners) if owners else np.empty((0, 2), np.int64),
                     readers)
    for reader in readers:
        reader.close()
    return DedupReport(paths, counts, groups)


def _groups(digests: np.ndarray, owners: np.ndarray, readers) -> list[DuplicateGroup]:
    """Runs of equal digests, two records or more, each as a group."""
    if len(digests) < 2:
        return []
    order = np.lexsort((owners[:, 1], owners[:, 0], digests[:, 1], digests[:, 0]))
    sorted_digests = digests[order]
    same = np.all(sorted_digests[1:] == sorted_digests[:-1], axis=1)
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    ends = np.concatenate([starts[1:], [len(order)]])
    groups = []
    for start, end in zip(starts.tolist(), ends.tolist()):
        if end - start < 2:
            continue
        members = [Member(int(d), int(i), readers[int(d)].key_of(int(i)))
                   for d, i in owners[order[start:end]].tolist()]
        digest = sorted_digests[start].astype("<u8").tobytes().hex()
        groups.append(DuplicateGroup(digest, members))
    groups.sort(key=lambda g: (g.members[0].dataset, g.members[0].index))
    return groups

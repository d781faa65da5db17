"""Whole-dataset checks of sharded datasets for ``fastdata verify`` (no torch).

Two kinds, both returned as problems (``{"index", "path", "reason"}``, index
None for a whole file) rather than raised, so that verify lists every one:

- the index rows: shard numbers in range and in order, per-shard counts as
  the manifest says, and within a shard every record after the one before it,
  without overlap and inside the file (a row copied over another, from an
  index older than its SHA-256 or damaged with it, shows up here);
- the shard files against the manifest's per-shard SHA-256 and size, which
  cover every byte of a shard: tar headers and padding, ``.cls`` members,
  TFRecord framing, and a shard of another pack.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import numpy as np

from fastdata.formats.integrity import file_sha256

#: Rows reported per kind of index problem; the rest are counted.
ROWS_SHOWN = 5


#: Index rows checked at a time: the check's memory, whatever the dataset's size.
CHUNK_ROWS = 1 << 16


def index_problems(chunks: Iterable[np.ndarray], shards: list[dict], shard_paths: list[str],
                   index_path: str) -> list[dict]:
    """Problems with the rows of a dataset index (``INDEX_DTYPE``), given as
    consecutive chunks (the rows in order): one pass, a chunk in memory at a
    time. Rows naming a shard out of range are reported alone, then rows out
    of order alone, else the counts, rows past their shard's end and rows
    overlapping the one before."""
    check = _IndexCheck(shards, shard_paths, index_path)
    for chunk in chunks:
        check.add(chunk)
    return check.problems()


class _IndexCheck:
    """The state :func:`index_problems` carries from chunk to chunk: per
    shard counts, the last row, and the first ``ROWS_SHOWN`` rows of each kind
    of problem with how many there are."""

    def __init__(self, shards: list[dict], shard_paths: list[str], index_path: str) -> None:
        self.shards, self.paths, self.where = shards, shard_paths, index_path
        self.sizes = np.asarray([_shard_bytes(s, p) for s, p in zip(shards, shard_paths)],
                                dtype=np.uint64)
        self.counts = np.zeros(len(shards), np.int64)
        self.found = {kind: ([], 0) for kind in ("shard", "order", "past", "overlap")}
        self.at = 0
        self.last: tuple[int, int] | None = None  # the previous row: shard, end

    def add(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        n_shards = len(self.shards)
        shard = rows["shard"].astype(np.int64)
        before = np.r_[self.last[0] if self.last else shard[0], shard[:-1]]
        self._note("shard", np.flatnonzero(shard >= n_shards), lambda i: (
            f"index row {self.at + i} names shard {shard[i]}, but the dataset has "
            f"{n_shards} shards"))
        self._note("order", np.flatnonzero(shard < before), lambda i: (
            f"index row {self.at + i} is in shard {shard[i]}, after a row of shard "
            f"{before[i]}: rows must keep the records' order"))
        known = np.minimum(shard, max(0, n_shards - 1))
        self.counts += np.bincount(known[shard < n_shards], minlength=n_shards)[:n_shards]
        sizes = self.sizes[known] if n_shards else np.zeros(len(rows), np.uint64)
        offset, size = rows["offset"], rows["size"]
        # Clipped to the shard, so the sums cannot wrap (rows past the end are reported).
        end = np.minimum(offset, sizes) + np.minimum(size, sizes)
        self._note("past", np.flatnonzero((offset > sizes) | (size > sizes) | (end > sizes)),
                   lambda i: (f"index row {self.at + i} points at bytes {offset[i]}.."
                              f"{int(offset[i]) + int(size[i])} of {self._name(shard[i])}, "
                              f"past its end ({sizes[i]} bytes)"))
        end_before = np.r_[self.last[1] if self.last else 0, end[:-1]]
        same = shard == before
        if self.last is None:
            same[0] = False
        self._note("overlap", np.flatnonzero(same & (offset < end_before)), lambda i: (
            f"index row {self.at + i} starts at byte {offset[i]} of {self._name(shard[i])}, "
            f"before row {self.at + i - 1} ends (byte {end_before[i]}): records of a shard "
            f"follow each other without overlap, so a row is damaged or copied over another"))
        self.last = (int(shard[-1]), int(end[-1]))
        self.at += len(rows)

    def _name(self, shard: int) -> str:
        return os.path.basename(self.paths[shard])

    def _note(self, kind: str, rows: np.ndarray, reason: Callable[[int], str]) -> None:
        shown, more = self.found[kind]
        for i in rows[:max(0, ROWS_SHOWN - len(shown))].tolist():
            shown.append(_problem(self.at + i, self.where, reason(i) + ": the dataset index "
                                  "is damaged; re-pack it"))
        self.found[kind] = (shown, more + len(rows))

    def problems(self) -> list[dict]:
        if self.at == 0:
            return []
        for kind in ("shard", "order"):
            if self.found[kind][1]:
                return self._shown(kind)
        return (_count_problems(self.counts, self.shards, self.where) +
                self._shown("past") + self._shown("overlap"))

    def _shown(self, kind: str) -> list[dict]:
        shown, count = self.found[kind]
        if count > ROWS_SHOWN:
            return shown + [_problem(None, self.where, f"{count - ROWS_SHOWN} more index "
                                     "rows like these")]
        return list(shown)


def _count_problems(counts: np.ndarray, shards: list[dict], index_path: str) -> list[dict]:
    out = []
    for have, info in zip(counts.tolist(), shards):
        want = info.get("count")
        if isinstance(want, int) and have != want:
            out.append(_problem(None, index_path, f"the index has {have} rows for shard "
                                f"{info.get('path')!r}, the manifest counts {want} records"))
    return out


def _shard_bytes(info: dict, path: str) -> int:
    size = info.get("bytes")
    if isinstance(size, int) and size >= 0:
        return size
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def shard_problems(shards: list[dict], shard_paths: list[str],
                   on_bytes: Callable[[int], None] | None = None) -> list[dict]:
    """Shard files that are missing or fail the manifest's size or SHA-256."""
    problems = []
    for info, path in zip(shards, shard_paths):
        expected = info.get("sha256")
        want = info.get("bytes")
        try:
            size = os.path.getsize(path)
            if isinstance(want, int) and size != want:
                problems.append(_problem(None, path, f"is {size} bytes, the manifest says "
                                         f"{want}: it is damaged, or a shard of another pack; "
                                         f"re-pack it"))
                continue
            actual = file_sha256(path, on_bytes=on_bytes) if isinstance(expected, str) else None
        except OSError as exc:
            problems.append(_problem(None, path, f"cannot be read ({exc.strerror or exc}); "
                                     f"restore it or re-pack the dataset"))
            continue
        if actual is not None and actual != expected:
            problems.append(_problem(None, path, f"fails its SHA-256 check (the manifest "
                                     f"records {expected[:16]}..., the file gives "
                                     f"{actual[:16]}...): it is damaged, or a shard of another "
                                     f"pack; re-pack it"))
    return problems


def _problem(index: int | None, path: str, reason: str) -> dict:
    return {"index": index, "path": path, "reason": reason}

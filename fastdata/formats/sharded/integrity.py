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
from collections.abc import Callable

import numpy as np

from fastdata.formats.integrity import file_sha256

#: Rows reported per kind of index problem; the rest are counted.
ROWS_SHOWN = 5


def index_problems(index: np.ndarray, shards: list[dict], shard_paths: list[str],
                   index_path: str) -> list[dict]:
    """Problems with the rows of a dataset index (``INDEX_DTYPE``)."""
    if len(index) == 0:
        return []
    shard = index["shard"].astype(np.int64)
    n_shards = len(shards)
    bad = np.flatnonzero(shard >= n_shards)
    if len(bad):
        return _rows(bad, index_path, lambda i: f"index row {i} names shard {shard[i]}, but "
                     f"the dataset has {n_shards} shards")
    back = np.flatnonzero(np.diff(shard) < 0) + 1
    if len(back):
        return _rows(back, index_path, lambda i: f"index row {i} is in shard {shard[i]}, after "
                     f"a row of shard {shard[i - 1]}: rows must keep the records' order")
    problems = _count_problems(np.bincount(shard, minlength=n_shards), shards, index_path)
    sizes = np.asarray([_shard_bytes(s, p) for s, p in zip(shards, shard_paths)],
                       dtype=np.uint64)[shard]
    offset, size = index["offset"], index["size"]
    # Clipped to the shard, so the sums cannot wrap (rows past the end are reported).
    end = np.minimum(offset, sizes) + np.minimum(size, sizes)
    past = np.flatnonzero((offset > sizes) | (size > sizes) | (end > sizes))
    problems += _rows(past, index_path, lambda i: f"index row {i} points at bytes "
                      f"{offset[i]}..{int(offset[i]) + int(size[i])} of "
                      f"{os.path.basename(shard_paths[shard[i]])}, past its end ({sizes[i]} "
                      f"bytes)")
    overlap = np.flatnonzero((shard[1:] == shard[:-1]) & (offset[1:] < end[:-1])) + 1
    problems += _rows(overlap, index_path, lambda i: f"index row {i} starts at byte "
                      f"{offset[i]} of {os.path.basename(shard_paths[shard[i]])}, before row "
                      f"{i - 1} ends (byte {end[i - 1]}): records of a shard follow each other "
                      f"without overlap, so a row is damaged or copied over another")
    return problems


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


def _rows(rows: np.ndarray, index_path: str, reason: Callable[[int], str]) -> list[dict]:
    """One problem per row (the first ROWS_SHOWN), then one counting the rest."""
    out = [_problem(int(i), index_path, reason(int(i)) + ": the dataset index is damaged; "
                    "re-pack it") for i in rows[:ROWS_SHOWN]]
    if len(rows) > ROWS_SHOWN:
        out.append(_problem(None, index_path, f"{len(rows) - ROWS_SHOWN} more index rows "
                            f"like these"))
    return out


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

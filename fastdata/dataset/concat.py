"""Per-record columns of a version's parts, indexed as one (no torch)."""

from __future__ import annotations

import numpy as np

from fastdata.formats.column import LazyColumn, positions
from fastdata.dataset.columns import JoinedColumns


def inside(folder: str, name: str, reader) -> str:
    """``name`` (of a version record) inside the dataset's ``folder``, refused
    as any name a dataset holds that leads out of it."""
    from fastdata.contained import Folder

    return Folder(folder, where=reader.path, links_out=reader.allow_outside).path(
        name, "columns.path")


class ConcatColumn(LazyColumn):
    """Per-record columns of several parts, one after another; ``first``
    holds each part's first record and the total."""

    def __init__(self, columns: list, first: np.ndarray) -> None:
        self.columns, self.first = columns, first
        self.dtype = getattr(columns[0], "dtype", np.dtype(np.int64))
        self.shape = (int(first[-1]),)

    def locate(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        part = np.searchsorted(self.first, at, side="right") - 1
        return part, at - self.first[part]

    def __getitem__(self, where):
        n = len(self)
        if isinstance(where, (int, np.integer)):
            i = int(where) + (n if where < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"record {where} is outside the {n} records")
            part, local = self.locate(np.asarray([i]))
            return self.columns[int(part[0])][int(local[0])]
        at = positions(where, n)
        flat = at.reshape(-1)
        part, local = self.locate(flat)
        out = np.empty(len(flat), dtype=self.dtype)
        for p in np.unique(part).tolist():
            here = part == p
            out[here] = np.asarray(self.columns[p][local[here]])
        return out.reshape(at.shape)


class ConcatKeys(ConcatColumn):
    """The parts' keys, as one sequence of str."""

    def __init__(self, keys: list, first: np.ndarray) -> None:
        self.columns, self.first = keys, first
        self.shape = (int(first[-1]),)

    def __getitem__(self, where):
        if isinstance(where, (int, np.integer)):
            return super().__getitem__(where)
        part, local = self.locate(positions(where, len(self)))
        return [self.columns[int(p)][int(i)] for p, i in zip(part, local)]

    def __iter__(self):
        for keys in self.columns:
            yield from keys

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(list(self), dtype=dtype)


class RelabelledColumn(LazyColumn):
    """Labels a join gave (``labels.npy``) over the parts' own, for the
    records the join covered (records appended since keep their own)."""

    def __init__(self, own, joined: JoinedColumns) -> None:
        self.own, self.joined = own, joined
        self.dtype = np.dtype(np.int64)
        self.shape = own.shape

    def __getitem__(self, where):
        new = self.joined.array("labels.npy")
        if isinstance(where, (int, np.integer)):
            i = int(where) + (len(self) if where < 0 else 0)
            return int(new[i]) if i < len(new) else int(self.own[i])
        at = positions(where, len(self))
        out = np.asarray(self.own[at], dtype=np.int64).copy()
        covered = at < len(new)
        out[covered] = new[at[covered]]
        return out

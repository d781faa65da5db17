"""Per-record columns of a dataset record (labels, CRCs, keys), read at its
positions through the parts and their selections (no torch)."""

from __future__ import annotations

import numpy as np

from fastdata.formats.column import LazyColumn, positions


def one(where, n: int) -> int:
    """An int index (negative ones from the end) as a position in ``0..n``.

    Raises:
        IndexError: it is outside the ``n`` records.
    """
    i = int(where) + (n if where < 0 else 0)
    if not 0 <= i < n:
        raise IndexError(f"record {where} is outside the {n} records")
    return i


class PartColumn(LazyColumn):
    """One column per part (CRCs, labels), read at a record's positions."""

    def __init__(self, reader, columns: list) -> None:
        self.reader, self.columns = reader, columns
        self.dtype = getattr(columns[0], "dtype", np.dtype(np.int64))
        self.shape = (int(reader._first[-1]),)

    def _part_values(self, p: int, local: np.ndarray) -> np.ndarray:
        return np.asarray(self.columns[p][local])

    def __getitem__(self, where):
        n = len(self)
        if isinstance(where, (int, np.integer)):
            return self[np.asarray([one(where, n)])][0].item()
        at = positions(where, n)
        part, local = self.reader.locate(at.reshape(-1))
        out = np.empty(len(part), dtype=self.dtype)
        for p in np.unique(part).tolist():
            here = part == p
            out[here] = self._part_values(p, local[here])
        return out.reshape(at.shape)


class RecordLabels(PartColumn):
    """The parts' labels in the record's classes, a join's where it gave them."""

    def __init__(self, reader) -> None:
        super().__init__(reader, [r.labels for r in reader.parts])
        self.dtype = np.dtype(np.int64)

    def _part_values(self, p: int, local: np.ndarray) -> np.ndarray:
        values = np.asarray(self.columns[p][local], np.int64)
        remap = self.reader._remaps[p]
        if remap is not None:
            values = np.where(values >= 0, remap[np.maximum(values, 0)], values)
        relabel = self.reader._relabel
        if relabel is not None:
            joined, file, classes = relabel
            base = self.reader._base[p] + local
            covered = base < joined.records
            if covered.any():
                given = np.asarray(joined.array(file)[base[covered]], np.int64)
                if classes is not None:
                    given = np.where(given >= 0, classes[np.maximum(given, 0)], given)
                values = values.copy()
                values[covered] = given
        return values


class RecordKeys(LazyColumn):
    """The parts' keys at a record's positions (a sequence of str)."""

    def __init__(self, reader) -> None:
        self.reader = reader
        self.shape = (int(reader._first[-1]),)

    def __getitem__(self, where):
        n = len(self)
        if isinstance(where, (int, np.integer)):
            part, local = self.reader.locate([one(where, n)])
            return self.reader.parts[int(part[0])].keys[int(local[0])]
        part, local = self.reader.locate(positions(where, n).reshape(-1))
        return [self.reader.parts[p].keys[i] for p, i in zip(part.tolist(), local.tolist())]

    def __iter__(self):
        for lo in range(0, len(self), 4096):
            yield from self[lo:lo + 4096]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(list(self), dtype=dtype)

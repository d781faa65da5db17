"""A per-record column read on demand, indexed like a numpy array (no torch).

Readers hand out labels and CRCs as columns that need not sit in memory
whole: an index read a piece at a time, a view's selection of its
parent's, the parts of a version one after another. Each is indexed by an
int, a slice or an integer array; :class:`LazyColumn` gives the rest of
what numpy and the callers use from a ``__getitem__``.
"""

from __future__ import annotations

import numpy as np


class LazyColumn:
    """The array-like surface of a column whose subclass defines
    ``__getitem__`` (int, slice or integer array), ``dtype`` and ``shape``."""

    dtype = np.dtype(np.int64)
    shape: tuple[int, ...] = (0,)

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self):
        return iter(np.asarray(self))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.asarray(self[:])
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    def astype(self, dtype, copy: bool = True) -> np.ndarray:
        return np.asarray(self).astype(dtype)


def positions(where, n: int) -> np.ndarray:
    """An int array, slice or list of positions as int64 in ``0..n``
    (negative ones counted from the end)."""
    if isinstance(where, slice):
        return np.arange(*where.indices(n))
    at = np.asarray(where, dtype=np.int64)
    return np.where(at < 0, at + n, at)

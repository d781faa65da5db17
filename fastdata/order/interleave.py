"""A mixture's epoch computed per position, never as arrays of the epoch's size.

The mixture's epoch (:mod:`fastdata.order.mixture`) is its sources' samples
sorted by key, the j-th sample of source s at key ``(j + u_s) / c_s`` (ties
to the earlier source). Sample p of that order is found without sorting the
epoch: the key of the p-th sample is the largest float x with fewer than p+1
keys below it, found by bisection over the float's bits, and the samples of
each source before it are counted by bisection over j with the same float
arithmetic as the sort, so the order is the sorted one exactly. A chunk of
:data:`CHUNK` positions is then its sources' samples between two such
points, sorted: O(chunk) time and memory, whatever the epoch's size.

Nothing here imports torch.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

#: Positions of an epoch computed (and kept) at a time.
CHUNK = 1 << 16
#: Chunks kept per epoch.
CHUNKS_KEPT = 4


def _keys(j: np.ndarray, phase: float, count: int) -> np.ndarray:
    """Keys of samples ``j`` of a source: the float arithmetic of the sort."""
    return (np.asarray(j, dtype=np.int64) + phase) / count


class EpochInterleave:
    """Epoch positions to (source, sample of that source in this epoch).

    Args:
        counts: samples of each source in the epoch.
        phases: each source's phase ``u_s`` in [0, 1).
    """

    def __init__(self, counts: np.ndarray, phases: np.ndarray) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.phases = np.asarray(phases, dtype=np.float64)
        self.total = int(self.counts.sum())
        self.live = np.flatnonzero(self.counts > 0)
        self._points: dict[int, np.ndarray] = {0: np.zeros(len(self.counts), np.int64),
                                               self.total: self.counts.copy()}
        self._chunks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def _below(self, x: float) -> np.ndarray:
        """Samples of each source whose key is below ``x`` (bisection over j)."""
        out = np.zeros(len(self.counts), dtype=np.int64)
        for s in self.live.tolist():
            lo, hi = 0, int(self.counts[s])  # keys[lo-1] < x <= keys[hi]
            c, u = int(self.counts[s]), float(self.phases[s])
            while lo < hi:
                mid = (lo + hi) // 2
                if _keys(np.asarray([mid]), u, c)[0] < x:
                    lo = mid + 1
                else:
                    hi = mid
            out[s] = lo
        return out

    def before(self, p: int) -> np.ndarray:
        """Samples of each source among the epoch's first ``p`` positions."""
        found = self._points.get(p)
        if found is not None:
            return found
        # The key of sample p: the largest x with at most p keys below it.
        lo, hi = 0, int(np.float64(2.0).view(np.int64))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(self._below(float(np.int64(mid).view(np.float64))).sum()) <= p:
                lo = mid
            else:
                hi = mid - 1
        x = float(np.int64(lo).view(np.float64))
        below = self._below(x)
        # Keys equal to x, one per source at most: the earlier sources first.
        ties = [s for s in self.live.tolist() if below[s] < self.counts[s]
                and _keys(np.asarray([below[s]]), float(self.phases[s]),
                          int(self.counts[s]))[0] == x]
        for s in ties[:p - int(below.sum())]:
            below[s] += 1
        self._points[p] = below
        return below

    def chunk(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ``k``'s (source, sample of its source) arrays, in order."""
        found = self._chunks.get(k)
        if found is not None:
            self._chunks.move_to_end(k)
            return found
        first, last = self.before(k * CHUNK), self.before(min(self.total, (k + 1) * CHUNK))
        keys, sources, samples = [], [], []
        for s in self.live.tolist():
            j = np.arange(first[s], last[s], dtype=np.int64)
            keys.append(_keys(j, float(self.phases[s]), int(self.counts[s])))
            sources.append(np.full(len(j), s, dtype=np.int64))
            samples.append(j)
        source = np.concatenate(sources) if sources else np.zeros(0, np.int64)
        order = np.lexsort((source, np.concatenate(keys))) if keys else source
        found = (source[order], np.concatenate(samples)[order] if samples else source)
        self._chunks[k] = found
        while len(self._chunks) > CHUNKS_KEPT:
            self._chunks.popitem(last=False)
        return found

    def at(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(source, sample of its source) at ``positions`` of the epoch."""
        pos = np.asarray(positions, dtype=np.int64)
        source = np.empty(pos.shape, dtype=np.int64)
        sample = np.empty(pos.shape, dtype=np.int64)
        chunk, within = np.divmod(pos, CHUNK)
        for k in dict.fromkeys(chunk.reshape(-1).tolist()):
            here = chunk == k
            s, j = self.chunk(k)
            source[here], sample[here] = s[within[here]], j[within[here]]
        return source, sample

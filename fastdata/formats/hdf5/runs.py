"""Reading records of an HDF5 dataset by batch and in order (no torch).

A batch is read with one HDF5 call: the requested records are sorted, merged
into contiguous runs (records less than ``merge_gap`` bytes apart share a
run), and the union of the runs is read into one buffer (one call per
:data:`RUNS_PER_READ` runs for larger batches). Sequential iteration reads
whole records up to ``block_bytes`` at a time, their offsets a window of
:data:`OFFSETS_WINDOW` at a time (never the whole column).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from fastdata.errors import CorruptDataError
from fastdata.formats.hdf5.schema import OFFSETS

#: What h5py raises for damaged metadata: OSError, KeyError ("bad object header
#: version number"), RuntimeError ("bad local heap signature"), ValueError.
H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError)
#: Ranges per HDF5 read: building a union of hyperslabs costs time quadratic in
#: the number of ranges (~2 us per range at 256, ~500 us at 16k), so a huge
#: batch is read in slices of this many ranges.
RUNS_PER_READ = 256
#: Records whose offsets sequential iteration reads at a time.
OFFSETS_WINDOW = 1 << 16


def h5_message(exc: Exception) -> str:
    """h5py's exception as one line of text."""
    # h5py's KeyError repr adds quotes; the text alone reads better in one line.
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


class RunReads:
    """The payload reads of :class:`~fastdata.formats.hdf5.reader.HDF5Reader`
    (a mixin: it uses the reader's ``_payload``, ``_offsets_array``,
    ``_get_file``, ``merge_gap``, ``block_bytes``, ``path`` and ``key_of``)."""

    def _read_many(self, indices: Sequence[int]) -> list[bytes]:
        if len(indices) == 0:
            return []
        offsets = self._offsets_array()
        self._get_file()
        if len(indices) == 1:
            # One record: h5py's cached simple-slice reader beats building a selection.
            i = indices[0]
            a, b = int(offsets[i]), int(offsets[i + 1])
            if b < a:  # pieces are checked within, not across their bounds
                raise CorruptDataError(f"dataset {OFFSETS!r} puts the end of record {i} "
                                       f"before its start; re-pack it", path=self.path,
                                       key=OFFSETS, record=i)
            try:
                return [self._payload[a:b].tobytes()]
            except H5_ERRORS as exc:
                raise self._read_error(exc, [a], [b], [i]) from None
        idx = np.asarray(indices, dtype=np.int64)
        both = np.asarray(offsets[np.concatenate([idx, idx + 1])], dtype=np.int64)
        starts, ends = both[:len(idx)], both[len(idx):]
        if np.any(ends < starts):  # pieces are checked within, not across their bounds
            i = int(idx[np.flatnonzero(ends < starts)[0]])
            raise CorruptDataError(f"dataset {OFFSETS!r} puts the end of record {i} before "
                                   f"its start; re-pack it", path=self.path, key=OFFSETS,
                                   record=i)
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
        # A new run starts where a record begins more than merge_gap bytes past
        # everything before it; duplicates and neighbours fall into one run.
        reach = np.maximum.accumulate(e)
        new = np.ones(len(s), dtype=bool)
        new[1:] = s[1:] > reach[:-1] + self.merge_gap
        first = np.flatnonzero(new)
        run_start = s[first]
        run_end = np.maximum.reduceat(e, first)
        run_len = run_end - run_start
        run_pos = np.zeros(len(first), dtype=np.int64)
        np.cumsum(run_len[:-1], out=run_pos[1:])
        run_of = np.cumsum(new) - 1
        pos = np.empty(len(idx), dtype=np.int64)
        pos[order] = run_pos[run_of] + (s - run_start[run_of])
        buf = self._read_runs(run_start, run_end, int(run_len.sum()), idx[order][first])
        view = memoryview(buf)
        return [view[p:p + n].tobytes() for p, n in zip(pos.tolist(), (ends - starts).tolist())]

    def _read_runs(self, run_start: np.ndarray, run_end: np.ndarray, total: int,
                   first_records: np.ndarray) -> np.ndarray:
        """Read the byte ranges ``[run_start[k], run_end[k])`` (sorted, disjoint)
        back to back into one buffer, one HDF5 read per ``RUNS_PER_READ`` ranges."""
        import h5py

        buf = np.empty(total, dtype=np.uint8)
        dset = self._payload
        starts, ends = run_start.tolist(), run_end.tolist()
        pos = 0
        for g in range(0, len(starts), RUNS_PER_READ):
            group = [(a, b) for a, b in zip(starts[g:g + RUNS_PER_READ],
                                            ends[g:g + RUNS_PER_READ]) if b > a]
            size = sum(b - a for a, b in group)
            if size == 0:
                continue
            try:
                space = dset.id.get_space()
                space.select_none()
                for a, b in group:
                    space.select_hyperslab((a,), (b - a,), op=h5py.h5s.SELECT_OR)
                dset.id.read(h5py.h5s.create_simple((size,)), space, buf[pos:pos + size])
            except H5_ERRORS as exc:
                raise self._read_error(exc, run_start, run_end, first_records) from None
            pos += size
        return buf

    def _read_error(self, exc: Exception, run_start, run_end, first_records) -> CorruptDataError:
        # Name the first range that fails on its own, so the message points at a record.
        bad = 0
        for k, (a, b) in enumerate(zip(run_start, run_end)):
            try:
                self._payload[a:b]
            except H5_ERRORS:
                bad = k
                break
        index = int(first_records[bad])
        return CorruptDataError(
            f"record {index} cannot be read (payload bytes {int(run_start[bad])}.."
            f"{int(run_end[bad])}; h5py: {exc}): the file is damaged; re-pack it or read "
            f"with on_error='skip'", path=self.path, key=self.key_of(index), record=index)

    def _iter_payloads(self) -> Iterator[tuple[int, bytes]]:
        offsets = self._offsets_array()
        self._get_file()
        n = len(offsets) - 1
        i = 0
        window, base = np.zeros(0, dtype=np.int64), 0  # offsets[base:base + len(window)]
        while i < n:
            if i + 1 >= base + len(window):  # a window of offsets at a time, not all
                base = i
                window = np.asarray(offsets[i:min(n, i + OFFSETS_WINDOW) + 1], dtype=np.int64)
            start = int(window[i - base])
            # Whole records up to block_bytes, and at least one record.
            j = base + int(np.searchsorted(window, start + self.block_bytes, side="right")) - 1
            j = min(max(j, i + 1), base + len(window) - 1)
            end = int(window[j - base])
            if end < start:
                raise CorruptDataError(f"dataset {OFFSETS!r} decreases after record {i}; "
                                       f"re-pack it", path=self.path, key=OFFSETS, record=i)
            try:
                view = memoryview(self._payload[start:end])
            except H5_ERRORS as exc:
                raise self._read_error(exc, [start], [end], [i]) from None
            for k in range(i, j):
                lo, hi = int(window[k - base]) - start, int(window[k + 1 - base]) - start
                yield k, view[lo:hi].tobytes()
            i = j

"""External sorting of fixed-width rows (no torch): sorted runs on disk and a
k-way merge that streams them.

A row is one element of a structured numpy array (fixed-width fields, no
objects); ``order`` names the fields that sort it, the first the most
significant. A run is a ``.npy`` file (``np.save``, read back without pickle)
holding rows in that order. Ties keep their input order everywhere (a stable
sort; in a merge, the run's position in the list, then the row's within its
run), so a merge's output depends only on the runs and their order.

What grows with the data: the runs on disk. In memory, a writer holds
``rows_in_memory`` rows; a merge holds about ``len(paths) * chunk_rows`` rows
(:func:`combine_runs` bounds the number of runs a merge reads at once).
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from fastdata.errors import FastDataError

#: The merge bounds the jobs share: runs read at once (more are first
#: combined into longer runs) and rows loaded of each at a time; a merge holds
#: about 3 x 64 x 2,048 rows (11 MB at 28 B), a bound every run reaches once
#: it holds 2,048 rows, so its memory stops growing there.
MERGE_FAN_IN, MERGE_CHUNK = 64, 2048

#: Bytes reserved for a streamed run's header: room for any row count.
_HEADER = 256


def stable_order(rows, order: Sequence[str]) -> np.ndarray:
    """The indices that sort ``rows`` (a structured array, or a mapping of
    field name to column) by the fields ``order`` (first field most
    significant), ties in input order: ``np.lexsort``'s result.

    Unsigned fields that span few values (max - min) sort by 16-bit digits
    (numpy's stable sort of uint16 is a radix sort: about 3x faster than
    ``lexsort`` on a 32-bit key); anything else goes to ``np.lexsort``.
    """
    columns = [rows[name] for name in order]
    spans = []  # (least value, 16-bit digits of the span) of each field
    for column in columns:
        if column.dtype.kind != "u" or len(column) == 0:
            spans = None
            break
        low = column.min()
        spans.append((low, -(-int(column.max() - low).bit_length() // 16)))
    if spans is None or sum(digits for _, digits in spans) > 3:
        return np.lexsort(tuple(reversed(columns)))
    index = None
    # Least significant digit first: each pass is stable, so earlier passes break its ties.
    for column, (low, digits) in reversed(list(zip(columns, spans))):
        for digit in range(digits):
            part = (column if index is None else column[index]) - low
            if digit:
                part >>= 16 * digit
            step = np.argsort(part.astype(np.uint16), kind="stable")  # the low 16 bits
            index = step if index is None else index[step]
    if index is None:  # every key is 0
        index = np.arange(len(columns[0]))
    return index


def take(rows: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``rows[index]`` for a structured array, gathered as whole rows (raw
    bytes): numpy gathers a structured dtype field by field, 2-3x slower."""
    rows = np.ascontiguousarray(rows)
    return np.take(rows.view(f"V{rows.dtype.itemsize}"), index).view(rows.dtype)


def write_run(path: str, rows: np.ndarray, order: tuple[str, ...]) -> str:
    """Sort ``rows`` (a structured numpy array) by the fields ``order`` (first
    field most significant; ``np.lexsort``'s order, ties in input order) and
    write them to ``path`` atomically (a temporary name, then a rename).

    Returns:
        ``path``.
    """
    _check_fields(rows.dtype, order, path)
    rows = take(rows, stable_order(rows, order))
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as out:
        np.save(out, rows, allow_pickle=False)
    os.replace(temporary, path)
    return path


def save_chunks(path: str, chunks: Iterable[np.ndarray], dtype: np.dtype) -> int:
    """Write ``chunks`` (arrays of ``dtype``, already in their final order) one
    after another as one ``.npy`` file at ``path``, atomically; memory: one
    chunk. Returns the number of rows written."""
    dtype = np.dtype(dtype)
    temporary = f"{path}.{os.getpid()}.tmp"
    rows = 0
    with open(temporary, "wb") as out:
        out.write(_npy_header(dtype, 0))
        for chunk in chunks:
            if chunk.dtype != dtype:
                raise ValueError(f"a chunk for {path} has dtype {chunk.dtype}, not {dtype}")
            out.write(np.ascontiguousarray(chunk).view(np.uint8).data)  # no copy
            rows += len(chunk)
        out.seek(0)
        out.write(_npy_header(dtype, rows))  # the real count, in the same reserved bytes
    os.replace(temporary, path)
    return rows


def _npy_header(dtype: np.dtype, rows: int) -> bytes:
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": (rows,)}
    text = "{" + "".join(f"{key!r}: {value!r}, " for key, value in fields.items()) + "}"
    room = _HEADER - 10 - 1
    if len(text) > room:
        raise ValueError(f"dtype {dtype} is too wide for a streamed run")
    # Version 1.0: magic, version, header length, then the dict padded with spaces.
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", room + 1) + \
        (text + " " * (room - len(text)) + "\n").encode("latin1")


def _check_fields(dtype: np.dtype, order: Sequence[str], path: str) -> None:
    if dtype.names is None or dtype.hasobject:
        raise ValueError(f"rows for {path} must be a structured array of fixed-width fields, "
                         f"not {dtype}")
    missing = [name for name in order if name not in dtype.names]
    if missing or not order:
        raise ValueError(f"rows for {path} have no field(s) {missing or 'to sort by'} "
                         f"(fields: {', '.join(dtype.names)})")


class RunWriter:
    """Rows added in any order, spilled as sorted runs of at most
    ``rows_in_memory`` rows into ``folder`` (names ``prefix-000000.npy``, ...).
    Memory: ``rows_in_memory`` rows and a sort's copy of them."""

    def __init__(self, folder: str, dtype: np.dtype, order: tuple[str, ...], *,
                 rows_in_memory: int = 1 << 20, prefix: str = "run") -> None:
        if rows_in_memory < 1:
            raise ValueError(f"rows_in_memory is 1 or more, not {rows_in_memory}")
        self.folder, self.dtype, self.order, self.prefix = folder, np.dtype(dtype), order, prefix
        _check_fields(self.dtype, order, folder)
        self._buffer = np.empty(rows_in_memory, self.dtype)
        self._filled = 0
        self.paths: list[str] = []
        os.makedirs(folder, exist_ok=True)

    def add(self, rows: np.ndarray) -> None:
        """Take ``rows`` (an array of the writer's dtype)."""
        if rows.dtype != self.dtype:
            raise ValueError(f"rows for {self.folder} have dtype {rows.dtype}, not {self.dtype}")
        start = 0
        while start < len(rows):
            take = min(len(rows) - start, len(self._buffer) - self._filled)
            self._buffer[self._filled:self._filled + take] = rows[start:start + take]
            self._filled += take
            start += take
            if self._filled == len(self._buffer):
                self._spill()

    def _spill(self) -> None:
        if self._filled:
            path = os.path.join(self.folder, f"{self.prefix}-{len(self.paths):06d}.npy")
            self.paths.append(write_run(path, self._buffer[:self._filled], self.order))
            self._filled = 0

    def close(self) -> list[str]:
        """Write the rows still held; returns the paths of every run written."""
        self._spill()
        self._buffer = self._buffer[:0]
        return list(self.paths)


class RunFile:
    """A run (any ``.npy`` of rows with the ``order`` fields) read a chunk at a
    time with plain reads (``pread``, the file kept open until :meth:`close`):
    a memory map would keep every page read in this process's resident set,
    so its peak would grow with the runs' size."""

    def __init__(self, path: str, order: Sequence[str]) -> None:
        self.path = path
        self._fd = -1
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                    else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(f)
                self.offset = f.tell()
            size = os.path.getsize(path)
            self._fd = os.open(path, os.O_RDONLY)
        except (OSError, ValueError) as exc:
            raise FastDataError(f"not a readable sorted run ({exc}); write the run again",
                                path=path) from None
        if len(shape) != 1 or fortran or dtype.names is None or \
                self.offset + shape[0] * dtype.itemsize > size:
            self.close()
            raise FastDataError(f"not a run of {shape} rows in {size} bytes: cut short or not "
                                "written by write_run; write the run again", path=path)
        self.dtype, self.rows = dtype, shape[0]
        self.begin, self.end = 0, self.rows
        try:
            _check_fields(dtype, order, path)
        except ValueError:
            self.close()
            raise

    def read(self, start: int, count: int) -> np.ndarray:
        """Rows ``start`` .. ``start + count`` (fewer at the end; read-only)."""
        count = max(0, min(count, self.rows - start))
        size = count * self.dtype.itemsize
        data = os.pread(self._fd, size, self.offset + start * self.dtype.itemsize) if count \
            else b""
        if len(data) != size:
            raise FastDataError(f"the run ended early (rows {start}+{count}); write it again",
                                path=self.path)
        return np.frombuffer(data, self.dtype)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    def key(self, at: int, order: Sequence[str]) -> tuple:
        row = self.read(at, 1)[0]
        return tuple(row[name].item() for name in order)


def _key(rows: np.ndarray, at: int, order: Sequence[str]) -> tuple:
    row = rows[at]
    return tuple(row[name].item() for name in order)


def _count(rows: np.ndarray, bound: tuple, order: Sequence[str], inclusive: bool) -> int:
    """How many of the sorted ``rows`` sort before ``bound`` (or equal it)."""
    search = bisect_right if inclusive else bisect_left
    return search(range(len(rows)), bound, key=lambda at: _key(rows, at, order))


def merged(paths: Sequence[str], order: tuple[str, ...], *, chunk_rows: int = 1 << 16,
           start: int | None = None, stop: int | None = None) -> Iterator[np.ndarray]:
    """The rows of every run in one sorted order, as chunks of at most
    ``chunk_rows`` rows. Ties: by the run's position in ``paths``, then within
    the run (stable), so the result is deterministic. With ``start``/``stop``:
    only the rows whose first ``order`` field is in ``[start, stop)``.

    Each step loads up to ``chunk_rows`` rows of every run; the least of the
    last loaded keys of the runs not yet read to their end is the bound, and
    every loaded row before it (and equal to it, from runs at or before the
    first run holding it) is emitted, sorted in one vectorised pass.
    Memory: about ``3 * len(paths) * chunk_rows`` rows.

    Raises:
        FastDataError: a run that is not a readable ``.npy`` of rows with
            these fields, or that does not match the first run's dtype.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows is 1 or more, not {chunk_rows}")
    runs = [RunFile(path, order) for path in paths]
    try:
        yield from _merge(runs, order, chunk_rows, start, stop)
    finally:
        for run in runs:
            run.close()


def _merge(runs: list[RunFile], order: tuple[str, ...], chunk_rows: int, start, stop
           ) -> Iterator[np.ndarray]:
    for run in runs[1:]:
        if run.dtype != runs[0].dtype:
            raise FastDataError(f"its rows are {run.dtype}, those of {runs[0].path} are "
                                f"{runs[0].dtype}: merge runs of one kind", path=run.path)
    for run in runs:
        _restrict(run, order, start, stop)
    buffers = [np.empty(0, run.dtype) for run in runs]
    while True:
        for k, run in enumerate(runs):
            if len(buffers[k]) <= chunk_rows // 2 and run.begin < run.end:
                count = min(chunk_rows - len(buffers[k]), run.end - run.begin)
                buffers[k] = np.concatenate([buffers[k], run.read(run.begin, count)])
                run.begin += count
        open_runs = [k for k, run in enumerate(runs) if run.begin < run.end]
        if not open_runs:
            break
        # The first open run whose last loaded key is least: rows equal to it may
        # still come from it, so later runs keep theirs (ties stay in run order).
        first = min(open_runs, key=lambda k: (_key(buffers[k], -1, order), k))
        bound = _key(buffers[first], -1, order)
        counts = [_count(b, bound, order, k <= first) for k, b in enumerate(buffers)]
        yield from _emit([b[:c] for b, c in zip(buffers, counts)], order, chunk_rows)
        buffers = [b[c:] for b, c in zip(buffers, counts)]
    yield from _emit(buffers, order, chunk_rows)


def _restrict(run: RunFile, order: Sequence[str], start: int | None, stop: int | None) -> None:
    """Narrow ``run`` to the rows whose first field is in ``[start, stop)``
    (a binary search over the file: a few reads)."""
    def first(at: int):
        return run.key(at, order[:1])[0]

    if start is not None:
        run.begin = bisect_left(range(run.rows), start, key=first)
    if stop is not None:
        run.end = max(run.begin, bisect_left(range(run.rows), stop, key=first))


def _emit(parts: list[np.ndarray], order: Sequence[str], chunk_rows: int
          ) -> Iterator[np.ndarray]:
    parts = [p for p in parts if len(p)]
    if not parts:
        return
    rows = np.concatenate(parts)  # in run order: the stable sort keeps ties so
    rows = take(rows, stable_order(rows, order))
    # Copies, not views: a chunk the reader still holds when the next step
    # sorts would keep this whole step's rows alive beside the next one's.
    for at in range(0, len(rows), chunk_rows):
        yield rows[at:at + chunk_rows].copy()


def combine_runs(paths: Sequence[str], order: tuple[str, ...], folder: str, *,
                 fan_in: int = 256, chunk_rows: int = 1 << 14, prefix: str = "combined"
                 ) -> list[str]:
    """Merge ``paths`` in consecutive groups of ``fan_in`` into fewer, longer
    runs in ``folder``, again until at most ``fan_in`` remain, so that a merge
    of the result reads at most ``fan_in`` runs at once (memory: about
    ``fan_in * chunk_rows`` rows per pass, at the cost of rewriting the rows
    once per pass). The order of :func:`merged` over the result is the order
    over ``paths``, ties included; the runs given are left in place."""
    if fan_in < 2:
        raise ValueError(f"fan_in is 2 or more, not {fan_in}")
    paths = list(paths)
    level = 0
    while len(paths) > fan_in:
        out = []
        for number, at in enumerate(range(0, len(paths), fan_in)):
            group = paths[at:at + fan_in]
            path = os.path.join(folder, f"{prefix}-{level}-{number:06d}.npy")
            first = RunFile(group[0], order)
            dtype = first.dtype
            first.close()
            save_chunks(path, merged(group, order, chunk_rows=chunk_rows), dtype)
            out.append(path)
        paths, level = out, level + 1
    return paths


def group_chunks(chunks: Iterable[np.ndarray], fields: tuple[str, ...]
                 ) -> Iterator[np.ndarray]:
    """The sorted ``chunks`` again, cut where ``fields`` change so that each
    chunk holds whole groups of rows equal in ``fields`` (a group is never
    split between two chunks); memory: a chunk and one group. Only a group
    that crosses a boundary is copied."""
    held: list[np.ndarray] = []  # the rows of one group so far

    def same(rows: np.ndarray, row: np.ndarray) -> np.ndarray:
        equal = np.ones(len(rows), bool)
        for name in fields:
            equal &= rows[name] == row[name]
        return equal

    for chunk in chunks:
        if not len(chunk):
            continue
        if held:
            # Rows equal to the held group's come first (the chunks are sorted).
            cont = same(chunk, held[0][0])
            end = int(np.argmin(cont)) if not cont.all() else len(chunk)
            held.append(chunk[:end])
            if end == len(chunk):
                continue
            yield np.concatenate(held) if len(held) > 1 else held[0]
            chunk, held = chunk[end:], []
        tail = same(chunk, chunk[-1])
        cut = int(np.flatnonzero(~tail)[-1]) + 1 if not tail.all() else 0
        if cut:
            yield chunk[:cut]
        held = [chunk[cut:]]
    if held:
        yield np.concatenate(held) if len(held) > 1 else held[0]


def equal_runs(chunks: Iterable[np.ndarray], fields: tuple[str, ...]) -> Iterator[np.ndarray]:
    """From sorted ``chunks``, each group of two or more consecutive rows equal
    in ``fields`` (a group may cross chunk boundaries), as one array; memory:
    a chunk and one group."""
    for rows in group_chunks(chunks, fields):
        change = np.zeros(len(rows) - 1, bool)
        for name in fields:
            change |= rows[name][1:] != rows[name][:-1]
        bounds = np.concatenate([[0], np.flatnonzero(change) + 1, [len(rows)]])
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            if hi - lo >= 2:
                yield rows[lo:hi]

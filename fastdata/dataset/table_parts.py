"""Reading a table (CSV/TSV, JSON Lines, Parquet) in parts, each part on its
own and in any process (no torch).

:func:`plan_table` cuts the table once: byte ranges of a text table, each
starting where a line starts (for CSV, a line that ends outside quotes), or
runs of a Parquet file's row groups. :class:`TablePart` gives one part's
rows as dicts of the values fastdata.dataset.tables describes, with the row
and line numbers a read of the whole table gives when it is told where the
part starts. A table read whole is the plan of one part.

Tables must be UTF-8 (a UTF-8 byte order mark is skipped). What grows with
the table here: one line at a time (Parquet: a batch of 4,096 rows), and
the plan (two numbers a part).
"""

from __future__ import annotations

import codecs
import csv
import itertools
import json
import os
from collections.abc import Iterator

import numpy as np

from fastdata.dataset.tables import read_value
from fastdata.errors import FastDataError

_FORMATS = ((".csv", "csv"), (".tsv", "tsv"), (".jsonl", "jsonl"), (".ndjson", "jsonl"),
            (".parquet", "parquet"))
_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
         (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))
_SAVE = "save it as UTF-8"
#: Bytes read at a time when a CSV file is scanned for where its parts start.
SCAN_BYTES = 8 << 20
#: Parquet rows converted at a time.
PARQUET_BATCH = 4096


def part_size(total: int, parts: int, low: int, high: int) -> int:
    """The size of each of about ``parts`` parts of ``total`` (records, rows
    or bytes), kept within ``low``..``high`` (so a part is worth a task and
    a piece's memory stays bounded)."""
    return min(high, max(low, -(-total // parts)))


def plan_table(path: str, *, parts: int = 1, min_bytes: int = 1, max_bytes: int = 1 << 62,
               min_rows: int = 1, max_rows: int = 1 << 62) -> dict:
    """The table's plan: its format, its parts and where its rows start.

    Args:
        parts: about how many parts (1: the table whole).
        min_bytes, max_bytes: the bounds of a text table's part, in bytes.
        min_rows, max_rows: the bounds of a Parquet table's part, in rows
            (whole row groups).

    Returns:
        a JSON value: ``path``, ``format``, ``size`` and ``mtime_ns`` (a job
        resumed over another table is another job), ``parts`` (``[start,
        end)`` byte offsets or row groups), ``first_line`` (of the rows) and,
        for CSV/TSV, ``header``.

    Raises:
        FastDataError: another extension; a table in UTF-16 or UTF-32; a
            CSV header that cannot be read or names a column twice.
    """
    lower = path.lower()
    fmt = next((f for ext, f in _FORMATS if lower.endswith(ext)), None)
    if fmt is None:
        raise FastDataError("a table is a .csv, .tsv, .jsonl or .parquet file", path=path)
    stat = os.stat(path)
    spec = {"path": path, "format": fmt, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if fmt == "parquet":
        return {**spec, "parts": _row_group_parts(path, parts, min_rows, max_rows),
                "first_line": 1}
    start = _text_start(path)
    step = part_size(stat.st_size - start, parts, min_bytes, max_bytes)
    if parts <= 1:
        step = max(stat.st_size, 1)
    if fmt == "jsonl":
        return {**spec, "parts": _line_parts(path, start, stat.st_size, step),
                "first_line": 1}
    header, end, line = _csv_header(path, start, stat.st_size, fmt)
    cut = [] if header is None else _line_parts(path, end, stat.st_size, step, quotes=True)
    return {**spec, "parts": cut, "header": header, "first_line": line + 1}


class Misaligned(Exception):
    """A CSV part ends inside a quoted cell: its plan cut it where a quote
    inside an unquoted cell made the count of quotes lie. Read the table as
    one part instead."""


# -- where the parts start ----------------------------------------------------------------

def _text_start(path: str) -> int:
    """Where a text table's lines start: past a UTF-8 byte order mark."""
    with open(path, "rb") as f:
        head = f.read(4)
    for bom, name in _BOMS:
        if head.startswith(bom):
            raise FastDataError(f"the table is {name} (it starts with a {name} byte "
                                f"order mark); {_SAVE}", path=path, offset=0)
    return len(codecs.BOM_UTF8) if head.startswith(codecs.BOM_UTF8) else 0


def _line_parts(path: str, start: int, size: int, step: int, quotes: bool = False
                ) -> list[list[int]]:
    """Byte ranges of about ``step`` bytes, each starting where a line
    starts: for CSV (``quotes``) a line that ends outside quotes, counting
    every quote from ``start``."""
    if start >= size:
        return []
    if size - start <= step:
        return [[start, size]]
    if not quotes:
        return _parts_at_lines(path, start, size, step)
    bounds, target, parity, at = [start], start + step, 0, start
    with open(path, "rb") as f:
        f.seek(start)
        while target < size:
            block = f.read(SCAN_BYTES)
            if not block:
                break
            data = np.frombuffer(block, np.uint8)
            ends = np.flatnonzero(data == 10)
            counted = np.cumsum(data == 34, dtype=np.int64)  # quotes so far
            ends = ends[(counted[ends] + parity) % 2 == 0] + at
            parity = int(counted[-1] + parity) % 2
            while target < size:
                k = int(np.searchsorted(ends, target - 1))
                if k == len(ends):
                    break
                bound = int(ends[k]) + 1
                if bound < size:
                    bounds.append(bound)
                target = bound + step
            at += len(block)
    bounds.append(size)
    return [list(pair) for pair in itertools.pairwise(bounds)]


def _parts_at_lines(path: str, start: int, size: int, step: int) -> list[list[int]]:
    """Ranges of about ``step`` bytes, each starting where a line starts: the
    first newline at or past each target is found where the target is."""
    bounds = [start]
    with open(path, "rb") as f:
        while bounds[-1] + step < size:
            f.seek(bounds[-1] + step - 1)
            at = bounds[-1] + step - 1
            while True:
                block = f.read(1 << 16)
                found = block.find(b"\n")
                if not block or found >= 0:
                    break
                at += len(block)
            if not block or at + found + 1 >= size:
                break
            bounds.append(at + found + 1)
    bounds.append(size)
    return [list(pair) for pair in itertools.pairwise(bounds)]


def _row_group_parts(path: str, parts: int, min_rows: int, max_rows: int
                     ) -> list[list[int]]:
    """Runs of whole row groups of about ``rows / parts`` rows each."""
    pq = _parquet(path)[1]
    meta = pq.ParquetFile(path).metadata
    counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    size = part_size(sum(counts), parts, min_rows, max_rows) if sum(counts) else 1
    cut, begin, rows = [], 0, 0
    for g, count in enumerate(counts):
        rows += count
        if rows >= size and parts > 1:
            cut.append([begin, g + 1])
            begin, rows = g + 1, 0
    if begin < len(counts):
        cut.append([begin, len(counts)])
    return cut


def _parquet(path: str):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise FastDataError("reading Parquet needs pyarrow: pip install pyarrow",
                            path=path) from None
    return pa, pq


def _csv_header(path: str, start: int, size: int, fmt: str) -> tuple:
    """(header, where the records start, the header's last line), or
    (None, ...) for a table without a line."""
    lines = _Lines(path, start, size, 1)
    reader = csv.reader(lines.texts(), delimiter="\t" if fmt == "tsv" else ",", strict=True)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise FastDataError(f"line {lines.line} is not {fmt.upper()} ({exc})",
                            path=path) from None
    if header is not None:
        twice = sorted({c for c in header if header.count(c) > 1})
        if twice:
            raise FastDataError(f"the header names column {twice[0]!r} twice; name each "
                                f"column once", path=path)
    return header, lines.offset, lines.line


# -- a part's rows -------------------------------------------------------------------------

class _Lines:
    """The lines of a text table that start in ``[start, end)``, numbered
    from ``first_line``; a NUL byte or a byte that is not UTF-8 is refused,
    naming the line and the byte offset."""

    def __init__(self, path: str, start: int, end: int, first_line: int) -> None:
        self.path, self.end = path, end
        self.offset, self.line, self.exhausted = start, first_line - 1, False

    def numbered(self) -> Iterator[tuple[int, str]]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            for raw in f:
                if self.offset >= self.end:
                    break
                n, at = self.line + 1, self.offset
                if b"\0" in raw:
                    at += raw.index(b"\0")
                    raise FastDataError(f"line {n} holds a NUL byte (at byte offset {at}): "
                                        f"the table looks like UTF-16 or binary; {_SAVE}",
                                        path=self.path, offset=at)
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    at += exc.start
                    raise FastDataError(f"line {n} is not UTF-8 (byte "
                                        f"{raw[exc.start:exc.start + 1]!r} at byte offset "
                                        f"{at}); {_SAVE}", path=self.path, offset=at) from None
                self.line, self.offset = n, self.offset + len(raw)
                yield n, text
        self.exhausted = True

    def texts(self) -> Iterator[str]:
        for _, text in self.numbered():
            yield text


class TablePart:
    """The rows of part ``part`` of a planned table (:func:`plan_table`).

    Args:
        first_line, first_row: the numbers of the part's first line and row
            in the whole table (its messages use them; default: the table's
            first, right for the first part).

    Attributes:
        lines: the lines read so far (text tables).
    """

    def __init__(self, table: dict, part: int, types: dict, *, first_line: int | None = None,
                 first_row: int = 1) -> None:
        self.table, self.part, self.types = table, part, types
        self.start, self.end = table["parts"][part]
        self.first_line = table["first_line"] if first_line is None else first_line
        self.first_row, self.lines = first_row, 0
        self._lines = _Lines(table["path"], self.start, self.end, self.first_line)

    def rows(self) -> Iterator[dict]:
        """Each row: column -> value, read as fastdata.dataset.tables reads it.

        Raises:
            FastDataError: a line that is not UTF-8, JSON or CSV, a row with
                more cells than the header, a value that does not read as its
                type (naming the row, line and column).
            Misaligned: a CSV part cut inside a quoted cell.
        """
        raw = {"jsonl": self._jsonl, "parquet": self._parquet}.get(self.table["format"],
                                                                   self._csv)
        path, implied, kinds = self.table["path"], None, self.types
        for where, row, given in raw():
            if given is not implied:  # the format's own types, under the user's
                implied, kinds = given, {**given, **self.types}
            yield {c: read_value(v, kinds.get(c), path, where, c) for c, v in row.items()}

    def _counted(self) -> Iterator[tuple[int, str]]:
        for n, text in self._lines.numbered():
            self.lines += 1
            yield n, text

    def _jsonl(self):
        number, path = self.first_row - 1, self.table["path"]
        for n, text in self._counted():
            if not text.strip():
                continue
            number += 1
            try:
                row = json.loads(text)
            except ValueError as exc:
                raise FastDataError(f"line {n} is not JSON ({exc})", path=path) from None
            if not isinstance(row, dict):
                raise FastDataError(f"line {n} is not a JSON object", path=path)
            yield f"row {number} (line {n})", row, {}

    def _csv(self):
        fmt, path, header = self.table["format"], self.table["path"], self.table["header"]
        line = self.first_line - 1

        def texts():
            nonlocal line
            for line, text in self._counted():
                yield text

        delimiter = "\t" if fmt == "tsv" else ","
        reader = csv.reader(texts(), delimiter=delimiter, strict=True)
        try:
            number, first = self.first_row - 1, line + 1
            for cells in reader:
                where = f"row {number + 1} (line {first})"
                first = line + 1
                if not cells:
                    continue
                number += 1
                if len(cells) > len(header):
                    raise FastDataError(f"{where} has {len(cells)} cells, the header "
                                        f"{len(header)}; quote cells that hold a "
                                        f"{delimiter!r}", path=path)
                yield where, dict(zip(header, cells + [None] * (len(header) - len(cells)))), {}
        except csv.Error as exc:
            if self._lines.exhausted and self.part + 1 < len(self.table["parts"]):
                raise Misaligned() from None
            raise FastDataError(f"line {line} is not {fmt.upper()} ({exc})",
                                path=path) from None

    def _parquet(self):
        pa, pq = _parquet(self.table["path"])
        table = pq.ParquetFile(self.table["path"])
        implied = {}  # float32 columns and lists of float32 stay float32
        for field in table.schema_arrow:
            kind = field.type
            if pa.types.is_list(kind) or pa.types.is_large_list(kind) or \
                    pa.types.is_fixed_size_list(kind):
                kind = kind.value_type
            if pa.types.is_float32(kind):
                implied[field.name] = "float32"
        number = self.first_row - 1
        for batch in table.iter_batches(batch_size=PARQUET_BATCH,
                                        row_groups=list(range(self.start, self.end))):
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", row, implied

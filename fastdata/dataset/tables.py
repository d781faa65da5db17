"""The table a join reads: rows of CSV/TSV, JSON Lines or Parquet as dicts
of typed values (no torch).

Values keep the types the table gives them. CSV and TSV cells are text,
unless ``types`` names their column; JSON Lines and Parquet values keep the
types they carry. A cell comes out as one of:

    None                   a missing value (JSON null, Parquet null, an empty
                           cell of a typed CSV column)
    bool, int, float, str  as the table has it; an int must fit int64
    numpy float32          a float32 value (Parquet float, or ``"float32"``)
    numpy array            a list of ints (int64), of bools (bool), of numbers
                           with a float among them (float64; Parquet float32
                           lists and ``"float32"`` give float32)
    list, dict             any other JSON value (stored as JSON text)

Tables must be UTF-8 (a UTF-8 byte order mark is skipped). What grows with
the table here: one row at a time (Parquet: one batch of 4,096 rows).
"""

from __future__ import annotations

import codecs
import csv
import json
import re
from collections.abc import Iterator, Mapping

import numpy as np

from fastdata.errors import FastDataError

#: The types a column may be given, and what each reads.
TYPES = {"int": "a whole number that fits int64", "float": "a number",
         "float32": "a number within float32's range", "bool": "true/false, yes/no or 1/0",
         "str": "text or a whole number", "json": "JSON text"}
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
#: Ints up to this size are exact as float64 (2**53).
EXACT_FLOAT = 1 << 53
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_TRUE, _FALSE = {"true", "yes", "1"}, {"false", "no", "0"}
_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
         (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))
_SAVE = "save it as UTF-8"


def check_types(types: Mapping[str, str] | None, table: str) -> dict[str, str]:
    """``types`` as a dict, each one a known type.

    Raises:
        FastDataError: a type this does not know, naming the known ones.
    """
    out = dict(types or {})
    for column, kind in out.items():
        if kind not in TYPES:
            raise FastDataError(f"column {column!r} is given the type {kind!r}; the types "
                                f"are {', '.join(TYPES)}", path=table)
    return out


def table_rows(path: str, types: Mapping[str, str] | None = None) -> Iterator[dict]:
    """The rows of a CSV/TSV, JSON Lines or Parquet table, as dicts of the
    values described in this module's docstring.

    Args:
        types: column -> a name of :data:`TYPES`: how that column's values
            are read (a CSV cell is text without one).

    Raises:
        FastDataError: another extension; a table that is not UTF-8; a row
            that cannot be read, or a value that does not read as its
            column's type or does not fit int64 (naming the row and column).
    """
    types = check_types(types, path)
    lower = path.lower()
    if lower.endswith((".csv", ".tsv")):
        rows = _csv_rows(path, "\t" if lower.endswith(".tsv") else ",")
    elif lower.endswith((".jsonl", ".ndjson")):
        rows = _jsonl_rows(path)
    elif lower.endswith(".parquet"):
        rows = _parquet_rows(path)
    else:
        raise FastDataError("a table is a .csv, .tsv, .jsonl or .parquet file", path=path)
    implied, kinds = None, types
    for where, row, given in rows:
        if given is not implied:  # the format's own types, under the user's
            implied, kinds = given, {**given, **types}
        yield {c: _read(v, kinds.get(c), path, where, c) for c, v in row.items()}


# -- the formats ----------------------------------------------------------------------

def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file, past a UTF-8 byte order mark."""
    with open(path, "rb") as f:
        head = f.read(4)
        for bom, name in _BOMS:
            if head.startswith(bom):
                raise FastDataError(f"the table is {name} (it starts with a {name} byte "
                                    f"order mark); {_SAVE}", path=path, offset=0)
        offset = len(codecs.BOM_UTF8) if head.startswith(codecs.BOM_UTF8) else 0
        f.seek(offset)
        for n, raw in enumerate(f, 1):
            if b"\0" in raw:
                at = offset + raw.index(b"\0")
                raise FastDataError(f"line {n} holds a NUL byte (at byte offset {at}): the "
                                    f"table looks like UTF-16 or binary; {_SAVE}",
                                    path=path, offset=at)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                at = offset + exc.start
                raise FastDataError(f"line {n} is not UTF-8 (byte "
                                    f"{raw[exc.start:exc.start + 1]!r} at byte offset {at}); "
                                    f"{_SAVE}", path=path, offset=at) from None
            yield n, text
            offset += len(raw)


def _csv_rows(path: str, delimiter: str) -> Iterator[tuple[str, dict, dict]]:
    line = 0
    numbered = _lines(path)

    def texts():
        nonlocal line
        for line, text in numbered:
            yield text

    reader = csv.reader(texts(), delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
        if header is None:
            return
        twice = sorted({c for c in header if header.count(c) > 1})
        if twice:
            raise FastDataError(f"the header names column {twice[0]!r} twice; name each "
                                f"column once", path=path)
        number = 0
        first = line + 1
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
        what = "TSV" if delimiter == "\t" else "CSV"
        raise FastDataError(f"line {line} is not {what} ({exc})", path=path) from None


def _jsonl_rows(path: str) -> Iterator[tuple[str, dict, dict]]:
    number = 0
    for n, text in _lines(path):
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


def _parquet_rows(path: str) -> Iterator[tuple[str, dict, dict]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise FastDataError("reading Parquet needs pyarrow: pip install pyarrow",
                            path=path) from None
    number = 0
    table = pq.ParquetFile(path)
    implied = {}  # float32 columns and lists of float32 stay float32
    for field in table.schema_arrow:
        kind = field.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind) or \
                pa.types.is_fixed_size_list(kind):
            kind = kind.value_type
        if pa.types.is_float32(kind):
            implied[field.name] = "float32"
    for batch in table.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            number += 1
            yield f"row {number}", row, implied


# -- values ---------------------------------------------------------------------------

def _read(value, kind: str | None, table: str, where: str, column: str):
    """One cell as the column's type gives it (None: as the table has it)."""
    if kind is None:
        return _plain(value, table, where, column)
    if value is None or (value == "" and kind != "str"):
        return None
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise _bad(value, kind, table, where, column, f" ({exc})") from None
        return _plain(value, table, where, column)
    if kind == "str":
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise _bad(value, kind, table, where, column)
    if isinstance(value, list):
        items = [None if v is None else _scalar(v, kind, table, where, column)
                 for v in value]
        if items and None not in items:
            return np.asarray(items, dtype=_DTYPES[kind])
        # Empty, or with a null in it: a list (stored as JSON).
        return [v.item() if isinstance(v, np.generic) else v for v in items]
    return _scalar(value, kind, table, where, column)


_DTYPES = {"int": np.int64, "float": np.float64, "float32": np.float32, "bool": bool}


def _scalar(value, kind: str, table: str, where: str, column: str):
    """A value of the types int, float, float32 or bool."""
    text = value.strip() if isinstance(value, str) else None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
    elif kind == "int":
        if text is not None and _INT_TEXT.fullmatch(text):
            value = int(text)
        if isinstance(value, int) and not isinstance(value, bool):
            return _int64(value, table, where, column)
    else:
        number = None
        if text is not None and "_" not in text:
            try:
                number = float(text)
            except ValueError:
                number = None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        if number is not None and kind == "float32":
            with np.errstate(over="ignore"):
                small = np.float32(number)
            if np.isinf(small) and not np.isinf(number):
                raise _bad(value, kind, table, where, column)
            return small
        if number is not None:
            return number
    raise _bad(value, kind, table, where, column)


def _plain(value, table: str, where: str, column: str):
    """A value as the table gives it: ints checked against int64, lists of
    numbers or bools of one type as arrays, what JSON cannot hold refused."""
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        return _int64(value, table, where, column)
    if isinstance(value, list):
        return _array(value, table, where, column)
    if isinstance(value, dict):
        _check_json(value, table, where, column)
        return value
    raise FastDataError(f"{where}, column {column!r}: a value of type {type(value).__name__} "
                        f"cannot be stored; make the column text or numbers", path=table)


def _array(items: list, table: str, where: str, column: str):
    """A list as an array where its items are all ints, all bools, or
    numbers with a float among them; else the list (stored as JSON)."""
    if items and all(isinstance(v, bool) for v in items):
        return np.asarray(items, dtype=bool)
    if items and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        ints = [v for v in items if isinstance(v, int)]
        for v in ints:
            _int64(v, table, where, column)
        if len(ints) == len(items):
            return np.asarray(items, dtype=np.int64)
        if all(-EXACT_FLOAT <= v <= EXACT_FLOAT for v in ints):
            return np.asarray(items, dtype=np.float64)
    _check_json(items, table, where, column)
    return items


def _check_json(value, table: str, where: str, column: str) -> None:
    """Refuse a value JSON cannot hold (a Parquet date, decimal or bytes)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise FastDataError(f"{where}, column {column!r}: a map with a key of type "
                                    f"{type(k).__name__} cannot be stored", path=table)
            _check_json(v, table, where, column)
    elif isinstance(value, list):
        for v in value:
            _check_json(v, table, where, column)
    elif value is not None and not isinstance(value, (bool, int, float, str)):
        raise FastDataError(f"{where}, column {column!r}: a value of type "
                            f"{type(value).__name__} cannot be stored; make the column text "
                            f"or numbers", path=table)


def _int64(value: int, table: str, where: str, column: str) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise FastDataError(f"{where}, column {column!r}: {value} does not fit int64 "
                            f"({INT64_MIN} to {INT64_MAX}); to keep such ids as text, give "
                            f"the column the type str", path=table)
    return value


def _bad(value, kind: str, table: str, where: str, column: str,
         why: str = "") -> FastDataError:
    shown = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return FastDataError(f"{where}, column {column!r}: {shown} does not read as {kind} "
                         f"({TYPES[kind]}){why}; correct the cell, or give the column "
                         f"another type", path=table)

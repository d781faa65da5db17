"""The values of the table a join reads (CSV/TSV, JSON Lines or Parquet;
its rows are read by fastdata.dataset.table_parts), as typed values (no
torch).

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

What grows with the table here: nothing (a value at a time).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

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


# -- values ---------------------------------------------------------------------------

def read_value(value, kind: str | None, table: str, where: str, column: str):
    """One cell as the value this module's docstring lists.

    Args:
        value: the cell as the format gives it (text for CSV/TSV).
        kind: its column's type (a name of :data:`TYPES`); None: as the
            table has it.
        table, where, column: the table's path, the row (``"row 3 (line
            4)"``) and the column, for the messages.

    Raises:
        FastDataError: a value that does not read as ``kind``, an int that
            does not fit int64, a value JSON cannot hold.
    """
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

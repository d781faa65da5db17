"""Reading the columns of a Parquet table in the Hugging Face image layout:
which column holds the images and how, the label's class names from the
``huggingface`` schema metadata, which columns can become metadata, and their
values as JSON.

The ``datasets`` library writes an ``Image`` feature as a struct of ``bytes``
(the encoded file) and ``path`` (its file name, or a path when the bytes are
not embedded), and a ``ClassLabel`` as integers, with the names in the schema
metadata: ``b"huggingface"`` -> ``{"info": {"features": {"label": {"names":
[...], "_type": "ClassLabel"}}}}``.
"""

from __future__ import annotations

import datetime
import decimal
import json
from typing import Any

from fastdata.errors import SourceError

#: How a column holds its images.
STRUCT, BYTES, PATHS = "struct", "bytes", "paths"


def import_parquet():
    """``pyarrow.parquet``, or an error that says how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError("reading Parquet needs pyarrow: pip install pyarrow") \
            from None
    return pq


def image_layout(schema, column: str, path: str, option: str = "image_column") -> str:
    """How ``column`` holds images: STRUCT (``bytes`` and/or ``path``), BYTES, PATHS.
    ``option`` is the caller's name for the option that chose ``column``."""
    import pyarrow as pa

    if column not in schema.names:
        raise SourceError(f"no image column {column!r}; the table has "
                          f"{', '.join(map(repr, schema.names))} ({option}=NAME names another)",
                          path=path)
    kind = schema.field(column).type
    if pa.types.is_struct(kind):
        names = {kind.field(i).name for i in range(kind.num_fields)}
        if "bytes" in names and _is_binary(kind.field("bytes").type) or \
                "path" in names and _is_text(kind.field("path").type):
            return STRUCT
    elif _is_binary(kind):
        return BYTES
    elif _is_text(kind):
        return PATHS
    raise SourceError(f"the image column {column!r} is {kind}: expected a struct of bytes "
                      f"and path (a Hugging Face Image), binary image bytes, or file paths",
                      path=path)


def struct_fields(schema, column: str) -> tuple[bool, bool]:
    """Whether the image struct has a ``bytes`` field and a ``path`` field."""
    kind = schema.field(column).type
    names = {kind.field(i).name for i in range(kind.num_fields)}
    return "bytes" in names, "path" in names


def label_kind(schema, column: str, path: str) -> None:
    """Refuse a label column that holds neither integers nor class names."""
    import pyarrow as pa

    kind = schema.field(column).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_integer(kind) or _is_text(kind)):
        raise SourceError(f"the label column {column!r} is {kind}: expected integers or class "
                          f"names", path=path)


def class_label_names(schema, column: str) -> tuple[list[str] | None, str | None]:
    """The ClassLabel names of ``column`` from the ``huggingface`` schema metadata,
    or None; and a warning when that metadata is there but cannot be read."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None, None
    try:
        info = json.loads(raw)
        feature = info.get("info", {}).get("features", {}).get(column)
    except (ValueError, AttributeError, RecursionError):
        return None, ("the table's huggingface schema metadata is not readable JSON; labels "
                      "are taken as integers")
    if not isinstance(feature, dict) or feature.get("_type") != "ClassLabel":
        return None, None
    names = feature.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None, (f"the huggingface metadata of {column!r} has no list of class names; "
                      f"labels are taken as integers")
    return names, None


def metadata_columns(schema, taken: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The columns kept as metadata, and those left out (binary data is no JSON)."""
    kept, left = [], []
    for field in schema:
        if field.name in taken:
            continue
        (left if _holds_binary(field.type) else kept).append(field.name)
    return kept, left


def needs_conversion(schema, columns: list[str]) -> bool:
    """Whether values of these columns come out of pyarrow as something other
    than JSON types (dates and times, decimals, maps)."""
    return any(_holds(schema.field(c).type, _NOT_JSON) for c in columns)


def json_value(value: Any) -> Any:
    """A pyarrow ``as_py`` value as JSON: dates and times as ISO 8601 text,
    durations in seconds, decimals as text, map entries as [key, value] pairs."""
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def _is_binary(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or \
        pa.types.is_fixed_size_binary(kind) or _is(kind, "is_binary_view")


def _is_text(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
        _is(kind, "is_string_view")


def _is(kind, test: str) -> bool:
    import pyarrow as pa

    check = getattr(pa.types, test, None)  # newer pyarrow only
    return bool(check and check(kind))


def _holds_binary(kind) -> bool:
    return _holds(kind, _is_binary)


def _NOT_JSON(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_temporal(kind) or pa.types.is_decimal(kind) or pa.types.is_map(kind)


def _holds(kind, test) -> bool:
    """Whether ``kind`` or any type nested in it passes ``test``."""
    import pyarrow as pa

    if test(kind):
        return True
    if pa.types.is_dictionary(kind):
        return _holds(kind.value_type, test)
    return any(_holds(kind.field(i).type, test) for i in range(getattr(kind, "num_fields", 0)))

"""Parquet tables of images, in the layout the Hugging Face ``datasets`` library
writes (``Dataset.to_parquet``, the Hub's ``data/*.parquet``).

One row per image. The image column (``image``) is a struct of ``bytes`` (the
encoded file, stored as it is) and ``path`` (its file name; the file read from
it, relative to the table's folder, when ``bytes`` is null); a plain binary
column (the bytes) or text column (the paths) works too. The label column
(``label``) holds integers or class names; the class names of a ``ClassLabel``
come from the table's ``huggingface`` schema metadata. Labels of -1 (the
``datasets`` way of saying "no label") or null in every row make the table
unlabelled. Every other column goes into the entry's metadata; columns holding
binary data are left out (and named in a warning).

Keys are the image's ``path`` when it has one, else ``{table stem}/{row:08d}``
(the row within its file); a path that an earlier row already has is keyed by
position too, so keys stay unique. Rows are read a batch at a time
(``ParquetFile.iter_batches``): a table larger than memory packs in memory of
the order of one batch. pyarrow is imported only here (``pip install
pyarrow``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from fastdata.contained import list_folder
from fastdata.errors import SourceError
from fastdata.packers.source import SourceEntry
from fastdata.packers.sources.labels import LabelPlan, LabelScan
from fastdata.packers.sources.listed import LABEL_COLUMN, list_key
from fastdata.packers.sources.parquet_schema import (
    PATHS,
    STRUCT,
    class_label_names,
    image_layout,
    import_parquet,
    json_value,
    label_kind,
    metadata_columns,
    needs_conversion,
    struct_fields,
)

#: The column that holds the images, by default (a Hugging Face ``Image`` feature).
IMAGE_COLUMN = "image"
#: Rows are read in batches of about this many bytes (at most _MAX_BATCH_ROWS rows).
_BATCH_BYTES = 8 << 20
_MAX_BATCH_ROWS = 1024


class ParquetSource:
    """A Parquet file, or a folder of them (every ``.parquet`` file directly in
    it, sorted by name), as a :class:`~fastdata.Source` (see the module doc).

    Args:
        path: the file or the folder.
        image_column: the column holding the images.
        label_column: the column holding the labels; None: ``label`` when the
            table has it, else the table is unlabelled (labels -1, no classes).
        allow_outside: read image paths that lead out of the table's folder
            (absolute, ``..``, links out) for rows without bytes: for a table
            of your own; refused by default (a path beside embedded bytes is
            only the row's key, never opened).

    Raises:
        SourceError: pyarrow missing, no such file or no Parquet files, a file
            that is not Parquet, tables with different columns, no image column,
            a label column of another type, labels that are no class index,
            mixed names and integers, or missing in some rows, no rows.
        UnsafeNameError: (while reading) a row without bytes names a file
            outside the table's folder and ``allow_outside`` is off.
    """

    kind = "parquet"

    def __init__(self, path: str | os.PathLike, *, image_column: str = IMAGE_COLUMN,
                 label_column: str | None = None, allow_outside: bool = False,
                 _column_option: str = "image_column") -> None:
        # _column_option: what the caller calls image_column, for messages
        # (open_source and pack take it as path_column=).
        pq = import_parquet()
        self.path = os.path.abspath(os.fspath(path))
        self.allow_outside = allow_outside
        self.tables = parquet_files(self.path)
        self.image_column = image_column
        schema = self._schema(pq)
        self._layout = image_layout(schema, image_column, self.path, _column_option)
        if self._layout == STRUCT:
            self._has_bytes, self._has_path = struct_fields(schema, image_column)
        else:
            self._has_bytes, self._has_path = self._layout != PATHS, self._layout == PATHS
        if label_column is not None and label_column == image_column:
            raise SourceError(f"the image column and the label column are both "
                              f"{image_column!r}; name two different columns", path=self.path)
        if label_column is not None and label_column not in schema.names:
            raise SourceError(f"no label column {label_column!r} (label_column=NAME); the table "
                              f"has {', '.join(map(repr, schema.names))}", path=self.path)
        if label_column is None and LABEL_COLUMN in schema.names \
                and image_column != LABEL_COLUMN:
            label_column = LABEL_COLUMN
        self.label_column = label_column
        self._warnings: list[str] = []
        names = None
        if label_column is not None:
            label_kind(schema, label_column, self.path)
            names, problem = class_label_names(schema, label_column)
            self._warnings += [problem] if problem else []
        self.metadata_columns, left_out = metadata_columns(schema, (image_column, label_column))
        if left_out:
            self._warnings.append(f"column(s) {', '.join(map(repr, left_out))} hold binary data "
                                  f"and are not kept as metadata")
        self._convert = needs_conversion(schema, self.metadata_columns)
        self._count = 0
        self._labels, self._keys, repeated = self._scan(pq, names)
        self.classes = self._labels.classes
        if repeated:
            self._warnings.append(f"{repeated} row(s) have an image path an earlier row has; "
                                  f"they are keyed by table and row (TABLE/ROW) instead")

    # -- the Source protocol -------------------------------------------------------

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[SourceEntry]:
        pq = import_parquet()
        columns = [self.image_column, *([self.label_column] if self.label_column else []),
                   *self.metadata_columns]
        for number, table in enumerate(self.tables):
            stem = self._stems[number]
            base = os.path.dirname(table)
            names = list_folder(base, table, kind="table row")
            row = 0
            for batch in _batches(pq, table, columns):
                data, paths = self._images(batch.column(0))
                labels = batch.column(1).to_pylist() if self.label_column else None
                metas = batch.select(self.metadata_columns).to_pylist() \
                    if self.metadata_columns else None
                for i in range(batch.num_rows):
                    key = self._keys.get((number, row + i)) or \
                        (list_key(paths[i]) if paths[i] else f"{stem}/{row + i:08d}")
                    label = -1 if labels is None else self._labels.index(_label_value(labels[i]))
                    meta = None if metas is None else metas[i]
                    if meta is not None and self._convert:
                        meta = json_value(meta)
                    if data[i] is not None or not paths[i]:
                        # no bytes and no path: empty, which the pack skips and reports
                        yield SourceEntry(key, label, data=data[i] or b"", metadata=meta)
                    else:
                        path = os.path.join(base, paths[i]) if self.allow_outside else \
                            names.path(paths[i], f"{row + i} ({self._path_column})")
                        yield SourceEntry(key, label, path=path, metadata=meta)
                row += batch.num_rows

    def describe(self) -> dict[str, Any]:
        root = self.path if os.path.isdir(self.path) else os.path.dirname(self.path)
        return {"root": self.path, "kind": self.kind, "files": self._count, "ignored": 0,
                "tables": [os.path.relpath(t, root) for t in self.tables],
                "image_column": self.image_column, "label_column": self.label_column,
                "labels": self._labels.kind, "metadata_columns": self.metadata_columns}

    def warnings(self) -> list[str]:
        return list(self._warnings)

    # -- reading -----------------------------------------------------------------------

    def _schema(self, pq):
        """The first table's schema; every other table must have the same columns."""
        first = None
        for table in self.tables:
            schema = _read_schema(pq, table)
            if first is None:
                first = schema
            elif not schema.equals(first, check_metadata=False):
                raise SourceError(f"has other columns than {os.path.basename(self.tables[0])}; "
                                  f"the tables of a folder must share their columns",
                                  path=table)
        return first

    def _images(self, column) -> tuple[list, list]:
        """The bytes (or None) and the path (or None) of each row of a batch."""
        if self._layout == PATHS:
            return [None] * len(column), column.to_pylist()
        if self._layout != STRUCT:
            return column.to_pylist(), [None] * len(column)
        fields = dict(zip((f.name for f in column.type), column.flatten()))
        none = [None] * len(column)
        return (fields["bytes"].to_pylist() if self._has_bytes else none,
                fields["path"].to_pylist() if self._has_path else none)

    def _paths(self, column) -> list:
        """The path of each row of a batch read with ``_path_column`` only."""
        if self._layout == PATHS:
            return column.to_pylist()
        return column.flatten()[0].to_pylist()  # the struct holds the path field only

    def _scan(self, pq, names) -> tuple[LabelPlan, dict[tuple[int, int], str], int]:
        """One pass over the label and path columns (never the image bytes): the
        labels checked, the row count, and the keys that are not the default."""
        scan = LabelScan(self.label_column or LABEL_COLUMN, self.path, names)
        columns = [*([self.label_column] if self.label_column else []),
                   *([self._path_column] if self._has_path else [])]
        self._stems = _stems(self.tables)
        keys: dict[tuple[int, int], str] = {}
        used: set[str] = set()
        repeated = 0
        for number, table in enumerate(self.tables):
            row = 0
            name = os.path.basename(table)
            for batch in _batches(pq, table, columns, count_only=not columns):
                labels = batch.column(0).to_pylist() if self.label_column else ()
                for i, value in enumerate(labels):
                    scan.add(_label_value(value), lambda at=row + i, name=name: f"{name} row {at}")
                if self._has_path:
                    paths = self._paths(batch.column(len(columns) - 1))
                    repeated += _assign_keys(paths, number, row, self._stems[number], used, keys)
                row += batch.num_rows
            self._count += row
        if self._count == 0:
            raise SourceError("the table has no rows", path=self.path)
        return scan.finish(), keys, repeated

    @property
    def _path_column(self) -> str:
        return self.image_column if self._layout == PATHS else f"{self.image_column}.path"


def parquet_files(path: str) -> list[str]:
    """``path`` itself, or the ``.parquet`` files directly in the folder ``path``,
    sorted by name (hidden ones left out)."""
    if not os.path.exists(path):
        raise SourceError("Parquet source does not exist", path=path)
    if not os.path.isdir(path):
        return [path]
    names = sorted(n for n in os.listdir(path) if n.lower().endswith(".parquet")
                   and not n.startswith(".") and os.path.isfile(os.path.join(path, n)))
    if not names:
        raise SourceError("no .parquet files in the folder", path=path)
    return [os.path.join(path, n) for n in names]


def _batches(pq, table: str, columns: list[str], *, count_only: bool = False):
    """The rows of ``table`` in batches of about _BATCH_BYTES, ``columns`` only
    (``count_only``: the row groups' row counts, nothing read)."""
    import pyarrow as pa

    try:
        with open(table, "rb") as f:
            # pre_buffer (pyarrow's default) reads ahead every row group a reader
            # is given, and a batch spanning row groups holds them all: a reader
            # per row group, without read-ahead, holds about one row group.
            pf = pq.ParquetFile(f, pre_buffer=False)
            meta = pf.metadata
            if count_only:
                for i in range(meta.num_row_groups):
                    yield _Rows(meta.row_group(i).num_rows)
                return
            for i in range(meta.num_row_groups):
                group = meta.row_group(i)
                per_row = max(1, group.total_byte_size // max(1, group.num_rows))
                rows = max(1, min(_MAX_BATCH_ROWS, _BATCH_BYTES // per_row))
                yield from pf.iter_batches(batch_size=rows, row_groups=[i], columns=columns,
                                           use_threads=False)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise SourceError(f"cannot read the Parquet table: {exc}", path=table) from None


def _read_schema(pq, table: str):
    import pyarrow as pa

    try:
        with open(table, "rb") as f:
            return pq.ParquetFile(f).schema_arrow
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise SourceError(f"cannot read the Parquet table: {exc}", path=table) from None


class _Rows:
    """A batch with a row count and no columns."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows


def _label_value(value):
    """A label as the scan takes it: null and -1 (``datasets``' "no label") are None."""
    return None if value is None or value == -1 else value


def _stems(tables: list[str]) -> list[str]:
    """Each table's name without ``.parquet`` (its whole name where two would clash)."""
    stems = [os.path.basename(t)[:-len(".parquet")] if t.lower().endswith(".parquet")
             else os.path.basename(t) for t in tables]
    clash = {s for s in stems if stems.count(s) > 1}
    return [os.path.basename(t) if s in clash else s for s, t in zip(stems, tables)]


def _assign_keys(paths: list, number: int, start: int, stem: str, used: set[str],
                 keys: dict[tuple[int, int], str]) -> int:
    """Record in ``keys`` the rows whose key is not their path (or, with no path,
    TABLE/ROW): a path an earlier row has. Returns how many there were."""
    repeated = 0
    for i, path in enumerate(paths):
        row = start + i
        default = list_key(path) if path else f"{stem}/{row:08d}"
        key = default
        if key in used:
            repeated += bool(path)
            key = f"{stem}/{row:08d}"
            n = 0
            while key in used:  # a path that looks like TABLE/ROW: a suffix makes it unique
                n += 1
                key = f"{stem}/{row:08d}_{n}"
        used.add(key)
        if key != default:
            keys[(number, row)] = key
    return repeated

"""``fastdata.join``: per-record columns from a table (captions, embeddings,
scores, corrected labels), stored beside the dataset as a new version
without touching its records (no torch).

Rows are matched to records by key. Keys of the table that the dataset
does not hold, and records the table has no row for, are counted and
reported, never dropped silently. What grows with the dataset in this
process: a dict of every key (to match rows), and the joined values until
they are written (a 512-float embedding is 2 KB per record).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fastdata.errors import FastDataError

SHOWN = 10


@dataclass(frozen=True)
class JoinResult:
    """What :func:`join` did.

    Attributes:
        dataset, version: the dataset and its new version's number.
        columns: the columns joined, with their stored kind.
        matched: records that got a row.
        missing_in_table: records with no row (count; ``missing_keys`` the
            first of them).
        missing_in_dataset: table keys the dataset does not hold (count;
            ``unknown_keys`` the first).
        new_classes: classes a label column added (at the end of the list).
        relabelled: records whose label the label column changed.
    """

    dataset: str
    version: int
    columns: dict
    matched: int
    missing_in_table: int
    missing_in_dataset: int
    missing_keys: list[str] = field(default_factory=list)
    unknown_keys: list[str] = field(default_factory=list)
    new_classes: list[str] = field(default_factory=list)
    relabelled: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def join(dataset: str | os.PathLike, table: str | os.PathLike, *, key: str,
         columns: list[str] | None = None, label_column: str | None = None,
         types: Mapping[str, str] | None = None,
         allow_outside: bool = False) -> JoinResult:
    """Join the columns of ``table`` (CSV/TSV, JSON Lines or Parquet) to the
    records of ``dataset`` whose key is in column ``key``, as a new version.

    Args:
        columns: the columns to join (default: every one but ``key`` and
            ``label_column``).
        label_column: a column of class names that become the records' new
            labels (names the dataset lacks are appended to its classes),
            taken exactly as written (``"010"`` is the class "010").
        types: column -> ``"int"``, ``"float"``, ``"float32"``, ``"bool"``,
            ``"str"`` or ``"json"``: how that column's values are read.
            Without one, CSV/TSV cells stay text and JSON Lines and Parquet
            values keep their own types (ints int64, floats float64, a list
            of numbers a vector of its element type); ``"float32"`` stores
            smaller floats (an embedding).

    Read them with ``with_metadata=True`` (each sample's metadata holds
    them) or ``reader.metadata(i)``.

    Raises:
        FastDataError: a column missing from the table, a key given twice,
            no row matching any record, a table that is not UTF-8, a value
            that does not read as its type or does not fit int64 (naming the
            row and column), or another process changed the dataset
            meanwhile.
    """
    from fastdata.dataset.columns import write_columns
    from fastdata.dataset.commit import Conflict, commit, step
    from fastdata.dataset.history import dataset_folder, history_dir, relative_name
    from fastdata.dataset.record import new_id
    from fastdata.dataset.resolve import open_reader
    from fastdata.dataset.tables import check_types, table_rows
    from fastdata.ops.append import _read_version
    from fastdata.ops.gc import remove_tree
    from fastdata.storage.urls import join as url_join

    dataset, table = os.fspath(dataset), os.fspath(table)
    types = check_types(types, table)
    if label_column is not None and label_column in types:
        raise FastDataError(f"the label column {label_column!r} holds class names, read as "
                            f"text; leave it out of types", path=table)
    with open_reader(dataset, allow_outside=allow_outside) as reader:
        if getattr(reader, "is_view", False):
            raise FastDataError("join to the dataset itself, not a view of it", path=dataset)
        dataset_name, read = _read_version(reader)
        if read.records != read.base_records:
            raise FastDataError("this version reads a selection of its parts; join to a "
                                "version that reads them whole", path=dataset)
        n = len(reader)
        where = {k: i for i, k in enumerate(reader.keys)}
        classes = list(reader.classes)
        labels = np.asarray(reader.labels, dtype=np.int64).copy() if label_column else None
    # Columns as rows name them (a JSON Lines row may lack a field others have).
    values: dict[str, list] = {c: [None] * n for c in columns or []}
    seen_names: dict[str, None] = {}
    present = np.zeros(n, bool)
    unknown, rows, new_classes, relabelled = [], 0, [], 0
    for number, row in enumerate(table_rows(table, types), 1):
        rows += 1
        for c in row:
            if c not in seen_names:
                seen_names[c] = None
                if columns is None and c not in (key, label_column):
                    values[c] = [None] * n
        k = row.get(key)
        if k is None and key not in row:
            _check_columns(list(seen_names), key, columns, label_column, table, types)
            raise FastDataError(f"row {number} has no {key!r} field; give every row its "
                                f"key", path=table)
        i = where.get(str(k)) if k is not None else None
        if i is None:
            unknown.append(str(k))
            continue
        if present[i]:
            raise FastDataError(f"key {k!r} has two rows (row {number} is the second); give "
                                f"each record one row", path=table)
        present[i] = True
        for c, column in values.items():
            column[i] = row.get(c)
        if label_column is not None and row.get(label_column) is not None:
            name = _class_name(row[label_column], number, label_column, table)
            if name not in classes:
                classes.append(name)
                new_classes.append(name)
            label = classes.index(name)
            relabelled += int(labels[i] != label)
            labels[i] = label
    if not rows:
        raise FastDataError("the table has no rows", path=table)
    _check_columns(list(seen_names), key, columns, label_column, table, types)
    if not present.any():
        raise FastDataError(f"no row of the table matches a record's key (column {key!r}; "
                            f"keys look like {next(iter(where), '')!r})", path=table)
    folder = url_join(history_dir(dataset_name), "columns", new_id())
    written = _write(folder, n, values, present, labels, write_columns)
    step("after-columns")
    entry = {"id": os.path.basename(folder.rstrip("/\\").replace("\\", "/")),
             "path": relative_name(dataset_folder(dataset_name), folder), "records": n,
             **written}
    label_entry, counts = None, None
    if labels is not None:
        counts = np.bincount(labels[labels >= 0], minlength=len(classes)).tolist()
        label_entry = {"path": entry["path"], "file": "labels.npy", "records": n,
                       "sha256": written["sha256"]["labels.npy"], "classes": classes}
    missing = np.flatnonzero(~present)
    keys = [k for k, i in where.items() if not present[i]][:SHOWN] if len(missing) else []
    what = (f"joined {', '.join(values) or 'no column'} from {os.path.basename(table)}"
            + (f", labels from {label_column}" if label_column else "")
            + f" ({int(present.sum()):,} records matched, {len(missing):,} without a row, "
              f"{len(unknown):,} table keys not in the dataset)")
    change = AddColumns(entry, label_entry, classes, counts, what, folder)
    try:
        version = commit(dataset_name, change, read)
    except Conflict:
        remove_tree(folder)
        raise
    return JoinResult(dataset, version.number, written["columns"], int(present.sum()),
                      len(missing), len(unknown), keys, unknown[:SHOWN], new_classes,
                      relabelled)


@dataclass
class AddColumns:
    """The change a join commits: a column set (and maybe labels). It lands
    after other joins of other columns; a join of the same column, or
    labels given on a dataset that changed since it was read, conflict."""

    entry: dict
    labels: dict | None
    classes: list[str]
    class_counts: list[int] | None
    summary: str
    folder: str
    kind: str = "join"

    def apply(self, head, read):
        import dataclasses

        from fastdata.dataset.commit import Conflict

        if [p.id for p in head.parts[:len(read.parts)]] != [p.id for p in read.parts]:
            raise Conflict(f"version {head.number} ({head.change}) changed the parts this "
                           f"join was made on; join again")
        mine = set(self.entry["columns"])
        landed = [c for c in head.columns if c not in read.columns]
        taken = sorted({n for c in landed for n in c["columns"] if n in mine})
        if taken:
            raise Conflict(f"column(s) {', '.join(map(repr, taken))} were joined meanwhile by "
                           f"another writer (now version {head.number}); join another name, "
                           f"or join again to replace them")
        classes, counts, labels = head.classes, head.class_counts, head.labels
        if self.labels is not None:
            if head.labels != read.labels or len(head.parts) != len(read.parts) or \
                    head.classes != read.classes:
                raise Conflict(f"the dataset changed since this join read its labels (now "
                               f"version {head.number}: {head.change}); join again")
            classes, counts, labels = self.classes, self.class_counts, self.labels
        return dataclasses.replace(head, classes=list(classes), class_counts=list(counts),
                                   columns=list(head.columns) + [self.entry], labels=labels,
                                   summary=self.summary)

    def check_files(self) -> None:
        from fastdata.formats.remote_files import is_remote
        from fastdata.storage import list_tree

        there = list_tree(self.folder) if is_remote(self.folder) else \
            os.path.isdir(self.folder)
        if not there:
            raise FastDataError("the joined columns were removed before they were recorded "
                                "(by fastdata gc with a grace period shorter than this join "
                                "took); join again", path=self.folder)


def _check_columns(names: list[str], key: str, columns, label_column, table: str,
                   types=None) -> None:
    wanted = [key] + list(columns or []) + ([label_column] if label_column else []) + \
        list(types or [])
    absent = list(dict.fromkeys(c for c in wanted if c not in names))
    if absent:
        raise FastDataError(f"the table has no column {', '.join(map(repr, absent))}; its "
                            f"columns: {', '.join(names[:20])}", path=table)


def _class_name(value, number: int, label_column: str, table: str) -> str:
    """A label cell as a class name: text exactly as written (an int as its
    digits); never a number read from text."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise FastDataError(f"row {number}, column {label_column!r}: {value!r} is not a class "
                        f"name; give class names as text", path=table)


def _write(folder: str, n: int, values, present, labels, write_columns) -> dict:
    """The column folder, written locally or staged and uploaded."""
    if "://" not in folder:
        return write_columns(folder, n, values, present, labels)
    from fastdata.storage import upload_file
    from fastdata.storage.urls import join as url_join

    with tempfile.TemporaryDirectory(prefix="fastdata-join-") as staged:
        written = write_columns(staged, n, values, present, labels)
        for name in written["sha256"]:
            upload_file(os.path.join(staged, name), url_join(folder, name))
    return written

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
         allow_outside: bool = False) -> JoinResult:
    """Join the columns of ``table`` (CSV/TSV, JSON Lines or Parquet) to the
    records of ``dataset`` whose key is in column ``key``, as a new version.

    Args:
        columns: the columns to join (default: every one but ``key`` and
            ``label_column``).
        label_column: a column of class names that become the records' new
            labels (names the dataset lacks are appended to its classes).

    Read them with ``with_metadata=True`` (each sample's metadata holds
    them) or ``reader.metadata(i)``.

    Raises:
        FastDataError: a column missing from the table, a key given twice,
            no row matching any record, or another process changed the
            dataset meanwhile.
    """
    from fastdata.formats import open_reader
    from fastdata.dataset import history
    from fastdata.ops.append import _digest, _part_name, _sep
    from fastdata.dataset.columns import table_rows, write_columns

    dataset, table = os.fspath(dataset), os.fspath(table)
    with open_reader(dataset, allow_outside=allow_outside) as reader:
        if getattr(reader, "is_view", False):
            raise FastDataError("join to the dataset itself, not a view of it", path=dataset)
        current = reader.version if getattr(reader, "is_version", False) else None
        base = reader.dataset_path
        n = len(reader)
        where = {k: i for i, k in enumerate(reader.keys)}
        classes = list(reader.classes)
        labels = np.asarray(reader.labels, dtype=np.int64).copy() if label_column else None
        manifest = reader.manifest
        first = None if current is not None else history.Part(
            _part_name(base, base), n, _digest(manifest))
    # Columns as rows name them (a JSON Lines row may lack a field others have).
    values: dict[str, list] = {c: [None] * n for c in columns or []}
    seen_names: dict[str, None] = {}
    present = np.zeros(n, bool)
    unknown, rows, new_classes, relabelled = [], 0, [], 0
    for number, row in enumerate(table_rows(table), 1):
        rows += 1
        for c in row:
            if c not in seen_names:
                seen_names[c] = None
                if columns is None and c not in (key, label_column):
                    values[c] = [None] * n
        k = row.get(key)
        if k is None and key not in row:
            _check_columns(list(seen_names), key, columns, label_column, table)
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
        for c in values:
            v = row.get(c)
            values[c][i] = np.asarray(v, np.float32) if isinstance(v, list) and v and \
                all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v) else v
        if label_column is not None and row.get(label_column) is not None:
            name = str(row[label_column])
            if name not in classes:
                classes.append(name)
                new_classes.append(name)
            label = classes.index(name)
            relabelled += int(labels[i] != label)
            labels[i] = label
    if not rows:
        raise FastDataError("the table has no rows", path=table)
    _check_columns(list(seen_names), key, columns, label_column, table)
    if not present.any():
        raise FastDataError(f"no row of the table matches a record's key (column {key!r}; "
                            f"keys look like {next(iter(where), '')!r})", path=table)
    number = (current.number if current is not None else 1) + 1
    folder = history.history_dir(base) + _sep(base) + f"columns{_sep(base)}{number:06d}"
    written = _write(folder, n, values, present, labels, write_columns)
    entry = {"path": _part_name(base, folder), "records": n, **written}
    if current is None:
        current = history.write_version(base, history.Version(
            number=1, format=manifest.format, change="pack", summary="packed", records=n,
            classes=list(manifest.classes), class_counts=list(manifest.class_counts),
            parts=[first], created_at=manifest.created_at))
    counts = list(current.class_counts) + [0] * len(new_classes)
    label_entry = current.labels
    if labels is not None:
        counts = np.bincount(labels[labels >= 0], minlength=len(classes)).tolist()
        label_entry = {"path": entry["path"], "file": "labels.npy", "records": n,
                       "sha256": written["sha256"]["labels.npy"]}
    missing = np.flatnonzero(~present)
    keys = [k for k, i in where.items() if not present[i]][:SHOWN] if len(missing) else []
    what = (f"joined {', '.join(values) or 'no column'} from {os.path.basename(table)}"
            + (f", labels from {label_column}" if label_column else "")
            + f" ({int(present.sum()):,} records matched, {len(missing):,} without a row, "
              f"{len(unknown):,} table keys not in the dataset)")
    version = history.write_version(base, history.Version(
        number=number, format=current.format, change="join", summary=what, records=n,
        classes=classes, class_counts=counts, parts=list(current.parts),
        parent=current.number, parent_sha256=current.sha256,
        columns=list(current.columns) + [entry], labels=label_entry))
    return JoinResult(dataset, version.number, written["columns"], int(present.sum()),
                      len(missing), len(unknown), keys, unknown[:SHOWN], new_classes,
                      relabelled)


def _check_columns(names: list[str], key: str, columns, label_column, table: str) -> None:
    wanted = [key] + list(columns or []) + ([label_column] if label_column else [])
    absent = [c for c in wanted if c not in names]
    if absent:
        raise FastDataError(f"the table has no column {', '.join(map(repr, absent))}; its "
                            f"columns: {', '.join(names[:20])}", path=table)


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

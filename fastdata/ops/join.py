"""``fastdata.join``: per-record columns from a table (captions, embeddings,
scores, corrected labels), stored beside the dataset as a new version
without touching its records (no torch).

Rows are matched to records by key. Keys of the table that the dataset
does not hold, and records the table has no row for, are counted and
reported, never dropped silently.

A join is a job (fastdata.jobs), on this machine's processes, a Dask or a
Ray cluster, with the same result. Its pieces (fastdata.ops.join_pieces)
hash the dataset's keys in ranges of records and read the table in parts
(fastdata.dataset.table_parts), each writing a sorted run of 128-bit key
hashes and stores of its keys and values (fastdata.ops.join_stores). The
merge (fastdata.ops.join_match) pairs each record with its row in hash
order (keys whose hashes are equal are compared as text: a collision never
matches two keys) and checks the pairs in record order; the column files
are then written a chunk of records at a time (fastdata.ops.join_columns)
and the new version is committed here, after the pieces.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastdata.errors import FastDataError


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
        """The fields as a dict (for ``--json``)."""
        return dict(self.__dict__)


def join(dataset: str | os.PathLike, table: str | os.PathLike, *, key: str,
         columns: list[str] | None = None, label_column: str | None = None,
         types: Mapping[str, str] | None = None, allow_outside: bool = False,
         scheduler: Any = None, ray: Any = None, workers: int | None = None,
         resume: bool = False, progress: bool | None = None,
         on_event: Callable[[str], None] | None = None) -> JoinResult:
    """Join the columns of ``table`` (CSV/TSV, JSON Lines or Parquet) to the
    records of ``dataset`` whose key is in column ``key``, as a new version.

    Args:
        dataset: a dataset or a version file of it (not a view: a view's
            columns are its dataset's).
        table: the table's path.
        key: the table's column of record keys.
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
        allow_outside: let the dataset's files lie outside its folder.
        scheduler: run the pieces on a Dask cluster (its scheduler's address
            or a ``distributed.Client``). The workers must see the dataset,
            the table and ``$FASTDATA_STAGING_DIR`` at the same paths.
        ray: run them on a Ray cluster (its address, or True for
            ``$FASTDATA_RAY``), with the same condition.
        workers: processes on this machine (None: one per usable core).
        resume: continue an interrupted run of the same join (its finished
            pieces are kept in its work folder, see fastdata.jobs.journal).
        progress: a progress bar over the pieces (None: when stderr is a
            terminal).
        on_event: called with each note (a run kept or started over).

    Read them with ``with_metadata=True`` (each sample's metadata holds
    them) or ``reader.metadata(i)``. The result, the column files and the
    version are the same whichever executor ran the pieces.

    What grows with the dataset (N records) and the table (R rows):

    - memory, in each process: not N nor R. A piece sorts at most 2^20 rows
      (25 bytes each) before it spills a run, and holds 4,096 rows' values;
      the merge holds a chunk of each of 64 runs (4,096 rows of 25 bytes,
      then 8,192 matches of 17 bytes: under 30 MB); the column files are written 8,192 records
      at a time. With a label column, this
      process holds the new class names, and the dataset's labels as its
      reader holds them (LMDB, HDF5: 8 bytes per record). A format's reader
      may hold every key of the dataset in a process that reads keys.
    - on disk while the job runs (its work folder, removed at the end):
      about 50 bytes per record and per table row (the runs and the stored
      keys) plus the keys' text, 25 bytes per row and joined column plus the
      values' own bytes (text, vectors: a 512-float embedding is 2 KB), and
      41 bytes per matched record.
    - kept: the column files (fastdata.dataset.columns).

    Raises:
        FastDataError: a view, a version that reads a selection of its
            parts, a column missing from the table, a key given twice, no
            row matching any record, a table that is not UTF-8, a value that
            does not read as its type or does not fit int64 (naming the row,
            line and column), or another process changed the dataset
            meanwhile.
    """
    from fastdata.dataset.resolve import open_reader
    from fastdata.dataset.tables import check_types
    from fastdata.ops.join_match import Matcher
    from fastdata.ops.join_pieces import plan_table

    dataset, table = os.fspath(dataset), os.fspath(table)
    types = check_types(types, table)
    if label_column is not None and label_column in types:
        raise FastDataError(f"the label column {label_column!r} holds class names, read as "
                            f"text; leave it out of types", path=table)
    dataset_name, read, spec, n, classes = _read_dataset(dataset, allow_outside)
    options = {"key": key, "label_column": label_column, "types": types,
               "columns": None if columns is None else list(dict.fromkeys(columns))}
    cluster = {"scheduler": scheduler, "ray": ray, "workers": workers}
    plan = plan_table(table)
    run = _run_pieces(spec, n, plan, options, cluster, resume, progress, on_event)
    if any(r.get("misaligned") for r in run.results):
        run.finish()  # a quote inside an unquoted cell: read the table as one piece
        plan = plan_table(table, whole=True)
        run = _run_pieces(spec, n, plan, options, cluster, resume, progress, on_event)
    matcher = Matcher(run, plan, options, n, table)
    try:
        found = matcher.match(classes if label_column is not None else None)
        with open_reader(spec["path"], version=spec["version"], allow_outside=allow_outside) \
                if label_column is not None else contextlib.nullcontext() as labelled:
            return _write_and_commit(matcher, found, dataset, dataset_name, read, classes,
                                     labelled)
    except FastDataError:
        run.finish()  # the table's own error, or a conflict: a rerun would meet it again
        raise
    except BaseException:
        run.journal.release()  # Ctrl-C, a crash: the finished pieces stay for --resume
        raise


def _read_dataset(dataset: str, allow_outside: bool) -> tuple:
    """The dataset's name, the version read (a record), how pieces open it
    (fastdata.ops.piece_readers.describe: the version read now, whatever
    commits land meanwhile), its record count and classes.

    Raises:
        FastDataError: a view, or a version that reads a selection of its parts.
    """
    from fastdata.dataset.history import is_version_file
    from fastdata.dataset.resolve import open_reader
    from fastdata.ops.piece_readers import describe, read_version

    specs, counts = describe([dataset], allow_outside)
    spec = specs[0]
    if spec["version"] is not None and is_version_file(spec["path"]):
        spec = {**spec, "version": None}  # a version file is that version: opened as it is
    with open_reader(spec["path"], version=spec["version"],
                     allow_outside=allow_outside) as reader:
        if getattr(reader, "is_view", False):
            raise FastDataError("join to the dataset itself, not a view of it (a view's "
                                "columns are its dataset's)", path=dataset)
        dataset_name, read = read_version(reader)
        if read.records != read.base_records:
            raise FastDataError("this version reads a selection of its parts; join to a "
                                "version that reads them whole", path=dataset)
        return dataset_name, read, spec, counts[0], list(reader.classes)


def _run_pieces(spec: dict, n: int, plan: dict, options: dict, cluster: dict,
                resume: bool, progress: bool | None, on_event):
    """Every piece, on the executor ``cluster`` names: the table's parts, then
    the dataset's keys in ranges of records."""
    from fastdata.jobs.choose import open_executor
    from fastdata.jobs.runner import Job, run_job
    from fastdata.ops.join_pieces import join_piece, plan_records

    ranges = plan_records(n)
    # The table's parts first: fewer and longer, the keys' pieces fill in after.
    args = [("table", part) for part in range(len(plan["parts"]))] + \
        [("dataset", start, end) for start, end in ranges]
    fingerprint = {"dataset": dict(spec, records=n), "table": plan, "options": options,
                   "records_per_piece": ranges[0][1] if ranges else 0}
    job = Job("join", fingerprint, join_piece, args, common=(spec, plan, options))
    # A piece per side at most: this process runs them, no processes to start.
    pieces = 1 if len(args) <= 2 else len(args)
    with contextlib.closing(open_executor(**cluster, on_event=on_event,
                                          pieces=pieces)) as executor:
        return run_job(job, executor, resume=resume, progress=progress, on_event=on_event)


def _write_and_commit(matcher, found, dataset: str, dataset_name: str, read,
                      classes: list[str], labelled) -> JoinResult:
    """Write the column folder from ``found`` (the merge's matches), then
    commit the version that names it; the folder goes again if the commit
    is refused."""
    from fastdata.dataset.commit import Conflict, commit, step
    from fastdata.dataset.history import dataset_folder, history_dir, relative_name
    from fastdata.dataset.record import new_id
    from fastdata.ops.gc import remove_tree
    from fastdata.ops.join_columns import LabelChunks
    from fastdata.ops.join_match import key_text
    from fastdata.storage.urls import join as url_join

    n, options, stores = matcher.n, matcher.options, matcher.stores
    new, remap = found.new_classes()
    classes = classes + new
    labels = LabelChunks(labelled, len(classes) - len(new), remap, len(classes)) \
        if labelled is not None else None
    folder = url_join(history_dir(dataset_name), "columns", new_id())
    try:
        written = _write_folder(folder, matcher, found, labels)
        missing = [key_text(k) for k in stores.dataset_keys(found.missing)]
        unknown_keys = [key_text(k) for k in stores.table("keys", found.unknown,
                                                          blobs=True)[1]]
        matcher.run.finish()  # the work folder is read no more
        step("after-columns")
        entry = {"id": os.path.basename(folder.rstrip("/\\").replace("\\", "/")),
                 "path": relative_name(dataset_folder(dataset_name), folder),
                 "records": n, **written}
        label_entry, counts = None, None
        if labels is not None:
            counts = labels.counts.tolist()
            label_entry = {"path": entry["path"], "file": "labels.npy", "records": n,
                           "sha256": written["sha256"]["labels.npy"], "classes": classes}
        matched, unknown = found.matched, found.rows - found.matched
        what = (f"joined {', '.join(matcher.columns) or 'no column'} from "
                f"{os.path.basename(matcher.table)}"
                + (f", labels from {options['label_column']}" if labels else "")
                + f" ({matched:,} records matched, {n - matched:,} without a row, "
                  f"{unknown:,} table keys not in the dataset)")
        change = AddColumns(entry, label_entry, classes, counts, what, folder)
        version = commit(dataset_name, change, read)
    except (Conflict, FastDataError):
        remove_tree(folder)
        raise
    return JoinResult(dataset, version.number, written["columns"], matched, n - matched,
                      unknown, missing, unknown_keys, new,
                      labels.relabelled if labels else 0)


def _write_folder(folder: str, matcher, found, labels) -> dict:
    """The column folder, written locally or staged and uploaded."""
    from fastdata.ops.join_columns import write_streams
    from fastdata.ops.join_match import record_chunks

    kinds = {name: found.aggregates[name].kind()[0] for name in matcher.columns}

    def write(where: str) -> dict:
        return write_streams(where, matcher.n, found.aggregates,
                             record_chunks(found, matcher.stores, kinds, matcher.n), labels)

    if "://" not in folder:
        return write(folder)
    from fastdata.storage import upload_file
    from fastdata.storage.urls import join as url_join

    with tempfile.TemporaryDirectory(prefix="fastdata-join-") as staged:
        written = write(staged)
        for name in written["sha256"]:
            upload_file(os.path.join(staged, name), url_join(folder, name))
    return written


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
        """The version after ``head`` (the current one; ``read``: the one
        this join read), or :class:`~fastdata.dataset.commit.Conflict`."""
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
        """Refuse to commit when the column folder is gone (removed by gc)."""
        from fastdata.formats.remote_files import is_remote
        from fastdata.storage import list_tree

        there = list_tree(self.folder) if is_remote(self.folder) else \
            os.path.isdir(self.folder)
        if not there:
            raise FastDataError("the joined columns were removed before they were recorded "
                                "(by fastdata gc with a grace period shorter than this join "
                                "took); join again", path=self.folder)



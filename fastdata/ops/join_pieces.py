"""``fastdata join`` as a job (see fastdata.jobs): its plan and its pieces.

A *dataset piece* reads the keys of a range of records; a *table piece*
reads one part of the table (fastdata.dataset.table_parts: a range of
lines of a JSON Lines, CSV or TSV file, or a run of a Parquet file's row
groups). Each writes a sorted run of rows (the key's hash, its side, its
record or row) and stores (fastdata.ops.join_stores): the keys as text,
and for a table piece each column's values and the label column's class
names. A table row is named by its *position*, ``piece << 32 | row``,
which sorts as the table does. The merge (fastdata.ops.join_match)
streams the runs in hash order.

What grows with the data, per piece: its rows (25 bytes each) sorted in
memory (at most ``RUN_ROWS``, then spilled), and a batch of ``BATCH`` table
rows until their values are written. On disk: the runs (25 bytes per key),
the stores (25 bytes per key and per value, and the bytes of text, vectors
and JSON). The format's reader may hold every key of the dataset in a
process that reads keys (LMDB, HDF5: the keys are one stored list; a
sharded dataset's are read a piece of 128 at a time).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from fastdata.dataset import table_parts
from fastdata.dataset.table_parts import Misaligned, TablePart, part_size
from fastdata.errors import FastDataError
from fastdata.ops.join_stores import (
    NONE,
    NOT_A_NAME,
    STR,
    StoreWriter,
    encode,
    encode_many,
)
from fastdata.ops.piece_readers import piece_reader

#: A run's row: the key's hash (16 bytes, two big-endian halves), its side
#: (``DATASET`` or ``TABLE``) and the record's index or the row's position.
ROW = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("side", "u1"), ("pos", "<i8")])
ORDER = ("hi", "lo", "side", "pos")
DATASET, TABLE = 0, 1
#: A table row's position: its piece in the high bits, its row below.
LOCAL_BITS = 32
#: Records per dataset piece: at most, at least (the last aside), and the
#: pieces a job aims at between the two.
PIECE_RECORDS, MIN_PIECE_RECORDS, TARGET_PIECES = 1 << 18, 4096, 256
#: Bytes of a text table per piece: at least, at most.
MIN_TABLE_BYTES, MAX_TABLE_BYTES = 1 << 20, 64 << 20
#: Rows a table piece sorts in memory before it spills a run.
RUN_ROWS = 1 << 20
#: Keys read and hashed at a time.
BATCH = 4096
#: Keys a join lists of those it reports (records without a row, table keys
#: the dataset lacks, null keys): the first, in dataset and table order.
SHOWN = 10


def key_hash(data: bytes) -> bytes:
    """A key's 16-byte hash (BLAKE2b-128 of its UTF-8): equal keys have equal
    hashes; keys with equal hashes are compared as text by the merge."""
    return hashlib.blake2b(data, digest_size=16).digest()


def key_bytes(key) -> bytes:
    """A key as the bytes hashed and stored: the UTF-8 of its text."""
    return str(key).encode("utf-8", "surrogatepass")


def hash_rows(keys: list[bytes], side: int, positions) -> np.ndarray:
    """:data:`ROW` rows of ``keys`` (their bytes) of ``side`` at ``positions``."""
    rows = np.empty(len(keys), ROW)
    halves = np.frombuffer(b"".join(key_hash(k) for k in keys), ">u8").reshape(-1, 2)
    rows["hi"], rows["lo"] = halves[:, 0], halves[:, 1]
    rows["side"] = side
    rows["pos"] = positions
    return rows


def plan_records(count: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each dataset piece: about ``TARGET_PIECES``."""
    size = part_size(count, TARGET_PIECES, MIN_PIECE_RECORDS, PIECE_RECORDS)
    return [(start, min(start + size, count)) for start in range(0, count, size)]


def plan_table(path: str, *, whole: bool = False) -> dict:
    """The table's plan (fastdata.dataset.table_parts.plan_table): a part per
    table piece, about ``TARGET_PIECES`` of them (``whole``: one)."""
    if whole:
        return table_parts.plan_table(path)
    return table_parts.plan_table(path, parts=TARGET_PIECES, min_bytes=MIN_TABLE_BYTES,
                max_bytes=MAX_TABLE_BYTES, min_rows=MIN_PIECE_RECORDS,
                max_rows=PIECE_RECORDS)


# -- the pieces ---------------------------------------------------------------------------


def join_piece(number: int, arg: tuple, work: str, dataset: dict, table: dict,
               options: dict) -> dict:
    """Run one piece of a join: ``("dataset", start, end)`` or ``("table",
    part)``; ``dataset`` as fastdata.ops.piece_readers describes it,
    ``table`` the table's plan (:func:`plan_table`), ``options`` the join's
    key, columns, label column and types. Returns what it wrote (JSON)."""
    if arg[0] == "dataset":
        return _dataset_piece(number, arg[1], arg[2], work, dataset)
    return _table_piece(arg[1], work, table, options)


def _dataset_piece(number: int, start: int, end: int, work: str, spec: dict) -> dict:
    from fastdata.jobs.sorted_runs import write_run

    reader = piece_reader(spec)
    name = f"d{number:06d}"
    keys = StoreWriter(os.path.join(work, name + ".keys"))
    rows = np.empty(end - start, ROW)  # filled in place: no list of batches to join
    for at in range(start, end, BATCH):
        texts = [key_bytes(_key(reader, i)) for i in range(at, min(at + BATCH, end))]
        keys.add([STR] * len(texts), np.zeros(len(texts), np.int64), texts)
        rows[at - start:at - start + len(texts)] = hash_rows(
            texts, DATASET, np.arange(at, at + len(texts)))
    keys.close()
    write_run(os.path.join(work, name + ".run.npy"), rows, ORDER)
    return {"side": "dataset", "start": start, "end": end, "run": name + ".run.npy",
            "keys": name + ".keys"}


def _key(reader, index: int) -> str:
    """Record ``index``'s key: read from its piece of the keys file where the
    format keeps one (a sharded dataset: the keys are not all loaded), else
    from the keys (which raise, naming the file, when they cannot be read)."""
    key = reader.key_of(index)
    return reader.keys[index] if key is None else key


class _TablePiece:
    """A table piece's files: its runs and its stores, written a batch of
    ``BATCH`` rows at a time."""

    def __init__(self, part: int, work: str, options: dict) -> None:
        from fastdata.jobs.sorted_runs import RunWriter

        self.name, self.work, self.options = f"t{part:06d}", work, options
        self.base = part << LOCAL_BITS
        self.runs = RunWriter(work, ROW, ORDER, rows_in_memory=RUN_ROWS,
                              prefix=self.name + "-run")
        self.keys = StoreWriter(os.path.join(work, self.name + ".keys"))
        self.labels = StoreWriter(os.path.join(work, self.name + ".label")) \
            if options["label_column"] is not None else None
        self.columns: dict[str, StoreWriter] = {}
        self.names: dict[str, None] = {}
        self.batch: list[dict] = []
        self.nulls: list[int] = []
        self.rows = 0  # rows written (the batch's not yet)

    def wanted(self, name: str) -> bool:
        columns, options = self.options["columns"], self.options
        if columns is not None:
            return name in columns
        return name not in (options["key"], options["label_column"])

    def add(self, row: dict) -> bool:
        """Take a row; False when it has no key field (the piece stops)."""
        for c in row:
            if c not in self.names:
                self.names[c] = None
                if self.wanted(c):
                    store = StoreWriter(os.path.join(
                        self.work, f"{self.name}.c{len(self.columns):04d}"))
                    store.pad(self.rows)
                    self.columns[c] = store
        key = self.options["key"]
        if key not in row:
            return False
        self.batch.append(row)
        if len(self.batch) >= BATCH:
            self._write()
        return True

    def _write(self) -> None:
        """The batch's keys (hashed into the runs), class names and values."""
        batch, key = self.batch, self.options["key"]
        texts = [b"None" if row[key] is None else key_bytes(row[key]) for row in batch]
        # A null key matches no record (and is listed as "None").
        null = [k for k, row in enumerate(batch) if row[key] is None]
        self.nulls += [self.rows + k for k in null[:SHOWN - len(self.nulls)]]
        tags = np.full(len(batch), STR, np.uint8)
        tags[null] = NONE
        self.keys.add(tags, np.zeros(len(texts), np.int64), texts)
        hashed = np.flatnonzero(tags == STR)
        positions = self.base + self.rows + hashed
        if len(hashed):
            self.runs.add(hash_rows([texts[k] for k in hashed.tolist()], TABLE, positions))
        if self.labels is not None:
            label = self.options["label_column"]
            cells = [class_cell(row.get(label)) for row in batch]
            self.labels.add([c[0] for c in cells], np.zeros(len(cells), np.int64),
                            [c[2] for c in cells])
        for c, store in self.columns.items():
            store.add(*encode_many([row.get(c) for row in batch]))
        self.rows += len(batch)
        self.batch = []

    def close(self) -> dict:
        self._write()
        runs = [os.path.basename(p) for p in self.runs.close()]
        for store in [self.keys, self.labels, *self.columns.values()]:
            if store is not None:
                store.close()
        return {"side": "table", "rows": self.rows, "runs": runs, "prefix": self.name,
                "names": list(self.names), "stored": list(self.columns),
                "nulls": self.nulls}


def class_cell(value) -> tuple[int, int, bytes]:
    """A label cell as a store row (tag, number, bytes): none, a class name
    (text exactly as written, an int as its digits, never a number read
    from text), or :data:`NOT_A_NAME` (refused if its row matches)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if value is None or isinstance(value, str):
        return encode(value)
    return NOT_A_NAME, 0, b""


def _table_piece(part: int, work: str, table: dict, options: dict) -> dict:
    piece = _TablePiece(part, work, options)
    reader = TablePart(table, part, options["types"])
    stop = None
    try:
        for row in reader.rows():
            if not piece.add(row):
                stop = {"at": piece.rows + len(piece.batch), "what": "no key",
                        "names": list(piece.names)}
                break
    except Misaligned:
        piece.close()
        return {"side": "table", "misaligned": True}
    except FastDataError:
        stop = {"at": piece.rows + len(piece.batch), "what": "table"}
    return {**piece.close(), "lines": reader.lines, "stop": stop}

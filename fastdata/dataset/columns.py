"""Joined columns: per-record values from a table, stored beside the
dataset as plain arrays (no pickle, no torch).

A join writes one folder, ``NAME.versions/columns/NNNNNN/``:

    present.npy            bool per record: the table had its row
    COLUMN.missing.npy     bool per record, where a row's value was missing or null
    COLUMN.npy             a number per record (int64, float64 or bool), or a
                           fixed-length vector (float32, ``(records, D)``)
    COLUMN.utf8            text of every record, one after another (UTF-8),
    COLUMN.offsets.npy     and where each record's starts (int64, records + 1)
    labels.npy             with a label column: every record's label (int64)

Text columns hold strings, or JSON for other values (``kind: "json"``). The
version record lists each file's SHA-256, checked when the column is first
read. What grows with the dataset: the columns themselves (a 512-float
embedding is 2 KB per record), read memory-mapped, not loaded.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from collections.abc import Iterator

import numpy as np

from fastdata.errors import FastDataError

KINDS = ("number", "vector", "string", "json", "bool")


# -- reading the table ------------------------------------------------------------

def table_rows(path: str) -> Iterator[dict]:
    """The rows of a CSV/TSV, JSON Lines or Parquet table, as dicts.

    Raises:
        FastDataError: another extension, or a row that cannot be read.
    """
    lower = path.lower()
    if lower.endswith((".csv", ".tsv")):
        yield from _csv_rows(path, "\t" if lower.endswith(".tsv") else ",")
    elif lower.endswith((".jsonl", ".ndjson")):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise FastDataError(f"line {n} is not JSON ({exc})", path=path) from None
                if not isinstance(row, dict):
                    raise FastDataError(f"line {n} is not a JSON object", path=path)
                yield row
    elif lower.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise FastDataError("reading Parquet needs pyarrow: pip install pyarrow",
                                path=path) from None
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            yield from batch.to_pylist()
    else:
        raise FastDataError("a table is a .csv, .tsv, .jsonl or .parquet file", path=path)


def _csv_rows(path: str, delimiter: str) -> Iterator[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter=delimiter):
            yield {k: _number(v) for k, v in row.items()}


def _number(text):
    """A CSV cell as a number where it reads as one (``"3"``, ``"0.5"``)."""
    if not isinstance(text, str):
        return text
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value if kind is int or math.isfinite(value) else text
    return text


# -- writing ----------------------------------------------------------------------

def kind_of(values: list) -> tuple[str, list[int] | None]:
    """The stored kind of a column's values (missing ones are None), and a
    vector's shape."""
    seen = [v for v in values if v is not None]
    if seen and all(isinstance(v, bool) for v in seen):
        return "bool", None
    if seen and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
        return "number", None
    if seen and all(isinstance(v, np.ndarray) and v.ndim == 1 and v.size for v in seen):
        lengths = {len(v) for v in seen}
        if len(lengths) == 1:
            return "vector", [lengths.pop()]
    if all(isinstance(v, str) for v in seen):
        return "string", None
    return "json", None


def _plain(value):
    """A value as JSON holds it (a vector of another length as a list)."""
    return value.tolist() if isinstance(value, np.ndarray) else value


def write_columns(folder: str, records: int, columns: dict[str, list], present: np.ndarray,
                  labels: np.ndarray | None = None) -> dict:
    """Write the column folder; returns its description for the version
    record (``columns``: name -> kind, dtype, shape; ``sha256``: file ->
    digest)."""
    os.makedirs(folder, exist_ok=True)
    files: dict[str, np.ndarray | bytes] = {"present.npy": present.astype(bool)}
    described = {}
    for name, values in columns.items():
        kind, shape = kind_of(values)
        # A row's missing or null value (its record not "present" aside).
        missing = np.asarray([v is None for v in values], bool) & present.astype(bool)
        if missing.any():
            files[f"{name}.missing.npy"] = missing
        if kind == "number":
            ints = all(isinstance(v, int) for v in values if v is not None)
            arr = np.asarray([(0 if ints else np.nan) if v is None else v for v in values],
                             dtype=np.int64 if ints else np.float64)
            files[f"{name}.npy"] = arr
            described[name] = {"kind": kind, "dtype": str(arr.dtype)}
        elif kind == "bool":
            files[f"{name}.npy"] = np.asarray([bool(v) for v in values], dtype=bool)
            described[name] = {"kind": kind, "dtype": "bool"}
        elif kind == "vector":
            arr = np.full((records, shape[0]), np.nan, dtype=np.float32)
            for i, v in enumerate(values):
                if v is not None:
                    arr[i] = v
            files[f"{name}.npy"] = arr
            described[name] = {"kind": kind, "dtype": "float32", "shape": shape}
        else:
            texts = [b"" if v is None else (v if kind == "string" else
                                            json.dumps(_plain(v), ensure_ascii=False)
                                            ).encode("utf-8")
                     for v in values]
            offsets = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)
            files[f"{name}.utf8"] = b"".join(texts)
            files[f"{name}.offsets.npy"] = offsets
            described[name] = {"kind": kind}
    if labels is not None:
        files["labels.npy"] = labels.astype(np.int64)
    digests = {}
    for file, data in files.items():
        path = os.path.join(folder, file)
        if isinstance(data, bytes):
            with open(path, "wb") as f:
                f.write(data)
        else:
            np.save(path, data, allow_pickle=False)
        digests[file] = _sha256(path)
    return {"columns": described, "sha256": digests}


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- reading ----------------------------------------------------------------------

class JoinedColumns:
    """The columns one join wrote, read per record (memory-mapped, each file
    checked against its SHA-256 when first used).

    Args:
        folder: the column folder (local, or a URL: files fetched whole into
            the shared cache).
        entry: the version record's entry for it.
    """

    def __init__(self, folder: str, entry: dict) -> None:
        self.folder, self.entry = folder, entry
        self.records = int(entry["records"])
        self.names = list(entry["columns"])
        self._arrays: dict[str, np.ndarray] = {}
        self._texts: dict[str, np.ndarray] = {}

    def __getstate__(self):
        return {**self.__dict__, "_arrays": {}, "_texts": {}}

    def _file(self, file: str) -> str:
        from fastdata.formats.remote_files import local_copy
        from fastdata.storage.urls import join

        return local_copy(join(self.folder, file))

    def _checked(self, file: str) -> str:
        from fastdata.errors import CorruptDataError

        path = self._file(file)
        if _sha256(path) != self.entry["sha256"].get(file):
            raise CorruptDataError(f"joined column file {file} fails its SHA-256 check; join "
                                   f"the table again", path=path)
        return path

    def array(self, file: str) -> np.ndarray:
        found = self._arrays.get(file)
        if found is None:
            found = self._arrays[file] = np.load(self._checked(file), mmap_mode="r",
                                                 allow_pickle=False)
        return found

    def text(self, name: str) -> np.ndarray:
        found = self._texts.get(name)
        if found is None:
            path = self._checked(f"{name}.utf8")  # checked whatever its size
            found = self._texts[name] = np.memmap(path, dtype=np.uint8, mode="r") \
                if os.path.getsize(path) else np.zeros(0, np.uint8)
        return found

    def _missing(self, name: str, i: int) -> bool:
        file = f"{name}.missing.npy"
        return file in self.entry["sha256"] and bool(self.array(file)[i])

    def values(self, indices) -> list[dict]:
        """Each record's joined values (``{}`` for a record without a row, or
        past the records the join covered)."""
        out = []
        present = self.array("present.npy")
        for i in (int(j) for j in indices):
            if i >= self.records or not present[i]:
                out.append({})
                continue
            row = {}
            for name, spec in self.entry["columns"].items():
                kind = spec["kind"]
                if self._missing(name, i):
                    row[name] = None
                    continue
                if kind in ("number", "bool"):
                    value = self.array(f"{name}.npy")[i].item()
                    row[name] = None if isinstance(value, float) and math.isnan(value) else value
                elif kind == "vector":
                    row[name] = np.array(self.array(f"{name}.npy")[i])
                else:
                    offsets = self.array(f"{name}.offsets.npy")
                    raw = bytes(self.text(name)[offsets[i]:offsets[i + 1]]).decode("utf-8")
                    row[name] = raw if kind == "string" else (json.loads(raw) if raw else None)
            out.append(row)
        return out

"""A join's column files, written from its matches in record order a chunk
of records at a time (no torch; see fastdata.ops.join).

The files are those :mod:`fastdata.dataset.columns` describes, byte for
byte what an in-memory join writes: ``.npy`` headers for the final shape
first, then the rows, hashed as they go. A column's kind is found from
what a pass over its matched values saw (:class:`Aggregate`), before any
file is written.

What grows: in memory, a chunk of records' values (``CHUNK`` records of
fastdata.ops.join_match); on disk, the columns themselves.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Iterable

import numpy as np

from fastdata.dataset.columns import ROLES, SUFFIXES
from fastdata.ops.join_stores import (
    ARRAY,
    ARRAYS,
    BIG,
    BOOL,
    F32,
    FLOAT,
    INT,
    NONE,
    STR,
    json_text,
)


class Aggregate:
    """What a column's stored kind depends on, over the matched rows of one
    column: the tags seen, vectors' (element, length), big ints, and how many
    values were missing."""

    def __init__(self) -> None:
        self.tags: set[int] = set()
        self.vectors: set[tuple[int, int]] = set()
        self.big = False
        self.missing = 0

    def add(self, rows: np.ndarray) -> None:
        """Take the store rows of some matched values."""
        tags = rows["tag"]
        base = tags & ~np.uint8(BIG)
        self.missing += int((base == NONE).sum())
        self.tags.update(np.unique(base[base != NONE]).tolist())
        self.big |= bool((tags & BIG).any())
        arrays = base >= ARRAY
        if arrays.any() and len(self.vectors) < 3:
            codes = base[arrays].astype(np.int64) - ARRAY
            lengths = rows["size"][arrays] // np.array([d.itemsize for d in ARRAYS])[codes]
            pairs = np.unique(np.stack([codes, lengths], 1), axis=0)
            self.vectors.update((int(c), int(n)) for c, n in pairs[:3])

    def kind(self) -> tuple[str, str | None, list[int] | None]:
        """The stored kind of the values (missing ones aside), its dtype, and a
        vector's shape: ints int64, floats float64 (ints among floats too,
        where float64 holds them exactly), float32 and bool as they are;
        vectors of one length and dtype; text; JSON for the rest."""
        tags = self.tags
        if tags <= {STR}:
            return "string", None, None
        if tags <= {BOOL}:
            return "bool", "bool", None
        if tags <= {F32}:
            return "number", "float32", None
        if tags <= {INT, FLOAT}:
            if tags <= {INT}:
                return "number", "int64", None
            return ("json", None, None) if self.big else ("number", "float64", None)
        if all(t >= ARRAY for t in tags):
            codes = {c for c, _ in self.vectors}
            lengths = {n for _, n in self.vectors}
            if len(lengths) == 1 and len(codes) == 1:
                return "vector", str(ARRAYS[codes.pop()]), [lengths.pop()]
            if len(lengths) == 1 and codes == {0, 1} and not self.big:
                return "vector", "float64", [lengths.pop()]
        return "json", None, None


class _Stream:
    """A file written a chunk at a time and hashed as it goes (``.npy``
    files start with the header ``np.save`` writes for the final shape)."""

    def __init__(self, path: str, dtype=None, shape: tuple = ()) -> None:
        self.path, self._sha = path, hashlib.sha256()
        self._file = open(path, "wb")  # noqa: SIM115 - written chunk by chunk
        if dtype is not None:
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {
                "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                "fortran_order": False, "shape": tuple(shape)})
            self.write(header.getvalue())

    def write(self, data) -> None:
        data = data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes()
        self._sha.update(data)
        self._file.write(data)

    def close(self) -> str:
        self._file.close()
        return self._sha.hexdigest()


def _filled(dtype: str, shape: tuple) -> np.ndarray:
    """An array whose missing values read NaN (floats), 0 or False."""
    arr = np.zeros(shape, dtype=dtype)
    if arr.dtype.kind == "f":
        arr.fill(np.nan)
    return arr


class ColumnWriter:
    """One joined column's files, written a chunk of records at a time."""

    def __init__(self, folder: str, number: int, records: int, aggregate: Aggregate) -> None:
        self.kind, self.dtype, self.shape = aggregate.kind()
        self.names = {role: f"c{number:04d}{SUFFIXES[role]}" for role in ROLES[self.kind]}
        if aggregate.missing:
            self.names["missing"] = f"c{number:04d}{SUFFIXES['missing']}"
        path = {role: os.path.join(folder, name) for role, name in self.names.items()}
        self.streams: dict[str, _Stream] = {}
        if self.kind in ("number", "bool", "vector"):
            self.streams["values"] = _Stream(path["values"], self.dtype,
                                             (records, *(self.shape or ())))
        else:
            self.streams["text"] = _Stream(path["text"])
            self.streams["offsets"] = _Stream(path["offsets"], np.int64, (records + 1,))
            self.streams["offsets"].write(np.zeros(1, np.int64))
            self._end = 0
        if "missing" in path:
            self.streams["missing"] = _Stream(path["missing"], bool, (records,))

    def spec(self) -> dict:
        """The column's entry in the version record (kind, dtype, files)."""
        spec: dict = {"kind": self.kind}
        if self.kind in ("number", "bool", "vector"):
            spec["dtype"] = self.dtype
            if self.shape:
                spec["shape"] = self.shape
        return {**spec, "files": dict(self.names)}

    def add(self, count: int, at: np.ndarray, rows: np.ndarray, blobs: list[bytes]) -> None:
        """The next ``count`` records: ``at`` those with a row, ``rows`` and
        ``blobs`` their store rows and bytes."""
        base = rows["tag"] & ~np.uint8(BIG)
        if "missing" in self.streams:
            missing = np.zeros(count, bool)
            missing[at[base == NONE]] = True
            self.streams["missing"].write(missing)
        if self.kind in ("string", "json"):
            texts = [b""] * count
            for i, tag, num, blob in zip(at.tolist(), rows["tag"].tolist(),
                                         rows["num"].tolist(), blobs):
                texts[i] = blob if self.kind == "string" else json_text(tag, num, blob)
            ends = self._end + np.cumsum([len(t) for t in texts], dtype=np.int64)
            self._end = int(ends[-1]) if count else self._end
            self.streams["text"].write(b"".join(texts))
            self.streams["offsets"].write(ends)
            return
        arr = _filled(self.dtype, (count, *(self.shape or ())))
        if self.kind == "vector":
            for code in np.unique(base[base >= ARRAY]).tolist():
                these = np.flatnonzero(base == code)
                flat = np.frombuffer(b"".join(blobs[k] for k in these.tolist()),
                                     ARRAYS[code - ARRAY])
                arr[at[these]] = flat.reshape(len(these), -1)
        else:
            have = base != NONE
            num = rows["num"][have]
            if self.kind == "bool":
                values = num != 0
            elif self.dtype == "int64":
                values = num
            else:  # float64 or float32: ints as numbers, floats from their bits
                values = np.where(base[have] == INT, num.astype(np.float64),
                                  num.view(np.float64))
            arr[at[have]] = values
        self.streams["values"].write(arr)

    def close(self) -> dict[str, str]:
        """Close the files; returns each one's SHA-256 by name."""
        return {self.names[role]: stream.close() for role, stream in self.streams.items()}


def write_streams(folder: str, records: int, aggregates: dict[str, Aggregate],
                  chunks: Iterable, labels_at: Callable | None) -> dict:
    """Write a join's column folder from ``chunks`` of records in order, each
    ``(count, at, {column: (rows, blobs)}, label_codes)``; ``labels_at(start,
    count, at, codes)`` gives the chunk's labels. Returns the folder's
    description for the version record (``columns``: name -> kind, dtype,
    shape and ``files``, role -> file name; ``sha256``: file -> digest)."""
    os.makedirs(folder, exist_ok=True)
    present = _Stream(os.path.join(folder, "present.npy"), bool, (records,))
    writers = {name: ColumnWriter(folder, number, records, aggregate)
               for number, (name, aggregate) in enumerate(aggregates.items())}
    label_file = _Stream(os.path.join(folder, "labels.npy"), np.int64, (records,)) \
        if labels_at is not None else None
    start = 0
    for count, at, columns, codes in chunks:
        mask = np.zeros(count, bool)
        mask[at] = True
        present.write(mask)
        for name, writer in writers.items():
            writer.add(count, at, *columns[name])
        if label_file is not None:
            label_file.write(labels_at(start, count, at, codes))
        start += count
    digests = {"present.npy": present.close()}
    for writer in writers.values():
        digests.update(writer.close())
    if label_file is not None:
        digests["labels.npy"] = label_file.close()
    return {"columns": {name: w.spec() for name, w in writers.items()}, "sha256": digests}


class LabelChunks:
    """The records' labels, a chunk at a time (``labels_at`` of
    :func:`write_streams`): the dataset's, with a label column's classes
    where its matched rows give one; counted as they go.

    Args:
        reader: the dataset's reader (its ``labels``, read a chunk at a time).
        known: the dataset's classes; codes from ``known`` on are new ones,
            ``remap[code - known]`` their class.
        classes: the classes after the join.
    """

    def __init__(self, reader, known: int, remap: np.ndarray, classes: int) -> None:
        self.reader, self.known, self.remap = reader, known, remap
        self.counts = np.zeros(classes, np.int64)
        self.relabelled = 0

    def __call__(self, start: int, count: int, at: np.ndarray, codes: np.ndarray):
        old = np.asarray(self.reader.labels[start:start + count], np.int64)
        labels = old.copy()
        given = codes >= 0
        new = codes[given]
        new = np.where(new >= self.known, self.remap[np.maximum(new - self.known, 0)], new) \
            if len(self.remap) else new
        labels[at[given]] = new
        self.relabelled += int((new != old[at[given]]).sum())
        counted = np.bincount(labels[labels >= 0], minlength=len(self.counts))
        if len(counted) > len(self.counts):
            self.counts = np.pad(self.counts, (0, len(counted) - len(self.counts)))
        self.counts += counted
        return labels

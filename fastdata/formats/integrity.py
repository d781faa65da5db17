"""Checksums of the small per-record arrays, shared by writers and readers (no torch).

A record's payload carries its CRC32, but the arrays that say which label a
record has, which CRC32 it must match, what it is called and where it is
(labels, CRC32s, keys, offsets, the sharded index) need their own check: one
damaged byte there gives a wrong label or the wrong record silently.

The manifest's ``checksums["metadata_sha256"]`` maps the name of each such
array, as the format stores it, to the SHA-256 of its bytes:

- LMDB: the values of the keys ``__labels__``, ``__crc32__`` and ``__keys__``;
- HDF5: the datasets ``labels`` (int64 LE), ``crc32`` (uint32 LE) and
  ``offsets`` (int64 LE) as arrays of those types; ``keys`` as the UTF-8 JSON
  list of the keys (the bytes LMDB stores: variable-length HDF5 strings have
  no single byte form of their own);
- tar and TFRecord: the whole files ``NAME.fastdata.index.npy`` and
  ``NAME.fastdata.keys.json``, header included.

Per-record arrays are also checked a piece at a time, so that a read by
position checks what it reads and nothing more: the sharded index
(:func:`piece_crc32s` of every 128 rows, the ``-crc.npy`` file) and, from
LMDB key schema 1.1 and HDF5 schema 1.1 on, the label, CRC32 and offset
columns (every :data:`COLUMN_PIECE_ROWS` values; the manifest's
``extra["column_pieces"]`` names the arrays of checksums, which are under
a SHA-256 themselves). Such columns are checked when their pieces are read
and whole by ``verify``; the other arrays on open (a few milliseconds for a
million records), the keys when first loaded (they are loaded lazily and
only then can be used). A name the manifest does not list is not checked:
datasets packed before these checksums open as they did.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zlib
from collections.abc import Callable

import numpy as np

from fastdata.errors import CorruptDataError, ManifestError
from fastdata.records import Manifest

#: Field of ``manifest.checksums`` holding ``{array name: SHA-256 hex}``.
METADATA_SHA256 = "metadata_sha256"

_READ_BLOCK = 1 << 20
#: Manifest field (in ``extra``) describing a format's per-piece column checksums.
COLUMN_PIECES = "column_pieces"
#: Values per checked piece of an LMDB or HDF5 column (as the sharded index: 128 rows).
COLUMN_PIECE_ROWS = 128
#: The type of a piece checksum as stored (a CRC-32, little-endian).
PIECE_SUM_DTYPE = np.dtype("<u4")


def sha256_hex(data) -> str:
    """SHA-256 (hex) of a bytes-like object."""
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike,
                on_bytes: Callable[[int], None] | None = None) -> str:
    """SHA-256 (hex) of a whole file, read in blocks; ``on_bytes(n)`` after each."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_READ_BLOCK), b""):
            sha.update(block)
            if on_bytes is not None:
                on_bytes(len(block))
    return sha.hexdigest()


def keys_json(keys) -> bytes:
    """The keys as the UTF-8 JSON list LMDB and the keys sidecar store: the byte
    form in which HDF5's keys (variable-length strings) are hashed."""
    # surrogatepass: a key from an undecodable file name must not stop a checksum
    return json.dumps(list(keys), ensure_ascii=False).encode("utf-8", "surrogatepass")


def piece_crc32s(values: np.ndarray, rows: int) -> np.ndarray:
    """The CRC-32 (zlib) of every piece of ``rows`` values of the 1-D array
    ``values`` as stored (its bytes in order; the last piece may be
    shorter): one checksum per piece, as :data:`PIECE_SUM_DTYPE`."""
    raw = np.ascontiguousarray(values).view(np.uint8)
    step = rows * values.dtype.itemsize
    return np.fromiter((zlib.crc32(raw[k:k + step]) for k in range(0, len(raw), step)),
                       dtype=PIECE_SUM_DTYPE, count=-(-len(raw) // step))


def column_pieces(manifest: Manifest, names: dict[str, str], *,
                  path: str) -> tuple[int, dict[str, str]] | None:
    """The per-piece checksums a manifest gives for a format's columns:
    (values per piece, {column: array of its checksums}), or None for a
    dataset packed before them (its columns are checked whole).

    Args:
        names: each column this fastdata checks by piece, and the name its
            format gives the array of checksums.

    Raises:
        ManifestError: the field is malformed or names an array this
            fastdata does not know.
    """
    extra = manifest.extra if isinstance(manifest.extra, dict) else {}
    field = extra.get(COLUMN_PIECES)
    if field is None:
        return None
    rows = field.get("rows") if isinstance(field, dict) else None
    listed = field.get("checksums") if isinstance(field, dict) else None
    if type(rows) is not int or rows < 1 or not isinstance(listed, dict):
        raise ManifestError(f"manifest field extra.{COLUMN_PIECES} is not "
                            f"{{\"rows\": N, \"checksums\": {{...}}}}; re-pack the dataset",
                            path=path)
    for column, name in listed.items():
        if names.get(column) != name:
            raise ManifestError(f"manifest field extra.{COLUMN_PIECES} names checksums "
                                f"{name!r} of column {column!r}, which this fastdata does not "
                                f"read; upgrade fastdata or re-pack the dataset", path=path)
    return rows, dict(listed)


def piece_sums(manifest: Manifest, name: str, raw, pieces: int, *, path: str,
               what: str) -> np.ndarray:
    """The stored checksums ``raw`` (bytes, None when missing) of ``pieces``
    pieces, checked against the manifest's SHA-256 of array ``name``.

    Raises:
        CorruptDataError: missing, of another length, or failing the SHA-256.
    """
    if raw is None or len(raw) != pieces * PIECE_SUM_DTYPE.itemsize:
        raise CorruptDataError(f"{what} are missing or not {pieces} checksums; re-pack the "
                               f"dataset", path=path, key=name)
    check_sha256(manifest, name, raw, path=path, what=what)
    return np.frombuffer(bytes(raw), dtype=PIECE_SUM_DTYPE)


def with_metadata_sha256(manifest: Manifest, digests: dict[str, str]) -> Manifest:
    """``manifest`` with ``digests`` added to ``checksums["metadata_sha256"]``."""
    checksums = dict(manifest.checksums)
    checksums[METADATA_SHA256] = {**checksums.get(METADATA_SHA256, {}), **digests}
    return dataclasses.replace(manifest, checksums=checksums)


def expected_sha256(manifest: Manifest, name: str, *, path: str) -> str | None:
    """The SHA-256 the manifest records for array ``name``, or None when it records none."""
    checksums = manifest.checksums if isinstance(manifest.checksums, dict) else {}
    table = checksums.get(METADATA_SHA256)
    if table is None:
        return None  # packed before these checksums
    if not isinstance(table, dict):
        raise ManifestError(f"manifest field checksums.{METADATA_SHA256} is not an object",
                            path=path)
    value = table.get(name)
    if value is not None and not isinstance(value, str):
        raise ManifestError(f"manifest checksum of {name!r} is not a string", path=path)
    return value


def check_sha256(manifest: Manifest, name: str, data, *, path: str, what: str) -> None:
    """Raise CorruptDataError when ``data`` (array ``name`` as stored) does not
    match the SHA-256 the manifest records for it.

    Args:
        data: the stored bytes, or None when the array is missing.
        what: the array for the message ("the labels (dataset 'labels')").
    """
    expected = expected_sha256(manifest, name, path=path)
    if expected is None:
        return
    if data is None:
        raise CorruptDataError(f"{what} are missing, though the manifest records their "
                               f"SHA-256: the file is damaged; re-pack it", path=path)
    check_digest(expected, sha256_hex(data), path=path, what=what)


def check_file_sha256(manifest: Manifest, name: str, file_path: str, *, what: str) -> None:
    """As :func:`check_sha256`, for a whole file (read only when a checksum exists)."""
    expected = expected_sha256(manifest, name, path=file_path)
    if expected is None:
        return
    try:
        actual = file_sha256(file_path)
    except OSError as exc:
        raise CorruptDataError(f"cannot read {what} ({exc.strerror or exc}); re-pack it",
                               path=file_path) from None
    check_digest(expected, actual, path=file_path, what=what)


def check_digest(expected: str, actual: str | None, *, path: str, what: str) -> None:
    """Raise CorruptDataError unless ``actual`` (a SHA-256 hex digest; None:
    the array is missing) is the ``expected`` one the manifest records."""
    if actual is None:
        raise CorruptDataError(f"{what} are missing, though the manifest records their "
                               f"SHA-256: the file is damaged; re-pack it", path=path)
    if actual != expected:
        raise CorruptDataError(
            f"{what} fail the SHA-256 check (the manifest records {expected[:16]}..., the "
            f"stored bytes give {actual[:16]}...): the file is damaged or was changed after "
            f"packing; re-pack it", path=path)


def check_labels(labels: np.ndarray, manifest: Manifest, *, path: str) -> None:
    """Raise CorruptDataError when a label is not a class index, or the labels
    disagree with the manifest's per-class counts (which the pack tallied from
    the same labels: a changed label shows up there even without a checksum)."""
    if not isinstance(manifest.classes, list):
        return  # not a manifest this reader accepts; refused where the manifest is read
    n_classes = len(manifest.classes)
    check_label_range(labels, n_classes, path=path)
    if n_classes == 0:
        return
    if len(labels):
        check_class_counts(np.bincount(labels, minlength=n_classes), manifest, path=path)


def check_class_counts(actual: np.ndarray, manifest: Manifest, *, path: str) -> None:
    """Raise CorruptDataError when the records per class the labels give
    (``actual``, a count per class) differ from the manifest's counts."""
    counts = manifest.class_counts
    n_classes = len(manifest.classes) if isinstance(manifest.classes, list) else 0
    if not (n_classes and isinstance(counts, list) and len(counts) == n_classes
            and all(type(c) is int for c in counts)):
        return
    differ = np.flatnonzero(actual != np.asarray(counts, dtype=np.int64))
    if len(differ):
        c = int(differ[0])
        raise CorruptDataError(
            f"the labels give {int(actual[c])} records of class {manifest.classes[c]!r} "
            f"but the manifest counts {counts[c]}: the labels are damaged; re-pack it",
            path=path)


@dataclasses.dataclass(frozen=True)
class LabelRange:
    """The check of a piece of labels (a picklable callable): each a class
    index of ``classes`` classes, -1 when there are none."""

    classes: int
    path: str

    def __call__(self, first: int, labels: np.ndarray) -> None:
        check_label_range(labels, self.classes, path=self.path, first=first)


def check_label_range(labels: np.ndarray, n_classes: int, *, path: str, first: int = 0) -> None:
    """Raise CorruptDataError when a label is not a class index (-1 for every
    record of a dataset without classes); ``labels`` are those of records
    ``first`` on."""
    labels = np.asarray(labels)
    if n_classes == 0:  # unlabelled records: every label is -1
        bad = np.flatnonzero(labels != -1)
        if len(bad):
            i = int(bad[0])
            raise CorruptDataError(
                f"record {first + i} has label {int(labels[i])}, but the dataset has no "
                f"classes (its records are unlabelled, label -1): the labels are damaged; "
                f"re-pack it", path=path, record=first + i)
        return
    bad = np.flatnonzero((labels < 0) | (labels >= n_classes))
    if len(bad):
        i = int(bad[0])
        more = f", and {len(bad) - 1} more records" if len(bad) > 1 else ""
        raise CorruptDataError(
            f"record {first + i} has label {int(labels[i])}, not a class index (0..{n_classes - 1} "
            f"for {n_classes} classes){more}: the labels are damaged (fastdata does not read "
            f"negative labels as unlabelled records); re-pack it", path=path, record=first + i)

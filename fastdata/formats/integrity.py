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

Readers check everything but the keys on open (a few milliseconds for a
million records) and the keys when they are first loaded (they are loaded
lazily and only then can be used). A name the manifest does not list is not
checked: datasets packed before these checksums open as they did.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable

import numpy as np

from fastdata.errors import CorruptDataError, ManifestError
from fastdata.records import Manifest

#: Field of ``manifest.checksums`` holding ``{array name: SHA-256 hex}``.
METADATA_SHA256 = "metadata_sha256"

_READ_BLOCK = 1 << 20


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
    _compare(expected, sha256_hex(data), path=path, what=what)


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
    _compare(expected, actual, path=file_path, what=what)


def _compare(expected: str, actual: str, *, path: str, what: str) -> None:
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
    counts = manifest.class_counts
    if (isinstance(counts, list) and len(counts) == n_classes and len(labels)
            and all(type(c) is int for c in counts)):
        actual = np.bincount(labels, minlength=n_classes)
        differ = np.flatnonzero(actual != np.asarray(counts, dtype=np.int64))
        if len(differ):
            c = int(differ[0])
            raise CorruptDataError(
                f"the labels give {int(actual[c])} records of class {manifest.classes[c]!r} "
                f"but the manifest counts {counts[c]}: the labels are damaged; re-pack it",
                path=path)


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

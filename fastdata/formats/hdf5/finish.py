"""What an HDF5 pack writes after its payload (no torch): the per-record
columns and their piece checksums, the keys, the metadata, and the
manifest last (schema in ``schema.py``).

Each column is written from the writer's spool (``record_spool.py``) a
block of records at a time, one column after another: the same datasets at
the same offsets as writing each whole gave (the keys' strings may sit
elsewhere in HDF5's global heap).

What grows with the dataset: each column's piece checksums, 4 bytes per 128
values (0.03 B per record and column); in memory besides, a block of the
spool's rows or keys and 4 MiB of metadata at a time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator

import numpy as np

from fastdata.errors import FastDataError
from fastdata.formats.hdf5.schema import (
    CRC32,
    CRC32_DTYPE,
    KEY_ENCODING,
    KEYS,
    LABEL_DTYPE,
    LABELS,
    MANIFEST,
    METADATA,
    METADATA_CRC32,
    METADATA_OFFSETS,
    OFFSET_DTYPE,
    OFFSETS,
    PAYLOAD,
    PIECES,
    SCHEMA_FULL,
    SIZE_DIGITS,
)
from fastdata.formats.integrity import (
    COLUMN_PIECE_ROWS,
    COLUMN_PIECES,
    PIECE_SUM_DTYPE,
    piece_crc32s,
    with_metadata_sha256,
)
from fastdata.records import Manifest

#: Metadata bytes copied into the file at a time.
METADATA_BLOCK = 4 << 20


@dataclasses.dataclass(frozen=True)
class Spooled:
    """What the writer kept of its records, read back a block at a time.

    Attributes:
        count: the records.
        payload_bytes: the payload's size, which the sizes must add up to.
        fact_blocks: every record's facts (``writer.RECORD_FACTS``), in blocks.
        key_blocks: every key, in blocks (lists of str).
        keys_json_to: writes the keys' JSON list to a binary file.
        metadata_path: every record's metadata JSON, one after another
            (None: the dataset has no metadata).
    """

    count: int
    payload_bytes: int
    fact_blocks: Callable[[], Iterator[np.ndarray]]
    key_blocks: Callable[[], Iterator[list[str]]]
    keys_json_to: Callable[[object], object]
    metadata_path: str | None


class _Column:
    """One column's values, given in order in arrays of any length: written
    into ``dset`` (None: only checked), with the SHA-256 of its bytes as
    stored and the CRC-32 of each piece of :data:`COLUMN_PIECE_ROWS` values."""

    def __init__(self, dset=None) -> None:
        self.dset, self.at = dset, 0
        self._sha, self._carry, self._sums = hashlib.sha256(), b"", []

    def write(self, values: np.ndarray) -> None:
        if self.dset is not None and len(values):
            self.dset[self.at:self.at + len(values)] = values
        self.at += len(values)
        raw = values.tobytes()
        self._sha.update(raw)
        data = self._carry + raw
        step = COLUMN_PIECE_ROWS * values.dtype.itemsize
        whole = len(data) - len(data) % step
        if whole:
            self._sums.append(piece_crc32s(np.frombuffer(data, np.uint8, whole), step))
        self._carry = data[whole:]

    def sha256(self) -> str:
        return self._sha.hexdigest()

    def sums(self) -> np.ndarray:
        """The pieces' CRC-32s (the last piece may be shorter)."""
        if self._carry:
            self._sums.append(piece_crc32s(np.frombuffer(self._carry, np.uint8),
                                           len(self._carry)))
            self._carry = b""
        return np.concatenate(self._sums) if self._sums else np.zeros(0, PIECE_SUM_DTYPE)


def _offsets(blocks: Iterator[np.ndarray], field: str) -> Iterator[np.ndarray]:
    """The offsets column of the sizes ``field``: 0, then each running total."""
    total = 0
    yield np.zeros(1, OFFSET_DTYPE)
    for block in blocks:
        ends = np.cumsum(block[field].astype(np.int64)) + total
        total = int(ends[-1]) if len(ends) else total
        yield ends.astype(OFFSET_DTYPE)


def _values(blocks: Iterator[np.ndarray], field: str, dtype) -> Iterator[np.ndarray]:
    for block in blocks:
        yield block[field].astype(dtype)


#: The columns of the facts: dataset -> (the facts' field, its dtype, whether
#: it is the offsets of that field's sizes: one value more than records).
_FACT_COLUMNS = {
    OFFSETS: ("size", OFFSET_DTYPE, True),
    LABELS: ("label", LABEL_DTYPE, False),
    CRC32: ("crc32", CRC32_DTYPE, False),
    METADATA_OFFSETS: ("metadata_size", OFFSET_DTYPE, True),
    METADATA_CRC32: ("metadata_crc32", CRC32_DTYPE, False),
}


def _column(f, name: str, spooled: Spooled, *, write: bool) -> _Column:
    """Column ``name`` from the spool, written into the file ``f`` as
    dataset ``name`` (``write``) or only checksummed."""
    field, dtype, offsets = _FACT_COLUMNS[name]
    column = _Column(f.create_dataset(name, shape=(spooled.count + offsets,), dtype=dtype,
                                      track_times=False) if write else None)
    blocks = spooled.fact_blocks()
    for values in _offsets(blocks, field) if offsets else _values(blocks, field, dtype):
        column.write(values)
    return column


class _Hashing:
    """A binary sink that keeps only the SHA-256 of what is written to it."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.sha.update(data)


def write_end(f, manifest: Manifest, spooled: Spooled, *, layout: dict,
              path: str) -> Manifest:
    """Write the columns and their pieces' CRC-32s, the keys, the metadata
    and, last, the manifest into the open h5py file ``f``; the manifest as
    written: the SHA-256 of each per-record dataset's bytes as stored (see
    :mod:`fastdata.formats.integrity`) and of each array of piece
    checksums, its layout fields and the file size filled in.

    Args:
        layout: the manifest's ``extra`` fields of the payload's layout
            (``layout``, ``chunk_bytes``, ``metadata``) and the output's
            ``path``.
        path: the output, for errors.

    Raises:
        FastDataError: the sizes do not add up to the payload.
        OSError, RuntimeError: h5py failed to write (it reports failed
            flushes as RuntimeError).
    """
    import h5py

    columns = {name: _column(f, name, spooled, write=True) for name in (OFFSETS, LABELS, CRC32)}
    total = int(f[OFFSETS][spooled.count])  # the last offset: 0 for no records
    if total != spooled.payload_bytes:
        raise FastDataError(f"payload holds {spooled.payload_bytes} bytes, offsets add up to "
                            f"{total}", path=path)
    meta = () if spooled.metadata_path is None else (METADATA_OFFSETS, METADATA_CRC32)
    # Readers check the columns by piece, against these CRC-32s; the metadata
    # columns' are stored before those columns are.
    checked = {**columns, **{name: _column(f, name, spooled, write=False) for name in meta}}
    sums = {name: column.sums() for name, column in checked.items()}
    for name, values in sums.items():
        f.create_dataset(PIECES[name], data=values, track_times=False)
    keys = f.create_dataset(KEYS, shape=(spooled.count,),
                            dtype=h5py.string_dtype(KEY_ENCODING), track_times=False)
    at = 0
    for block in spooled.key_blocks():
        keys[at:at + len(block)] = np.asarray(block, dtype=object)
        at += len(block)
    keys_sha = _Hashing()
    spooled.keys_json_to(keys_sha)
    if meta:
        _copy_metadata(f, spooled.metadata_path)
        for name in meta:
            _column(f, name, spooled, write=True)
    digests = {name: column.sha256() for name, column in columns.items()}
    digests[KEYS] = keys_sha.sha.hexdigest()
    digests.update({name: checked[name].sha256() for name in meta})
    digests.update({PIECES[name]: hashlib.sha256(values.tobytes()).hexdigest()
                    for name, values in sums.items()})
    manifest = with_metadata_sha256(manifest, digests)
    # The manifest names the file size, known only once the manifest's own
    # space is allocated: write a placeholder of the final length, flush,
    # then fill it in place (a fixed-length dataset keeps the file size).
    pieced = list(sums)
    placeholder = _manifest_text(_with_layout(manifest, layout, 0, pieced))
    length = len(placeholder) + SIZE_DIGITS
    dset = f.create_dataset(MANIFEST, shape=(), dtype=h5py.string_dtype(KEY_ENCODING, length),
                            track_times=False)
    dset[()] = placeholder.ljust(length)
    f.flush()
    manifest = _with_layout(manifest, layout, int(f.id.get_filesize()), pieced)
    dset[()] = _manifest_text(manifest).ljust(length)
    return manifest


def _copy_metadata(f, path: str) -> None:
    """The metadata JSON bytes, from the spool file ``path``, as the
    ``METADATA`` dataset of bytes."""
    size = os.path.getsize(path)
    dset = f.create_dataset(METADATA, shape=(size,), dtype=np.uint8, track_times=False)
    with open(path, "rb") as spool:
        for at in range(0, size, METADATA_BLOCK):
            dset[at:at + METADATA_BLOCK] = np.frombuffer(spool.read(METADATA_BLOCK), np.uint8)


def _manifest_text(manifest: Manifest) -> bytes:
    # Compact and ASCII-only: its length in bytes is its length in characters.
    return json.dumps(manifest.to_dict(), separators=(",", ":")).encode("ascii")


def _with_layout(manifest: Manifest, layout: dict, on_disk: int,
                 pieced: list[str]) -> Manifest:
    size = dict(manifest.bytes, on_disk=on_disk)
    return dataclasses.replace(
        manifest,
        bytes=size,
        shards=[{"path": os.path.basename(layout["path"]), "count": manifest.count,
                 "bytes": on_disk}],
        extra={"schema": SCHEMA_FULL, "payload": PAYLOAD, "offsets": OFFSETS, "labels": LABELS,
               "crc32": CRC32, "keys": KEYS, "manifest": MANIFEST,
               "layout": layout["layout"], "chunk_bytes": layout["chunk_bytes"],
               **({"metadata": layout["metadata"]} if "metadata" in layout else {}),
               COLUMN_PIECES: {"rows": COLUMN_PIECE_ROWS,
                               "checksums": {name: PIECES[name] for name in pieced}}},
    )

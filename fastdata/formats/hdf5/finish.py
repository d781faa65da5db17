"""What an HDF5 pack writes after its payload (no torch): the per-record
columns and their piece checksums, the keys, the metadata, and the
manifest last (schema in ``schema.py``).

What grows with the dataset: every column whole in memory while it is
written (the offsets, labels and CRC32s: 20 bytes per record, 36 with
metadata), plus the keys' JSON and the metadata's bytes.
"""

from __future__ import annotations

import dataclasses
import json
import os

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
    piece_crc32s,
    sha256_hex,
    with_metadata_sha256,
)
from fastdata.records import Manifest


@dataclasses.dataclass(frozen=True)
class Columns:
    """The datasets that follow the payload, but for the keys and the
    manifest, as they are stored.

    Attributes:
        columns: offsets, labels and CRC32s, by dataset name.
        metadata: the metadata JSON bytes, their offsets and CRC32s (empty
            for a dataset without metadata).
        sums: the CRC-32 of each piece of every column checked by piece
            (all but the metadata bytes), by the column's name.
    """

    columns: dict[str, np.ndarray]
    metadata: dict[str, np.ndarray]
    sums: dict[str, np.ndarray]


def end_columns(facts: np.ndarray, payload_bytes: int, metadata: bytes | None, *,
                path: str) -> Columns:
    """The columns of the records ``facts`` describes (the writer's record
    facts) and their pieces' CRC-32s.

    Args:
        facts: per record: size, label, crc32, metadata_size, metadata_crc32.
        payload_bytes: the payload's size, which the sizes must add up to.
        metadata: every record's metadata JSON, one after another (None:
            the dataset has no metadata).
        path: the output, for errors.

    Raises:
        FastDataError: the sizes do not add up to the payload.
    """
    offsets = np.zeros(len(facts) + 1, dtype=OFFSET_DTYPE)
    np.cumsum(facts["size"].astype(np.int64), out=offsets[1:])
    if int(offsets[-1]) != payload_bytes:
        raise FastDataError(f"payload holds {payload_bytes} bytes, offsets add up to "
                            f"{int(offsets[-1])}", path=path)
    columns = {OFFSETS: offsets, LABELS: facts["label"].astype(LABEL_DTYPE),
               CRC32: facts["crc32"].astype(CRC32_DTYPE)}
    meta = {} if metadata is None else _metadata_arrays(facts, metadata)
    # Readers check the columns by piece, against these CRC-32s.
    sums = {name: piece_crc32s(values, COLUMN_PIECE_ROWS) for name, values in
            [*columns.items(), *((k, v) for k, v in meta.items() if k != METADATA)]}
    return Columns(columns, meta, sums)


def with_digests(manifest: Manifest, ends: Columns, keys_json: bytes) -> Manifest:
    """``manifest`` with the SHA-256 of each per-record dataset's bytes as
    stored (see :mod:`fastdata.formats.integrity`) and of each array of
    piece checksums; ``keys_json`` the keys' JSON list."""
    digests = {name: sha256_hex(values.tobytes()) for name, values in ends.columns.items()}
    digests[KEYS] = sha256_hex(keys_json)
    if ends.metadata:  # the JSON itself is covered by its per-record CRC32
        digests.update({name: sha256_hex(ends.metadata[name].tobytes())
                        for name in (METADATA_OFFSETS, METADATA_CRC32)})
    digests.update({PIECES[name]: sha256_hex(sums.tobytes())
                    for name, sums in ends.sums.items()})
    return with_metadata_sha256(manifest, digests)


def write_end(f, manifest: Manifest, ends: Columns, keys_json: bytes, *,
              layout: dict) -> Manifest:
    """Write ``ends``, the keys and, last, the manifest into the open h5py
    file ``f``; the manifest as written (its layout fields and file size
    filled in).

    Args:
        layout: the manifest's ``extra`` fields of the payload's layout
            (``layout``, ``chunk_bytes``, ``metadata``) and the output's
            ``path``.

    Raises:
        OSError, RuntimeError: h5py failed to write (it reports failed
            flushes as RuntimeError).
    """
    import h5py

    for name, values in ends.columns.items():
        f.create_dataset(name, data=values, track_times=False)
    for name, sums in ends.sums.items():
        f.create_dataset(PIECES[name], data=sums, track_times=False)
    f.create_dataset(KEYS, data=np.asarray(json.loads(keys_json), dtype=object),
                     shape=(len(ends.columns[LABELS]),),
                     dtype=h5py.string_dtype(KEY_ENCODING), track_times=False)
    for name, array in ends.metadata.items():
        f.create_dataset(name, data=array, track_times=False)
    # The manifest names the file size, known only once the manifest's own
    # space is allocated: write a placeholder of the final length, flush,
    # then fill it in place (a fixed-length dataset keeps the file size).
    pieced = list(ends.sums)
    placeholder = _manifest_text(_with_layout(manifest, layout, 0, pieced))
    length = len(placeholder) + SIZE_DIGITS
    dset = f.create_dataset(MANIFEST, shape=(), dtype=h5py.string_dtype(KEY_ENCODING, length),
                            track_times=False)
    dset[()] = placeholder.ljust(length)
    f.flush()
    manifest = _with_layout(manifest, layout, int(f.id.get_filesize()), pieced)
    dset[()] = _manifest_text(manifest).ljust(length)
    return manifest


def _metadata_arrays(facts: np.ndarray, data: bytes) -> dict[str, np.ndarray]:
    """The metadata datasets: the JSON bytes, their offsets and CRC32s."""
    sizes = facts["metadata_size"]
    offsets = np.zeros(len(sizes) + 1, dtype=OFFSET_DTYPE)
    np.cumsum(sizes, out=offsets[1:])
    return {METADATA: np.frombuffer(data, dtype=np.uint8),
            METADATA_OFFSETS: offsets,
            METADATA_CRC32: facts["metadata_crc32"].astype(CRC32_DTYPE)}


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

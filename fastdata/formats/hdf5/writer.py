"""HDF5 writer: records into one HDF5 file (schema and layout notes in ``schema.py``)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from fastdata.errors import FastDataError
from fastdata.formats.hdf5.schema import (
    CRC32,
    CRC32_DTYPE,
    DEFAULT_CHUNK_BYTES,
    FLUSH_BYTES,
    KEY_ENCODING,
    KEYS,
    LABEL_DTYPE,
    LABELS,
    MANIFEST,
    OFFSET_DTYPE,
    OFFSETS,
    PAYLOAD,
    PAYLOAD_DTYPE,
    SCHEMA,
    SCHEMA_ATTR,
    SIZE_DIGITS,
)
from fastdata.formats.integrity import keys_json, sha256_hex, with_metadata_sha256
from fastdata.formats.writer import Writer
from fastdata.records import Manifest, Record


class HDF5Writer(Writer):
    """Writes records into one HDF5 file.

    Payloads are gathered in memory and appended to the resizable ``payload``
    dataset in whole chunks (``flush_bytes`` at a time), so every chunk is
    written once, in full, without a read-modify-write.

    Args:
        path: the output ``.h5``/``.hdf5`` file.
        overwrite: replace an existing output.
        chunk_bytes: chunk size of the payload dataset in bytes.
        flush_bytes: payload bytes gathered in memory before a write (rounded
            down to whole chunks, at least one).
    """

    format_name = "hdf5"
    output_is_dir = False

    def __init__(self, path, *, overwrite: bool = False,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, flush_bytes: int = FLUSH_BYTES) -> None:
        for name, value in (("chunk_bytes", chunk_bytes), ("flush_bytes", flush_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        self._chunk = chunk_bytes
        self._flush_at = max(flush_bytes // chunk_bytes, 1) * chunk_bytes
        self._pending = bytearray()
        self._written = 0
        self._sizes: list[int] = []
        self._file = None
        self._payload = None
        self._layout = ""
        super().__init__(path, overwrite=overwrite)

    def _open(self, temp_path: str) -> None:
        import h5py

        try:
            # No chunk cache: whole chunks are written once anyway, and with one a
            # full disk fails inside a later flush or close, after which HDF5
            # crashes the process (segfault); without, the write itself fails.
            self._file = h5py.File(temp_path, "w", rdcc_nbytes=0)
            self._file.attrs[SCHEMA_ATTR] = SCHEMA
        except OSError as exc:
            raise FastDataError(f"cannot create the HDF5 file ({exc})", path=temp_path) from exc

    def _create_payload(self, final_size: int | None) -> None:
        """Create the payload dataset: contiguous and of its exact size when all of
        it is known at the first write (small datasets: no partly empty chunk),
        chunked and resizable otherwise."""
        if final_size is not None:
            self._payload = self._file.create_dataset(
                PAYLOAD, shape=(final_size,), dtype=PAYLOAD_DTYPE, track_times=False)
            self._layout = "contiguous"
        else:
            self._payload = self._file.create_dataset(
                PAYLOAD, shape=(0,), maxshape=(None,), dtype=PAYLOAD_DTYPE,
                chunks=(self._chunk,), track_times=False)
            self._layout = "chunked"

    def _write(self, record: Record, crc: int) -> None:
        self._pending += record.payload
        self._sizes.append(len(record.payload))
        if len(self._pending) >= self._flush_at:
            self._flush(final=False)

    def _flush(self, *, final: bool) -> None:
        # Whole chunks only until the end, so no chunk is ever written twice.
        n = len(self._pending) if final else len(self._pending) // self._chunk * self._chunk
        if n == 0:
            return
        start = self._written
        try:
            if self._payload is None:
                self._create_payload(n if final else None)
            if self._layout == "chunked":
                self._payload.resize((start + n,))
            block = np.frombuffer(self._pending, dtype=np.uint8, count=n)
            self._payload[start:start + n] = block
            del block  # release the buffer export before the bytearray shrinks
        except (OSError, RuntimeError) as exc:
            raise FastDataError(f"writing the payload failed ({exc})", path=self.path) from exc
        del self._pending[:n]
        self._written += n

    def _close(self, manifest: Manifest) -> Manifest:
        import h5py

        self._flush(final=True)
        if self._payload is None:  # no payload bytes at all
            self._create_payload(0)
        f = self._file
        n = self.count
        offsets = np.zeros(n + 1, dtype=OFFSET_DTYPE)
        np.cumsum(np.asarray(self._sizes, dtype=np.int64), out=offsets[1:])
        if int(offsets[-1]) != self._written:
            raise FastDataError(f"payload holds {self._written} bytes, offsets add up to "
                                f"{int(offsets[-1])}", path=self.path)
        manifest = with_metadata_sha256(manifest, _array_digests(offsets, self))
        try:
            f.create_dataset(OFFSETS, data=offsets, track_times=False)
            f.create_dataset(LABELS, data=np.asarray(self.labels, dtype=LABEL_DTYPE),
                             track_times=False)
            f.create_dataset(CRC32, data=np.asarray(self.crcs, dtype=CRC32_DTYPE),
                             track_times=False)
            f.create_dataset(KEYS, data=np.asarray(self.keys, dtype=object), shape=(n,),
                             dtype=h5py.string_dtype(KEY_ENCODING), track_times=False)
            # The manifest names the file size, known only once the manifest's own
            # space is allocated: write a placeholder of the final length, flush,
            # then fill it in place (a fixed-length dataset keeps the file size).
            placeholder = _manifest_text(_with_layout(manifest, self, 0))
            length = len(placeholder) + SIZE_DIGITS
            dset = f.create_dataset(MANIFEST, shape=(),
                                    dtype=h5py.string_dtype(KEY_ENCODING, length),
                                    track_times=False)
            dset[()] = placeholder.ljust(length)
            f.flush()
            on_disk = int(f.id.get_filesize())
            manifest = _with_layout(manifest, self, on_disk)
            dset[()] = _manifest_text(manifest).ljust(length)
            f.close()
        except (OSError, RuntimeError) as exc:  # h5py reports failed flushes as RuntimeError
            self._discard()
            raise FastDataError(f"writing the HDF5 file failed ({exc})", path=self.path) from exc
        self._file = None
        self._payload = None
        return manifest

    def _discard(self) -> None:
        # Forget the handles first, so a failed close is never retried.
        file, self._file, self._payload = self._file, None, None
        if file is not None:
            try:
                file.close()
            except (OSError, RuntimeError):
                pass  # the file is removed next; a failed close changes nothing


def _array_digests(offsets: np.ndarray, writer: HDF5Writer) -> dict[str, str]:
    """SHA-256 of each per-record dataset's bytes as stored (see fastdata.formats.integrity)."""
    return {
        OFFSETS: sha256_hex(offsets.astype(OFFSET_DTYPE).tobytes()),
        LABELS: sha256_hex(np.asarray(writer.labels, dtype=LABEL_DTYPE).tobytes()),
        CRC32: sha256_hex(np.asarray(writer.crcs, dtype=CRC32_DTYPE).tobytes()),
        KEYS: sha256_hex(keys_json(writer.keys)),
    }


def _manifest_text(manifest: Manifest) -> bytes:
    # Compact and ASCII-only: its length in bytes is its length in characters.
    return json.dumps(manifest.to_dict(), separators=(",", ":")).encode("ascii")


def _with_layout(manifest: Manifest, writer: HDF5Writer, on_disk: int) -> Manifest:
    size = dict(manifest.bytes, on_disk=on_disk)
    return dataclasses.replace(
        manifest,
        bytes=size,
        shards=[{"path": os.path.basename(writer.path), "count": manifest.count,
                 "bytes": on_disk}],
        extra={"schema": SCHEMA, "payload": PAYLOAD, "offsets": OFFSETS, "labels": LABELS,
               "crc32": CRC32, "keys": KEYS, "manifest": MANIFEST,
               "layout": writer._layout,
               "chunk_bytes": writer._chunk if writer._layout == "chunked" else None},
    )

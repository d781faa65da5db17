"""HDF5 writer: records into one HDF5 file (schema and layout notes in ``schema.py``)."""

from __future__ import annotations

import os

import numpy as np

from fastdata.errors import FastDataError
from fastdata.formats.hdf5.finish import Spooled, write_end
from fastdata.formats.hdf5.pieces import read_side, remove_side, remove_sides, write_side
from fastdata.formats.hdf5.schema import (
    DEFAULT_CHUNK_BYTES,
    FLUSH_BYTES,
    METADATA,
    METADATA_CRC32,
    METADATA_OFFSETS,
    PAYLOAD,
    PAYLOAD_DTYPE,
    SCHEMA,
    SCHEMA_ATTR,
)
from fastdata.formats.integrity import sha256_hex
from fastdata.formats.output import fsync_file
from fastdata.formats.writer import PieceLost, Writer, check_piece_payload
from fastdata.records import Manifest, PieceRecord, Record

#: What h5py raises for a damaged or half-written file.
_H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError)


class HDF5Writer(Writer):
    """Writes records into one HDF5 file.

    Payloads are gathered in memory and appended to the resizable ``payload``
    dataset in whole chunks (``flush_bytes`` at a time), so every chunk is
    written once, in full, without a read-modify-write.

    Resuming (``piece_mode``): pieces change none of that. When chunks were
    written since the last piece, ``end_piece`` closes the file, fsyncs it and
    opens it again (metadata is then written at piece ends only); it writes
    the piece's bytes still in memory to a side file (``pieces.py``). A
    piece's state: the payload bytes in the dataset (``written``), where its
    records end (``end``), and the length and SHA-256 of its side file.
    ``done_adopting`` cuts the payload back to the last adopted piece's
    ``written`` and takes its bytes still in memory back from the side files.
    A resumed file is byte-identical to an uninterrupted piece-mode one; a
    piece-mode file that writes chunks before ``finish`` differs from a plain
    one in layout and size (HDF5 forgets the free space it knew of when the
    file is closed), one that writes none (contiguous) does not.

    Args:
        path: the output ``.h5``/``.hdf5`` file.
        overwrite: replace an existing output.
        chunk_bytes: chunk size of the payload dataset in bytes.
        flush_bytes: payload bytes gathered in memory before a write (rounded
            down to whole chunks, at least one).
        resume_path: the partial file of an interrupted pack to continue.
    """

    format_name = "hdf5"
    output_is_dir = False
    resumable = True
    stores_metadata = True

    def __init__(self, path, *, overwrite: bool = False,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, flush_bytes: int = FLUSH_BYTES,
                 resume_path: str | None = None) -> None:
        for name, value in (("chunk_bytes", chunk_bytes), ("flush_bytes", flush_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        self._chunk = chunk_bytes
        self._flush_at = max(flush_bytes // chunk_bytes, 1) * chunk_bytes
        self._pending = bytearray()
        self._written = 0
        self._file = None
        self._payload = None
        self._layout = ""
        self._synced = 0  # payload bytes in the file when it was last made durable
        self._piece_end = 0  # payload bytes up to the end of the last piece
        self._sides: dict[int, int] = {}  # side files kept: piece number -> its end
        self._adopted = b""  # the bytes of the piece being adopted
        self._reopen_error = ""  # why h5py could not open the partial output
        super().__init__(path, overwrite=overwrite, resume_path=resume_path)

    def _init_records(self, spool: str) -> None:
        super()._init_records(spool)
        # Each record's metadata JSON, one after another, written at finish; a
        # resumed pack takes it back from the journal (see Writer._adopt_piece).
        self._metadata = open(os.path.join(spool, "metadata.bin"), "w+b")  # noqa: SIM115
        self._spools.append(self._metadata)

    def _open(self, temp_path: str) -> None:
        import h5py

        try:
            # No chunk cache: whole chunks are written once anyway, and with one a
            # full disk fails inside a later flush or close, after which HDF5
            # crashes the process (segfault); without, the write itself fails.
            self._file = h5py.File(temp_path, "w", rdcc_nbytes=0, locking=False)
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
        if record.metadata:
            self._metadata.write(record.metadata)
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
        self._flush(final=True)
        if self._payload is None:  # no payload bytes at all
            self._create_payload(0)
        self._metadata.flush()
        spooled = Spooled(self.count, self._written, self.fact_blocks, self.key_blocks,
                          self.keys_json_to,
                          self._metadata.name if self.has_metadata else None)
        try:
            manifest = write_end(self._file, manifest, spooled,
                                 layout=self._layout_fields(), path=self.path)
            self._file.close()
        except (OSError, RuntimeError) as exc:  # h5py reports failed flushes as RuntimeError
            self._discard()
            raise FastDataError(f"writing the HDF5 file failed ({exc})", path=self.path) from exc
        self._file = None
        self._payload = None
        remove_sides(self.temp_path)
        return manifest

    def _layout_fields(self) -> dict:
        """The manifest's fields of this file's layout (see ``finish.write_end``)."""
        fields = {"path": self.path, "layout": self._layout,
                  "chunk_bytes": self._chunk if self._layout == "chunked" else None}
        if self.has_metadata:
            fields["metadata"] = {"records": self.metadata_records, "data": METADATA,
                                  "offsets": METADATA_OFFSETS, "crc32": METADATA_CRC32}
        return fields

    def _discard(self) -> None:
        # Forget the handles first, so a failed close is never retried.
        file, self._file, self._payload = self._file, None, None
        if file is not None:
            try:
                file.close()
            except (OSError, RuntimeError):
                pass  # the file is removed next; a failed close changes nothing

    def _drop(self) -> None:
        try:
            if self.temp_path:
                remove_sides(self.temp_path)
        finally:
            super()._drop()

    # -- pieces of a resumable pack ------------------------------------------------

    def _end_piece(self, number: int) -> dict:
        # In the file since the last piece ended, which the journal names by now:
        # a resumed pack keeps the file up to there, never less.
        kept = self._synced
        if self._written != self._synced:
            # Chunks were written since the last piece: their index and the new
            # extent reach the disk now (only then, so a small pack that never
            # writes a chunk before finish keeps the layout of a plain pack).
            self._cycle_file()
            self._synced = self._written
        end = self.payload_bytes
        side = bytes(self._pending[max(self._piece_end - self._written, 0):])
        if side:
            write_side(self.temp_path, number, side)
            self._sides[number] = end
        for older, older_end in list(self._sides.items()):
            if older_end <= kept:  # all its bytes are in the file for good
                remove_side(self.temp_path, older)
                del self._sides[older]
        self._piece_end = end
        return {"written": self._written, "end": end, "side_bytes": len(side),
                "side_sha256": sha256_hex(side)}

    def _cycle_file(self) -> None:
        """Close the file (writing out all it holds), fsync it and open it again.
        Then this pack stands where a resumed one stands after opening the
        file: HDF5 keeps the free space it knows of in memory only, and later
        allocations depend on it."""
        file, self._file, self._payload = self._file, None, None
        try:
            file.close()
        except _H5_ERRORS as exc:
            raise FastDataError(f"writing the HDF5 file failed ({exc})", path=self.path) from exc
        fsync_file(self.temp_path)
        try:
            self._open_partial(self.temp_path)
        except _H5_ERRORS as exc:
            raise FastDataError(f"cannot open the HDF5 file again ({exc})",
                                path=self.path) from exc

    def _open_partial(self, temp_path: str) -> None:
        import h5py

        # No HDF5 file lock: the output's own lock keeps other packs out, and
        # pack worker processes forked while the file is open inherit the
        # descriptor HDF5 locked, so reopening it after a piece would fail.
        self._file = h5py.File(temp_path, "r+", rdcc_nbytes=0, locking=False)
        # Metadata reaches the file only when a piece ends: a killed pack leaves
        # the file as its last piece left it, not half-updated by evictions.
        config = self._file.id.get_mdc_config()
        config.incr_mode = config.flash_incr_mode = config.decr_mode = 0  # off
        config.evictions_enabled = False
        self._file.id.set_mdc_config(config)
        self._payload = self._file.get(PAYLOAD)
        if self._payload is not None:
            self._layout = "chunked" if self._payload.chunks else "contiguous"

    def _reopen(self, temp_path: str) -> None:
        try:
            self._open_partial(temp_path)
        except _H5_ERRORS as exc:
            # Killed in the middle of a metadata write, or before the first
            # flush: pieces whose bytes are all in side files can still be
            # adopted, the others raise PieceLost (and the file is made afresh).
            self._discard()
            self._reopen_error = f"h5py cannot open the partial output ({exc})"

    def _adopt_piece(self, number: int, state: dict, records: list[PieceRecord]) -> None:
        start = self.payload_bytes
        end = start + sum(r.size for r in records)
        written = state.get("written")
        if (state.get("end") != end or not isinstance(written, int)
                or not self._written <= written <= end):
            raise PieceLost(f"piece {number}: the journal's state {state} does not fit its "
                            f"records (payload bytes {start} to {end})", path=self.temp_path)
        held = 0 if self._payload is None else self._payload.shape[0]
        if held < written:
            raise PieceLost(f"piece {number}: the payload dataset holds {held} bytes, the "
                            f"piece needs {written} ({self._reopen_error or 'not flushed'})",
                            path=self.temp_path)
        side_start = max(written, start)
        data = self._read_payload(number, start, side_start) + self._side_bytes(
            number, state, side_start, end)
        pos = 0
        for index, record in enumerate(records, start=self.count):
            check_piece_payload(number, index, record, data[pos:pos + record.size],
                                self.temp_path)
            pos += record.size
        # Whole: the writer now stands where the interrupted pack stood after it.
        self._adopted = data
        self._pending += data
        del self._pending[:written - self._written]
        self._written = self._synced = written
        for r in records:
            if r.metadata:
                self._metadata.write(r.metadata)
        self._piece_end = end
        if state.get("side_bytes"):
            self._sides[number] = end

    def _read_payload(self, number: int, start: int, stop: int) -> bytes:
        """Payload bytes ``start:stop`` from the partial file (PieceLost if not there)."""
        if stop <= start:
            return b""
        if self._payload is None or self._payload.shape[0] < stop:
            held = 0 if self._payload is None else self._payload.shape[0]
            raise PieceLost(f"piece {number}: the payload dataset holds {held} bytes, the "
                            f"piece needs {stop} ({self._reopen_error or 'not flushed'})",
                            path=self.temp_path)
        try:
            return self._payload[start:stop].tobytes()
        except _H5_ERRORS as exc:
            raise PieceLost(f"piece {number}: payload bytes {start} to {stop} cannot be "
                            f"read ({exc})", path=self.temp_path) from exc

    def _side_bytes(self, number: int, state: dict, start: int, stop: int) -> bytes:
        """Piece ``number``'s bytes that were not in the file when it ended: from its
        side file, or from the file where a later piece wrote them."""
        if stop <= start:
            return b""
        data = read_side(self.temp_path, number)
        if (not _is_side(data, state) and self._payload is not None
                and self._payload.shape[0] >= stop):
            data = self._read_payload(number, start, stop)
        if not _is_side(data, state):
            raise PieceLost(f"piece {number}: its last {stop - start} payload bytes are lost "
                            "(its side file is missing or damaged)", path=self.temp_path)
        return data

    def _payloads(self, number: int, state: dict, records: list[PieceRecord]):
        view, self._adopted = memoryview(self._adopted), b""
        pos = 0
        for record in records:
            yield view[pos:pos + record.size]
            pos += record.size

    def _after_adopting(self) -> None:
        remove_sides(self.temp_path, keep=self._sides)  # those of pieces not adopted
        if self._written == 0:
            # Nothing of the file is kept: make it afresh, as an uninterrupted
            # pack has it here (no chunk written, never flushed).
            self._discard()
            self._payload, self._layout = None, ""
            self._open(self.temp_path)
            return
        try:
            for name in list(self._file):
                if name != PAYLOAD:  # datasets of an interrupted finish
                    del self._file[name]
            if self._payload.shape[0] > self._written:
                self._payload.resize((self._written,))
        except _H5_ERRORS as exc:
            raise FastDataError(f"cannot cut the partial output back to its adopted pieces "
                                f"({exc})", path=self.temp_path) from exc


def _is_side(data: bytes | None, state: dict) -> bool:
    """Whether ``data`` is the side file a piece's ``state`` describes."""
    return (data is not None and len(data) == state.get("side_bytes")
            and sha256_hex(data) == state.get("side_sha256"))

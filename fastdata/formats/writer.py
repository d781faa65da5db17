"""The base of every container writer: record bookkeeping and atomic publishing.

A writer holds a lock on its output (``.NAME.fastdata.lock``, see ``output.py``),
writes into a temporary sibling (``.NAME.partial-XXXX``), fsyncs it and renames
it into place only after the manifest is written, so an interrupted pack never
leaves something that looks like a complete dataset, and an interrupted
overwrite keeps the old one. A failed write (a full disk) is one clear error.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import tempfile
import zlib
from collections.abc import Iterator

import numpy as np

from fastdata.errors import FastDataError, OutputExistsError
from fastdata.formats.output import (
    OutputLock,
    disk_full_error,
    is_disk_full,
    lock_path,
    publish_output,
    remove_path,
)
from fastdata.formats.record_spool import PIECE_KEYS, KeySpool, RowSpool
from fastdata.records import Manifest, PieceRecord, Record, RenamedKey

#: What a writer keeps of each record until the end (on disk: record_spool.py).
RECORD_FACTS = np.dtype([("label", "<i8"), ("crc32", "<u4"), ("metadata_crc32", "<u4"),
                         ("size", "<u8"), ("metadata_size", "<u8")])


class UploadStep(enum.IntEnum):
    """When a pack to a URL uploads a file of the output (fastdata.packers.upload):
    the data first, then the files that name it, and last the file that makes the
    dataset visible, so that an interrupted upload leaves nothing a reader opens."""

    NEVER = 0  #: not uploaded (per-process state)
    DATA = 1
    NAMES_DATA = 2  #: sidecars, reports: they name the data files
    LAST = 3  #: the manifest: readers find the dataset through it


class PieceLost(FastDataError):
    """A piece of an interrupted pack is no longer whole in its partial output."""


def check_piece_payload(number: int, index: int, record: PieceRecord, payload,
                        path: str) -> None:
    """Raise ``PieceLost`` unless ``payload`` (None: missing) is record ``index``
    of piece ``number`` as the journal describes it (its size and CRC-32)."""
    if payload is None:
        raise PieceLost(f"piece {number}: record {index} is missing from the partial output",
                        path=path, key=record.key, record=index)
    if len(payload) != record.size or zlib.crc32(payload) != record.crc:
        raise PieceLost(f"piece {number}: record {index} differs from the journal "
                        f"({len(payload)} bytes, CRC-32 {zlib.crc32(payload):08x}; "
                        f"expected {record.size} bytes, {record.crc:08x})",
                        path=path, key=record.key, record=index)


#: What a failed write raises: OS errors, h5py's RuntimeError for a failed flush,
#: and fastdata's own errors that wrap either (see ``Writer._failure``).
_WRITE_ERRORS = (OSError, RuntimeError, FastDataError)


class Writer:
    """Base class for container writers.

    Subclasses implement ``_open``, ``_write`` and ``_close``; callers use
    ``write`` for each record, then ``finish`` with the manifest (or ``abort``).

    A pack that can be resumed (fastdata.packers.pieces) also cuts the records
    into pieces: ``end_piece`` makes a piece durable and returns what a later
    run needs to take it back (``adopt_piece``) from the partial output that
    ``resume_path`` reopens; ``suspend`` lets go of the output but leaves the
    partial output for that run. Formats implement ``_end_piece``,
    ``_adopt_piece``, ``_reopen`` and ``_payloads`` for it.

    Args:
        path: the final output path.
        overwrite: replace an existing output instead of refusing.
        resume_path: the partial output of an interrupted pack to continue
            (reopened instead of a new temporary output).
        **options: format options (for example ``shard_size``); unknown ones are
            an error in the subclass.
    """

    #: Whether the format can take pieces back from a partial output.
    resumable = False
    #: Set by a resumable pack: records are committed only at ``end_piece``
    #: (and shards cut there), so an interrupted pack ends on a piece boundary.
    piece_mode = False

    format_name = ""
    #: Whether the output is a folder (True) or a single file (False).
    output_is_dir = False
    #: Whether the format stores per-sample metadata (``Record.metadata``); a
    #: format that does not refuses a record with metadata rather than drop it.
    stores_metadata = False

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False,
                 resume_path: str | None = None, detached_dir: str | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.overwrite = overwrite
        if detached_dir is not None:
            self._init_detached(detached_dir)
            return
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        base = os.path.basename(self.path)
        self.temp_path = ""
        self.payload_bytes = 0
        try:
            # Held until the output is published or dropped: a second pack to the
            # same output fails here, before it scans or writes anything.
            self._lock = OutputLock(lock_path(parent, base), self._output_name())
        except OSError as exc:
            raise self._failure(exc)  # an unwritable folder, a full disk
        try:
            self._check_existing()
            self.temp_path = resume_path or self._make_temp(parent, base)
        except _WRITE_ERRORS as exc:
            self._lock.release()
            raise self._failure(exc)
        except BaseException:
            self._lock.release()
            raise
        self._done = False
        try:
            self._init_records(spool_of(self.temp_path))
            if resume_path:
                self._reopen(self.temp_path)
            else:
                self._open(self.temp_path)
        except _WRITE_ERRORS as exc:
            failure = self._failure(exc)  # measured before the temporary output goes
            self._drop()  # nothing half-made stays behind
            raise failure
        except BaseException:
            self._drop()
            raise

    def _init_records(self, spool: str) -> None:
        """No record written yet: the per-record facts, spooled to files in the
        folder ``spool`` (see record_spool.py), the metadata, the running SHA-256
        of the payloads."""
        self.count = 0
        remove_path(spool)  # an interrupted pack's: a resumed one adopts its pieces again
        os.mkdir(spool)
        self.spool_folder = spool
        self._facts = RowSpool(os.path.join(spool, "records.bin"), RECORD_FACTS)
        self._keys = KeySpool(os.path.join(spool, "keys.jsonl"))
        self._spools: list = [self._facts, self._keys]
        #: The CRC32 of the last record written.
        self.last_crc = 0
        #: Records that have metadata; a dataset stores metadata only when > 0.
        self.metadata_records = 0
        self._sha = hashlib.sha256()

    def _init_detached(self, folder: str) -> None:
        """A writer of pieces only, into ``folder`` (a cluster worker's): no lock,
        no output of its own, nothing published; ``end_piece`` returns what the
        pack's writer adopts."""
        self.temp_path = folder
        self.payload_bytes = 0
        self._init_records(spool_of(os.path.join(folder, "writer")))
        self._done = True  # nothing to abort: the caller owns the folder
        self._lock = None
        self.piece_mode = True
        self._open(folder)

    @property
    def has_metadata(self) -> bool:
        """Whether any record written so far has metadata."""
        return self.metadata_records > 0

    def _add_facts(self, key: str, label: int, crc: int, size: int,
                   metadata: bytes | None) -> None:
        self._facts.append((label, crc, 0 if metadata is None else zlib.crc32(metadata), size,
                            0 if metadata is None else len(metadata)))
        self._keys.append(key)
        self.metadata_records += metadata is not None

    def facts(self) -> np.ndarray:
        """Every record's facts (:data:`RECORD_FACTS`: ``label``, ``crc32``,
        ``size``; ``metadata_crc32`` and ``metadata_size``, 0 for a record
        without metadata) as one array, for a format that stores the columns
        whole: read once, its fields taken from it."""
        return self._facts.rows()

    def fact_blocks(self) -> Iterator[np.ndarray]:
        """Every record's facts (:data:`RECORD_FACTS`), a block at a time."""
        return self._facts.blocks()

    def keys_json(self) -> bytes:
        """Every key as the UTF-8 JSON list the keys file stores (whole)."""
        return self._keys.json_bytes()

    def key_blocks(self) -> Iterator[list[str]]:
        """Every key, in order, a block of the spool at a time."""
        return self._keys.blocks()

    def keys_json_to(self, f) -> None:
        """Write every key, as the JSON list :meth:`keys_json` gives, to the
        binary file ``f`` (a block of keys in memory at a time)."""
        self._keys.write_json(f, PIECE_KEYS)

    def keys(self) -> list[str]:
        """Every key, in order (a list of them all: for tests and small packs)."""
        return self._keys.all()

    def _drop_spool(self) -> None:
        spool = getattr(self, "spool_folder", None)
        if spool:
            for part in getattr(self, "_spools", []):
                try:
                    part.close()
                except OSError:  # a full disk: what was not flushed goes with the folder
                    pass
            remove_path(spool)
            self.spool_folder = None

    @classmethod
    def output_stem(cls, path, **options) -> str:
        """The path this writer's lock, temporary output and pack state are
        named after (the output itself; sharded formats: the sidecars' stem)."""
        return os.path.abspath(os.fspath(path))

    def _make_temp(self, parent: str, base: str) -> str:
        if self.output_is_dir:
            temp = tempfile.mkdtemp(prefix=f".{base}.partial-", dir=parent)
        else:
            fd, temp = tempfile.mkstemp(prefix=f".{base}.partial-", dir=parent)
            os.close(fd)
        # mkdtemp/mkstemp create owner-only entries; give the output the
        # permissions any new file would get under the user's umask.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, (0o777 if self.output_is_dir else 0o666) & ~umask)
        return temp

    def _output_name(self) -> str:
        """The output as errors name it."""
        return self.path

    @property
    def files(self) -> list[str]:
        """What a finished pack put in place: here the one file or folder."""
        return [self.path]

    def _check_existing(self) -> None:
        """Refuse an existing output unless overwriting (called with the lock held)."""
        if os.path.lexists(self.path) and not self.overwrite:
            raise OutputExistsError("output already exists; pass overwrite=True to replace it",
                                    path=self.path)

    # -- a pack to a URL (fastdata.packers.upload): the output is written into a
    # local staging folder, then uploaded; what the upload needs to know of the
    # format. The defaults suit an output that is one file. --------------------

    @classmethod
    def remote_marker(cls, url: str) -> str:
        """The object whose presence means that a dataset of this format is at
        ``url`` (refused unless overwriting): here the output itself."""
        return url

    @classmethod
    def remote_files(cls, url: str) -> list[str]:
        """The objects of this format's dataset at ``url``, the one that makes it
        visible last: an overwrite deletes that one first, uploads the new files,
        then deletes the listed ones the new dataset lacks. Only objects provably
        this output's are listed. Here none: the upload replaces the one object."""
        return []

    @classmethod
    def stage_remote(cls, folder: str, staging: str):
        """Before a pack to a URL in ``folder`` writes into the local ``staging``
        folder: copy in what the writer updates beside its output. Returns a
        function called after the pack, before the upload, or None."""
        return None

    @classmethod
    def upload_step(cls, name: str) -> UploadStep | None:
        """When the file ``name`` (relative to the staging folder) is uploaded;
        None: as fastdata's names say (a ``.fastdata.json`` manifest last, its
        sidecars and the report before it, everything else first)."""
        return None

    # -- subclass hooks -------------------------------------------------------

    def _open(self, temp_path: str) -> None:
        raise NotImplementedError

    def _write(self, record: Record, crc: int) -> None:
        """Store ``record`` (its ``metadata`` too, when it has some and the
        format stores metadata: see ``has_metadata`` and ``facts``)."""
        raise NotImplementedError

    def _close(self, manifest: Manifest) -> Manifest:
        """Store the manifest, close files, and return the manifest with the
        format's ``shards``/``extra``/on-disk figures filled in."""
        raise NotImplementedError

    def _discard(self) -> None:
        """Release handles after a failure (files are removed by the base)."""

    def _end_piece(self, number: int) -> dict:
        """Make every record written so far durable; return the JSON-ready facts
        ``_adopt_piece`` needs to take piece ``number`` back."""
        raise NotImplementedError(f"{self.format_name} packs cannot be resumed")

    def _adopt_piece(self, number: int, state: dict, records: list["PieceRecord"]) -> None:
        """Take piece ``number`` back from the reopened partial output, checking
        it is whole (raise ``PieceLost`` if not); its records follow those
        already counted. Each record's ``metadata`` is the one the journal
        holds: a format that keeps metadata in memory until ``finish`` takes
        it from there, one that wrote it into the piece checks it is there."""
        raise NotImplementedError(f"{self.format_name} packs cannot be resumed")

    def _reopen(self, temp_path: str) -> None:
        """Open the partial output of an interrupted pack to continue it."""
        raise NotImplementedError(f"{self.format_name} packs cannot be resumed")

    def _payloads(self, number: int, state: dict, records: list["PieceRecord"]):
        """The payloads of an adopted piece, in record order (for the running
        SHA-256 of every payload)."""
        raise NotImplementedError(f"{self.format_name} packs cannot be resumed")

    def _after_adopting(self) -> None:
        """Called once the pieces to keep are adopted, before new records come:
        drop whatever the partial output holds beyond them."""

    def renamed_keys(self) -> list[RenamedKey]:
        """Records stored under another name than their key, after ``finish``
        (none, unless the format restricts names: tar)."""
        return []

    # -- public API -----------------------------------------------------------

    def write(self, record: Record) -> None:
        """Append one record. Records must come with dense indices 0, 1, 2, ..."""
        if record.index != self.count:
            raise ValueError(f"record index {record.index} out of order (expected {self.count})")
        if record.metadata is not None and not self.stores_metadata:
            raise FastDataError(f"the {self.format_name} format does not store per-sample "
                                f"metadata, and record {record.index} has some; pack into a "
                                f"format that does (lmdb, hdf5, tfrecord, tar)",
                                path=self._output_name(), key=record.key)
        crc = zlib.crc32(record.payload)
        self._sha.update(record.payload)
        try:
            self._write(record, crc)
            self._add_facts(record.key, record.label, crc, len(record.payload), record.metadata)
        except _WRITE_ERRORS as exc:
            raise self._failure(exc)
        self.last_crc = crc
        self.payload_bytes += len(record.payload)
        self.count += 1

    def begin_piece(self, number: int) -> None:
        """The records written next belong to piece ``number``."""
        self._piece = number

    def end_piece(self, number: int) -> dict:
        """Piece ``number`` is complete: make it durable and return its facts."""
        try:
            return self._end_piece(number)
        except _WRITE_ERRORS as exc:
            raise self._failure(exc)

    def check_piece(self, number: int, state: dict, records: list["PieceRecord"]) -> None:
        """Raise ``PieceLost`` unless piece ``number`` is whole in the partial
        output (formats whose pieces are files of their own check them here,
        before any is adopted; the others check in ``_adopt_piece``)."""
        self._check_piece(number, state, records)

    def _check_piece(self, number: int, state: dict, records: list["PieceRecord"]) -> None:
        pass

    def adopt_piece(self, number: int, state: dict, records: list["PieceRecord"]) -> None:
        """Count piece ``number`` of an interrupted pack as written (see ``_adopt_piece``)."""
        self._adopt_piece(number, state, records)
        for payload in self._payloads(number, state, records):
            self._sha.update(payload)
        try:
            for r in records:
                self._add_facts(r.key, r.label, r.crc, r.size, r.metadata)
                self.payload_bytes += r.size
        except _WRITE_ERRORS as exc:
            raise self._failure(exc)
        self.count += len(records)

    def done_adopting(self) -> None:
        self._after_adopting()

    def suspend(self) -> None:
        """Stop without removing the partial output (for a later resume)."""
        self._stop(remove=False)

    @property
    def payload_sha256(self) -> str:
        return self._sha.hexdigest()

    def finish(self, manifest: Manifest) -> Manifest:
        """Write the manifest, close, and move the output into place atomically."""
        manifest = dataclasses.replace(
            manifest,
            checksums={"record": "crc32", "payload_sha256": self.payload_sha256},
        )
        try:
            manifest = self._close(manifest)
            self._publish()
        except _WRITE_ERRORS as exc:
            raise self._failure(exc)
        self._done = True
        self._drop_spool()
        self._lock.release()
        return manifest

    def abort(self) -> None:
        """Drop everything written so far. Safe to call more than once."""
        self._stop(remove=True)

    def _stop(self, *, remove: bool) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._discard()
        finally:
            self._drop_spool()
            if remove:
                self._drop()
            else:
                self._lock.release()

    def _drop(self) -> None:
        """Remove the temporary output and let go of the output's lock."""
        try:
            self._drop_spool()
            if self.temp_path:
                remove_path(self.temp_path)
        finally:
            self._lock.release()

    def _failure(self, exc: Exception) -> Exception:
        """What to raise for ``exc`` while writing: a full disk becomes one error
        naming the output and the space, any other OS error one naming the output
        (each caused by ``exc``); anything else stays as it is."""
        if is_disk_full(exc):
            error = disk_full_error(self._output_name(), self.temp_path, self.payload_bytes)
        elif isinstance(exc, OSError):
            error = FastDataError(f"cannot write the output ({exc.strerror or exc})",
                                  path=self._output_name())
        else:
            return exc
        error.__cause__ = exc
        return error

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False

    def _publish(self) -> None:
        publish_output(self.temp_path, self.path, overwrite=self.overwrite,
                       output_is_dir=self.output_is_dir)


def spool_of(temp_path: str) -> str:
    """The folder where the writer of the temporary output ``temp_path`` keeps
    its records' facts until the end (see record_spool.py)."""
    return f"{temp_path}.records"

"""HDF5 reader (no torch). The schema lives in ``schema.py``.

The per-record columns (offsets, labels, CRC32s) are read and checked a
piece at a time (schema 1.1, ``columns.py``), or loaded into numpy and
checked whole on open (schema 1). Records are read by batch and in order as
``runs.py`` describes.

The payload dataset is opened without a chunk cache: a cached chunk is read
whole (1 MiB for one 2 KB record) while an uncached one is read for just the
selected bytes, and the OS page cache already keeps what was read. Measured on
2 KB records: ~240k records/s shuffled without the cache, ~30k/s with it.

h5py handles are opened lazily in the process that reads. A handle inherited
across fork is kept alive but never used or closed in the child (closing it
would release the parent's file lock, which the two processes share), and the
child opens its own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from fastdata.errors import CorruptDataError, FastDataError, ManifestError, UnsafeNameError
from fastdata.formats.column import PieceColumn, column_problems
from fastdata.formats.hdf5.columns import HDF5Columns, OffsetsCheck, piece_column
from fastdata.formats.hdf5.heap import check_vlen_dataset, read_root_attribute
from fastdata.formats.hdf5.links import check_stored_inside
from fastdata.formats.hdf5.runs import H5_ERRORS, RunReads, h5_message
from fastdata.formats.hdf5.schema import (
    CRC32,
    CRC32_DTYPE,
    HDF5_SIGNATURE,
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
    SCHEMA,
    SCHEMA_ATTR,
    SCHEMA_PREFIX,
    SCHEMA_VERSION,
)
from fastdata.formats.integrity import LabelRange, check_sha256, column_pieces, keys_json
from fastdata.formats.reader import Reader

#: Handles inherited from a parent process: referenced so they are never
#: closed here, and never used.
_INHERITED: list = []


class HDF5Reader(RunReads, Reader):
    """Reads a fastdata HDF5 file.

    The offset, label and CRC32 columns (schema 1.1) are read a piece of
    128 values at a time, the pieces a batch touches, each checked against
    its CRC-32 the first time (``columns.py``); the last 2,048 pieces read
    of each column stay in memory (at most 5 MiB for the three). What grows
    with the dataset, per process: the pieces' checksums, read and checked
    against the manifest's SHA-256 on open (4 bytes per 128 records per
    column: 94 MB for the three columns of 10^9 records), and a flag per
    piece (1 byte per 128 records per column). A schema 1 file (no piece
    checksums) has its columns read and checked whole on open: 20 bytes per
    record.

    Args:
        path: the ``.h5``/``.hdf5`` file.
        verify: check record CRC32s on read.
        rdcc_nbytes: chunk cache of the payload dataset in bytes. 0 (default)
            reads just the requested bytes; a cache larger than a chunk only
            pays when the same chunks are read again and again and the page
            cache cannot hold them.
        merge_gap: records of a batch less than this many bytes apart are
            read as one range (the gap is read and dropped).
        block_bytes: bytes read at a time by sequential iteration.
        allow_outside: follow symbolic links that lead out of the dataset's
            folder (see :class:`fastdata.formats.reader.Reader`).
    """

    format_name = "hdf5"
    needs_local_file = True

    def __init__(self, path, *, verify: bool = True, rdcc_nbytes: int = 0,
                 merge_gap: int = 64 << 10, block_bytes: int = 16 << 20,
                 allow_outside: bool = False) -> None:
        for name, value, low in (("rdcc_nbytes", rdcc_nbytes, 0), ("merge_gap", merge_gap, 0),
                                 ("block_bytes", block_bytes, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, not {value!r}")
        self.rdcc_nbytes = rdcc_nbytes
        self.merge_gap = merge_gap
        self.block_bytes = block_bytes
        self._offsets: np.ndarray | PieceColumn | None = None
        self._meta_offsets: np.ndarray | PieceColumn | None = None
        self._columns: HDF5Columns | None = None
        self._pieces: tuple[int, dict[str, str]] | None = None
        super().__init__(path, verify=verify, allow_outside=allow_outside)

    # -- handles ----------------------------------------------------------------

    def __getstate__(self):
        state = super().__getstate__()
        state["_offsets"] = None  # per-record: reloaded in the receiving process
        state["_meta_offsets"] = None
        return state

    def _open_handle(self):
        return self._open_file()

    def _abandon_handle(self, handle) -> None:
        # Closing an inherited h5py file would release the file lock that the
        # two processes share: keep it alive and unused.
        _INHERITED.append(handle)

    def _release_handle(self, handle) -> None:
        try:
            handle[0].close()
        except OSError:
            pass  # closing a read-only file loses nothing

    def close(self) -> None:
        columns = getattr(self, "_columns", None)
        if columns is not None:
            columns.close()  # opened again if its columns are read again
        super().close()

    def _get_file(self):
        """The open h5py.File of this process, opened on first use."""
        return self._process_handle()[0]

    @property
    def _file(self):
        return None if self._handle is None else self._handle[0]

    @property
    def _payload(self):
        return self._process_handle()[1]

    def _open_file(self):
        import h5py

        if os.path.isdir(self.path):
            raise ManifestError("is a folder, not an HDF5 file", path=self.path)
        if not os.path.exists(self.path):
            raise ManifestError("no such HDF5 file", path=self.path)
        try:
            file = h5py.File(self.path, "r")
        except H5_ERRORS as exc:
            raise self._open_error(exc) from None
        payload = None
        try:
            check_stored_inside(file, self.path)
            if PAYLOAD in file:
                dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
                dapl.set_chunk_cache(521, self.rdcc_nbytes, 0.75)
                payload = _dataset(h5py.h5d.open(file.id, PAYLOAD.encode(), dapl=dapl))
        except UnsafeNameError:
            file.close()
            raise
        except (*H5_ERRORS, TypeError) as exc:
            file.close()
            raise CorruptDataError(f"cannot open dataset {PAYLOAD!r} ({h5_message(exc)}); the "
                                   f"file is damaged, re-pack it", path=self.path,
                                   key=PAYLOAD) from None
        return file, payload

    def _open_error(self, exc: Exception) -> FastDataError:
        if isinstance(exc, PermissionError):
            return FastDataError(f"cannot open ({exc.strerror or exc})", path=self.path)
        try:
            with open(self.path, "rb") as f:
                head = f.read(len(HDF5_SIGNATURE))
            size = os.path.getsize(self.path)
        except OSError as exc2:
            return FastDataError(f"cannot open ({exc2.strerror or exc2})", path=self.path)
        if head == HDF5_SIGNATURE or size == 0 or HDF5_SIGNATURE.startswith(head):
            return CorruptDataError(
                f"HDF5 file is truncated or damaged ({size} bytes; h5py: {exc}); re-pack it "
                f"or restore the file", path=self.path)
        return ManifestError("not an HDF5 file (no HDF5 signature); is this the right path?",
                             path=self.path)

    # -- metadata ---------------------------------------------------------------

    def _load_metadata(self) -> None:
        f = self._get_file()
        try:
            try:
                self._load_from(f)
            except H5_ERRORS as exc:
                raise CorruptDataError(f"HDF5 metadata cannot be read ({h5_message(exc)}); "
                                       f"the file is damaged, re-pack it", path=self.path) from None
        except FastDataError:
            # Do not keep a refused file open (the error's traceback holds this reader).
            self._close_handles()
            raise

    def _load_from(self, f) -> None:
        if MANIFEST not in f:
            raise ManifestError(
                f"HDF5 file has no fastdata manifest (dataset {MANIFEST!r}): it was not "
                f"written by fastdata or its pack did not finish; re-run `fastdata pack`",
                path=self.path)
        raw = f[MANIFEST][()]
        if not isinstance(raw, (bytes, str)):  # an array or a number: not ours
            raise ManifestError(f"dataset {MANIFEST!r} is not a scalar string", path=self.path)
        manifest = self._accept_manifest(raw, self.path)
        # Not attrs.get(): reading a variable-length string can loop forever in
        # HDF5 on a damaged heap; this checks the heap first.
        _check_schema(read_root_attribute(f, SCHEMA_ATTR, self.path), self.path)
        n = manifest.count
        payload = self._payload
        if payload is None:
            raise CorruptDataError(f"dataset {PAYLOAD!r} is missing; re-pack it",
                                   path=self.path, key=PAYLOAD)
        if payload.ndim != 1 or payload.dtype != np.uint8:
            raise CorruptDataError(f"dataset {PAYLOAD!r} is {payload.dtype} of shape "
                                   f"{payload.shape}, expected 1-D uint8", path=self.path,
                                   key=PAYLOAD)
        self._pieces = column_pieces(manifest, PIECES, path=self.path)
        self._columns = HDF5Columns(self.path, self._pieces[0] if self._pieces else 1)
        offsets = self._column(f, manifest, OFFSETS, n + 1, OFFSET_DTYPE, OffsetsCheck(
            self.path, OFFSETS, n + 1, payload.shape[0], "the payload"))
        pieced = self._pieces is not None and LABELS in self._pieces[1]
        labels = self._column(f, manifest, LABELS, n, LABEL_DTYPE,
                              LabelRange(len(manifest.classes), self.path) if pieced else None)
        crcs = self._column(f, manifest, CRC32, n, CRC32_DTYPE)
        self._manifest = manifest
        self._offsets = offsets
        self._labels = labels if pieced else labels.astype(np.int64, copy=False)
        self._crcs = crcs

    def _column(self, f, manifest, name: str, length: int, stored, check=None):
        """Dataset ``name`` (``length`` integers, stored as ``stored``): a
        :class:`PieceColumn` when the file has its pieces' checksums, else
        read whole and checked (its SHA-256, then ``check(0, values)``)."""
        if self._pieces is not None and name in self._pieces[1]:
            self._array_shape(f, name, length)
            return piece_column(self._columns, f, manifest, self._pieces[0], name, length,
                                stored, PIECES[name], check)
        array = self._array(f, name, length).astype(stored, copy=False)
        check_sha256(manifest, name, array.tobytes(), path=self.path,
                     what=f"the {name} (dataset {name!r})")
        if check is not None:
            check(0, array)
        return array

    def check_layout(self) -> list[dict]:
        """Every piece of the columns checked by piece (and each column
        against its SHA-256, the labels against the class counts)."""
        self._offsets_array()
        columns = [self._offsets, self._labels, self._crcs]
        if self.has_metadata:
            try:
                columns.append(self.metadata_crcs())
                columns.append(self._meta_offsets)
            except CorruptDataError:
                pass  # reported by verify's metadata check
        labels = self._labels if isinstance(self._labels, PieceColumn) else None
        return column_problems([c for c in columns if isinstance(c, PieceColumn)],
                               self.manifest, labels)

    def _array(self, f, name: str, length: int) -> np.ndarray:
        return self._array_shape(f, name, length)[()]

    def _array_shape(self, f, name: str, length: int):
        """Dataset ``name`` once checked to be ``length`` integers (not read)."""
        if name not in f:
            raise CorruptDataError(f"dataset {name!r} is missing; re-pack it",
                                   path=self.path, key=name)
        dset = f[name]
        if dset.shape != (length,) or dset.dtype.kind not in "iu":
            raise CorruptDataError(f"dataset {name!r} is {dset.dtype} of shape {dset.shape}, "
                                   f"expected {length} integers", path=self.path, key=name)
        return dset

    def _load_keys(self) -> list[str]:
        f = self._get_file()
        try:
            if KEYS not in f:
                check_sha256(self.manifest, KEYS, None, path=self.path,
                             what=f"the keys (dataset {KEYS!r})")
                return None
            dset = f[KEYS]
            if dset.shape != (len(self),):
                raise CorruptDataError(f"dataset {KEYS!r} has shape {dset.shape}, expected "
                                       f"({len(self)},); re-pack it", path=self.path, key=KEYS)
            check_vlen_dataset(f, dset, self.path, KEYS)  # before HDF5 walks the heap
            keys = dset.asstr()[()]
        except H5_ERRORS as exc:
            raise CorruptDataError(f"dataset {KEYS!r} cannot be read ({h5_message(exc)}); the "
                                   f"file is damaged, re-pack it", path=self.path,
                                   key=KEYS) from None
        keys = keys.tolist()
        check_sha256(self.manifest, KEYS, keys_json(keys), path=self.path,
                     what=f"the keys (dataset {KEYS!r})")
        return keys

    def _load_metadata_crcs(self):
        """The metadata CRC32s, loading the metadata offsets with them (both
        checked against the manifest, the offsets against the JSON bytes)."""
        f = self._get_file()
        n = len(self)
        try:
            data = f.get(METADATA)
            if data is None or data.ndim != 1 or data.dtype != np.uint8:
                raise CorruptDataError(f"dataset {METADATA!r} is missing or not 1-D uint8; "
                                       f"re-pack it", path=self.path, key=METADATA)
            offsets = self._column(f, self.manifest, METADATA_OFFSETS, n + 1, OFFSET_DTYPE,
                                   OffsetsCheck(self.path, METADATA_OFFSETS, n + 1,
                                                data.shape[0], repr(METADATA)))
            crcs = self._column(f, self.manifest, METADATA_CRC32, n, CRC32_DTYPE)
        except H5_ERRORS as exc:
            raise CorruptDataError(f"the metadata cannot be read ({h5_message(exc)}); the "
                                   f"file is damaged, re-pack it", path=self.path,
                                   key=METADATA) from None
        self._meta_offsets = offsets
        return crcs

    def _read_metadata_many(self, indices: Sequence[int]) -> list[bytes | None]:
        if self._meta_offsets is None:
            self._metadata_crcs = self._load_metadata_crcs()
        offsets = self._meta_offsets
        out: list[bytes | None] = []
        try:
            data = self._get_file()[METADATA]
            for i in indices:
                a, b = int(offsets[i]), int(offsets[i + 1])
                out.append(data[a:b].tobytes() if b > a else None)
        except H5_ERRORS as exc:
            i = indices[len(out)]
            raise CorruptDataError(f"the metadata of record {i} cannot be read "
                                   f"({h5_message(exc)}); the file is damaged, re-pack it",
                                   path=self.path, key=self.key_of(i), record=i) from None
        return out

    def _offsets_array(self) -> np.ndarray:
        if self._offsets is None:
            self._load()
        return self._offsets

def _dataset(dsid):
    import h5py

    try:
        # Read-only lets h5py cache its fast slice reader (2-3x faster single reads).
        return h5py.Dataset(dsid, readonly=True)
    except TypeError:  # h5py without the keyword
        return h5py.Dataset(dsid)


def _check_schema(value, path: str) -> None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or not value.startswith(SCHEMA_PREFIX):
        raise ManifestError(f"HDF5 file has no {SCHEMA_ATTR!r} attribute of the form "
                            f"{SCHEMA!r}: it was not written by fastdata", path=path)
    try:  # MAJOR or MAJOR.MINOR: a minor version adds only what a reader may ignore
        version = int(value[len(SCHEMA_PREFIX):].split(".", 1)[0])
    except ValueError:
        raise ManifestError(f"unknown HDF5 schema {value!r}", path=path) from None
    if version > SCHEMA_VERSION:
        raise ManifestError(
            f"HDF5 schema {value!r} is newer than this fastdata reads ({SCHEMA}); upgrade "
            f"fastdata (in its checkout: git pull, then pip install -e .)", path=path)

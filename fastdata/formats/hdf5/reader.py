"""HDF5 reader (no torch). The schema lives in ``schema.py``.

The small per-record arrays (offsets, labels, CRC32s) are loaded into numpy on
open. A batch is read with one HDF5 call: the requested records are sorted,
merged into contiguous runs (records less than ``merge_gap`` bytes apart share
a run), and the union of the runs is read into one buffer (one call per 256
runs for larger batches).

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
from collections.abc import Iterator, Sequence

import numpy as np

from fastdata.errors import CorruptDataError, FastDataError, ManifestError, UnsafeNameError
from fastdata.formats.hdf5.heap import check_vlen_dataset, read_root_attribute
from fastdata.formats.hdf5.links import check_stored_inside
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
    SCHEMA,
    SCHEMA_ATTR,
    SCHEMA_PREFIX,
    SCHEMA_VERSION,
)
from fastdata.formats.integrity import check_sha256, keys_json
from fastdata.formats.reader import Reader

#: Handles inherited from a parent process: referenced so they are never
#: closed here, and never used.
_INHERITED: list = []
#: What h5py raises for damaged metadata: OSError, KeyError ("bad object header
#: version number"), RuntimeError ("bad local heap signature"), ValueError.
H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError)
#: Ranges per HDF5 read: building a union of hyperslabs costs time quadratic in
#: the number of ranges (~2 us per range at 256, ~500 us at 16k), so a huge
#: batch is read in slices of this many ranges.
RUNS_PER_READ = 256


class HDF5Reader(Reader):
    """Reads a fastdata HDF5 file.

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
        self._offsets: np.ndarray | None = None
        self._meta_offsets: np.ndarray | None = None
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
            raise CorruptDataError(f"cannot open dataset {PAYLOAD!r} ({_h5_message(exc)}); the "
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
                raise CorruptDataError(f"HDF5 metadata cannot be read ({_h5_message(exc)}); "
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
        offsets = self._array(f, OFFSETS, n + 1).astype(np.int64, copy=False)
        labels = self._array(f, LABELS, n).astype(LABEL_DTYPE, copy=False)
        crcs = self._array(f, CRC32, n).astype(CRC32_DTYPE, copy=False)
        if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != payload.shape[0]:
            raise CorruptDataError(
                f"dataset {OFFSETS!r} does not describe the {payload.shape[0]} payload bytes "
                f"(it must start at 0, never decrease and end at the payload size); re-pack it",
                path=self.path, key=OFFSETS)
        for name, array, dtype in ((OFFSETS, offsets, OFFSET_DTYPE), (LABELS, labels, LABEL_DTYPE),
                                   (CRC32, crcs, CRC32_DTYPE)):
            check_sha256(manifest, name, array.astype(dtype, copy=False).tobytes(),
                         path=self.path, what=f"the {name} (dataset {name!r})")
        self._manifest = manifest
        self._offsets = offsets
        self._labels = labels.astype(np.int64, copy=False)
        self._crcs = crcs

    def _array(self, f, name: str, length: int) -> np.ndarray:
        if name not in f:
            raise CorruptDataError(f"dataset {name!r} is missing; re-pack it",
                                   path=self.path, key=name)
        dset = f[name]
        if dset.shape != (length,) or dset.dtype.kind not in "iu":
            raise CorruptDataError(f"dataset {name!r} is {dset.dtype} of shape {dset.shape}, "
                                   f"expected {length} integers", path=self.path, key=name)
        return dset[()]

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
            raise CorruptDataError(f"dataset {KEYS!r} cannot be read ({_h5_message(exc)}); the "
                                   f"file is damaged, re-pack it", path=self.path,
                                   key=KEYS) from None
        keys = keys.tolist()
        check_sha256(self.manifest, KEYS, keys_json(keys), path=self.path,
                     what=f"the keys (dataset {KEYS!r})")
        return keys

    def _load_metadata_crcs(self) -> np.ndarray:
        """The metadata CRC32s, loading the metadata offsets with them (both
        checked against the manifest, the offsets against the JSON bytes)."""
        f = self._get_file()
        n = len(self)
        try:
            data = f.get(METADATA)
            if data is None or data.ndim != 1 or data.dtype != np.uint8:
                raise CorruptDataError(f"dataset {METADATA!r} is missing or not 1-D uint8; "
                                       f"re-pack it", path=self.path, key=METADATA)
            offsets = self._array(f, METADATA_OFFSETS, n + 1).astype(np.int64, copy=False)
            crcs = self._array(f, METADATA_CRC32, n).astype(CRC32_DTYPE, copy=False)
        except H5_ERRORS as exc:
            raise CorruptDataError(f"the metadata cannot be read ({_h5_message(exc)}); the "
                                   f"file is damaged, re-pack it", path=self.path,
                                   key=METADATA) from None
        for name, array, dtype in ((METADATA_OFFSETS, offsets, OFFSET_DTYPE),
                                   (METADATA_CRC32, crcs, CRC32_DTYPE)):
            check_sha256(self.manifest, name, array.astype(dtype, copy=False).tobytes(),
                         path=self.path, what=f"the {name} (dataset {name!r})")
        if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != data.shape[0]:
            raise CorruptDataError(
                f"dataset {METADATA_OFFSETS!r} does not describe the {data.shape[0]} bytes of "
                f"{METADATA!r}; re-pack it", path=self.path, key=METADATA_OFFSETS)
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
                                   f"({_h5_message(exc)}); the file is damaged, re-pack it",
                                   path=self.path, key=self.key_of(i), record=i) from None
        return out

    def _offsets_array(self) -> np.ndarray:
        if self._offsets is None:
            self._load()
        return self._offsets

    # -- reading ----------------------------------------------------------------

    def _read_many(self, indices: Sequence[int]) -> list[bytes]:
        if len(indices) == 0:
            return []
        offsets = self._offsets_array()
        self._get_file()
        if len(indices) == 1:
            # One record: h5py's cached simple-slice reader beats building a selection.
            i = indices[0]
            a, b = int(offsets[i]), int(offsets[i + 1])
            try:
                return [self._payload[a:b].tobytes()]
            except H5_ERRORS as exc:
                raise self._read_error(exc, [a], [b], [i]) from None
        idx = np.asarray(indices, dtype=np.int64)
        starts = offsets[idx]
        ends = offsets[idx + 1]
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
        # A new run starts where a record begins more than merge_gap bytes past
        # everything before it; duplicates and neighbours fall into one run.
        reach = np.maximum.accumulate(e)
        new = np.ones(len(s), dtype=bool)
        new[1:] = s[1:] > reach[:-1] + self.merge_gap
        first = np.flatnonzero(new)
        run_start = s[first]
        run_end = np.maximum.reduceat(e, first)
        run_len = run_end - run_start
        run_pos = np.zeros(len(first), dtype=np.int64)
        np.cumsum(run_len[:-1], out=run_pos[1:])
        run_of = np.cumsum(new) - 1
        pos = np.empty(len(idx), dtype=np.int64)
        pos[order] = run_pos[run_of] + (s - run_start[run_of])
        buf = self._read_runs(run_start, run_end, int(run_len.sum()), idx[order][first])
        view = memoryview(buf)
        return [view[p:p + n].tobytes() for p, n in zip(pos.tolist(), (ends - starts).tolist())]

    def _read_runs(self, run_start: np.ndarray, run_end: np.ndarray, total: int,
                   first_records: np.ndarray) -> np.ndarray:
        """Read the byte ranges ``[run_start[k], run_end[k])`` (sorted, disjoint)
        back to back into one buffer, one HDF5 read per ``RUNS_PER_READ`` ranges."""
        import h5py

        buf = np.empty(total, dtype=np.uint8)
        dset = self._payload
        starts, ends = run_start.tolist(), run_end.tolist()
        pos = 0
        for g in range(0, len(starts), RUNS_PER_READ):
            group = [(a, b) for a, b in zip(starts[g:g + RUNS_PER_READ],
                                            ends[g:g + RUNS_PER_READ]) if b > a]
            size = sum(b - a for a, b in group)
            if size == 0:
                continue
            try:
                space = dset.id.get_space()
                space.select_none()
                for a, b in group:
                    space.select_hyperslab((a,), (b - a,), op=h5py.h5s.SELECT_OR)
                dset.id.read(h5py.h5s.create_simple((size,)), space, buf[pos:pos + size])
            except H5_ERRORS as exc:
                raise self._read_error(exc, run_start, run_end, first_records) from None
            pos += size
        return buf

    def _read_error(self, exc: Exception, run_start, run_end, first_records) -> CorruptDataError:
        # Name the first range that fails on its own, so the message points at a record.
        bad = 0
        for k, (a, b) in enumerate(zip(run_start, run_end)):
            try:
                self._payload[a:b]
            except H5_ERRORS:
                bad = k
                break
        index = int(first_records[bad])
        return CorruptDataError(
            f"record {index} cannot be read (payload bytes {int(run_start[bad])}.."
            f"{int(run_end[bad])}; h5py: {exc}): the file is damaged; re-pack it or read "
            f"with on_error='skip'", path=self.path, key=self.key_of(index), record=index)

    def _iter_payloads(self) -> Iterator[tuple[int, bytes]]:
        offsets = self._offsets_array()
        self._get_file()
        n = len(offsets) - 1
        i = 0
        while i < n:
            start = int(offsets[i])
            # Whole records up to block_bytes, and at least one record.
            j = int(np.searchsorted(offsets, start + self.block_bytes, side="right")) - 1
            j = min(max(j, i + 1), n)
            end = int(offsets[j])
            try:
                view = memoryview(self._payload[start:end])
            except H5_ERRORS as exc:
                raise self._read_error(exc, [start], [end], [i]) from None
            for k in range(i, j):
                yield k, view[int(offsets[k]) - start:int(offsets[k + 1]) - start].tobytes()
            i = j


def _dataset(dsid):
    import h5py

    try:
        # Read-only lets h5py cache its fast slice reader (2-3x faster single reads).
        return h5py.Dataset(dsid, readonly=True)
    except TypeError:  # h5py without the keyword
        return h5py.Dataset(dsid)


def _h5_message(exc: Exception) -> str:
    # h5py's KeyError repr adds quotes; the text alone reads better in one line.
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def _check_schema(value, path: str) -> None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or not value.startswith(SCHEMA_PREFIX):
        raise ManifestError(f"HDF5 file has no {SCHEMA_ATTR!r} attribute of the form "
                            f"{SCHEMA!r}: it was not written by fastdata", path=path)
    try:
        version = int(value[len(SCHEMA_PREFIX):])
    except ValueError:
        raise ManifestError(f"unknown HDF5 schema {value!r}", path=path) from None
    if version > SCHEMA_VERSION:
        raise ManifestError(
            f"HDF5 schema {value!r} is newer than this fastdata reads ({SCHEMA}); upgrade "
            f"fastdata (in its checkout: git pull, then pip install -e .)", path=path)

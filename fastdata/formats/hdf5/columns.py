"""The offset, label and CRC32 columns of an HDF5 dataset, a piece at a time (no torch).

fastdata stores each column as a contiguous, unfiltered little-endian
dataset, so its values lie in the file as one run of bytes: the pieces a
batch touches are read from there with ``os.pread`` (no memory map: a
mapped page of the page cache counts in every process that touches it,
with its whole folio), and each is checked against its CRC-32
(:class:`fastdata.formats.column.PieceColumn`). A column stored otherwise
(chunked or filtered by another tool, such as ``h5repack``) is read whole
through h5py once and checked by piece the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np

from fastdata.errors import CorruptDataError, FastDataError
from fastdata.formats.column import PieceColumn
from fastdata.formats.integrity import piece_sums

#: Bytes hashed at a time by ``verify``'s SHA-256 of a whole column.
_HASH_BLOCK = 16 << 20


class HDF5Columns:
    """The stored columns of the HDF5 file at ``path``, ``rows`` values per
    piece: each at a byte offset of the file (read through a descriptor of
    the file h5py opened, even if its path was replaced since), or an array
    in memory."""

    def __init__(self, path: str, rows: int) -> None:
        self.path, self.rows = path, rows
        self._places: dict[str, tuple] = {}
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file read

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None}

    def add(self, dset, name: str, count: int, stored) -> None:
        """Read column ``name`` (the h5py dataset ``dset`` of ``count`` values
        of ``stored``) in place where its layout allows, else whole now.

        Raises:
            CorruptDataError: its bytes would lie past the end of the file.
        """
        import h5py

        stored = np.dtype(stored)
        plist = dset.id.get_create_plist()
        offset = dset.id.get_offset()
        if (count and offset is not None and plist.get_layout() == h5py.h5d.CONTIGUOUS
                and plist.get_nfilters() == 0 and dset.dtype == stored):
            end = offset + count * stored.itemsize
            if self._fd is None:
                self._open(_vfd_identity(dset))
            size = os.fstat(self._fd).st_size
            if end > size:
                raise CorruptDataError(f"dataset {name!r} ends at byte {end}, past the end of "
                                       f"the file ({size} bytes): the file is truncated; "
                                       f"re-pack it or restore the file", path=self.path,
                                       key=name)
            self._places[name] = (offset, count, stored)
        else:
            self._places[name] = (np.ascontiguousarray(dset[()], dtype=stored),)

    def _open(self, identity: tuple[int, int] | None = None) -> int:
        """A descriptor of the file, refused when the path now names another
        file than the one first read (or than ``identity``, h5py's)."""
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(fd)
        want = self._identity or identity
        if want is not None and want != (st.st_dev, st.st_ino):
            os.close(fd)
            raise FastDataError("the file was replaced since this dataset was opened; open "
                                "it again", path=self.path)
        self._identity, self._fd = (st.st_dev, st.st_ino), fd
        return fd

    def dtype(self, name: str) -> np.dtype:
        place = self._places[name]
        return place[2] if len(place) == 3 else place[0].dtype

    def read(self, name: str, pieces: list[int]) -> list[np.ndarray]:
        """The stored values of each of ``pieces`` of column ``name``, unchecked
        (a short read gives fewer values)."""
        place = self._places[name]
        rows = self.rows
        if len(place) == 1:
            return [place[0][p * rows:(p + 1) * rows] for p in pieces]
        offset, count, stored = place
        size = stored.itemsize
        fd = self._fd if self._fd is not None else self._open()
        try:
            return [np.frombuffer(os.pread(fd, (min(count, (p + 1) * rows) - p * rows) * size,
                                           offset + p * rows * size), dtype=stored)
                    for p in pieces]
        except OSError as exc:
            raise CorruptDataError(f"cannot read dataset {name!r} ({exc.strerror or exc}); "
                                   f"re-pack it or restore the file", path=self.path,
                                   key=name) from None

    def sha256(self, name: str) -> str:
        """The SHA-256 of column ``name``'s values as stored."""
        place = self._places[name]
        if len(place) == 1:
            return hashlib.sha256(place[0]).hexdigest()
        offset, count, stored = place
        sha = hashlib.sha256()
        fd = self._fd if self._fd is not None else self._open()
        left, at = count * stored.itemsize, offset
        while left:
            block = os.pread(fd, min(left, _HASH_BLOCK), at)
            if not block:
                break  # truncated: the digest differs
            sha.update(block)
            left, at = left - len(block), at + len(block)
        return sha.hexdigest()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - may run at interpreter exit: nothing to do
            pass


def _vfd_identity(dset) -> tuple[int, int] | None:
    """(device, inode) of the file h5py has open for ``dset``, if it says."""
    try:
        st = os.fstat(dset.file.id.get_vfd_handle())
    except (OSError, ValueError, TypeError, RuntimeError):
        return None  # a driver without a descriptor
    return st.st_dev, st.st_ino


def piece_column(store: HDF5Columns, f, manifest, rows: int, name: str, count: int,
                 stored, sums_name: str, check=None) -> PieceColumn:
    """Dataset ``name`` of the open file ``f`` as a :class:`PieceColumn`
    (its pieces' checksums, dataset ``sums_name``, read and checked against
    the manifest); ``check`` as PieceColumn takes it."""
    if sums_name not in f:
        raise CorruptDataError(f"dataset {sums_name!r} (the piece checksums of {name!r}) is "
                               f"missing; re-pack it", path=store.path, key=sums_name)
    raw = f[sums_name]
    raw = raw[()].astype("<u4").tobytes() if raw.ndim == 1 and raw.dtype.kind == "u" else None
    sums = piece_sums(manifest, sums_name, raw, -(-count // rows), path=store.path,
                      what=f"the piece checksums of {name!r} (dataset {sums_name!r})")
    store.add(f[name], name, count, stored)
    return PieceColumn(store, name, count=count, stored=stored, sums=sums, rows=rows,
                       path=store.path, what=f"the {name} (dataset {name!r})", check=check)


@dataclasses.dataclass(frozen=True)
class OffsetsCheck:
    """The check of a piece (or all) of ``count`` offsets into ``total``
    bytes of ``what`` (a picklable callable): the first 0, the last
    ``total``, none decreasing."""

    path: str
    name: str
    count: int
    total: int
    what: str

    def __call__(self, first: int, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.int64)
        if not len(v):
            return
        bad = ((first == 0 and v[0] != 0) or bool(np.any(np.diff(v) < 0))
               or int(v.min()) < 0 or int(v.max()) > self.total
               or (first + len(v) == self.count and v[-1] != self.total))
        if bad:
            rows = "" if first == 0 and len(v) == self.count else \
                f" (in its values {first}..{first + len(v) - 1})"
            raise CorruptDataError(
                f"dataset {self.name!r} does not describe the {self.total} bytes of "
                f"{self.what}{rows}: it must start at 0, never decrease and end at their "
                f"size; re-pack it", path=self.path, key=self.name)

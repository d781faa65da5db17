"""Bounded checks of HDF5 global heap collections, made before h5py reads
variable-length data from them (no torch, no h5py import at module level).

Variable-length strings (the ``fastdata_schema`` attribute and the ``keys``
dataset) are stored in global heap collections: a ``GCOL`` header, then heap
objects (index, reference count, size, data). HDF5 (1.14.6 here) loads a
collection whole and walks its objects; a free-space object of size 0 (64 zero
bytes over a collection do it) makes that walk loop forever, so a damaged file
would hang ``attrs[...]`` or a read of the keys at 100% CPU. Before such a read,
fastdata walks the collections involved itself, with bounds, and refuses a
damaged one with an error naming the file and offset.

The heap IDs are found without reading through HDF5's variable-length path:
for the keys, in the dataset's raw contiguous storage; for the attribute, in
the root group's object header (version 1, h5py's default), parsed here.
"""

from __future__ import annotations

import os

import numpy as np

from fastdata.errors import CorruptDataError, ManifestError

_GCOL = b"GCOL"
#: Collection header and heap object header sizes for 8-byte lengths (HDF5 aligns both to 8).
_HDR = 16
_OBJ_HDR = 16
#: A collection larger than this is damage: fastdata stores short strings there
#: (HDF5 sizes a collection to max(4 KiB, the object)), and a bound keeps the walk short.
MAX_COLLECTION = 16 << 20
#: Object header chunks followed (continuations) and bytes read per chunk, at most.
_MAX_CHUNKS = 64
#: Heap object indices are 16-bit: a collection holds at most this many objects.
_MAX_OBJECTS = 65535
_MAX_CHUNK_BYTES = 1 << 20
_MSG_CONTINUATION = 0x10
_MSG_ATTRIBUTE = 0x0C
_ADVICE = "the HDF5 file is damaged; re-pack it or restore the file"


def _damaged(message: str, path: str, offset: int | None = None) -> CorruptDataError:
    return CorruptDataError(f"{message}: {_ADVICE}", path=path, offset=offset)


def _pread(fd: int, size: int, offset: int, path: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) < size:
        raise _damaged(f"{size} bytes expected at byte offset {offset}, the file ends first", path,
                       offset)
    return data


def file_sizes(f) -> tuple[int, int]:
    """(bytes per address, bytes per length) of an open h5py file."""
    sizes = f.id.get_create_plist().get_sizes()
    return int(sizes[0]), int(sizes[1])


def heap_id_dtype(f, path: str) -> np.dtype:
    """On-disk variable-length element of file ``f``: sequence length, collection
    address, object index. The parsing here assumes 8-byte lengths (h5py's default)."""
    addr_size, len_size = file_sizes(f)
    if addr_size not in (4, 8) or len_size != 8:
        raise ManifestError(f"HDF5 file uses {addr_size}-byte addresses and {len_size}-byte "
                            f"lengths; fastdata reads files with 8-byte lengths and 4- or "
                            f"8-byte addresses (h5py's default is 8 and 8)", path=path)
    return np.dtype([("len", "<u4"), ("addr", f"<u{addr_size}"), ("idx", "<u4")])


# -- collections -------------------------------------------------------------------------


def _read_collections(fd: int, addrs: np.ndarray, file_size: int, path: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The collections at ``addrs`` back to back in one buffer: (buffer, starts, sizes)."""
    parts, starts, sizes = [], [], []
    pos = 0
    for addr in addrs.tolist():
        if addr + _HDR > file_size:
            raise _damaged(f"a global heap collection is said to lie at byte offset {addr}, past "
                           f"the end of the file ({file_size} bytes)", path, addr)
        head = os.pread(fd, min(4096, file_size - addr), addr)
        if head[:4] != _GCOL or head[4] != 1:
            raise _damaged("a global heap collection has a bad signature or version", path, addr)
        size = int.from_bytes(head[8:16], "little")
        if not _HDR <= size <= min(MAX_COLLECTION, file_size - addr):
            raise _damaged(f"a global heap collection claims {size} bytes", path, addr)
        parts.append(head[:size] if size <= len(head) else _pread(fd, size, addr, path))
        starts.append(pos)
        sizes.append(size)
        pos += size
    buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
    return buf, np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)


def walk_collections(buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Walk the heap objects of every collection at once, as HDF5 does on load.

    Returns:
        (collection number, object index, object size) of every object, and per
        collection the offset of the first damaged object header inside it, or -1.
        Damage: a free-space object smaller than an object header (HDF5 loops
        forever on size 0), an object running past its collection, or more
        objects than 16-bit indices allow.
    """
    ends = starts + sizes
    pos = starts + _HDR
    bad = np.full(len(starts), -1, dtype=np.int64)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for _ in range(_MAX_OBJECTS + 2):  # +2: the free-space object and the tail
        live = np.flatnonzero((pos < ends) & (bad < 0))
        if len(live) == 0:
            break
        p, room = pos[live], ends[live] - pos[live]
        tail = room < _OBJ_HDR  # too short for a header: free space, as HDF5 reads it
        pos[live[tail]] = ends[live[tail]]
        live, p, room = live[~tail], p[~tail], room[~tail]
        idx = buf[p].astype(np.int64) | (buf[p + 1].astype(np.int64) << 8)
        size = buf[p[:, None] + np.arange(8, 16)].copy().view("<u8").ravel()
        fits = size <= room.astype(np.uint64)
        size = np.where(fits, size, 0).astype(np.int64)
        need = np.where(idx > 0, _OBJ_HDR + ((size + 7) & ~7), size)
        broken = ~fits | ((idx == 0) & (size < _OBJ_HDR)) | (need > room)
        bad[live[broken]] = p[broken] - starts[live[broken]]
        ok = ~broken & (idx > 0)
        found.append((live[ok], idx[ok], size[ok]))
        pos[live[~broken]] += need[~broken]
    else:  # object indices are 16-bit: more objects than that is damage
        stuck = (pos < ends) & (bad < 0)
        bad[stuck] = pos[stuck] - starts[stuck]
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, bad
    coll, idx, size = (np.concatenate(a) for a in zip(*found))
    return coll, idx, size, bad


def check_heap_ids(fd: int, ids: np.ndarray, file_size: int, path: str, what: str) -> None:
    """Check that HDF5 can read the variable-length values ``ids`` (``heap_id_dtype``
    rows) without looping: every collection they name walks cleanly, and every
    object exists and holds at least the value's length.

    Raises:
        CorruptDataError: naming the first damaged collection's file offset.
    """
    ids = ids[ids["len"] > 0]  # HDF5 reads no heap for an empty value
    if len(ids) == 0:
        return
    addrs, which = np.unique(ids["addr"].astype(np.int64), return_inverse=True)
    buf, starts, sizes = _read_collections(fd, addrs, file_size, path)
    coll, idx, size, bad = walk_collections(buf, starts, sizes)
    broken = np.flatnonzero(bad >= 0)
    if len(broken):
        k = int(broken[0])
        raise _damaged(f"global heap collection holding {what} has a damaged object header "
                       f"(HDF5 would loop on it)", path, int(addrs[k] + bad[k]))
    # Every (collection, index) asked for must exist, with room for the value.
    have = coll * 65536 + idx
    order = np.argsort(have)
    have, size = have[order], size[order]
    want = which.astype(np.int64) * 65536 + ids["idx"].astype(np.int64)
    missing = np.ones(len(want), dtype=bool)
    if len(have):
        at = np.minimum(np.searchsorted(have, want), len(have) - 1)
        missing = (have[at] != want) | (size[at] < ids["len"].astype(np.int64))
    if missing.any():
        k = int(np.flatnonzero(missing)[0])
        raise _damaged(f"{what} points to a global heap object that is missing or too short",
                       path, int(addrs[which[k]]))


# -- the keys ----------------------------------------------------------------------------


def check_vlen_dataset(f, dset, path: str, name: str) -> None:
    """Check the heap collections a 1-D variable-length dataset's values live in."""
    n = dset.shape[0] if dset.shape else 1
    if n == 0:
        return
    dtype = heap_id_dtype(f, path)
    offset = dset.id.get_offset()
    file_size = os.path.getsize(path)
    need = n * dtype.itemsize
    if offset is None or offset + need > file_size:
        raise _damaged(f"dataset {name!r} is not stored contiguously inside the file, as "
                       f"fastdata writes it", path)
    fd = os.open(path, os.O_RDONLY)
    try:
        ids = np.frombuffer(_pread(fd, need, offset, path), dtype=dtype)
        check_heap_ids(fd, ids, file_size, path, f"dataset {name!r}")
    finally:
        os.close(fd)


# -- the root attribute ------------------------------------------------------------------


def read_root_attribute(f, name: str, path: str) -> object | None:
    """A root attribute's value, read only after its heap collection checks clean.

    Returns None when the attribute does not exist; its value otherwise (a
    fixed-length string is stored inline and read directly).

    Raises:
        CorruptDataError: the collection holding the value is damaged, or the
            attribute cannot be found in the object header to check it.
        ManifestError: the attribute is not a string.
    """
    import h5py

    bname = name.encode()
    if not h5py.h5a.exists(f.id, bname):
        return None
    kind = h5py.h5a.open(f.id, bname).get_type()
    if not isinstance(kind, h5py.h5t.TypeStringID):
        raise ManifestError(f"HDF5 attribute {name!r} is not a string", path=path)
    if kind.is_variable_str():
        _check_attribute_heap(f, bname, path)
    return f.attrs[name]


def _check_attribute_heap(f, name: bytes, path: str) -> None:
    import h5py

    dtype = heap_id_dtype(f, path)
    addr_size, len_size = file_sizes(f)
    file_size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = _find_attribute(fd, int(h5py.h5o.get_info(f.id).addr), name, addr_size,
                              len_size, file_size, path)
        if raw is None:
            raise _damaged(f"attribute {name.decode()!r} cannot be located in the root object "
                           f"header to check it (fastdata reads version-1 headers)", path)
        ids = np.frombuffer(raw[:dtype.itemsize], dtype=dtype)
        check_heap_ids(fd, ids, file_size, path, f"attribute {name.decode()!r}")
    finally:
        os.close(fd)


def _find_attribute(fd: int, header: int, name: bytes, addr_size: int, len_size: int,
                    file_size: int, path: str) -> bytes | None:
    """The raw data of attribute ``name`` in the version-1 object header at
    ``header``, following continuation chunks; None if not found."""
    head = _pread(fd, 16, header, path)
    if head[0] != 1:
        return None  # a version-2 header ("OHDR"): not parsed here
    chunks = [(header + 16, int.from_bytes(head[8:12], "little"))]
    for _ in range(_MAX_CHUNKS):
        if not chunks:
            return None
        addr, length = chunks.pop(0)
        if length > _MAX_CHUNK_BYTES or addr + length > file_size:
            raise _damaged(f"object header chunk of {length} bytes at byte offset {addr} does not "
                           f"fit the file", path, addr)
        data = _pread(fd, length, addr, path)
        pos = 0
        while pos + 8 <= length:
            mtype = int.from_bytes(data[pos:pos + 2], "little")
            msize = int.from_bytes(data[pos + 2:pos + 4], "little")
            body = data[pos + 8:pos + 8 + msize]
            if mtype == _MSG_CONTINUATION and len(body) >= addr_size + len_size:
                chunks.append((int.from_bytes(body[:addr_size], "little"),
                               int.from_bytes(body[addr_size:addr_size + len_size], "little")))
            elif mtype == _MSG_ATTRIBUTE and not data[pos + 4] & 0x02:  # not a shared message
                value = _attribute_data(body, name)
                if value is not None:
                    return value
            pos += 8 + msize
    raise _damaged("root object header has too many continuation chunks", path, header)


def _attribute_data(body: bytes, name: bytes) -> bytes | None:
    """The data of an attribute message named ``name`` (versions 1-3), else None."""
    version = body[0] if body else 0
    if version not in (1, 2, 3) or len(body) < 8:
        return None
    name_size, type_size, space_size = (int.from_bytes(body[i:i + 2], "little")
                                        for i in (2, 4, 6))
    pos = 8 if version < 3 else 9  # version 3 adds a character-set byte

    def pad(n: int) -> int:  # version 1 pads each part to 8 bytes
        return (n + 7) & ~7 if version == 1 else n

    if body[pos:pos + name_size].rstrip(b"\0") != name:
        return None
    pos += pad(name_size) + pad(type_size) + pad(space_size)
    return body[pos:]

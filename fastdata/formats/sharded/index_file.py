"""Reading the dataset index (``NAME.fastdata.index.npy``) without trusting it
(no torch).

``np.load`` believes the header: a damaged one raises tokenize.TokenError,
IndexError or OverflowError, and a shape of 2**40 rows asks for terabytes
before a byte is read. Here the header is parsed first, its errors become
CorruptDataError naming the file, its dtype and row count are checked against
the manifest and the file's size, and only then are the rows read. The rows
themselves are checked against the shards (shard number in range, every
record inside its shard file) before any of them is used to allocate a read.
"""

from __future__ import annotations

import errno
import io
import os
import tokenize

import numpy as np

from fastdata.errors import CorruptDataError, FastDataError
from fastdata.formats.sharded.layout import INDEX_DTYPE

#: What numpy's header parser raises on damaged bytes (SyntaxError and
#: tokenize.TokenError from its literal parser; ValueError covers UnicodeError).
_HEADER_ERRORS = (ValueError, SyntaxError, tokenize.TokenError, IndexError, OverflowError,
                  TypeError, KeyError, RecursionError)
ADVICE = "re-pack the dataset or restore the file"
#: The piece checksums' array type (the ``-crc.npy`` file).
PIECE_DTYPE = np.dtype("<u4")


def file_error(exc: OSError, path: str, *, doing: str = "open",
               what: str = "shard") -> FastDataError:
    """The error for a file of the dataset that cannot be opened or read:
    CorruptDataError, except for an exhausted file-descriptor limit, which is
    no damage and says what to do."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return FastDataError(
            f"cannot {doing} {what}: too many open files ({exc.strerror}); close datasets "
            f"no longer used (ds.close(), or open them in a with block) or raise the limit "
            f"(ulimit -n; now {_fd_limit()} for this process)", path=path)
    return CorruptDataError(f"cannot {doing} {what} ({exc.strerror or exc})", path=path)


def _fd_limit() -> str:
    try:
        import resource

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return "unknown"


def save_blocks(path: str, dtype: np.dtype, count: int, blocks) -> None:
    """Write ``count`` rows of ``dtype``, given as arrays in order, to the
    ``.npy`` file ``path``: the bytes ``np.save`` writes for them whole."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                 "fortran_order": False, "shape": (count,)})
        written = 0
        for block in blocks:
            f.write(np.ascontiguousarray(block, dtype=dtype).tobytes())
            written += len(block)
    if written != count:
        raise FastDataError(f"{written} rows written of {count}", path=path)


def load_index(path: str, count: int) -> np.ndarray:
    """The ``count`` rows of the dataset index at ``path`` (``INDEX_DTYPE``).

    Raises:
        CorruptDataError: the file is missing, its header is damaged, or it does
            not hold ``count`` rows of ``INDEX_DTYPE``.
    """
    try:
        with open(path, "rb") as f:
            shape, dtype = _read_header(f, path)
            _check_header(shape, dtype, count, os.fstat(f.fileno()).st_size - f.tell(), path)
            rows = np.fromfile(f, dtype=INDEX_DTYPE, count=count)
    except OSError as exc:
        raise CorruptDataError(f"cannot read the dataset index ({exc.strerror or exc}); "
                               f"{ADVICE}", path=path) from None
    if len(rows) != count:
        raise CorruptDataError(f"dataset index ends after {len(rows)} of its {count} rows; "
                               f"{ADVICE}", path=path)
    return rows


def rows_start(path, count: int, dtype: np.dtype = INDEX_DTYPE) -> int:
    """Where the ``count`` rows (of ``dtype``) of the ``.npy`` file at ``path``
    begin, after its header is checked; ``path`` may be a
    :class:`fastdata.formats.ranged_copy.RangedCopy` (its first bytes read;
    a header that fails is fetched again once, since the machine's copy of
    it may be what is damaged).

    Raises:
        CorruptDataError: as :func:`load_index`.
    """
    if not isinstance(path, str):  # a remote index read by ranges
        try:
            return _ranged_rows_start(path, count, dtype, fresh=False)
        except CorruptDataError:
            return _ranged_rows_start(path, count, dtype, fresh=True)
    try:
        with open(path, "rb") as f:
            shape, found = _read_header(f, path)
            start = f.tell()
            _check_header(shape, found, count, os.fstat(f.fileno()).st_size - start, path,
                          dtype)
            return start
    except OSError as exc:
        raise CorruptDataError(f"cannot read the dataset index ({exc.strerror or exc}); "
                               f"{ADVICE}", path=path) from None


def _ranged_rows_start(copy, count: int, dtype: np.dtype, *, fresh: bool) -> int:
    """:func:`rows_start` of a ranged copy, the header's block fetched again
    when ``fresh``. Its rows end where the object does: a remote index's
    size is :func:`npy_size`'s, so a header that says otherwise is damaged."""
    head = copy.read([(0, min(copy.size, 4096))], fresh=fresh)[0]  # the header, and more
    f = io.BytesIO(head)
    shape, found = _read_header(f, copy.url)
    start = f.tell()
    _check_header(shape, found, count, copy.size - start, copy.url, dtype)
    if start + count * dtype.itemsize != copy.size:
        raise CorruptDataError(f"dataset index header ends at byte {start}: its {count} rows "
                               f"would end at byte {start + count * dtype.itemsize}, not at "
                               f"the file's end ({copy.size} bytes); {ADVICE}", path=copy.url)
    return start


def npy_size(count: int, dtype: np.dtype = INDEX_DTYPE) -> int:
    """The bytes of the ``.npy`` file :func:`save_blocks` writes for ``count``
    rows of ``dtype`` (what a remote index holds, known without asking)."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                "fortran_order": False, "shape": (count,)})
    return len(head.getvalue()) + count * dtype.itemsize


def load_array(path: str, count: int, dtype: np.dtype) -> np.ndarray:
    """The ``count`` values (of ``dtype``) of the ``.npy`` file at ``path``,
    read after the header is checked.

    Raises:
        CorruptDataError: as :func:`load_index`.
    """
    start = rows_start(path, count, dtype)
    with open(path, "rb") as f:
        f.seek(start)
        return np.fromfile(f, dtype=dtype, count=count)


def _read_header(f, path: str) -> tuple[tuple, np.dtype]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f".npy format version {version} (fastdata writes 1.0)")
    except _HEADER_ERRORS as exc:
        raise CorruptDataError(f"dataset index has a damaged .npy header ({type(exc).__name__}: "
                               f"{str(exc)[:120]}); {ADVICE}", path=path) from None
    if fortran and len(shape) > 1:
        raise CorruptDataError(f"dataset index is a Fortran-order array; {ADVICE}", path=path)
    return shape, dtype


def _check_header(shape: tuple, dtype: np.dtype, count: int, data_bytes: int,
                  path: str, expected: np.dtype = INDEX_DTYPE) -> None:
    if dtype != expected or shape != (count,):
        raise CorruptDataError(f"dataset index holds {shape} of {dtype}, expected ({count},) "
                               f"rows of {expected}; {ADVICE}", path=path)
    if count * expected.itemsize > data_bytes:
        raise CorruptDataError(f"dataset index is truncated ({data_bytes} bytes of rows, "
                               f"{count} rows need {count * expected.itemsize}); {ADVICE}",
                               path=path)


def check_rows(index: np.ndarray, shard_sizes, path: str, *,
               first: int = 0) -> None:
    """Check that every row names an existing shard and lies inside that shard file
    (``index`` holds the rows from row ``first`` on: errors name the dataset's row).

    Raises:
        CorruptDataError: naming the index file and the first bad row.
    """
    if len(index) == 0:
        return
    shard = index["shard"].astype(np.int64)
    bad = np.flatnonzero(shard >= len(shard_sizes))
    if len(bad):
        i = int(bad[0])
        raise CorruptDataError(f"row {first + i} of the dataset index (record {first + i}) "
                               f"names shard {int(shard[i])}, but the dataset has "
                               f"{len(shard_sizes)} shard(s); {ADVICE}",
                               path=path, record=first + i)
    limit = np.asarray(shard_sizes, dtype=np.uint64)[shard]
    offset, size = index["offset"], index["size"]
    # offset <= limit first, so limit - offset cannot wrap around.
    outside = (offset > limit) | (size > limit - np.minimum(offset, limit))
    bad = np.flatnonzero(outside)
    if len(bad):
        i = int(bad[0])
        raise CorruptDataError(
            f"row {first + i} of the dataset index puts record {first + i} at byte offset "
            f"{int(offset[i])} with {int(size[i])} bytes, past the end of shard "
            f"{int(shard[i])} ({int(limit[i])} bytes); {ADVICE}", path=path, record=first + i)


def index_source(path: str, count: int):
    """What :meth:`IndexRows.open` reads an index of ``count`` rows from: the
    file itself, or at a URL a :class:`~fastdata.formats.ranged_copy.RangedCopy`
    (pieces fetched by ranges into a copy every process of the machine shares)."""
    from fastdata.formats.remote_files import is_remote

    if not is_remote(path):
        return path
    from fastdata.formats.ranged_copy import RangedCopy

    return RangedCopy(path, npy_size(count))


def piece_rows_of(extra_pieces, where: str) -> int:
    """The rows per piece a manifest's ``index_pieces`` gives.

    Raises:
        CorruptDataError: not a positive whole number.
    """
    rows = extra_pieces.get("rows") if isinstance(extra_pieces, dict) else None
    if type(rows) is not int or rows < 1:
        raise CorruptDataError(f"the manifest's index_pieces.rows is {rows!r}, not a number of "
                               f"rows per piece; {ADVICE}", path=where)
    return rows


def load_pieces(manifest, pieces: dict, path: str, count: int) -> tuple[np.ndarray, int]:
    """The piece checksums of an index of ``count`` rows: the file ``path``
    (named by ``pieces``, a manifest's ``index_pieces``) checked whole
    against the manifest's SHA-256 and read (4 bytes per piece: 31 MB for
    10^9 records). Returns (CRC-32s, rows per piece).

    Raises:
        CorruptDataError: the file is missing, damaged or of another size.
    """
    from fastdata.formats.integrity import check_file_sha256, expected_sha256
    from fastdata.formats.remote_files import is_remote, process_cache

    rows = piece_rows_of(pieces, path)
    n = -(-count // rows)
    local = path
    if is_remote(path):  # its copy named by its SHA-256 too: a re-pack is another copy
        digest = expected_sha256(manifest, pieces["file"], path=path)
        local = process_cache().local(path, limit=n * PIECE_DTYPE.itemsize + 4096,
                                      identity=None if digest is None else f"sha256 {digest}")
    check_file_sha256(manifest, pieces["file"], local, what="the index's piece checksums")
    return load_array(local, n, PIECE_DTYPE), rows

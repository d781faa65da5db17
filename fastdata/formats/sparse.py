"""Declared sizes against the bytes a file really stores (no torch).

A size field can claim gigabytes that a sparse file "holds" as a hole: a tar of
8 KB on disk can declare a 2 GiB member inside a 2 GiB file, and reading it
fills memory with zeros that were never written. Before a large declared
range is read, the file system is asked (``SEEK_DATA``/``SEEK_HOLE``) how much
of it is stored; a range that is mostly hole is damage, not data.

Only ranges of ``MIN_CHECKED`` bytes or more are checked: smaller ones cost
little to read, and file systems that compress may store long runs of zeros
as holes, which a large real image never is. Where the file system cannot
tell, every byte counts as stored and nothing is refused.
"""

from __future__ import annotations

import errno
import os

from fastdata.errors import CorruptDataError

#: Declared ranges below this size are read without asking.
MIN_CHECKED = 64 << 20
#: Extents counted per range at most: a range with more data extents than
#: this is taken as stored (real files have few; holes need deliberate work).
_MAX_EXTENTS = 64


def stored_bytes(fd: int, start: int, size: int) -> int:
    """Bytes of ``[start, start + size)`` that hold data rather than a hole
    (``size`` when the file system cannot tell, or past ``_MAX_EXTENTS`` extents)."""
    if not hasattr(os, "SEEK_DATA"):
        return size
    end = start + size
    pos, stored = start, 0
    for _ in range(_MAX_EXTENTS):
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after pos: the rest is a hole
                return stored
            return size  # not supported here: count everything
        if data >= end:
            return stored
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        stored += hole - data
        pos = hole
        if pos >= end:
            return stored
    return size


def check_stored(fd: int, start: int, size: int, *, path: str, offset: int | None,
                 what: str) -> None:
    """Refuse a declared range of ``size`` bytes at ``start`` that is mostly a hole.

    Raises:
        CorruptDataError: naming ``path`` and ``offset``, before anything is read.
    """
    if size < MIN_CHECKED:
        return
    stored = stored_bytes(fd, start, size)
    if stored * 2 < size:
        raise CorruptDataError(
            f"{what} declares {size:,} bytes but the file stores only {stored:,} of them "
            f"(the rest is a hole in a sparse file, never written): the file is damaged or "
            f"crafted; re-create it", path=path, offset=offset)

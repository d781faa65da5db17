"""Take back an LMDB environment's last commit (what LMDB's MDB_PREVSNAPSHOT does).

LMDB keeps two meta pages, each naming a snapshot, and opens the one with the
higher transaction id. A commit never reuses the pages of the snapshot before
it (pages freed by commit T are reused from commit T + 2 on), so while commit
T + 1 is the newest, snapshot T is whole: copying the older meta page over the
newer one makes T the newest again, and the next commit is T + 1 once more,
written where an uninterrupted run writes it. py-lmdb cannot ask LMDB for
this, so it is done here on the closed environment's ``data.mdb``.

A resumed pack uses it to drop a piece that was committed but never
journaled, which leaves ``data.mdb`` as the uninterrupted pack had it.
"""

from __future__ import annotations

import os
import struct
import sys

_MAGIC = 0xBEEFC0DE
_P_META = 0x08
#: The page header (page number, pad, flags, lower, upper) of 64-bit builds.
_HEADER = 16
#: Where MDB_meta keeps its transaction id: after the magic, version, address,
#: map size, two 48-byte MDB_db records and the last page number.
_TXNID_AT = _HEADER + 128


def drop_last_commit(data_path: str, page_size: int, txnid: int) -> bool:
    """Make commit ``txnid`` the newest of the closed environment whose data file
    is ``data_path`` again, where its newest is ``txnid + 1``; return whether
    it did (False, and nothing changed, for anything else)."""
    if struct.calcsize("P") != 8 or sys.byteorder != "little":
        return False  # a meta page this module does not know
    with open(data_path, "r+b") as f:
        pages = [f.read(page_size), f.read(page_size)]
        ids = [_txnid(page, page_size) for page in pages]
        if None in ids:
            return False
        newer = 0 if ids[0] > ids[1] else 1
        if ids[newer] != txnid + 1 or ids[1 - newer] != txnid:
            return False
        f.seek(newer * page_size + _HEADER)
        f.write(pages[1 - newer][_HEADER:])
        f.flush()
        os.fsync(f.fileno())
    return True


def _txnid(page: bytes, page_size: int) -> int | None:
    if (len(page) != page_size or not struct.unpack_from("<H", page, 10)[0] & _P_META
            or struct.unpack_from("<I", page, _HEADER)[0] != _MAGIC):
        return None
    return struct.unpack_from("<Q", page, _TXNID_AT)[0]

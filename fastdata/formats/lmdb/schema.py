"""The LMDB key schema, shared by the writer and the reader.

Layout: ``out.lmdb/`` is an ordinary LMDB environment folder (``data.mdb``,
``lock.mdb``) with one unnamed database holding

=====================  =======================================================
key (ASCII)            value
=====================  =======================================================
``0000000000`` ...     record i's payload (the original file bytes by
                       default); the key is i as 10 zero-padded decimal digits
``__labels__``         int64 little-endian array of the N labels
``__crc32__``          uint32 little-endian array of the N payload CRC32s (zlib)
``__labels__/P``       piece P of ``__labels__``: its values 128P to 128P+127
                       (P as 10 zero-padded decimal digits)
``__crc32__/P``        piece P of ``__crc32__``, the same way
``__labels_pieces__``  uint32 little-endian CRC-32 (zlib) of each piece of
                       ``__labels__`` (of the value of ``__labels__/P``)
``__crc32_pieces__``   the same for ``__crc32__``
``__keys__``           JSON list of the N source keys (relative paths), UTF-8
``__manifest__``       the manifest, JSON, UTF-8 (written last)
=====================  =======================================================

and, only in a dataset whose records carry metadata (the manifest's
``extra["metadata"]`` says so):

==============================  ===========================================
``0000000000.json`` ...         record i's metadata, canonical UTF-8 JSON (a
                                record without metadata has no such key)
``__metadata_crc32__``          uint32 little-endian array of the N metadata
                                CRC32s (zlib; 0 for a record without metadata)
``__metadata_crc32__/P``        its pieces, and
``__metadata_crc32_pieces__``   the CRC-32 of each piece of it, as above
==============================  ===========================================

Sample keys sort before the ``__`` keys, so a cursor walks records in order
(a record's metadata key right after its payload's).

Versions (the manifest's ``extra["key_schema"]``): ``fastdata-lmdb-1``
has no pieces, and its columns are checked whole by their SHA-256 on open.
``fastdata-lmdb-1.1`` adds them (the manifest's ``extra["column_pieces"]``
gives the values per piece and names the checksums): a reader gets and
checks the pieces a batch touches, never a whole column (a get of a large
value makes LMDB touch all its pages). The whole values stay, under their
SHA-256 in the manifest, so a reader of 1 still opens a 1.1 dataset. A
reader refuses a newer major version.
"""

from __future__ import annotations

SAMPLE_KEY_FORMAT = "{:010d}"
LABELS_KEY = b"__labels__"
CRC32_KEY = b"__crc32__"
KEYS_KEY = b"__keys__"
MANIFEST_KEY = b"__manifest__"
METADATA_KEY_FORMAT = "{:010d}.json"
METADATA_CRC32_KEY = b"__metadata_crc32__"
LABEL_DTYPE = "<i8"
CRC32_DTYPE = "<u4"
LABELS_PIECES_KEY = b"__labels_pieces__"
CRC32_PIECES_KEY = b"__crc32_pieces__"
METADATA_CRC32_PIECES_KEY = b"__metadata_crc32_pieces__"
#: Each column checked by piece (from 1.1 on), and the key of its pieces' CRC-32s.
PIECES_KEYS = {LABELS_KEY: LABELS_PIECES_KEY, CRC32_KEY: CRC32_PIECES_KEY,
               METADATA_CRC32_KEY: METADATA_CRC32_PIECES_KEY}
#: The key schema's name and version (major.minor), in the manifest's extra.
KEY_SCHEMA_PREFIX = "fastdata-lmdb-"
KEY_SCHEMA_MAJOR = 1
KEY_SCHEMA_MINOR = 1
KEY_SCHEMA = f"{KEY_SCHEMA_PREFIX}{KEY_SCHEMA_MAJOR}.{KEY_SCHEMA_MINOR}"
#: The data file inside an environment folder.
DATA_FILE = "data.mdb"
#: LMDB's lock file beside it: per-process state, never part of a copy.
LOCK_FILE = "lock.mdb"


def sample_key(index: int) -> bytes:
    """The LMDB key of record ``index``."""
    return b"%010d" % index


def metadata_key(index: int) -> bytes:
    """The LMDB key of record ``index``'s metadata."""
    return b"%010d.json" % index


def piece_key(column: str, piece: int) -> bytes:
    """The LMDB key of piece ``piece`` of column ``column`` (``"__labels__"``)."""
    return b"%s/%010d" % (column.encode(), piece)

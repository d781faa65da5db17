"""The LMDB key schema, shared by the writer and the reader.

Layout: ``out.lmdb/`` is an ordinary LMDB environment folder (``data.mdb``,
``lock.mdb``) with one unnamed database holding

==================  ==========================================================
key (ASCII)         value
==================  ==========================================================
``0000000000`` ...  record i's payload (the original file bytes by default);
                    the key is i as 10 zero-padded decimal digits
``__labels__``      int64 little-endian array of the N labels
``__crc32__``       uint32 little-endian array of the N payload CRC32s (zlib)
``__keys__``        JSON list of the N source keys (relative paths), UTF-8
``__manifest__``    the manifest, JSON, UTF-8 (written last)
==================  ==========================================================

and, only in a dataset whose records carry metadata (the manifest's
``extra["metadata"]`` says so):

==========================  ==================================================
``0000000000.json`` ...     record i's metadata, canonical UTF-8 JSON (a
                            record without metadata has no such key)
``__metadata_crc32__``      uint32 little-endian array of the N metadata
                            CRC32s (zlib; 0 for a record without metadata)
==========================  ==================================================

Sample keys sort before the ``__`` keys, so a cursor walks records in order
(a record's metadata key right after its payload's).
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
KEY_SCHEMA = "fastdata-lmdb-1"
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

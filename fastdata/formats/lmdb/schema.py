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

Sample keys sort before the ``__`` keys, so a cursor walks records in order.
"""

from __future__ import annotations

SAMPLE_KEY_FORMAT = "{:010d}"
LABELS_KEY = b"__labels__"
CRC32_KEY = b"__crc32__"
KEYS_KEY = b"__keys__"
MANIFEST_KEY = b"__manifest__"
LABEL_DTYPE = "<i8"
CRC32_DTYPE = "<u4"
KEY_SCHEMA = "fastdata-lmdb-1"
#: The data file inside an environment folder.
DATA_FILE = "data.mdb"


def sample_key(index: int) -> bytes:
    """The LMDB key of record ``index``."""
    return b"%010d" % index

"""The HDF5 schema, shared by the writer and the reader.

Layout: ``out.h5`` is one HDF5 file whose root group holds

==============  =========================  =========================================
name            type, shape                content
==============  =========================  =========================================
``payload``     uint8, (P,)                every record's payload, concatenated in
                                           record order (P = total payload bytes)
``offsets``     int64 LE, (N+1,)           record i is ``payload[offsets[i]:offsets[i+1]]``;
                                           ``offsets[0] == 0``, ``offsets[N] == P``
``labels``      int64 LE, (N,)             class index of each record
``crc32``       uint32 LE, (N,)            zlib CRC32 of each record's payload
``keys``        vlen UTF-8 string, (N,)    source key (relative path) of each record
``manifest``    fixed-length UTF-8         the manifest JSON (padded with trailing
                string, scalar             spaces), written last
==============  =========================  =========================================

In a dataset whose records carry metadata (the manifest's ``extra["metadata"]``
names these), also

======================  ==============  ======================================
``metadata``            uint8, (M,)     every record's metadata JSON (canonical
                                        UTF-8), concatenated in record order
``metadata_offsets``    int64 LE,       record i's metadata is
                        (N+1,)          ``metadata[metadata_offsets[i]:metadata_offsets[i+1]]``;
                                        empty for a record without
``metadata_crc32``      uint32 LE, (N,) zlib CRC32 of each record's metadata
                                        JSON (0 for a record without)
======================  ==============  ======================================

and the root attribute ``fastdata_schema`` (``"fastdata-hdf5-1"``). The manifest
is a dataset, not an attribute: attributes in compact storage are limited to
64 KiB, which the class list of a large dataset can exceed.

One flat byte array plus offsets, rather than one variable-length array per
sample, lets a batch be read with one HDF5 call over a few contiguous ranges
instead of one call per sample (see ``bench/hdf5_read.py``). The payload
is chunked (``chunk_bytes``, 1 MiB by default) so it can grow while packing in
one pass, with no second copy of the data on disk; a payload that fits in the
first write buffer (``FLUSH_BYTES``) is stored contiguous, at its exact size.
"""

from __future__ import annotations

#: Schema name and version, stored in the ``fastdata_schema`` root attribute.
SCHEMA = "fastdata-hdf5-1"
SCHEMA_PREFIX = "fastdata-hdf5-"
SCHEMA_VERSION = 1
SCHEMA_ATTR = "fastdata_schema"

PAYLOAD = "payload"
OFFSETS = "offsets"
LABELS = "labels"
CRC32 = "crc32"
KEYS = "keys"
MANIFEST = "manifest"
METADATA = "metadata"
METADATA_OFFSETS = "metadata_offsets"
METADATA_CRC32 = "metadata_crc32"

PAYLOAD_DTYPE = "u1"
OFFSET_DTYPE = "<i8"
LABEL_DTYPE = "<i8"
CRC32_DTYPE = "<u4"
KEY_ENCODING = "utf-8"

DEFAULT_CHUNK_BYTES = 1 << 20
#: Payload bytes gathered in memory before one write to the file.
FLUSH_BYTES = 8 << 20
#: Room left in the manifest dataset for the digits of ``bytes.on_disk``,
#: which is only known once everything else is written.
SIZE_DIGITS = 20

#: The first 8 bytes of every HDF5 file (without a user block).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"

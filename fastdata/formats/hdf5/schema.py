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

Schema 1.1 (the manifest's ``extra["schema"]``; the attribute keeps the
major version, which is what a reader must understand) adds, for each of
``offsets``, ``labels``, ``crc32``, ``metadata_offsets`` and
``metadata_crc32`` present, a dataset ``NAME_pieces``: uint32 LE, the zlib
CRC-32 of each piece of the column's values as stored (values 0-127,
128-255, ...; the manifest's ``extra["column_pieces"]`` gives the values
per piece and names them). A reader checks the pieces it reads, never a
whole column on open; the columns are contiguous datasets, so it reads a
piece with one ``pread`` of the file. Schema 1 files have no pieces: their columns are
read and checked whole by their SHA-256 on open.

One flat byte array plus offsets, rather than one variable-length array per
sample, lets a batch be read with one HDF5 call over a few contiguous ranges
instead of one call per sample (see ``bench/hdf5_read.py``). The payload
is chunked (``chunk_bytes``, 1 MiB by default) so it can grow while packing in
one pass, with no second copy of the data on disk; a payload that fits in the
first write buffer (``FLUSH_BYTES``) is stored contiguous, at its exact size.
"""

from __future__ import annotations

#: Schema name and major version, stored in the ``fastdata_schema`` root attribute.
SCHEMA = "fastdata-hdf5-1"
SCHEMA_PREFIX = "fastdata-hdf5-"
SCHEMA_VERSION = 1
SCHEMA_ATTR = "fastdata_schema"
#: The minor version this fastdata writes: 1 adds the columns' piece checksums.
SCHEMA_MINOR = 1
#: The full version (major.minor), in the manifest's ``extra["schema"]``.
SCHEMA_FULL = f"{SCHEMA}.{SCHEMA_MINOR}"

PAYLOAD = "payload"
OFFSETS = "offsets"
LABELS = "labels"
CRC32 = "crc32"
KEYS = "keys"
MANIFEST = "manifest"
METADATA = "metadata"
METADATA_OFFSETS = "metadata_offsets"
METADATA_CRC32 = "metadata_crc32"
#: Each column checked by piece (from 1.1 on), and the dataset of its pieces' CRC-32s.
PIECES = {name: f"{name}_pieces"
          for name in (OFFSETS, LABELS, CRC32, METADATA_OFFSETS, METADATA_CRC32)}

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

"""Container formats: one folder per format, and the registry that lists them.

``fastdata.formats.<name>`` holds everything about one format (its on-disk
schema, writer and reader); ``registry`` is where the formats are listed and
found. Importing this package imports no format library (lmdb, h5py, ...):
each format's ``__init__`` only declares its :class:`FormatSpec` (with the
writer options it offers on the command line).
"""

from __future__ import annotations

from fastdata.formats import hdf5, lmdb, tar, tfrecord
from fastdata.formats.registry import (
    FORMATS,
    MANIFEST_SUFFIX,
    FormatSpec,
    WriterOption,
    check_local,
    detect_format,
    format_for_output,
    get_format,
    known_extensions,
    open_reader,
    read_manifest,
    register_format,
    sharded_formats,
    unregister_format,
    writer_options,
)

for _spec in (lmdb.SPEC, hdf5.SPEC, tfrecord.SPEC, tar.SPEC):
    register_format(_spec)
del _spec

__all__ = [
    "FORMATS", "MANIFEST_SUFFIX", "FormatSpec", "WriterOption", "check_local", "detect_format",
    "format_for_output", "get_format", "known_extensions", "open_reader", "read_manifest",
    "register_format", "sharded_formats", "unregister_format", "writer_options",
]

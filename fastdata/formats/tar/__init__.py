"""Tar: webdataset-style tar shards (KEY.jpg + KEY.cls); streamable, read by webdataset."""

from __future__ import annotations

from fastdata.formats.registry import FormatSpec
from fastdata.formats.tar.schema import EXTENSIONS

SPEC = FormatSpec(
    name="tar",
    extensions=EXTENSIONS,
    writer="fastdata.formats.tar.writer:TarWriter",
    reader="fastdata.formats.tar.reader:TarReader",
    help="webdataset-style tar shards (KEY.jpg + KEY.cls); streamable, webdataset readable",
    sharded=True,
)

"""LMDB: one environment folder (``out.lmdb/``), random access, readable with plain ``lmdb``."""

from __future__ import annotations

import os

from fastdata.formats.lmdb.schema import DATA_FILE
from fastdata.formats.registry import FormatSpec


def _probe(path: str) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, DATA_FILE))


SPEC = FormatSpec(
    name="lmdb",
    extensions=(".lmdb",),
    writer="fastdata.formats.lmdb.writer:LMDBWriter",
    reader="fastdata.formats.lmdb.reader:LMDBReader",
    help="LMDB key-value store (a folder); random access, fastest small reads",
    probe=_probe,
)

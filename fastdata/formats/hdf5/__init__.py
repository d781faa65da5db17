"""HDF5: one file (``out.h5``) of flat payload bytes plus offsets; random access, plain h5py."""

from __future__ import annotations

import os

from fastdata.formats.hdf5.schema import HDF5_SIGNATURE
from fastdata.formats.registry import FormatSpec


def _probe(path: str) -> bool:
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
    except OSError:
        return False


SPEC = FormatSpec(
    name="hdf5",
    extensions=(".h5", ".hdf5"),
    writer="fastdata.formats.hdf5.writer:HDF5Writer",
    reader="fastdata.formats.hdf5.reader:HDF5Reader",
    help="one HDF5 file (flat byte array + offsets); random access, readable with h5py",
    probe=_probe,
)

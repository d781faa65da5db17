"""An HDF5 file may store a dataset's bytes in other files: an external link
to another file, external raw storage (``H5Pset_external``: the bytes of any
file, ``/etc/passwd`` included, read as the dataset) or a virtual dataset
mapping other files. h5py follows all three without a word. A fastdata HDF5
file never uses them, so the datasets the reader opens are checked to be
stored inside the file before any is opened (no torch here).
"""

from __future__ import annotations

from fastdata.errors import UnsafeNameError
from fastdata.formats.hdf5.schema import (
    CRC32,
    KEYS,
    LABELS,
    MANIFEST,
    METADATA,
    METADATA_CRC32,
    METADATA_OFFSETS,
    OFFSETS,
    PAYLOAD,
    PIECES,
)

#: The root datasets a reader opens.
READ_DATASETS = (MANIFEST, PAYLOAD, OFFSETS, LABELS, CRC32, KEYS, METADATA, METADATA_OFFSETS,
                 METADATA_CRC32, *PIECES.values())
_FIX = "fastdata reads only data stored inside the dataset's own file; re-pack it"


def check_stored_inside(file, path: str) -> None:
    """Refuse a file whose datasets (those fastdata reads) live in other files.

    Raises:
        UnsafeNameError: an external or soft link, external raw storage or a
            virtual dataset; the message names the dataset.
    """
    import h5py

    for name in READ_DATASETS:
        encoded = name.encode()
        if not file.id.links.exists(encoded):
            continue
        kind = file.id.links.get_info(encoded).type
        if kind != h5py.h5l.TYPE_HARD:
            what = {h5py.h5l.TYPE_SOFT: "a soft link",
                    h5py.h5l.TYPE_EXTERNAL: "an external link to another file"}.get(
                        kind, "a user-defined link")
            raise UnsafeNameError(f"dataset {name!r} is {what}; {_FIX}", path=path, key=name)
        try:
            obj = h5py.h5o.open(file.id, encoded)
            plist = obj.get_create_plist() if isinstance(obj, h5py.h5d.DatasetID) else None
        except (OSError, KeyError, RuntimeError, ValueError):
            continue  # damaged: the reader reports it where the dataset is used
        if plist is None:
            continue  # a group: the reader's own checks refuse it
        if plist.get_layout() == h5py.h5d.VIRTUAL:
            raise UnsafeNameError(f"dataset {name!r} is a virtual dataset mapping other "
                                  f"files; {_FIX}", path=path, key=name)
        if plist.get_external_count():
            target = plist.get_external(0)[0].decode("utf-8", "replace")
            raise UnsafeNameError(f"dataset {name!r} stores its bytes in another file "
                                  f"({target!r}); {_FIX}", path=path, key=name)

"""``fastdata verify``: check a dataset as it is now (its current version,
a version or a view) against every checksum it holds (no torch): each
part's records and files (see :mod:`fastdata.formats.verify`) and the
joined column files."""

from __future__ import annotations

import os

from fastdata.formats.verify import VerifyResult


def verify_dataset(path: str | os.PathLike, *, decode: bool = False,
                   progress: bool | None = None, allow_outside: bool = False,
                   version: int | None = None) -> VerifyResult:
    """Check every record of ``path`` and every file its manifest covers.

    Args:
        path: a packed dataset, a version record or a view file (or a
            ``fastdata.DatasetRef``).
        decode: also decode every image (JPEGs strictly: a JPEG that decodes
            only with libjpeg's corrupt-data warning is reported as damaged).
        progress: show a progress bar (None: only on a terminal).
        allow_outside: follow links that lead out of the dataset's folder (see
            :class:`fastdata.formats.reader.Reader`).
        version: check this version (None: the current one).

    Returns:
        The result; damaged records and files are listed, not raised.

    Raises:
        CorruptDataError: the dataset cannot be opened (a per-record array
            fails its SHA-256, a label is not a class index, a file is
            truncated).
    """
    from fastdata.dataset.resolve import open_reader
    from fastdata.formats.verify import verify_reader

    reader = open_reader(path, verify=True, allow_outside=allow_outside, version=version)
    return verify_reader(reader, decode=decode, progress=progress)

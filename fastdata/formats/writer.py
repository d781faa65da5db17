"""The base of every container writer: record bookkeeping and atomic publishing.

A writer writes into a temporary sibling of the output (``.NAME.partial-XXXX``)
and renames it into place only after the manifest is written, so an
interrupted pack never leaves something that looks like a complete dataset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import zlib

from fastdata.errors import OutputExistsError
from fastdata.records import Manifest, Record


class Writer:
    """Base class for container writers.

    Subclasses implement ``_open``, ``_write`` and ``_close``; callers use
    ``write`` for each record, then ``finish`` with the manifest (or ``abort``).

    Args:
        path: the final output path.
        overwrite: replace an existing output instead of refusing.
        **options: format options (for example ``shard_size``); unknown ones are
            an error in the subclass.
    """

    format_name = ""
    #: Whether the output is a folder (True) or a single file (False).
    output_is_dir = False

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.overwrite = overwrite
        if os.path.lexists(self.path) and not overwrite:
            raise OutputExistsError("output already exists; pass overwrite=True to replace it",
                                    path=self.path)
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        base = os.path.basename(self.path)
        if self.output_is_dir:
            self.temp_path = tempfile.mkdtemp(prefix=f".{base}.partial-", dir=parent)
        else:
            fd, self.temp_path = tempfile.mkstemp(prefix=f".{base}.partial-", dir=parent)
            os.close(fd)
        # mkdtemp/mkstemp create owner-only entries; give the output the
        # permissions any new file would get under the user's umask.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.temp_path, (0o777 if self.output_is_dir else 0o666) & ~umask)
        self.count = 0
        self.keys: list[str] = []
        self.labels: list[int] = []
        self.crcs: list[int] = []
        self.payload_bytes = 0
        self._sha = hashlib.sha256()
        self._done = False
        try:
            self._open(self.temp_path)
        except BaseException:
            remove_path(self.temp_path)  # nothing half-made stays behind
            raise

    # -- subclass hooks -------------------------------------------------------

    def _open(self, temp_path: str) -> None:
        raise NotImplementedError

    def _write(self, record: Record, crc: int) -> None:
        raise NotImplementedError

    def _close(self, manifest: Manifest) -> Manifest:
        """Store the manifest, close files, and return the manifest with the
        format's ``shards``/``extra``/on-disk figures filled in."""
        raise NotImplementedError

    def _discard(self) -> None:
        """Release handles after a failure (files are removed by the base)."""

    # -- public API -----------------------------------------------------------

    def write(self, record: Record) -> None:
        """Append one record. Records must come with dense indices 0, 1, 2, ..."""
        if record.index != self.count:
            raise ValueError(f"record index {record.index} out of order (expected {self.count})")
        crc = zlib.crc32(record.payload)
        self._sha.update(record.payload)
        self._write(record, crc)
        self.keys.append(record.key)
        self.labels.append(record.label)
        self.crcs.append(crc)
        self.payload_bytes += len(record.payload)
        self.count += 1

    @property
    def payload_sha256(self) -> str:
        return self._sha.hexdigest()

    def finish(self, manifest: Manifest) -> Manifest:
        """Write the manifest, close, and move the output into place atomically."""
        manifest = dataclasses.replace(
            manifest,
            checksums={"record": "crc32", "payload_sha256": self.payload_sha256},
        )
        manifest = self._close(manifest)
        self._publish()
        self._done = True
        return manifest

    def abort(self) -> None:
        """Drop everything written so far. Safe to call more than once."""
        if self._done:
            return
        self._done = True
        try:
            self._discard()
        finally:
            remove_path(self.temp_path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False

    def _publish(self) -> None:
        if os.path.lexists(self.path):
            if not self.overwrite:
                raise OutputExistsError("output appeared while packing; nothing was replaced",
                                        path=self.path)
            # Move the old output aside first so the new one lands in one rename.
            trash = f"{self.temp_path}.old"
            os.replace(self.path, trash)
            os.replace(self.temp_path, self.path)
            remove_path(trash)
        else:
            os.replace(self.temp_path, self.path)


def remove_path(path: str) -> None:
    """Remove a file, link or folder tree if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)

"""A tiny container format registered from the test suite, to prove that a new
format is one folder's worth of code plus one registry entry: the contract tests
then run over it like over the built-in formats.

Layout: ``out.toyfmt/`` holds ``payload.bin`` (every payload, concatenated),
``meta.json`` (offsets, labels, CRC32s and keys) and ``manifest.json``, written
last. No torch, no third-party library.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from fastdata.errors import CorruptDataError, ManifestError
from fastdata.formats import FormatSpec, register_format
from fastdata.formats.reader import Reader
from fastdata.formats.writer import Writer

PAYLOAD = "payload.bin"
META = "meta.json"
MANIFEST = "manifest.json"


class ToyWriter(Writer):
    format_name = "toy"
    output_is_dir = True

    def _open(self, temp_path: str) -> None:
        self._file = open(os.path.join(temp_path, PAYLOAD), "wb")
        self._offsets = [0]

    def _write(self, record, crc: int) -> None:
        self._file.write(record.payload)
        self._offsets.append(self._offsets[-1] + len(record.payload))

    def _close(self, manifest):
        self._file.close()
        meta = {"offsets": self._offsets, "labels": self.labels, "crc32": self.crcs,
                "keys": self.keys}
        with open(os.path.join(self.temp_path, META), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        size = os.path.getsize(os.path.join(self.temp_path, PAYLOAD))
        manifest = dataclasses.replace(
            manifest, bytes=dict(manifest.bytes, on_disk=size),
            shards=[{"path": PAYLOAD, "count": manifest.count, "bytes": size}])
        with open(os.path.join(self.temp_path, MANIFEST), "w", encoding="utf-8") as f:
            f.write(manifest.to_json())
        return manifest

    def _discard(self) -> None:
        self._file.close()


class ToyReader(Reader):
    format_name = "toy"

    def _load_metadata(self) -> None:
        try:
            with open(os.path.join(self.path, MANIFEST), "rb") as f:
                manifest = self._accept_manifest(f.read(), self.path)
            with open(os.path.join(self.path, META), encoding="utf-8") as f:
                meta = json.load(f)
        except OSError as exc:
            raise ManifestError(f"not a toy dataset ({exc.strerror})", path=self.path) from None
        offsets = np.asarray(meta["offsets"], dtype=np.int64)
        size = os.path.getsize(os.path.join(self.path, PAYLOAD))
        if size < offsets[-1]:
            raise CorruptDataError(f"payload is truncated ({size} of {offsets[-1]} bytes)",
                                   path=os.path.join(self.path, PAYLOAD))
        self._manifest = manifest
        self._offsets = offsets
        self._labels = np.asarray(meta["labels"], dtype=np.int64)
        self._crcs = np.asarray(meta["crc32"], dtype=np.uint32)
        self._stored_keys = meta["keys"]

    def _load_keys(self):
        if getattr(self, "_stored_keys", None) is None:
            self._load_metadata()
        return self._stored_keys

    def _open_handle(self):
        return os.open(os.path.join(self.path, PAYLOAD), os.O_RDONLY)

    def _release_handle(self, handle) -> None:
        os.close(handle)

    def _read_many(self, indices):
        if self._labels is None:
            self._load_metadata()
        fd = self._process_handle()
        out = []
        for i in indices:
            a, b = int(self._offsets[i]), int(self._offsets[i + 1])
            data = os.pread(fd, b - a, a)
            if len(data) != b - a:
                raise CorruptDataError(f"record {i} is cut short", path=self.path, offset=a)
            out.append(data)
        return out

    def __getstate__(self):
        state = super().__getstate__()
        state.update(_offsets=None, _stored_keys=None)
        return state


SPEC = FormatSpec(
    name="toy",
    extensions=(".toyfmt",),
    writer="toyformat:ToyWriter",
    reader="toyformat:ToyReader",
    help="a folder of concatenated payloads (registered by the test suite)",
)


def register() -> FormatSpec:
    """Register the toy format (idempotent)."""
    return register_format(SPEC)

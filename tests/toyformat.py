"""A tiny container format registered from the test suite, to prove that a new
format is one folder's worth of code plus one registry entry: the contract tests
then run over it like over the built-in formats, ``fastdata pack --help`` lists
its writer option (``--align``), and a pack to a URL uploads it as its writer
says (test_contract's toy tests).

Layout: ``out.toyfmt/`` holds ``payload.bin`` (every payload, each starting at
a multiple of ``align`` bytes, zeros between), ``meta.json`` (where each payload
starts and ends, labels, CRC32s and keys) and ``manifest.json``, written last.
No third-party library; its named Dataset class is registered with the torch
layer by :func:`register`, and DALI reads it through fastdata's reader (the
external source), as it reads LMDB and HDF5.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from fastdata.errors import CorruptDataError, FastDataError, ManifestError
from fastdata.formats import FormatSpec, WriterOption, register_format
from fastdata.formats.reader import Reader
from fastdata.formats.writer import UploadStep, Writer
from fastdata.loaders.datasets import PackedDataset, register_dataset

PAYLOAD = "payload.bin"
META = "meta.json"
MANIFEST = "manifest.json"


class ToyWriter(Writer):
    """Args (besides the base's): align: each payload starts at a multiple of
    this many bytes."""

    format_name = "toy"
    output_is_dir = True

    def __init__(self, path, *, overwrite: bool = False, align: int = 1,
                 resume_path: str | None = None, detached_dir: str | None = None) -> None:
        if isinstance(align, bool) or not isinstance(align, int) or align < 1:
            raise FastDataError(f"align={align!r}: give a whole number of bytes >= 1")
        self.align = align
        super().__init__(path, overwrite=overwrite, resume_path=resume_path,
                         detached_dir=detached_dir)

    def _open(self, temp_path: str) -> None:
        self._file = open(os.path.join(temp_path, PAYLOAD), "wb")
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._position = 0

    def _write(self, record, crc: int) -> None:
        gap = -self._position % self.align
        self._file.write(bytes(gap))
        self._file.write(record.payload)
        self._starts.append(self._position + gap)
        self._position += gap + len(record.payload)
        self._ends.append(self._position)

    def _close(self, manifest):
        self._file.close()
        facts = self.facts()
        meta = {"starts": self._starts, "ends": self._ends, "labels": facts["label"].tolist(),
                "crc32": facts["crc32"].tolist(), "keys": self.keys()}
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

    # -- a pack to a URL: the folder is three objects, the manifest says a
    # dataset is there and goes up last ---------------------------------------

    @classmethod
    def remote_marker(cls, url: str) -> str:
        from fastdata.storage import join

        return join(url.rstrip("/"), MANIFEST)

    @classmethod
    def remote_files(cls, url: str) -> list[str]:
        from fastdata.storage import join

        return [join(url.rstrip("/"), name) for name in (PAYLOAD, META, MANIFEST)]

    @classmethod
    def upload_step(cls, name: str) -> UploadStep | None:
        return {MANIFEST: UploadStep.LAST, META: UploadStep.NAMES_DATA}.get(
            name.rsplit("/", 1)[-1])


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
        starts = np.asarray(meta["starts"], dtype=np.int64)
        ends = np.asarray(meta["ends"], dtype=np.int64)
        end = int(ends[-1]) if len(ends) else 0
        size = os.path.getsize(os.path.join(self.path, PAYLOAD))
        if size < end:
            raise CorruptDataError(f"payload is truncated ({size} of {end} bytes)",
                                   path=os.path.join(self.path, PAYLOAD))
        self._manifest = manifest
        self._starts, self._ends = starts, ends
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
            a, b = int(self._starts[i]), int(self._ends[i])
            data = os.pread(fd, b - a, a)
            if len(data) != b - a:
                raise CorruptDataError(f"record {i} is cut short", path=self.path, offset=a)
            out.append(data)
        return out

    def __getstate__(self):
        state = super().__getstate__()
        state.update(_starts=None, _ends=None, _stored_keys=None)
        return state


class ToyDataset(PackedDataset):
    """Map-style Dataset over a toy dataset (what ``open_dataset`` gives for one)."""

    reader_class = ToyReader


SPEC = FormatSpec(
    name="toy",
    extensions=(".toyfmt",),
    writer="toyformat:ToyWriter",
    reader="toyformat:ToyReader",
    help="a folder of concatenated payloads (registered by the test suite)",
    options=(WriterOption("align", type=int, metavar="N",
                          help="start each payload at a multiple of N bytes [default: 1]"),),
)


def register() -> FormatSpec:
    """Register the toy format and its Dataset class (idempotent)."""
    register_dataset(SPEC.name, ToyDataset)
    return register_format(SPEC)

"""The format registry: which container formats exist and where their code lives.

Adding a format is one packer module (a Writer), one loader module (a Reader),
a Dataset class and one line here; the contract tests pick it up from this list.
Everything is referenced by import path, so nothing heavy is imported until a
format is used.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from fastdata.errors import UnknownFormatError


@dataclass(frozen=True)
class FormatSpec:
    """One container format.

    Attributes:
        name: the name used by ``--format`` and in manifests.
        extensions: output extensions (lower case, with dot) that select it.
        writer: "module:Class" of its Writer.
        reader: "module:Class" of its Reader.
        dataset: "module:Class" of its torch Dataset.
        description: one line for ``--help``.
    """

    name: str
    extensions: tuple[str, ...]
    writer: str
    reader: str
    dataset: str
    description: str

    def load_writer(self):
        return _load(self.writer)

    def load_reader(self):
        return _load(self.reader)

    def load_dataset(self):
        return _load(self.dataset)


FORMATS: dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec(
            "lmdb", (".lmdb",),
            "fastdata.packers.lmdb_packer:LMDBWriter",
            "fastdata.loaders.lmdb_loader:LMDBReader",
            "fastdata.loaders.datasets:LMDBDataset",
            "LMDB key-value store (a folder); random access, fastest small reads",
        ),
        FormatSpec(
            "hdf5", (".h5", ".hdf5"),
            "fastdata.packers.hdf5_packer:HDF5Writer",
            "fastdata.loaders.hdf5_loader:HDF5Reader",
            "fastdata.loaders.datasets:HDF5Dataset",
            "one HDF5 file (flat byte array + offsets); random access, readable with h5py",
        ),
        FormatSpec(
            "tfrecord", (".tfrecord", ".tfrecords"),
            "fastdata.packers.tfrecord_packer:TFRecordWriter",
            "fastdata.loaders.tfrecord_loader:TFRecordReader",
            "fastdata.loaders.datasets:TFRecordDataset",
            "TFRecord shards of tf.train.Example with index files; TensorFlow/DALI readable",
        ),
        FormatSpec(
            "tar", (".tar",),
            "fastdata.packers.tar_packer:TarWriter",
            "fastdata.loaders.tar_loader:TarReader",
            "fastdata.loaders.datasets:TarDataset",
            "webdataset-style tar shards (KEY.jpg + KEY.cls); streamable, webdataset readable",
        ),
    )
}


def _load(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def known_extensions() -> list[str]:
    """Every output extension that selects a format."""
    return [ext for spec in FORMATS.values() for ext in spec.extensions]


def get_format(name: str) -> FormatSpec:
    """The spec of format ``name``.

    Raises:
        UnknownFormatError: no such format.
    """
    try:
        return FORMATS[name.lower()]
    except KeyError:
        raise UnknownFormatError(
            f"unknown format {name!r}; choose one of: {', '.join(FORMATS)}") from None


def format_for_output(path: str | os.PathLike, override: str | None = None) -> FormatSpec:
    """Choose the format for writing ``path``: ``override`` if given, else its extension.

    Raises:
        UnknownFormatError: the extension selects no format and none was given.
    """
    if override:
        return get_format(override)
    lower = os.fspath(path).rstrip("/\\").lower()
    for spec in FORMATS.values():
        if lower.endswith(spec.extensions):
            return spec
    raise UnknownFormatError(
        f"cannot tell the format from the extension; use one of "
        f"{', '.join(known_extensions())} or pass --format ({'/'.join(FORMATS)})",
        path=path)


def detect_format(path: str | os.PathLike) -> FormatSpec:
    """Find the format of an existing packed dataset at ``path``.

    The extension decides when it is a known one; otherwise the files are probed.

    Raises:
        UnknownFormatError: nothing at ``path`` looks like a fastdata dataset.
    """
    if isinstance(path, (list, tuple)):  # a list of shard files
        path = path[0]
    path = os.fspath(path)
    lower = path.rstrip("/\\").lower()
    if lower.endswith(".fastdata.json"):
        return _format_from_manifest(path)
    for spec in FORMATS.values():
        if lower.endswith(spec.extensions):
            return spec
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "data.mdb")):
        return FORMATS["lmdb"]
    if not os.path.exists(path):
        raise UnknownFormatError("no such file or folder", path=path)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            head = f.read(8)
        if head == b"\x89HDF\r\n\x1a\n":
            return FORMATS["hdf5"]
    raise UnknownFormatError(
        f"not a recognised fastdata dataset; known extensions: {', '.join(known_extensions())}",
        path=path)


def _format_from_manifest(path: str) -> FormatSpec:
    import json

    try:
        with open(path, encoding="utf-8") as f:
            name = json.load(f).get("format", "")
    except (OSError, ValueError, AttributeError) as exc:
        raise UnknownFormatError(f"cannot read manifest ({exc})", path=path) from None
    return get_format(name)

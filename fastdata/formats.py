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
    path = os.fspath(path)
    lower = path.rstrip("/\\").lower()
    for spec in FORMATS.values():
        if lower.endswith(spec.extensions):
            return spec
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "data.mdb")):
        return FORMATS["lmdb"]
    if not os.path.exists(path):
        raise UnknownFormatError("no such file or folder", path=path)
    raise UnknownFormatError(
        f"not a recognised fastdata dataset; known extensions: {', '.join(known_extensions())}",
        path=path)

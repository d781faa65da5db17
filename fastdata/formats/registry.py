"""The format registry: which container formats exist, and what the rest of
fastdata needs to know about each.

A format is one folder under ``fastdata/formats/`` and one :class:`FormatSpec`
passed to :func:`register_format`. The spec holds the format's name, output
extensions, writer and reader, one line of help, whether it is sharded, a
probe for paths without a known extension, and the writer options it offers on
the command line. The CLI's ``--format`` choices and help and its writer
options, ``pack``'s check that ``--shard-size`` applies, :func:`detect_format`,
``open_dataset`` and the DALI pipelines read it. What else is the format's own
lives in its folder: a pack to a URL asks the writer (``Writer.remote_marker``
and the other upload hooks, ``fastdata.formats.writer``). The layers above keep
their own tables, so a spec names none of them: a named torch Dataset class is
registered with ``fastdata.loaders.datasets.register_dataset``, a native DALI
reader with ``fastdata.dali.readers.register_dali_reader``. Code is referenced
by ``"module:attribute"`` strings, so nothing heavy (lmdb, h5py, torch) is
imported until a format is used.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastdata.errors import FastDataError, ManifestError, UnknownFormatError
from fastdata.formats.remote_files import as_local, is_remote, manifest_bytes, peek_manifest
from fastdata.lazy import load

#: Suffix of the manifest sidecar of sharded datasets (``NAME.fastdata.json``, NAME the
#: output name without shard number: ``out.tar.fastdata.json``).
MANIFEST_SUFFIX = ".fastdata.json"

_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class WriterOption:
    """A keyword option of a format's writer that ``fastdata pack`` and
    ``fastdata convert`` offer as ``--NAME`` (underscores as dashes: ``split``
    is ``--split``, ``source_extensions`` ``--source-extensions``). Only a value
    given on the command line reaches the writer (as
    ``PackOptions.writer_options``); the writer's own default applies otherwise.

    Attributes:
        name: the writer's keyword: lower case letters, digits and underscores.
        help: what it does, for ``--help`` (which formats have it is added there).
        type: ``bool`` for a flag; ``str``, ``int`` or ``float`` for an option
            taking a value.
        metavar: how ``--help`` shows the value (``NAME``, ``N``).
    """

    name: str
    help: str
    type: type = str
    metavar: str | None = None

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.name):
            raise ValueError(f"writer option {self.name!r}: a name is lower case letters, "
                             f"digits and underscores, starting with a letter")
        if self.type not in (bool, str, int, float):
            raise ValueError(f"writer option {self.name!r}: type is bool, str, int or float, "
                             f"not {self.type!r}")

    @property
    def flag(self) -> str:
        """The option on the command line (``--source-extensions``)."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class FormatSpec:
    """One container format.

    Attributes:
        name: the name used by ``--format`` and in manifests.
        extensions: output extensions (lower case, with dot) that select it;
            the first is the one added when a name has none.
        writer: ``"module:Class"`` of its Writer (a ``fastdata.formats.writer.Writer``).
        reader: ``"module:Class"`` of its Reader (a ``fastdata.formats.reader.Reader``).
        help: one line for ``--help`` and error messages.
        sharded: its data are shard files with sidecars (``--shard-size`` applies,
            ``ShardedIterableDataset`` streams it).
        probe: ``probe(path) -> bool``, True when an existing path without a
            known extension holds a dataset of this format; must stay cheap and
            import nothing heavy.
        options: the writer options ``fastdata pack`` and ``fastdata convert``
            offer for it (:class:`WriterOption`), each a keyword of its writer.
    """

    name: str
    extensions: tuple[str, ...]
    writer: str
    reader: str
    help: str
    sharded: bool = False
    probe: Callable[[str], bool] | None = None
    options: tuple[WriterOption, ...] = ()

    def load_writer(self):
        return load(self.writer)

    def load_reader(self):
        return load(self.reader)


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def check_local(path) -> None:
    """Refuse a URL of a scheme fastdata cannot read or write (``ftp://...``):
    taken as a path it would quietly become a folder named ``ftp:``.

    Raises:
        FastDataError: ``path`` starts with an unsupported URL scheme.
    """
    text = os.fspath(path) if not isinstance(path, str) else path
    if isinstance(text, str) and _URL.match(text) and not is_remote(text) \
            and not text.startswith("file://"):
        scheme = text.split("://", 1)[0]
        raise FastDataError(
            f"{scheme}:// URLs are not supported: fastdata reads and writes local paths and "
            f"s3://, gs://, az:// URLs, and reads http(s)://; copy the data to one of those",
            path=text)


#: Registered formats by name, in registration order (the built-in ones first).
FORMATS: dict[str, FormatSpec] = {}


def register_format(spec: FormatSpec) -> FormatSpec:
    """Add ``spec`` to the registry (replacing a format of the same name).

    Raises:
        ValueError: an extension is already taken by another format, or a
            writer option of the same name as another format's takes another
            type (the command line has one ``--NAME`` for both).
    """
    for other in FORMATS.values():
        if other.name == spec.name:
            continue
        taken = set(other.extensions) & set(spec.extensions)
        if taken:
            raise ValueError(f"format {spec.name!r}: extension(s) {', '.join(sorted(taken))} "
                             f"already belong to format {other.name!r}")
        types = {option.name: option.type for option in other.options}
        for option in spec.options:
            if types.get(option.name, option.type) is not option.type:
                raise ValueError(f"format {spec.name!r}: writer option {option.name!r} "
                                 f"takes {option.type.__name__}, but format {other.name!r}'s "
                                 f"takes {types[option.name].__name__}")
    FORMATS[spec.name] = spec
    return spec


def unregister_format(name: str) -> None:
    """Remove a format added with :func:`register_format` (no error if absent)."""
    FORMATS.pop(name, None)


def known_extensions() -> list[str]:
    """Every output extension that selects a format."""
    return [ext for spec in FORMATS.values() for ext in spec.extensions]


def sharded_formats() -> list[str]:
    """Names of the formats written as shards."""
    return [spec.name for spec in FORMATS.values() if spec.sharded]


def writer_options() -> dict[str, list[tuple[FormatSpec, WriterOption]]]:
    """Every registered format's writer options by name, each with the formats
    that offer it, in registration order."""
    found: dict[str, list[tuple[FormatSpec, WriterOption]]] = {}
    for spec in FORMATS.values():
        for option in spec.options:
            found.setdefault(option.name, []).append((spec, option))
    return found


def get_format(name: str) -> FormatSpec:
    """The spec of format ``name``.

    Raises:
        UnknownFormatError: no such format.
    """
    try:
        return FORMATS[name.lower()]
    except KeyError:
        from difflib import get_close_matches

        close = get_close_matches(name.lower(), list(FORMATS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownFormatError(
            f"unknown format {name!r}; {hint}choose one of: {', '.join(FORMATS)}") from None


def format_for_output(path: str | os.PathLike, override: str | None = None) -> FormatSpec:
    """Choose the format for writing ``path``: its extension, or ``override``.

    An output named after a sharded dataset's manifest (``out.tar.fastdata.json``)
    counts with the name before ``.fastdata.json``. ``override`` applies to a name
    without a known extension; one that contradicts the extension is refused, so
    that a pack never writes a dataset its name does not open.

    Raises:
        UnknownFormatError: the extension selects no format and none was given,
            the extension selects another format than ``override``, or a
            manifest name is given for a format without manifest files.
    """
    check_local(path)
    name = os.fspath(path).rstrip("/\\")
    manifest = name.lower().endswith(MANIFEST_SUFFIX)
    if manifest:
        name = name[: -len(MANIFEST_SUFFIX)]
    implied = _by_extension(name)
    spec = get_format(override) if override else implied
    if spec is None:
        raise UnknownFormatError(
            f"cannot tell the format from the extension; use one of "
            f"{', '.join(known_extensions())} or name the format ({'/'.join(FORMATS)})",
            path=path)
    if implied is not None and implied.name != spec.name:
        ext = next(e for e in implied.extensions if name.lower().endswith(e))
        raise UnknownFormatError(
            f"the extension {ext} means the {implied.name} format, but format={spec.name} was "
            f"given: drop format={spec.name} to pack {implied.name}, or give an output name "
            f"ending in {' or '.join(spec.extensions)}", path=path)
    if manifest and not spec.sharded:
        raise UnknownFormatError(
            f"a .fastdata.json name is the manifest of a sharded dataset "
            f"({', '.join(sharded_formats())}); {spec.name} keeps its manifest inside: give "
            f"an output name ending in {' or '.join(spec.extensions)}", path=path)
    return spec


def manifest_format(path: str | os.PathLike) -> str | None:
    """The format a ``.fastdata.json`` manifest file names; None when it cannot be
    read as one (missing, unreadable, not a JSON object with a string ``format``)."""
    try:
        data = json.loads(manifest_bytes(path))
    except (OSError, ValueError, FastDataError):  # FastDataError: a remote one failed
        return None
    name = data.get("format") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def _by_extension(path: str) -> FormatSpec | None:
    lower = path.rstrip("/\\").lower()
    for spec in FORMATS.values():
        if lower.endswith(spec.extensions):
            return spec
    return None


def detect_format(path: str | os.PathLike | list | tuple) -> FormatSpec:
    """Find the format of an existing packed dataset at ``path``.

    A ``.fastdata.json`` manifest names its format; otherwise a known extension
    decides; otherwise each format's probe looks at the files.

    Raises:
        UnknownFormatError: nothing at ``path`` looks like a fastdata dataset.
    """
    if isinstance(path, (list, tuple)):  # a list of shard files
        if not path:
            raise UnknownFormatError("no shard files given (an empty list)")
        path = path[0]
    path = as_local(os.fspath(path))
    check_local(path)  # an unsupported scheme (ftp://...) is not a folder name either
    if path.rstrip("/\\").lower().endswith(MANIFEST_SUFFIX):
        return _format_from_manifest(path)
    spec = _by_extension(path)
    if spec is not None:
        return spec
    if is_remote(path):
        raise UnknownFormatError(
            f"no known extension: give the URL of the dataset's manifest (NAME.fastdata.json) "
            f"or of a file with one of {', '.join(known_extensions())}", path=path)
    if not os.path.exists(path):
        raise UnknownFormatError("no such file or folder", path=path)
    for spec in FORMATS.values():
        if spec.probe is not None and spec.probe(path):
            return spec
    if os.path.isdir(path):
        inside = sorted(n for n in os.listdir(path) if n.endswith(MANIFEST_SUFFIX))[:3]
        if inside:
            raise UnknownFormatError(
                f"a folder, not a dataset; it holds {', '.join(inside)}: open that "
                f"({os.path.join(path, inside[0])})", path=path)
        raise UnknownFormatError(
            f"a folder, not a packed dataset; pack it first (fastdata pack {path} "
            f"OUT.lmdb, or OUT.tar for shards), then open the output", path=path)
    raise UnknownFormatError(
        f"not a recognised fastdata dataset; known extensions: {', '.join(known_extensions())}",
        path=path)


#: The start of a manifest fastdata writes ("kind", then "format"), so a
#: manifest of 10^5 shards need not be parsed twice (here and by the reader).
_FORMAT_FIRST = re.compile(
    rb'\s*\{\s*(?:"kind"\s*:\s*"[a-z-]*"\s*,\s*)?"format"\s*:\s*"([a-z0-9_-]+)"\s*,')


def _format_from_manifest(path: str) -> FormatSpec:
    try:
        raw = peek_manifest(path)  # at a URL: the bytes a look a moment ago fetched
        first = _FORMAT_FIRST.match(raw[:256])
        name = first.group(1).decode() if first else json.loads(raw).get("format", "")
    except (OSError, ValueError, AttributeError) as exc:
        raise UnknownFormatError(f"cannot read manifest ({exc})", path=path) from None
    if not isinstance(name, str):
        raise ManifestError(f"manifest field 'format' must be a string, not {name!r}; re-pack "
                            f"the dataset or restore the manifest", path=path)
    return get_format(name)


def open_reader(path, *, verify: bool = True, allow_outside: bool = False,
                settings: Mapping[str, Any] | None = None):
    """Open the files of the packed dataset at ``path`` with the reader of its
    format (``settings``: that reader's own, by name; see ``Reader.open``),
    as they were packed. ``fastdata.open_reader`` reads a dataset as it is
    now: its current version, a view, or a version of your choice."""
    return detect_format(path).load_reader().open(path, verify=verify,
                                                  allow_outside=allow_outside, settings=settings)


def read_manifest(path, *, allow_outside: bool = False):
    """The manifest of the packed dataset at ``path``, as packed
    (``fastdata.read_manifest``: the dataset's current version's)."""
    with open_reader(path, allow_outside=allow_outside) as reader:
        return reader.manifest

"""Sharded datasets: shard naming, sidecar names and the dataset-level index layout.

A sharded dataset (tar, TFRecord) is a set of shard files plus sidecars next
to them, named after the output's NAME: the output name without its shard
number, extension included (``out.tar`` for ``out.tar``, ``out-%06d.tar`` and
``out-{000000..000009}.tar``; ``out.tfrecord`` for ``out.tfrecord``), so
datasets of two formats with one prefix never share a sidecar:

- ``NAME.fastdata.json``: the manifest, written last (its absence means the
  pack did not finish);
- ``NAME.fastdata.index.npy``: one row per record (shard number, byte offset
  and size of the payload inside the shard, label, CRC32), a NumPy structured
  array readable with ``np.load(path, allow_pickle=False)``; this is what gives
  random access into shards;
- ``NAME.fastdata.keys.json``: the source keys;
- ``NAME.fastdata.metadata.npy``: only when records carry metadata: rows of
  the index's dtype pointing at each record's metadata JSON inside its shard
  instead of its payload (size 0: the record has none; crc32: of the JSON);
- ``NAME.fastdata.index-crc.npy`` (and ``NAME.fastdata.metadata-crc.npy``):
  the CRC-32 of every piece of 128 rows of the index (of the metadata
  index), uint32, so a reader checks the rows it uses, a page at a time,
  without reading the whole index (``extra.index_pieces``);
- ``NAME.fastdata.keys-pieces.npy``: where each piece of 128 keys begins in
  the keys file and the CRC-32 of its bytes (a last row: where the list
  ends), so one record's key is read without the others
  (``extra.keys_pieces``).

Datasets packed with the earlier naming have sidecars named after the prefix
alone (``out.fastdata.json``): readers still find such a manifest when it is
of their format (:attr:`ShardLayout.legacy_manifest_path`), and an overwrite
replaces it with the current names (see ``publish.py``).

Output names: ``out.tar`` (one shard, or ``out-000000.tar``... when a shard
size is given), an explicit pattern ``out-%06d.tar``, or a brace pattern
``out-{000000..000009}.tar`` (its width is used; the real number of shards is
whatever the data needs and is listed in the manifest).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

import numpy as np

from fastdata.formats.remote_files import absolute
from fastdata.errors import FastDataError, ManifestError
from fastdata.formats.registry import MANIFEST_SUFFIX

INDEX_SUFFIX = ".fastdata.index.npy"
KEYS_SUFFIX = ".fastdata.keys.json"
METADATA_SUFFIX = ".fastdata.metadata.npy"
INDEX_PIECES_SUFFIX = ".fastdata.index-crc.npy"
METADATA_PIECES_SUFFIX = ".fastdata.metadata-crc.npy"
KEYS_PIECES_SUFFIX = ".fastdata.keys-pieces.npy"

INDEX_DTYPE = np.dtype([
    ("shard", "<u4"), ("offset", "<u8"), ("size", "<u8"), ("label", "<i8"), ("crc32", "<u4"),
])

_PRINTF = re.compile(r"%0?(\d*)d")
#: A shard number field of ``ShardLayout.pattern``.
_FIELD = re.compile(r"\{(?:index|total):\d*d\}")
BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


@dataclass(frozen=True)
class ShardLayout:
    """Where the files of a sharded dataset go.

    Attributes:
        directory: folder of the shards and sidecars.
        prefix: the output name without extension and shard number ("out").
        extension: shard file extension with dot (".tar").
        pattern: file name with one ``{index}`` (and optionally ``{total}``)
            placeholder, or None for a single unsharded file.
        sidecar_stem: what the sidecar names start with: ``prefix + extension``
            ("out.tar"), or, for a layout read from a manifest path, whatever
            comes before its ``.fastdata.json`` (also an earlier naming's "out").
    """

    directory: str
    prefix: str
    extension: str
    pattern: str | None
    sidecar_stem: str = ""

    def __post_init__(self) -> None:
        if not self.sidecar_stem:
            object.__setattr__(self, "sidecar_stem", self.prefix + self.extension)

    def with_current_names(self) -> ShardLayout:
        """This layout with the sidecar names a writer gives a new dataset."""
        return replace(self, sidecar_stem=self.prefix + self.extension)

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.directory, self.sidecar_stem + MANIFEST_SUFFIX)

    @property
    def index_path(self) -> str:
        return os.path.join(self.directory, self.sidecar_stem + INDEX_SUFFIX)

    @property
    def keys_path(self) -> str:
        return os.path.join(self.directory, self.sidecar_stem + KEYS_SUFFIX)

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.directory, self.sidecar_stem + METADATA_SUFFIX)

    @property
    def index_pieces_path(self) -> str:
        return os.path.join(self.directory, self.sidecar_stem + INDEX_PIECES_SUFFIX)

    @property
    def metadata_pieces_path(self) -> str:
        return os.path.join(self.directory, self.sidecar_stem + METADATA_PIECES_SUFFIX)

    @property
    def keys_pieces_path(self) -> str:
        return os.path.join(self.directory, self.sidecar_stem + KEYS_PIECES_SUFFIX)

    @property
    def legacy_manifest_path(self) -> str:
        """The manifest's name in the earlier naming, after the prefix alone
        (``out.fastdata.json``), which datasets of two formats could share."""
        return os.path.join(self.directory, self.prefix + MANIFEST_SUFFIX)

    @property
    def legacy_sidecars(self) -> tuple[str, str]:
        """The index and keys file names of the earlier naming."""
        return self.prefix + INDEX_SUFFIX, self.prefix + KEYS_SUFFIX

    def shard_name(self, index: int, total: int | None = None) -> str:
        """File name (no directory) of shard ``index`` of ``total``."""
        if self.pattern is None:
            return self.prefix + self.extension
        return self.pattern.format(index=index, total=total if total is not None else 0)

    def owns(self, name: str, extensions: tuple[str, ...]) -> bool:
        """Whether file name ``name`` is one of this output's shard names, for any
        shard count: its pattern with any numbers, or the prefix alone or with a
        shard number (the default names), ending in one of ``extensions``."""
        if self.pattern is not None:
            parts = _FIELD.split(self.pattern)
            if re.fullmatch(r"\d+".join(re.escape(p) for p in parts), name):
                return True
        ext = next((e for e in extensions if name.lower().endswith(e.lower())), None)
        if ext is None:
            return False
        numbered = re.escape(self.prefix) + r"(?:[-_.]\d+(?:-of-\d+)?)?"
        return re.fullmatch(numbered, name[: len(name) - len(ext)]) is not None


def parse_output(path: str | os.PathLike, extensions: tuple[str, ...], *, sharded: bool,
                 total_in_name: bool = False) -> ShardLayout:
    """Work out the shard layout for an output path.

    Args:
        path: the output as the user wrote it (file, printf or brace pattern,
            or the ``.fastdata.json`` manifest of an existing dataset: the
            layout's sidecars are then named as that manifest is).
        extensions: the format's extensions; the first is used when adding one.
        sharded: whether a shard size was given (adds a shard number to a
            plain name).
        total_in_name: name shards ``-00000-of-00008`` (TensorFlow's style)
            instead of ``-000000`` (webdataset's).
    """
    path = absolute(path)
    directory, name = os.path.split(path)
    sidecar_stem = ""
    if name.lower().endswith(MANIFEST_SUFFIX):  # a manifest names its dataset's shards
        name = sidecar_stem = name[: -len(MANIFEST_SUFFIX)]
    ext = next((e for e in extensions if name.lower().endswith(e)), None)
    if ext is None:
        ext = extensions[0]
        stem = name
    else:
        ext = name[len(name) - len(ext):]
        stem = name[: -len(ext)]
    printf = _PRINTF.search(stem)
    brace = BRACE.search(stem)
    if printf or brace:
        match = printf or brace
        width = len(match.group(1)) if brace else int(match.group(1) or 0)
        head, tail = stem[: match.start()], stem[match.end():]
        if "{" in head or "}" in head or "{" in tail or "}" in tail:
            raise FastDataError("output pattern may hold only one shard number", path=path)
        number = f"{{index:0{width}d}}"
        if total_in_name:
            number += f"-of-{{total:0{width}d}}"
        prefix = head.rstrip("-_.") or "data"
        return ShardLayout(directory, prefix, ext, head + number + tail + ext, sidecar_stem)
    if sharded:
        number = "{index:05d}-of-{total:05d}" if total_in_name else "{index:06d}"
        return ShardLayout(directory, stem, ext, f"{stem}-{number}{ext}", sidecar_stem)
    return ShardLayout(directory, stem, ext, None, sidecar_stem)


def parse_shard_size(text: str | int | None) -> tuple[int | None, int | None]:
    """Parse a shard size: a record count ("10000") or a byte size ("256MB", "1GiB").

    Returns:
        (max_records, max_bytes); at most one is set.
    """
    if text is None or text == "":
        return None, None
    if isinstance(text, int):
        return (text, None) if text > 0 else (None, None)
    s = str(text).strip().lower().replace(" ", "")
    units = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 10**3, "m": 10**6,
             "g": 10**9}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", s)
    if not m or (m.group(2) and m.group(2) not in units):
        raise FastDataError(
            f"cannot read shard size {text!r}: give a record count (10000) or a byte size "
            f"(256MB, 1GiB)")
    value = float(m.group(1))
    if m.group(2) in ("", None):
        if value != int(value) or value < 1:
            raise FastDataError(f"shard size {text!r} must be a whole number of records >= 1")
        return int(value), None
    size = int(value * units[m.group(2)])
    if size < 1:
        raise FastDataError(f"shard size {text!r} is too small")
    return None, size


def expand_shards(path: str, layout: ShardLayout) -> list[str]:
    """Existing shard files for a single-file, printf or brace path."""
    if layout.pattern is None:
        single = os.path.join(layout.directory, layout.shard_name(0))
        return [single] if os.path.isfile(single) else []
    brace = BRACE.search(os.path.basename(path))
    if brace:
        # An explicit range names exactly the shards wanted: a missing one is an
        # error, not a shorter dataset.
        lo, hi = int(brace.group(1)), int(brace.group(2))
        out = [os.path.join(layout.directory, layout.shard_name(n, None))
               for n in range(lo, hi + 1)]
        missing = [p for p in out if not os.path.isfile(p)]
        if missing:
            raise ManifestError(f"{len(missing)} of the {len(out)} shards the pattern names "
                                f"are missing, first {os.path.basename(missing[0])}", path=path)
        return out
    out = []
    number = 0
    while True:
        candidate = os.path.join(layout.directory, layout.shard_name(number, None))
        if not os.path.isfile(candidate):
            break
        out.append(candidate)
        number += 1
    if not out and "{total" in layout.pattern:
        raise FastDataError("give the manifest (.fastdata.json) or the shard files of a "
                            "dataset whose shard names include the total", path=path)
    return out

"""Sharded outputs: shard naming, the dataset-level index, and the sharded writer base.

A sharded dataset (tar, TFRecord) is a set of shard files plus two sidecars
next to them, both named after the output's prefix:

- ``PREFIX.fastdata.json``: the manifest, written last (its absence means the
  pack did not finish);
- ``PREFIX.fastdata.index.npy``: one row per record (shard number, byte offset
  and size of the payload inside the shard, label, CRC32), a NumPy structured
  array readable with ``np.load(path, allow_pickle=False)``; this is what gives
  random access into shards.

Output names: ``out.tar`` (one shard, or ``out-000000.tar``... when a shard
size is given), an explicit pattern ``out-%06d.tar``, or a brace pattern
``out-{000000..000009}.tar`` (its width is used; the real number of shards is
whatever the data needs and is listed in the manifest).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass

import numpy as np

from fastdata.errors import FastDataError, OutputExistsError
from fastdata.packers.writer import Writer, _remove
from fastdata.records import Manifest, Record

MANIFEST_SUFFIX = ".fastdata.json"
INDEX_SUFFIX = ".fastdata.index.npy"
KEYS_SUFFIX = ".fastdata.keys.json"

INDEX_DTYPE = np.dtype([
    ("shard", "<u4"), ("offset", "<u8"), ("size", "<u8"), ("label", "<i8"), ("crc32", "<u4"),
])

_PRINTF = re.compile(r"%0?(\d*)d")
_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


@dataclass(frozen=True)
class ShardLayout:
    """Where the files of a sharded dataset go.

    Attributes:
        directory: folder of the shards and sidecars.
        prefix: the output name without extension and shard number ("out").
        extension: shard file extension with dot (".tar").
        pattern: file name with one ``{index}`` (and optionally ``{total}``)
            placeholder, or None for a single unsharded file.
    """

    directory: str
    prefix: str
    extension: str
    pattern: str | None

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.directory, self.prefix + MANIFEST_SUFFIX)

    @property
    def index_path(self) -> str:
        return os.path.join(self.directory, self.prefix + INDEX_SUFFIX)

    @property
    def keys_path(self) -> str:
        return os.path.join(self.directory, self.prefix + KEYS_SUFFIX)

    def shard_name(self, index: int, total: int | None = None) -> str:
        """File name (no directory) of shard ``index`` of ``total``."""
        if self.pattern is None:
            return self.prefix + self.extension
        return self.pattern.format(index=index, total=total if total is not None else 0)


def parse_output(path: str | os.PathLike, extensions: tuple[str, ...], *, sharded: bool,
                 total_in_name: bool = False) -> ShardLayout:
    """Work out the shard layout for an output path.

    Args:
        path: the output as the user wrote it (file, printf or brace pattern,
            or the ``.fastdata.json`` manifest of an existing dataset).
        extensions: the format's extensions; the first is used when adding one.
        sharded: whether a shard size was given (adds a shard number to a
            plain name).
        total_in_name: name shards ``-00000-of-00008`` (TensorFlow's style)
            instead of ``-000000`` (webdataset's).
    """
    path = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(path)
    if name.endswith(MANIFEST_SUFFIX):
        return ShardLayout(directory, name[: -len(MANIFEST_SUFFIX)], extensions[0], None)
    ext = next((e for e in extensions if name.lower().endswith(e)), None)
    if ext is None:
        ext = extensions[0]
        stem = name
    else:
        ext = name[len(name) - len(ext):]
        stem = name[: -len(ext)]
    printf = _PRINTF.search(stem)
    brace = _BRACE.search(stem)
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
        return ShardLayout(directory, prefix, ext, head + number + tail + ext)
    if sharded:
        number = "{index:05d}-of-{total:05d}" if total_in_name else "{index:06d}"
        return ShardLayout(directory, stem, ext, f"{stem}-{number}{ext}")
    return ShardLayout(directory, stem, ext, None)


def parse_shard_size(text: str | int | None) -> tuple[int | None, int | None]:
    """Parse ``--shard-size``: a record count ("10000") or a byte size ("256MB", "1GiB").

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


class ShardFile:
    """A shard being written: buffered, and hashed and counted as it goes, so
    the manifest's SHA-256 and the records' offsets need no second pass."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.position = 0
        self._sha = hashlib.sha256()
        self._file = open(path, "wb", buffering=1 << 20)

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._sha.update(data)
        self.position += len(data)

    def writelines(self, parts) -> None:
        for part in parts:
            self.write(part)

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()

    def close(self, *, sync: bool = True) -> None:
        """Close; with ``sync`` the bytes are on disk before the shard is published."""
        if self._file.closed:
            return
        if sync:
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()


class ShardedWriter(Writer):
    """Base of writers that roll shard files (tar, TFRecord).

    Shards are written into a temporary folder beside the output and moved to
    their final names at the end (the final names may include the total shard
    count); the index, keys and finally the manifest follow, so a crash leaves
    no manifest and nothing that looks complete.

    The base opens each shard as a :class:`ShardFile` (``self._shard``), which
    hashes and counts what is written. Subclasses implement
    ``_append(record, crc) -> (offset, size)``, writing the record to
    ``self._shard`` and returning where its payload lies, and may implement
    ``_begin_shard(path)`` (per-shard state) and ``_end_shard() -> dict``
    (a trailer written to ``self._shard``, extra per-shard facts); they may
    override ``_shard_files(name)`` to publish side files (per-shard index
    files) and ``_stored_size(record)`` so a byte ``shard_size`` counts their
    framing (tar headers and padding).
    """

    output_is_dir = True
    #: Shard names carry the total ("-00000-of-00008").
    total_in_name = False
    #: Extensions of this format, first one preferred.
    extensions: tuple[str, ...] = ()

    def __init__(self, path, *, overwrite: bool = False, shard_size: str | int | None = None
                 ) -> None:
        self.max_records, self.max_bytes = parse_shard_size(shard_size)
        sharded = self.max_records is not None or self.max_bytes is not None
        self.layout = parse_output(path, self.extensions, sharded=sharded,
                                   total_in_name=self.total_in_name)
        if os.path.lexists(self.layout.manifest_path) and not overwrite:
            raise OutputExistsError("a dataset with this name exists; pass --overwrite to "
                                    "replace it", path=self.layout.manifest_path)
        single = self.layout.shard_name(0, 1)
        if (self.layout.pattern is None and not overwrite
                and os.path.lexists(os.path.join(self.layout.directory, single))):
            raise OutputExistsError("output already exists; pass --overwrite to replace it",
                                    path=os.path.join(self.layout.directory, single))
        self._shards: list[dict] = []
        self._rows: list[tuple] = []
        self._keys: list[str] = []
        self._shard_count = 0
        self._shard: ShardFile | None = None
        # The base class makes the temp folder next to "path"; use the prefix
        # so patterns with "%" never reach the file system.
        super().__init__(os.path.join(self.layout.directory, self.layout.prefix),
                         overwrite=True)
        self.overwrite = overwrite

    # -- hooks ----------------------------------------------------------------

    def _begin_shard(self, path: str) -> None:
        pass

    def _append(self, record: Record, crc: int) -> tuple[int, int]:
        raise NotImplementedError

    def _end_shard(self) -> dict:
        return {}

    def _shard_files(self, name: str) -> list[str]:
        """Files making up shard ``name`` (the shard and any side files)."""
        return [name]

    def _manifest_extra(self) -> dict:
        """Format-specific entries for the manifest's ``extra`` (key schema, ...)."""
        return {}

    # -- Writer implementation --------------------------------------------------

    def _open(self, temp_path: str) -> None:
        pass

    def _temp_shard_name(self, number: int) -> str:
        return f"shard-{number:06d}{self.layout.extension}"

    def _stored_size(self, record: Record) -> int:
        """Bytes ``record`` will take in its shard (framing included); what a
        byte ``shard_size`` counts."""
        return len(record.payload)

    def _write(self, record: Record, crc: int) -> None:
        if self._shard is not None and (
                (self.max_records is not None and self._shard_count >= self.max_records)
                or (self.max_bytes is not None and self._shard_count > 0
                    and self._shard.position + self._stored_size(record) > self.max_bytes)):
            self._finish_shard()
        if self._shard is None:
            path = os.path.join(self.temp_path, self._temp_shard_name(len(self._shards)))
            self._shard = ShardFile(path)
            self._begin_shard(path)
            self._shard_count = 0
            self._shard_first = record.index
        offset, length = self._append(record, crc)
        self._rows.append((len(self._shards), offset, length, record.label, crc))
        self._keys.append(record.key)
        self._shard_count += 1

    def _finish_shard(self) -> None:
        extra = self._end_shard()
        shard, self._shard = self._shard, None
        shard.close()
        self._shards.append({"temp": shard.path, "count": self._shard_count,
                             "sha256": shard.sha256, "first": self._shard_first, **extra})

    def _discard(self) -> None:
        if self._shard is not None:
            try:
                self._shard.close(sync=False)
            except OSError:
                pass
            self._shard = None

    def _close(self, manifest: Manifest) -> Manifest:
        import dataclasses
        import json

        if self._shard is not None:
            self._finish_shard()
        total = len(self._shards)
        shards = []
        on_disk = 0
        for number, info in enumerate(self._shards):
            temp = info.pop("temp")
            name = self.layout.shard_name(number, total)
            size = os.path.getsize(temp)
            on_disk += size
            shards.append({"path": name, "count": info.pop("count"), "bytes": size,
                           "sha256": info.pop("sha256"), **info})
            info["temp"] = temp
        index = np.array(self._rows, dtype=INDEX_DTYPE)
        np.save(os.path.join(self.temp_path, "index.npy"), index, allow_pickle=False)
        with open(os.path.join(self.temp_path, "keys.json"), "w", encoding="utf-8") as f:
            json.dump(self._keys, f, ensure_ascii=False)
        manifest = dataclasses.replace(
            manifest,
            bytes=dict(manifest.bytes, on_disk=on_disk),
            shards=shards,
            extra={"index": os.path.basename(self.layout.index_path),
                   "keys": os.path.basename(self.layout.keys_path),
                   "prefix": self.layout.prefix, **self._manifest_extra()},
        )
        with open(os.path.join(self.temp_path, "manifest.json"), "w", encoding="utf-8") as f:
            f.write(manifest.to_json())
        return manifest

    def _publish(self) -> None:
        layout = self.layout
        old = _existing_files(layout) if self.overwrite else []
        if os.path.lexists(layout.manifest_path):
            os.remove(layout.manifest_path)  # the dataset stops looking complete first
        total = len(self._shards)
        published = set()
        for number, info in enumerate(self._shards):
            temp_name = os.path.basename(info["temp"])
            final_name = layout.shard_name(number, total)
            for temp_file, final_file in zip(self._shard_files(temp_name),
                                             self._shard_files(final_name)):
                dest = os.path.join(layout.directory, final_file)
                os.replace(os.path.join(self.temp_path, temp_file), dest)
                published.add(dest)
        os.replace(os.path.join(self.temp_path, "index.npy"), layout.index_path)
        os.replace(os.path.join(self.temp_path, "keys.json"), layout.keys_path)
        for path in old:
            if path not in published and path not in (layout.index_path, layout.keys_path):
                _remove(path)
        os.replace(os.path.join(self.temp_path, "manifest.json"), layout.manifest_path)
        shutil.rmtree(self.temp_path, ignore_errors=True)

    @property
    def output_path(self) -> str:
        """What to pass to ``open_dataset``: the manifest sidecar."""
        return self.layout.manifest_path


def _existing_files(layout: ShardLayout) -> list[str]:
    """Shards (and their side files) of a dataset already at ``layout``."""
    import json

    try:
        with open(layout.manifest_path, encoding="utf-8") as f:
            shards = json.load(f).get("shards", [])
    except (OSError, ValueError):
        return []
    out = []
    for s in shards:
        p = os.path.join(layout.directory, s.get("path", ""))
        out.extend([p, p + ".idx"])
    return [p for p in out if os.path.lexists(p)]

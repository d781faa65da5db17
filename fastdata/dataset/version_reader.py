"""The reader of a dataset version: its parts' readers one after another
(no torch).

Record ``i`` of a version is record ``i - first[p]`` of part ``p``. Every
part is a complete dataset of the format, packed with the classes the
version had when the part was added as the first of its own (an append
only adds classes at the end), so a part's labels are the version's. Over
sharded parts, :class:`ShardedVersionReader` numbers the parts' shards one
after another, so streams, read-ahead and the sampler's remote reads see
one dataset. What grows with the dataset: the parts' readers' own costs,
and 8 bytes per part.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fastdata.errors import ManifestError
from fastdata.formats.composed import ComposedReader
from fastdata.formats.reader import Reader
from fastdata.dataset.columns import JoinedColumns
from fastdata.dataset.concat import ConcatColumn, ConcatKeys, RelabelledColumn, inside
from fastdata.dataset.history import Version, dataset_folder, read_version


class VersionReader(ComposedReader):
    """A version of a dataset (``NAME.versions/vNNNNNN.json``) read as one
    dataset of its parts' records.

    Raises:
        ManifestError: the record is damaged, or a part is not the dataset
            it was when the version was made.
    """

    is_version = True

    def __init__(self, path, *, verify: bool = True, allow_outside: bool = False,
                 settings: Mapping[str, Any] | None = None) -> None:
        self._joined: list[JoinedColumns] = []
        self.parts: list[Reader] = []
        self.version: Version | None = None
        super().__init__(path, verify=verify, allow_outside=allow_outside,
                         settings=settings)

    def _load_metadata(self) -> None:
        from fastdata.contained import Folder
        from fastdata.formats.registry import detect_format
        from fastdata.dataset.view_file import manifest_digest

        version = read_version(self.path)
        if not self.parts:
            folder = Folder(dataset_folder(self.path.rsplit(".versions", 1)[0]),
                            where=self.path, links_out=self.allow_outside)
            for k, part in enumerate(version.parts):
                where = folder.path(part.path, f"parts[{k}].path")
                reader = detect_format(where).load_reader().open(
                    where, verify=self.verify, allow_outside=self.allow_outside,
                    settings=self._settings, versions=False)
                self.parts.append(reader)
                if len(reader) != part.records or \
                        manifest_digest(reader.manifest) != part.manifest_sha256:
                    raise ManifestError(
                        f"part {part.path} is not the dataset version {version.number} was "
                        f"made with (it had {part.records:,} records, it has {len(reader):,}, "
                        f"and the manifests differ); restore it, or open a version made "
                        f"since", path=self.path)
        self.version = version
        first = np.concatenate([[0], np.cumsum([len(r) for r in self.parts])]).astype(np.int64)
        self._first = first
        base = self.parts[0].manifest
        self.format_name = version.format
        self.walk_in_child = any(r.walk_in_child for r in self.parts)
        self.url = self.parts[0].url
        shards = [s for r in self.parts for s in r.manifest.shards]
        payload = sum(int(r.manifest.bytes.get("payload", 0)) for r in self.parts)
        checksums = {k: v for k, v in base.checksums.items() if k != "payload_sha256"}
        self._manifest = dataclasses.replace(
            base, count=version.records, classes=list(version.classes),
            class_counts=list(version.class_counts), shards=shards,
            bytes={**base.bytes, "payload": payload}, checksums=checksums,
            created_at=version.created_at,
            extra={**base.extra, "dataset_version": {
                "number": version.number, "change": version.change,
                "sha256": version.sha256, "parts": len(self.parts)}})
        self._labels = ConcatColumn([r.labels for r in self.parts], first)
        folder = dataset_folder(self.path.rsplit(".versions", 1)[0])
        self._joined = [JoinedColumns(inside(folder, c["path"], self), c)
                        for c in version.columns]
        if version.labels:
            self._labels = RelabelledColumn(self._labels, JoinedColumns(
                inside(folder, version.labels["path"], self),
                {"records": version.labels["records"], "columns": {},
                 "sha256": {"labels.npy": version.labels["sha256"]}}))

    @property
    def dataset_path(self) -> str:
        """The dataset this is a version of (the name its history is kept under)."""
        return self.path.rsplit(".versions", 1)[0]

    @property
    def identity(self) -> dict:
        """What a resume state records of the dataset read: the version."""
        return {"version": self.version.number, "sha256": self.version.sha256}

    # -- records ------------------------------------------------------------------

    def _grouped(self, indices: Sequence[int]):
        at = np.asarray(self._normalise(indices), dtype=np.int64)
        part = np.searchsorted(self._first, at, side="right") - 1
        return at, part, at - self._first[part]

    def _per_part(self, indices: Sequence[int], ask) -> list | None:
        """``ask(part reader, its local indices)`` once per part the records
        are in, the answers put back in the order of ``indices``; None when a
        part answers None."""
        _, part, local = self._grouped(indices)
        out: list = [None] * len(part)
        for p in np.unique(part).tolist():
            ks = np.flatnonzero(part == p)
            got = ask(self.parts[p], local[ks].tolist())
            if got is None:
                return None
            for k, value in zip(ks.tolist(), got):
                out[k] = value
        return out

    def read_many(self, indices: Sequence[int], *, check: bool | None = None) -> list[bytes]:
        check = self.verify if check is None else check
        return self._per_part(indices, lambda r, local: r.read_many(local, check=check))

    def crcs_of(self, indices: Sequence[int]) -> list[int] | None:
        return self._per_part(indices, lambda r, local: r.crcs_of(local))

    def _one(self, index: int) -> tuple[Reader, int]:
        _, part, local = self._grouped([index])
        return self.parts[int(part[0])], int(local[0])

    def _check_inner(self, index: int, data, expected: int | None) -> None:
        reader, local = self._one(index)
        reader.check(local, data, expected)

    def records(self, *, check: bool) -> Iterator[tuple[int, bytes, int]]:
        for first, reader in zip(self._first.tolist(), self.parts):
            for i, data, label in reader.records(check=check):
                yield first + i, data, label

    def inner(self) -> list[Reader]:
        return list(self.parts)

    def _make_keys(self):
        return ConcatKeys([r.keys for r in self.parts], self._first)

    def key_of(self, index: int) -> str | None:
        try:
            reader, local = self._one(index)
            return reader.key_of(local)
        except (IndexError, ValueError):
            return None

    # -- metadata -----------------------------------------------------------------

    @property
    def has_metadata(self) -> bool:
        return bool(self._joined) or any(r.has_metadata for r in self.parts)

    def metadata_many(self, indices: Sequence[int]) -> list[dict]:
        """The records' own metadata, with the joined columns' values added
        (a later join's value of a name replaces an earlier one's)."""
        at = self._normalise(indices)
        out = self._per_part(at, lambda r, local: r.metadata_many(local))
        for joined in self._joined:
            out = [{**mine, **extra} if extra else mine
                   for mine, extra in zip(out, joined.values(at))]
        return out

    def metadata_bytes_many(self, indices, *, check: bool = True):
        return self._per_part(indices,
                              lambda r, local: r.metadata_bytes_many(local, check=check))

    def check_metadata(self, index: int, data) -> None:
        reader, local = self._one(index)
        reader.check_metadata(local, data)

    def parse_metadata(self, index: int, data):
        reader, local = self._one(index)
        return reader.parse_metadata(local, data)

    # -- whole files and processes ------------------------------------------------

    def check_layout(self) -> list[dict]:
        return [p for r in self.parts for p in r.check_layout()]

    def check_files(self, on_bytes=None) -> list[dict]:
        return [p for r in self.parts for p in r.check_files(on_bytes)]

    def crash_path(self) -> str:
        return self.parts[-1].crash_path() if self.parts else self.path


class ShardedVersionReader(VersionReader):
    """A version of a sharded dataset: its parts' shards numbered one after
    another."""

    def _shard_table(self):
        table = getattr(self, "_shards", None)
        if table is None:
            counts = [len(r.shard_paths) for r in self.parts]
            table = self._shards = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return table

    def _part_of_shard(self, shard: int) -> tuple[Reader, int]:
        table = self._shard_table()
        p = int(np.searchsorted(table, shard, side="right")) - 1
        return self.parts[p], shard - int(table[p])

    @property
    def coalesce(self):
        return self.parts[0].coalesce

    @coalesce.setter
    def coalesce(self, value) -> None:
        for reader in self.parts:
            reader.coalesce = value

    @property
    def shard_paths(self) -> list[str]:
        return [p for r in self.parts for p in r.shard_paths]

    def shard_sizes(self) -> list[int]:
        return [s for r in self.parts for s in r.shard_sizes()]

    def shard_ranges(self) -> list[tuple[int, int]]:
        return [(int(first) + s, c) for first, r in zip(self._first.tolist(), self.parts)
                for s, c in r.shard_ranges()]

    def shard_copy(self, shard: int, cache=None) -> str:
        reader, local = self._part_of_shard(shard)
        return reader.shard_copy(local, cache)

    def attach_local(self, shard: int, path: str) -> None:
        reader, local = self._part_of_shard(shard)
        reader.attach_local(local, path)

    def detach_local(self, shard: int) -> None:
        reader, local = self._part_of_shard(shard)
        reader.detach_local(local)

    def side_path(self, shard: int, suffix: str) -> str:
        reader, local = self._part_of_shard(shard)
        return reader.side_path(local, suffix)

    def placement(self, indices) -> tuple[np.ndarray, np.ndarray]:
        at = np.asarray(indices, dtype=np.int64).reshape(-1)
        part = np.searchsorted(self._first, at, side="right") - 1
        local = at - self._first[part]
        shards = np.empty(len(at), np.int64)
        sizes = np.empty(len(at), np.int64)
        table = self._shard_table()
        for p in np.unique(part).tolist():
            here = part == p
            s, z = self.parts[p].placement(local[here])
            shards[here] = np.asarray(s, np.int64) + table[p]
            sizes[here] = np.asarray(z, np.int64)
        return shards, sizes

    def shards_of(self, indices: Sequence[int]) -> list[int]:
        shards, _ = self.placement(indices)
        return list(dict.fromkeys(shards.tolist()))

    def iter_shard(self, shard: int) -> Iterator[tuple[int, bytes]]:
        reader, local = self._part_of_shard(shard)
        first = int(self._first[self.parts.index(reader)])
        for i, data in reader.iter_shard(local):
            yield first + i, data


def open_version(path, *, verify: bool = True, allow_outside: bool = False,
                 settings: Mapping[str, Any] | None = None) -> VersionReader:
    """The reader of the version record at ``path``."""
    reader = VersionReader(path, verify=verify, allow_outside=allow_outside, settings=settings)
    # Only the parts tell whether shard methods apply, and they are opened once.
    if hasattr(reader.parts[0], "shard_sizes"):
        reader.__class__ = ShardedVersionReader
    return reader


def open_if_version(path, *, verify: bool = True, allow_outside: bool = False,
                    settings: Mapping[str, Any] | None = None):
    """The reader of the version record at ``path``, else None (see
    ``fastdata.formats.reader.COMPOSITE_OPENERS``)."""
    from fastdata.dataset.history import is_version_file

    if not is_version_file(path):
        return None
    return open_version(path, verify=verify, allow_outside=allow_outside, settings=settings)


def open_current(reader, *, verify: bool = True, allow_outside: bool = False,
                 settings: Mapping[str, Any] | None = None):
    """The reader of the current version of the dataset ``reader`` opened,
    when it has changed since its pack; None otherwise (see
    ``fastdata.formats.reader.CURRENT_VERSION``)."""
    from fastdata.dataset.history import head_number, record_path

    head = head_number(reader.dataset_path)
    if head is None:
        return None
    return open_version(record_path(reader.dataset_path, head), verify=verify,
                        allow_outside=allow_outside, settings=settings)

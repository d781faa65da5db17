"""The reader of a dataset record: its parts' readers one after another,
each through its selection (no torch).

Position ``i`` of a record lies in part ``p`` (``first[p] <= i < first[p +
1]``, ``first`` counting selected records), at the part's record
``selection[p].parents(i - first[p])`` (itself without a selection). A
part's labels are mapped to the record's classes by name; labels a join
gave replace them where it covered the record. Over sharded parts, shards
are numbered one part after another, so streams, read-ahead, the sampler's
remote reads, the RAM cache and DALI's external source see one dataset.
What grows with the dataset: the parts' readers' own costs, their
selections (see :mod:`fastdata.dataset.selection`), and 16 bytes per part.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fastdata.dataset.columns import JoinedColumns
from fastdata.dataset.part_columns import PartColumn, RecordKeys, RecordLabels
from fastdata.dataset.part_shards import STEP, PartShards
from fastdata.dataset.record import DatasetRecord, manifest_digest
from fastdata.dataset.selection import Selection, SelectionError
from fastdata.errors import ManifestError
from fastdata.formats.composed import ComposedReader
from fastdata.formats.reader import Reader


class DatasetReader(PartShards, ComposedReader):
    """A version record or a view file, read as one dataset.

    Args:
        path: the record (``NAME.versions/vNNNNNN.json``) or view file.
        verify, allow_outside, settings: as for any reader; passed on to the
            parts' readers (``settings``: their format's own).
        record: the record, already read (else read from ``path``).
        opened: part readers already open, by absolute path (the pack a
            resolver opened to find the dataset's name): used, not reopened.

    Raises:
        ManifestError: the record is damaged, or a part is not the dataset
            it was when the record was made.
    """

    def __init__(self, path, *, verify: bool = True, allow_outside: bool = False,
                 settings: Mapping[str, Any] | None = None,
                 record: DatasetRecord | None = None,
                 opened: Mapping[str, Reader] | None = None) -> None:
        self.record = record
        self.parts: list[Reader] = []
        self._opened = dict(opened or {})
        self._joined: list[JoinedColumns] = []
        super().__init__(path, verify=verify, allow_outside=allow_outside,
                         settings=settings)

    # -- opening ------------------------------------------------------------------

    @property
    def root(self) -> str:
        """The folder (or URL prefix) the record's names are relative to."""
        from fastdata.dataset.history import dataset_folder, dataset_of_record
        from fastdata.storage.urls import dirname

        if self.record.kind == "version":
            return dataset_folder(dataset_of_record(self.path))
        return dirname(self.path)

    def _load_metadata(self) -> None:
        from fastdata.dataset.history import read_record

        if self.record is None:
            self.record = read_record(self.path)
        record = self.record
        if not self.parts:
            try:
                self.parts = self._open_parts(record)
            except BaseException:
                for reader in self._opened.values():
                    reader.close()
                raise
            finally:
                self._opened = {}
        self._layout(record)

    def _inside(self, name: str, field: str) -> str:
        from fastdata.contained import Folder

        return Folder(self.root, where=self.path, links_out=self.allow_outside).path(
            name, field)

    def _open_parts(self, record: DatasetRecord) -> list[Reader]:
        from fastdata.dataset.history import is_version_file, is_view_file
        from fastdata.formats.registry import detect_format
        from fastdata.formats.remote_files import absolute

        readers: list[Reader] = []
        try:
            for k, part in enumerate(record.parts):
                where = self._inside(part.path, f"parts[{k}].path")
                reader = self._opened.pop(absolute(where), None)
                if reader is None:
                    if is_view_file(where) or is_version_file(where):  # never a loop
                        raise ManifestError(f"parts[{k}] ({part.path}) is a view or a "
                                            f"version record; a part is a packed dataset",
                                            path=self.path)
                    reader = detect_format(where).load_reader().open(
                        where, verify=self.verify, allow_outside=self.allow_outside,
                        settings=self._settings)
                readers.append(reader)
                if reader.format_name != record.format:
                    raise ManifestError(f"part {part.path} is {reader.format_name}, the record "
                                        f"says {record.format}", path=self.path)
                if len(reader) != part.records or \
                        manifest_digest(reader.manifest) != part.manifest_sha256:
                    what = f"version {record.number}" if record.kind == "version" else \
                        "this view"
                    raise ManifestError(
                        f"part {part.path} is not the dataset {what} was made with (it "
                        f"had {part.records:,} records, it has {len(reader):,}, and the "
                        f"manifests differ); restore it, or open a version made since",
                        path=self.path)
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        return readers

    def _layout(self, record: DatasetRecord) -> None:
        """Positions, label maps and the manifest, from the record and parts."""
        self._selections: list[Selection | None] = []
        for k, (part, reader) in enumerate(zip(record.parts, self.parts)):
            if part.selection is None:
                self._selections.append(None)
                continue
            try:
                self._selections.append(Selection.decode(part.selection, part.records))
            except SelectionError as exc:
                raise ManifestError(f"parts[{k}]'s selection is damaged ({exc}); make the "
                                    f"view again with fastdata subset", path=self.path) \
                    from None
            if reader.sharded:  # never fetch unselected records by range
                reader.coalesce = 0
        counts = [p.selected for p in record.parts]
        self._first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._base = np.concatenate([[0], np.cumsum([p.records for p in record.parts])]
                                    ).astype(np.int64)
        self._remaps = [self._remap(reader.classes, f"part {part.path}")
                        for part, reader in zip(record.parts, self.parts)]
        self.sharded = all(r.sharded for r in self.parts)
        self.format_name = record.format
        self.walk_in_child = any(r.walk_in_child for r in self.parts)
        self.url = self.parts[0].url
        self._joined = [JoinedColumns(self._inside(c["path"], f"columns[{k}].path"), c)
                        for k, c in enumerate(record.columns)]
        self._relabel = None
        if record.labels is not None:
            entry = record.labels
            self._relabel = (JoinedColumns(self._inside(entry["path"], "labels.path"), {
                "records": entry["records"], "columns": {},
                "sha256": {entry["file"]: entry["sha256"]}}), entry["file"],
                self._remap(entry["classes"], "the joined labels"))
        self._labels = RecordLabels(self)
        self._crcs = None
        self._manifest = self._make_manifest(record)

    def _remap(self, names: list[str], what: str) -> np.ndarray | None:
        """Class index of ``names`` -> the record's (None: the same)."""
        classes = self.record.classes
        if list(names) == list(classes[:len(names)]):
            return None
        where = {c: i for i, c in enumerate(classes)}
        unknown = [c for c in names if c not in where]
        if unknown:
            raise ManifestError(f"{what} labels classes the record does not have "
                                f"({', '.join(map(repr, unknown[:5]))})", path=self.path)
        return np.asarray([where[c] for c in names], np.int64)

    def _make_manifest(self, record: DatasetRecord):
        base = self.parts[0].manifest
        whole = len(self.parts) == 1 and record.parts[0].selection is None
        payload = record.payload_bytes if record.payload_bytes is not None else \
            sum(int(r.manifest.bytes.get("payload", 0)) for r in self.parts)
        checksums = base.checksums if whole else \
            {k: v for k, v in base.checksums.items() if k != "payload_sha256"}
        if record.kind == "version":
            extra = {"dataset_version": {"number": record.number, "change": record.change,
                                         "sha256": record.sha256, "parts": len(self.parts)}}
        else:
            extra = {"view": {"of": record.of, "base_records": record.base_records,
                              "selected_by": record.selected_by,
                              "created_at": record.created_at}}
        return dataclasses.replace(
            base, count=record.records, classes=list(record.classes),
            class_counts=list(record.class_counts),
            shards=[s for r in self.parts for s in r.manifest.shards],
            bytes={**base.bytes, "payload": payload}, checksums=checksums,
            created_at=record.created_at or base.created_at,
            extra={**base.extra, **extra})

    # -- what it is ---------------------------------------------------------------

    @property
    def version(self) -> int | None:
        """The version's number (a view: the version it was made from)."""
        if self.record.kind == "version":
            return self.record.number
        return (self.record.of or {}).get("version")

    @property
    def selections(self) -> list[Selection | None]:
        """Each part's selection of its records (None: all of them)."""
        return list(self._selections)

    @property
    def is_view(self) -> bool:
        return self.record.kind == "view"

    @property
    def dataset_path(self) -> str:
        """A version's dataset (the name its history is kept under); a view's
        own file."""
        from fastdata.dataset.history import dataset_of_record

        if self.record.kind == "view":
            return self.path
        base = dataset_of_record(self.path)
        return base + ".fastdata.json" if self.sharded else base  # a set's name: its manifest

    @property
    def identity(self) -> dict:
        """What a resume state records of the dataset read."""
        if self.record.kind == "version":
            return {"version": self.record.number, "sha256": self.record.sha256}
        out = {"view": self.record.sha256}
        return {**out, "version": self.version} if self.version else out

    # -- positions ----------------------------------------------------------------

    def locate(self, at) -> tuple[np.ndarray, np.ndarray]:
        """Part and part-record index of each position (in range)."""
        at = np.asarray(at, dtype=np.int64).reshape(-1)
        part = np.searchsorted(self._first, at, side="right") - 1
        local = at - self._first[part]
        for p in np.unique(part).tolist():
            selection = self._selections[p]
            if selection is not None:
                here = part == p
                local[here] = selection.parents(local[here])
        return part, local

    def base_of(self, at) -> np.ndarray:
        """Each position's base position (what joined columns index)."""
        part, local = self.locate(at)
        return self._base[part] + local

    def _per_part(self, indices: Sequence[int], ask) -> list | None:
        """``ask(part reader, its record indices)`` once per part the records
        are in, answers put back in the order of ``indices``; None when a
        part answers None."""
        part, local = self.locate(indices)
        out: list = [None] * len(part)
        for p in np.unique(part).tolist():
            ks = np.flatnonzero(part == p)
            got = ask(self.parts[p], local[ks].tolist())
            if got is None:
                return None
            for k, value in zip(ks.tolist(), got):
                out[k] = value
        return out

    def _one(self, index: int) -> tuple[Reader, int]:
        part, local = self.locate([index])
        return self.parts[int(part[0])], int(local[0])

    # -- records ------------------------------------------------------------------

    def read_many(self, indices: Sequence[int], *, check: bool | None = None) -> list[bytes]:
        check = self.verify if check is None else check
        return self._per_part(self._normalise(indices),
                              lambda r, local: r.read_many(local, check=check))

    def crcs_of(self, indices: Sequence[int]) -> list[int] | None:
        return self._per_part(indices, lambda r, local: r.crcs_of(local))

    def _check_inner(self, index: int, data, expected: int | None) -> None:
        reader, local = self._one(index)
        reader.check(local, data, expected)

    def records(self, *, check: bool) -> Iterator[tuple[int, bytes, int]]:
        for p, reader in enumerate(self.parts):
            first = int(self._first[p])
            if self._selections[p] is None and self._relabel is None:
                remap = self._remaps[p]
                for i, data, label in reader.records(check=check):
                    yield first + i, data, int(remap[label]) if remap is not None and \
                        label >= 0 else label
                continue
            for lo in range(first, int(self._first[p + 1]), STEP):
                at = list(range(lo, min(int(self._first[p + 1]), lo + STEP)))
                labels = np.asarray(self._labels[np.asarray(at)]).tolist()
                yield from zip(at, self.read_many(at, check=check), labels)

    def inner(self) -> list[Reader]:
        return list(self.parts)

    def _make_keys(self):
        return RecordKeys(self)

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
        if self._joined:
            base = self.base_of(at)
            for joined in self._joined:
                out = [{**mine, **extra} if extra else mine
                       for mine, extra in zip(out, joined.values(base))]
        return out

    def metadata_bytes_many(self, indices, *, check: bool = True):
        return self._per_part(indices,
                              lambda r, local: r.metadata_bytes_many(local, check=check))

    def metadata_crcs(self):
        found = [r.metadata_crcs() for r in self.parts]
        return None if any(c is None for c in found) else PartColumn(self, found)

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
        found = [p for r in self.parts for p in r.check_files(on_bytes)]
        joined = list(self._joined) + ([self._relabel[0]] if self._relabel else [])
        for columns in joined:
            found += columns.check_files()
        return found

    def crash_path(self) -> str:
        return self.parts[-1].crash_path() if self.parts else self.path

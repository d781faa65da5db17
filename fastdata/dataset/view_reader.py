"""The reader of a view: its parent's reader, seen through the selection
(no torch).

Every way of reading takes a view because a :class:`ViewReader` is a reader:
view position ``i`` is the parent's record ``selection.parents(i)``, and
every method that takes record indices maps them before asking the parent.
The parent's files, handles and caches are the parent reader's own; a view
adds its selection (see :mod:`fastdata.dataset.selection` for what that costs).
Over a sharded parent, :class:`ShardedViewReader` adds the shard methods the
streams and read-ahead use, so a stream reads only the selected records'
ranges (or the whole shards that hold enough of them).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fastdata.errors import ManifestError
from fastdata.formats.column import LazyColumn, positions
from fastdata.formats.composed import ComposedReader
from fastdata.formats.reader import Reader
from fastdata.dataset.selection import Selection, SelectionError
from fastdata.dataset.view_file import manifest_digest, read_view_file

#: Records read together when a view is walked in order.
_STEP = 256


class MappedColumn(LazyColumn):
    """A parent's per-record column (labels, CRCs) at a view's positions."""

    def __init__(self, column, selection: Selection) -> None:
        self.column, self.selection = column, selection
        self.dtype = getattr(column, "dtype", np.dtype(np.int64))
        self.shape = (selection.count,)

    def __getitem__(self, where):
        if isinstance(where, (int, np.integer)):
            at = int(where) + (self.selection.count if where < 0 else 0)
            return self.column[int(self.selection.parents([at])[0])]
        return np.asarray(self.column[self.selection.parents(
            positions(where, self.selection.count))])


class MappedKeys(MappedColumn):
    """A parent's keys at a view's positions (a sequence of str)."""

    def __getitem__(self, where):
        if isinstance(where, (int, np.integer)):
            return super().__getitem__(where)
        at = positions(where, self.selection.count)
        return [self.column[int(p)] for p in self.selection.parents(at)]

    def __iter__(self):
        for lo in range(0, self.selection.count, 4096):
            yield from self[lo:lo + 4096]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(list(self), dtype=dtype)


class ViewReader(ComposedReader):
    """A view (``VIEW.fastdata.json``) read as a dataset of its selected
    records, in the parent's order.

    Args:
        path: the view file.
        verify, allow_outside: as for any reader; passed on to the parent's.
        settings: the parent format's reader settings.

    Raises:
        ManifestError: the view file is damaged, or its parent is another
            dataset (or another version) than the one it was made from.
    """

    is_view = True

    def __init__(self, path, *, verify: bool = True, allow_outside: bool = False,
                 settings: Mapping[str, Any] | None = None) -> None:
        self.parent: Reader | None = None
        self.selection: Selection | None = None
        self.view = None
        super().__init__(path, verify=verify, allow_outside=allow_outside,
                         settings=settings)

    # -- opening ------------------------------------------------------------------

    def _load_metadata(self) -> None:
        from fastdata.contained import Folder
        from fastdata.formats.registry import detect_format
        from fastdata.formats.remote_files import is_remote

        view = read_view_file(self.path)
        folder = os.path.dirname(self.path) if not is_remote(self.path) else \
            self.path.rsplit("/", 1)[0]
        parent_path = Folder(folder, where=self.path, links_out=self.allow_outside).path(
            view.parent, "parent.path")
        if self.parent is None:
            from fastdata.dataset.view_file import is_view_file

            if is_view_file(parent_path):  # checked before opening: a loop never opens
                raise ManifestError("the parent of a view is a view; make views of the "
                                    "dataset itself (fastdata subset on a view does)",
                                    path=self.path)
            spec = detect_format(parent_path)
            if spec.name != view.format:
                raise ManifestError(f"the view says format {view.format!r} but its parent "
                                    f"{view.parent} is {spec.name!r}; make the view again",
                                    path=self.path)
            # A dataset changed since keeps its pack as version 1: the view
            # reads what it was made from (a later version is named as such).
            self.parent = spec.load_reader().open(parent_path, verify=self.verify,
                                                  allow_outside=self.allow_outside,
                                                  settings=self._settings, versions=False)
        manifest = self.parent.manifest
        if len(self.parent) != view.parent_records or \
                manifest_digest(manifest) != view.parent_digest:
            raise ManifestError(
                f"the view was made from another dataset at {view.parent} (or another "
                f"version of it): it had {view.parent_records:,} records, this has "
                f"{len(self.parent):,}, and the manifests differ; make the view again with "
                f"fastdata subset", path=self.path)
        try:
            self.selection = Selection.decode(view.selection, view.parent_records)
        except SelectionError as exc:
            raise ManifestError(f"the view's selection is damaged ({exc}); make the view "
                                f"again with fastdata subset", path=self.path) from None
        if self.selection.count != view.records or \
                len(view.class_counts) != len(manifest.classes):
            raise ManifestError("the view's counts do not add up; make the view again",
                                path=self.path)
        self.view = view
        if hasattr(self.parent, "coalesce"):  # never fetch unselected records by range
            self.parent.coalesce = 0
        self.format_name = view.format
        self.walk_in_child = self.parent.walk_in_child
        self.url = self.parent.url
        payload = view.payload_bytes if view.payload_bytes is not None else \
            int(manifest.bytes.get("payload", 0))
        self._manifest = dataclasses.replace(
            manifest, count=view.records, class_counts=list(view.class_counts),
            bytes={**manifest.bytes, "payload": payload},
            extra={**manifest.extra, "view": {"parent": view.parent,
                                              "parent_records": view.parent_records,
                                              "selected_by": view.selected_by,
                                              "created_at": view.created_at}})
        self._labels = MappedColumn(self.parent.labels, self.selection)
        self._crcs = None

    @property
    def identity(self) -> dict:
        """What a resume state records of the dataset read: the selection,
        and the parent's version where it has versions."""
        out = {"view": self.view.selection.get("sha256")}
        parent = getattr(self.parent, "identity", None)
        return {**out, **parent} if parent else out

    # -- records ------------------------------------------------------------------

    def parents_of(self, indices) -> np.ndarray:
        """The parent's record index of each view index (in range)."""
        return self.selection.parents(np.asarray(indices, dtype=np.int64))

    def read_many(self, indices: Sequence[int], *, check: bool | None = None) -> list[bytes]:
        return self.parent.read_many(self.parents_of(self._normalise(indices)).tolist(),
                                     check=self.verify if check is None else check)

    def crcs_of(self, indices: Sequence[int]) -> list[int] | None:
        return self.parent.crcs_of(self.parents_of(indices).tolist())

    def _check_inner(self, index: int, data, expected: int | None) -> None:
        self.parent.check(int(self.parents_of([index])[0]), data, expected)

    def records(self, *, check: bool) -> Iterator[tuple[int, bytes, int]]:
        """``(index, payload, label)`` of the selected records in order, read a
        run at a time."""
        done = 0
        for start, stop in self.selection.runs():
            for lo in range(start, stop, _STEP):
                batch = list(range(lo, min(stop, lo + _STEP)))
                payloads = self.parent.read_many(batch, check=check)
                labels = self.parent.labels[np.asarray(batch)]
                for k, (data, label) in enumerate(zip(payloads, np.asarray(labels).tolist())):
                    yield done + k, data, int(label)
                done += len(batch)

    def inner(self) -> list[Reader]:
        return [self.parent] if self.parent is not None else []

    def _make_keys(self):
        return MappedKeys(self.parent.keys, self.selection)

    def key_of(self, index: int) -> str | None:
        try:
            return self.parent.key_of(int(self.parents_of([index])[0]))
        except (IndexError, ValueError):
            return None

    # -- metadata -----------------------------------------------------------------

    @property
    def has_metadata(self) -> bool:
        return self.parent.has_metadata

    def metadata_many(self, indices: Sequence[int]) -> list[dict]:
        return self.parent.metadata_many(self.parents_of(self._normalise(indices)).tolist())

    def metadata_bytes_many(self, indices, *, check: bool = True):
        return self.parent.metadata_bytes_many(self.parents_of(indices).tolist(), check=check)

    def metadata_crcs(self):
        crcs = self.parent.metadata_crcs()
        return None if crcs is None else MappedColumn(crcs, self.selection)

    def check_metadata(self, index: int, data) -> None:
        self.parent.check_metadata(int(self.parents_of([index])[0]), data)

    def parse_metadata(self, index: int, data):
        return self.parent.parse_metadata(int(self.parents_of([index])[0]), data)

    # -- whole files and processes ------------------------------------------------

    def check_layout(self) -> list[dict]:
        return self.parent.check_layout()

    def check_files(self, on_bytes=None) -> list[dict]:
        return self.parent.check_files(on_bytes)

    def crash_path(self) -> str:
        return self.parent.crash_path()


class ShardedViewReader(ViewReader):
    """A view of a sharded dataset: the shard methods the streams, the
    read-ahead and the sampler's remote reads use, in view indices."""

    @property
    def shard_paths(self) -> list[str]:
        return self.parent.shard_paths

    def shard_sizes(self) -> list[int]:
        return self.parent.shard_sizes()

    def shard_copy(self, shard: int, cache=None) -> str:
        return self.parent.shard_copy(shard, cache)

    def attach_local(self, shard: int, path: str) -> None:
        self.parent.attach_local(shard, path)

    def detach_local(self, shard: int) -> None:
        self.parent.detach_local(shard)

    def side_path(self, shard: int, suffix: str) -> str:
        return self.parent.side_path(shard, suffix)

    def shard_ranges(self) -> list[tuple[int, int]]:
        """(first view record, record count) of every shard of the parent (a
        shard the view selects nothing of has count 0)."""
        bounds = self.parent.shard_ranges()
        edges = np.asarray([first for first, _ in bounds] + [len(self.parent)], np.int64)
        at = self.selection.rank(edges)
        return [(int(at[k]), int(at[k + 1] - at[k])) for k in range(len(bounds))]

    def shards_of(self, indices: Sequence[int]) -> list[int]:
        return self.parent.shards_of(self.parents_of(indices))

    def placement(self, indices) -> tuple[np.ndarray, np.ndarray]:
        return self.parent.placement(self.parents_of(indices))

    def iter_shard(self, shard: int) -> Iterator[tuple[int, bytes]]:
        first, count = self.shard_ranges()[shard]
        for lo in range(first, first + count, _STEP):
            batch = list(range(lo, min(first + count, lo + _STEP)))
            yield from zip(batch, self.read_many(batch))


def open_view(path, *, verify: bool = True, allow_outside: bool = False,
              settings: Mapping[str, Any] | None = None) -> ViewReader:
    """The reader of the view at ``path``: a :class:`ShardedViewReader` over a
    sharded parent."""
    reader = ViewReader(path, verify=verify, allow_outside=allow_outside, settings=settings)
    # Only the parent tells whether shard methods apply, and it is opened once.
    if hasattr(reader.parent, "shard_sizes"):
        reader.__class__ = ShardedViewReader
    return reader



def open_if_view(path, *, verify: bool = True, allow_outside: bool = False,
                 settings: Mapping[str, Any] | None = None, versions: bool = True):
    """The view's reader when ``path`` is a view file, else None (see
    ``fastdata.formats.reader.COMPOSITE_OPENERS``)."""
    from fastdata.dataset.view_file import is_view_file

    if not is_view_file(path):
        return None
    return open_view(path, verify=verify, allow_outside=allow_outside, settings=settings)

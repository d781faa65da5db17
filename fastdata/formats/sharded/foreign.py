"""Shards written by other tools (no fastdata manifest), for
:class:`~fastdata.formats.sharded.reader.ShardedReader`: scanned once on open
into the same index a fastdata manifest gives (a mixin; no torch here).
"""

from __future__ import annotations

import os

import numpy as np

from fastdata.contained import check_inside
from fastdata.errors import ManifestError
from fastdata.formats.remote_files import is_remote, local_copy
from fastdata.formats.sharded.index_rows import IndexRows
from fastdata.formats.sharded.layout import INDEX_DTYPE, ShardLayout, expand_shards
from fastdata.records import MANIFEST_VERSION, Manifest


class ForeignShards:
    """The scan of another tool's shards (``_scan_shard`` is the format's)."""

    def _load_foreign(self, layout: ShardLayout) -> None:
        paths = self._explicit or (self._remote_shards() if is_remote(self.path)
                                   else expand_shards(self.path, layout))
        if not self._explicit:  # files a pattern found: inside its folder, like a manifest's
            for p in paths:
                if not is_remote(p):
                    check_inside(p, layout.directory, field=repr(os.path.basename(p)),
                                 where=self.path, allow_outside=self.allow_outside,
                                 kind="shard")
        # Shards of another tool are scanned whole: remote ones are read from
        # a cached download.
        paths = [local_copy(p) for p in paths]
        if not paths:
            raise ManifestError(
                f"no fastdata manifest ({os.path.basename(layout.manifest_path)}) and no "
                f"shard files found", path=self.path)
        rows, keys, meta_rows = [], [], []
        for number, p in enumerate(paths):
            for offset, size, label, key, *meta in self._scan_shard(p):
                rows.append((number, offset, size, label, 0))
                keys.append(key)
                meta_rows.append((number, *(meta or (0, 0)), label, 0))
        if not rows:
            raise ManifestError("shards hold no records", path=self.path)
        index = np.array(rows, dtype=INDEX_DTYPE)
        labels = index["label"].astype(np.int64)
        n_classes = int(labels.max()) + 1 if len(labels) else 0
        counts = np.bincount(labels[labels >= 0], minlength=n_classes).tolist()
        self._manifest = Manifest(
            format=self.format_name, count=len(rows),
            classes=[str(i) for i in range(n_classes)], class_counts=counts,
            encoding={"storage": "keep", "formats": {}, "shape": None},
            bytes={"payload": int(index["size"].sum()),
                   "on_disk": sum(os.path.getsize(p) for p in paths)},
            checksums={}, shards=[{"path": os.path.basename(p), "count": 0,
                                   "bytes": os.path.getsize(p)} for p in paths],
            source={"root": None, "note": "shards written by another tool; index built by scan"},
            pack_options={}, created_at="", fastdata_version="", version=MANIFEST_VERSION,
            extra={"foreign": True},
        )
        meta_index = np.array(meta_rows, dtype=INDEX_DTYPE)
        with_meta = int(np.count_nonzero(meta_index["size"]))
        if with_meta:  # the .json members of another tool's tar
            self._manifest.extra["metadata"] = {"records": with_meta, "foreign": True}
            self._meta_index = meta_index
        for s, n in zip(self._manifest.shards, np.bincount(index["shard"],
                                                          minlength=len(paths)).tolist()):
            s["count"] = n
        # Built by the scan: every row is good.
        self._index = IndexRows(index, shard_sizes=[os.path.getsize(p) for p in paths],
                                path=self.path, classes=n_classes, checked=True)
        self._labels = labels
        self._crcs = None
        self._shard_paths = paths
        self._foreign_keys = keys
        self._keys_path = None

    def _remote_shards(self) -> list[str]:
        if any(c in os.path.basename(self.path) for c in "%{*?["):
            raise ManifestError("a shard pattern cannot be listed at a URL without a fastdata "
                                "manifest; give the NAME.fastdata.json URL or a list of shard "
                                "URLs", path=self.path)
        return [self.path]

"""Per-sample metadata of sharded datasets (tar, TFRecord); no torch here.

Each record's metadata JSON lies inside its own shard, as the format stores it
(a tar sample's ``KEY.json`` member, a TFRecord Example's ``fastdata/metadata``
feature). The metadata index ``NAME.fastdata.metadata.npy`` (see
``layout.py``) has the dataset index's row layout and points at those bytes:
shard, offset and size of the JSON (size 0: the record has none), the
record's label, and the CRC32 of the JSON. Reading a record's metadata is one
``pread`` of just its JSON. Another tool's tar has no such index: its
``.json`` members are located by the scan that builds its dataset index.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from fastdata.errors import CorruptDataError, ManifestError
from fastdata.formats.integrity import check_file_sha256
from fastdata.formats.remote_files import index_limit, is_remote, local_copy
from fastdata.formats.sharded.index_file import load_index
from fastdata.formats.sharded.index_file import index_source, load_pieces
from fastdata.formats.sharded.index_rows import IndexRows
from fastdata.formats.sparse import MIN_CHECKED, check_stored


def metadata_rows(index: np.ndarray, places, crcs) -> np.ndarray:
    """The metadata index of a dataset: ``index``'s rows with the (offset, size)
    of each record's metadata JSON (``places``) and its CRC32 (``crcs``)."""
    rows = index.copy()
    at = np.asarray(places, dtype=np.uint64).reshape(-1, 2)
    rows["offset"], rows["size"] = at[:, 0], at[:, 1]
    rows["crc32"] = np.asarray(crcs, dtype=np.uint32)
    return rows


class ShardedMetadata:
    """The metadata side of :class:`~fastdata.formats.sharded.reader.ShardedReader`
    (a mixin: it uses the reader's index, shard paths and file descriptors)."""

    def _metadata_rows(self) -> IndexRows:
        """The metadata index (see layout.py), loaded and checked on first use."""
        self._ensure_index()
        if self._meta_index is None:
            self._meta_index = self._load_metadata_index()
        return self._meta_index

    def _load_metadata_index(self) -> IndexRows:
        path = self._meta_index_path  # resolved with the manifest's other names
        if path is None:
            raise ManifestError("manifest field extra.metadata.index is missing (the name of "
                                "the metadata index); re-pack the dataset",
                                path=self._layout().manifest_path)
        meta = self.manifest.extra["metadata"]
        # One shard of a set (``_records``): the set's file, its rows sliced.
        first, count, total = self._records or (0, self.manifest.count, self.manifest.count)
        if self._meta_pieces_path is None or self._records is not None:
            local = local_copy(path, limit=index_limit(total))
            # Packed before per-piece checksums, or one shard of a set: checked whole.
            check_file_sha256(self.manifest, meta["index"], local,
                              what="the metadata index rows")
            rows = load_index(local, total)[first:first + count]
            if self._records is not None:
                rows = rows.copy()
                rows["shard"] = 0
            return IndexRows(rows, shard_sizes=self._shard_sizes, path=path,
                             classes=self._index.classes, same_shards_as=self._index)
        # Read a piece at a time; a piece is checked (CRC-32, rows inside their shards,
        # the same shards as the dataset index's rows) when first used.
        pieces = load_pieces(self.manifest, meta["index_pieces"], self._meta_pieces_path, total)
        return IndexRows.open(index_source(path, total), total, path=path, shard_sizes=self._shard_sizes,
                              classes=self._index.classes, pieces=pieces,
                              same_shards_as=self._index)

    def _load_metadata_crcs(self) -> np.ndarray | None:
        if self._foreign_keys is not None:
            return None  # another tool's tar: no checksums
        return self._metadata_rows()["crc32"]

    def _read_metadata_many(self, indices: Sequence[int]) -> list[bytes | None]:
        rows = self._metadata_rows()[np.asarray(indices, dtype=np.int64)]
        wanted = [k for k, size in enumerate(rows["size"].tolist()) if size]
        out: list[bytes | None] = [None] * len(indices)
        if not wanted:
            return out
        shards, offsets = rows["shard"].tolist(), rows["offset"].tolist()
        sizes = rows["size"].tolist()
        remote = [k for k in wanted if shards[k] not in self._local_shards
                  and is_remote(self._shard_paths[shards[k]])]
        for shard in sorted({shards[k] for k in remote}):
            ks = [k for k in remote if shards[k] == shard]
            got = self._ranged.read(self._shard_paths[shard],
                                    [(offsets[k], sizes[k]) for k in ks],
                                    size=self._shard_sizes[shard])
            for k, raw in zip(ks, got):
                out[k] = self._whole(indices[k], raw, sizes[k], shard, offsets[k])
        for k in sorted(set(wanted) - set(remote)):
            shard, offset, size = shards[k], offsets[k], sizes[k]
            if size >= MIN_CHECKED:  # a huge size over a hole is refused unread
                check_stored(self._fd(shard), offset, size, path=self._shard_paths[shard],
                             offset=offset, what=f"the metadata of record {indices[k]}")
            out[k] = self._whole(indices[k], os.pread(self._fd(shard), size, offset), size,
                                 shard, offset)
        return out

    def _whole(self, index: int, raw: bytes, size: int, shard: int, offset: int) -> bytes:
        if len(raw) != size:
            raise CorruptDataError(
                f"the metadata of record {index} is cut short: {len(raw)} of {size} bytes at "
                f"byte offset {offset} (the shard is truncated)", path=self._shard_paths[shard],
                key=self.key_of(index), record=index, offset=offset)
        return raw

"""The base of readers for sharded formats (tar, TFRecord); no torch here.

Random access comes from the dataset index (``NAME.fastdata.index.npy``, see
fastdata.formats.sharded.layout): record i is ``size`` bytes at ``offset`` in shard
``shard``, read with one ``os.pread``. Shards written by other tools (no
fastdata manifest) are scanned once on open to build the same index in memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np

from fastdata.contained import Folder, check_inside
from fastdata.errors import CorruptDataError, FastDataError, ManifestError
from fastdata.formats.integrity import check_file_sha256
from fastdata.formats.sharded.integrity import CHUNK_ROWS, index_problems, shard_problems
from fastdata.formats.reader import Reader, open_lock
from fastdata.formats.remote_files import (RangedReads, absolute, exists, fetched_manifest,
                                           index_limit, is_remote, local_copy,
                                           manifest_bytes, parallel_map, process_cache)
from fastdata.formats.registry import manifest_format
from fastdata.formats.sharded.index_file import file_error
from fastdata.formats.sharded.index_file import index_source, load_pieces
from fastdata.formats.sharded.index_rows import IndexRows
from fastdata.formats.sharded.foreign import ForeignShards
from fastdata.formats.sharded.layout import ShardLayout, parse_output
from fastdata.formats.sharded.key_pieces import ShardedKeys
from fastdata.formats.sharded.metadata import ShardedMetadata
from fastdata.formats.sharded.one_shard import set_of_shard, shard_manifest
from fastdata.formats.sparse import MIN_CHECKED, check_stored
from fastdata.records import Manifest


def shard_error(exc: OSError, path: str, doing: str = "open") -> FastDataError:
    """The error for a shard that cannot be opened or read: CorruptDataError,
    except for an exhausted file-descriptor limit, which is no damage."""
    return file_error(exc, path, doing=doing, what="shard")


def _sidecar(manifest: Manifest, field: str, where: str) -> str:
    """The name of a sidecar the manifest's ``extra`` must give (its form is
    checked with the manifest, see fastdata.manifest_schema)."""
    name = manifest.extra.get(field)
    if name is None:
        raise ManifestError(f"manifest field extra.{field} is missing (the name of the "
                            f"dataset's {field} file); re-pack the dataset", path=where)
    return name


class ShardedReader(ShardedMetadata, ShardedKeys, ForeignShards, Reader):
    """Reader over the shards of one dataset.

    Args:
        path: the ``NAME.fastdata.json`` manifest, a single shard, or a shard
            pattern (``out-%06d.tar``, ``out-{000000..000009}.tar``), or a list
            of shard files written by another tool.
        verify: check payload checksums on read.
        allow_outside: follow symbolic links that lead out of the dataset's
            folder (see :class:`fastdata.formats.reader.Reader`).

    Subclasses implement ``_scan_shard`` (for shards without a fastdata index)
    and may override ``_extract`` (turn the indexed bytes into the payload).
    """

    sharded = True
    #: Extensions of the format, first one preferred.
    extensions: tuple[str, ...] = ()
    total_in_name = False

    def __init__(self, path, *, verify: bool = True, allow_outside: bool = False) -> None:
        self._fds: dict[int, int] = {}
        self._manifest_file: str | None = None  # the manifest read, when there is one
        self._ranged = RangedReads()  # records of shards at URLs
        #: How far apart records read by range may be and go in one request
        #: (None: the store's own merging, 1 MiB); a view sets 0, since the
        #: bytes between its records are never needed.
        self.coalesce: int | None = None
        self._local_shards: dict[int, str] = {}  # remote shards with a downloaded copy
        self._index: IndexRows | None = None
        self._shard_paths: list[str] = []
        self._shard_sizes: list[int] = []
        self._foreign_keys: list[str] | None = None
        #: Rows (INDEX_DTYPE) locating each record's metadata JSON; loaded on first use.
        self._meta_index: np.ndarray | None = None
        self._meta_index_path: str | None = None
        self._meta_pieces_path: str | None = None
        #: Opened by one shard's name: the set's layout, and (first, count, set
        #: count) of the set's records kept (see ``_keep_shard``).
        self._set_layout: ShardLayout | None = None
        self._records: tuple[int, int, int] | None = None
        if isinstance(path, (list, tuple)):
            if not path:
                raise ManifestError("no shard files given (an empty list)")
            self._explicit = [absolute(p) for p in path]
            path = self._explicit[0]
        else:
            self._explicit = None
        super().__init__(path, verify=verify, allow_outside=allow_outside)

    # -- hooks ----------------------------------------------------------------

    def _scan_shard(self, path: str) -> list[tuple]:
        """(offset, size, label, key) of every record of a foreign shard, and
        where the record's metadata JSON lies (offset, size; size 0: none) for
        formats that find such metadata."""
        raise NotImplementedError

    def _extract(self, raw: bytes, shard: int, offset: int) -> bytes:
        """The payload inside the indexed bytes (identity by default)."""
        return raw

    # -- metadata ---------------------------------------------------------------

    def _layout(self) -> ShardLayout:
        if self._set_layout is not None:  # one shard of a set: the set's files
            return self._set_layout
        return parse_output(self.path, self.extensions, sharded=False,
                            total_in_name=self.total_in_name)

    def _load_metadata(self) -> None:
        self._set_layout = self._records = None
        layout = self._layout()
        manifest_path = None if self._explicit is not None else self._manifest_path(layout)
        if manifest_path is not None:
            self._load_fastdata(layout, manifest_path)
            return
        found = None if self._explicit is not None else set_of_shard(
            self.path, self.extensions, total_in_name=self.total_in_name)
        if found is None:
            self._load_foreign(layout)
            return
        self._set_layout, manifest_path, shard = found
        self._load_fastdata(self._set_layout, manifest_path)
        self._keep_shard(shard, os.path.basename(manifest_path))

    def _keep_shard(self, shard: int, set_name: str) -> None:
        """Become shard ``shard`` of the set just loaded: its records only, with
        the set's classes, keys and checksums (see fastdata.formats.sharded.one_shard)."""
        first, count = self.shard_ranges()[shard]
        index = self._index[first:first + count]  # checked as it is read
        index["shard"] = 0
        self._records = (first, count, len(self._index))  # rows of the set's files kept
        self._manifest = shard_manifest(self._manifest, shard, index, index["label"], set_name)
        self._shard_paths = [self._shard_paths[shard]]
        self._shard_sizes = [self._shard_sizes[shard]]
        self._index = IndexRows(index, shard_sizes=self._shard_sizes, path=self._index.path,
                                classes=self._index.classes, checked=True)
        self._labels, self._crcs = self._index["label"], self._index["crc32"]

    @property
    def dataset_path(self) -> str:
        """The dataset's manifest (its name whatever pattern or shard opened
        it); the path itself for shards without one, or one shard of a set."""
        if self._set_layout is None and self._records is None and self._manifest_file:
            return self._manifest_file
        return self.url or self.path

    def _manifest_path(self, layout: ShardLayout) -> str | None:
        """This dataset's manifest: under the current name, or else under the
        earlier naming (``PREFIX.fastdata.json``) when that one is of this format
        (another format's dataset may own that name); None when there is none."""
        if fetched_manifest(layout.manifest_path) or exists(layout.manifest_path):
            return layout.manifest_path
        legacy = layout.legacy_manifest_path
        if legacy != layout.manifest_path and exists(legacy):
            found = manifest_format(legacy)
            if found is None or found == self.format_name:  # unreadable: let its error show
                return legacy
        return None

    def _load_fastdata(self, layout: ShardLayout, manifest_path: str) -> None:
        self._manifest_file = manifest_path
        manifest = self._accept_manifest(manifest_bytes(manifest_path, for_reader=True),
                                         manifest_path)
        # Every name resolved (and refused if it leads outside) before any is opened.
        folder = Folder(layout.directory, where=manifest_path, links_out=self.allow_outside)
        inside = folder.path
        shard_paths = folder.paths([s["path"] for s in manifest.shards], "shards[{}].path")
        index_path = inside(_sidecar(manifest, "index", manifest_path), "extra.index")
        keys_path = inside(_sidecar(manifest, "keys", manifest_path), "extra.keys")
        meta = manifest.extra.get("metadata")
        meta_name = meta.get("index") if isinstance(meta, dict) else None
        # Loaded on first use, but refused now like every other name.
        self._meta_index_path = None if meta_name is None else inside(
            meta_name, "extra.metadata.index")
        piece_paths = {}
        for field, holder in (("extra.index_pieces", manifest.extra),
                              ("extra.metadata.index_pieces", meta),
                              ("extra.keys_pieces", manifest.extra)):
            found = holder.get(field.rsplit(".", 1)[1]) if isinstance(holder, dict) else None
            if found is not None:
                if not isinstance(found, dict) or "file" not in found:
                    raise ManifestError(f"manifest field {field} names no file (its "
                                        f"\"file\"); re-pack the dataset", path=manifest_path)
                piece_paths[field] = inside(found["file"], field + ".file")
        self._meta_pieces_path = piece_paths.get("extra.metadata.index_pieces")
        self._keys_pieces_path = piece_paths.get("extra.keys_pieces")
        self._key_pieces = None
        # The sizes the manifest gives (one stat per shard at open would cost
        # seconds at 10^5 shards): a record past the end of a shorter file is
        # refused when read, as "cut short (the shard is truncated)".
        sizes = [int(s.get("bytes", 0)) for s in manifest.shards]
        if not is_remote(layout.directory):
            listed = folder.plain_files()
            for p, s in zip(shard_paths, manifest.shards):
                if not listed.get(s["path"]) and not os.path.exists(p):
                    raise CorruptDataError("shard file is missing", path=p)
        pieces = None
        if "extra.index_pieces" in piece_paths:
            pieces = load_pieces(manifest, manifest.extra["index_pieces"],
                                 piece_paths["extra.index_pieces"], manifest.count)
            # At a URL: the pieces read by ranges into the machine's shared copy.
            local_index = index_source(index_path, manifest.count)
        else:
            local_index = local_copy(index_path, limit=index_limit(manifest.count))
            # Packed before per-piece checksums: the file is checked whole,
            # before its header is parsed.
            check_file_sha256(manifest, manifest.extra["index"], local_index,
                              what="the dataset index rows")
        classes = len(manifest.classes) if isinstance(manifest.classes, list) else 0
        # Read a piece at a time; each checked (CRC-32, rows inside their shards,
        # labels) when a record of it is first used.
        index = IndexRows.open(local_index, manifest.count, path=index_path, shard_sizes=sizes,
                               classes=classes, pieces=pieces)
        self._manifest = manifest
        self._index = index
        self._labels = index["label"]
        self._crcs = index["crc32"]
        self._shard_paths = shard_paths
        self._keys_path = keys_path
        self._shard_sizes = sizes

    def __getstate__(self):
        state = super().__getstate__()
        state.update(_fds={}, _local_shards={})
        if state.get("_foreign_keys") is None:
            state["_index"] = None  # reloaded (memory-light) from the .npy in the worker
            state["_meta_index"] = None
        else:
            state["_labels"] = self._labels  # else every worker would re-scan the shards
        return state

    def _ensure_index(self) -> np.ndarray:
        if self._index is None:
            self._load()
        return self._index

    @property
    def shard_paths(self) -> list[str]:
        self._ensure_index()
        return self._shard_paths

    def shard_ranges(self) -> list[tuple[int, int]]:
        """(first record, record count) of every shard, in shard order."""
        self._ensure_index()
        # The manifest's per-shard counts (a dataset's rows are in shard order).
        counts = np.asarray([int(s["count"]) for s in self._manifest.shards], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        return [(int(s), int(c)) for s, c in zip(starts, counts)]

    def shard_rows(self, shard: int, *, checked: bool = True) -> np.ndarray:
        """The dataset index rows of one shard's records, in order (``INDEX_DTYPE``:
        shard, offset, size, label, crc32); ``checked=False``: as stored, for
        ``verify``, which reports a damaged piece of the index on its own."""
        first, count = self.shard_ranges()[shard]
        index = self._ensure_index()
        return index[first:first + count] if checked else index.unchecked(first, first + count)

    def check_layout(self) -> list[dict]:
        index = self._ensure_index()
        where = os.path.join(self._layout().directory, self.manifest.extra.get("index", ""))
        try:
            index.check_all()
        except CorruptDataError as exc:
            return [{"index": None, "path": where, "reason": exc.message}]
        chunks = (index.unchecked(lo, min(len(index), lo + CHUNK_ROWS))
                  for lo in range(0, len(index), CHUNK_ROWS))
        return index_problems(chunks, self.manifest.shards, self._shard_paths, where)

    def shard_copy(self, shard: int, cache=None) -> str:
        """A local file of shard ``shard``: itself, or a download into ``cache``
        (default: the process's) of at most the bytes the manifest gives it,
        which the cache reserves (and makes room for) before the download."""
        url = self.shard_paths[shard]
        if not is_remote(url):
            return url
        limit = None if self._foreign_keys is not None else \
            self.manifest.shards[shard].get("bytes")
        return (cache or process_cache()).local(url, size=limit)

    def side_path(self, shard: int, suffix: str) -> str:
        """The file beside shard ``shard`` named ``<shard><suffix>`` (a TFRecord
        ``.idx``), refused like the shards when a link takes it out of the
        dataset's folder."""
        path = self.shard_paths[shard] + suffix
        if is_remote(path) or self._explicit is not None:
            return path
        return check_inside(path, self._layout().directory, field=repr(os.path.basename(path)),
                            where=self.path, allow_outside=self.allow_outside, kind="file")

    def check_files(self, on_bytes=None, shards: range | None = None) -> list[dict]:
        self._ensure_index()
        shards = range(len(self._shard_paths)) if shards is None else shards
        # Checked whole: downloaded once.
        local = [self.shard_copy(n) for n in shards]
        problems = shard_problems([self.manifest.shards[n] for n in shards], local, on_bytes)
        named = dict(zip(local, (self._shard_paths[n] for n in shards)))
        for problem in problems:
            problem["path"] = named.get(problem["path"], problem["path"])
        return problems

    # -- reading ----------------------------------------------------------------

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:
            with open_lock():
                fd = self._fds.get(shard)
                if fd is None:
                    path = self._local_shards.get(shard, self._shard_paths[shard])
                    try:
                        fd = os.open(path, os.O_RDONLY)
                    except OSError as exc:
                        raise shard_error(exc, path) from None
                    self._fds[shard] = fd
        return fd

    def _read_many(self, indices: Sequence[int]) -> list[bytes]:
        index = self._ensure_index()
        rows = index[np.asarray(indices, dtype=np.int64)]
        if self._shard_paths and is_remote(self._shard_paths[0]) and \
                not set(rows["shard"].tolist()) <= self._local_shards.keys():
            return self._read_remote(indices, rows)
        out = []
        # Plain ints: numpy scalar field access costs more than the pread itself.
        for i, shard, offset, size in zip(indices, rows["shard"].tolist(),
                                          rows["offset"].tolist(), rows["size"].tolist()):
            if size >= MIN_CHECKED:  # a huge record over a hole is refused unread
                check_stored(self._fd(shard), offset, size, path=self._shard_paths[shard],
                             offset=offset, what=f"record {i}")
            raw = os.pread(self._fd(shard), size, offset)
            if len(raw) != size:
                raise CorruptDataError(
                    f"record {i} is cut short: {len(raw)} of {size} bytes at byte offset {offset} "
                    f"(the shard is truncated)", path=self._shard_paths[shard],
                    key=self.key_of(i), record=i, offset=offset)
            try:
                out.append(self._extract(raw, shard, offset))
            except CorruptDataError as exc:
                if exc.record is not None or exc.key is not None:
                    raise
                # The container's framing names a byte offset; the reader knows the record.
                raise CorruptDataError(exc.message, path=exc.path, key=self.key_of(i),
                                       offset=exc.offset, record=i) from None
        return out

    def shards_of(self, indices: Sequence[int]) -> list[int]:
        """The shards holding ``indices``, each once, in order of first use."""
        shards = self._ensure_index()[np.asarray(indices, dtype=np.int64)]["shard"]
        return list(dict.fromkeys(shards.tolist()))

    def attach_local(self, shard: int, path: str) -> None:
        """Read remote shard ``shard`` from ``path``, a downloaded copy, from now on
        (in this process)."""
        self._ensure_index()
        self._local_shards[shard] = path

    def detach_local(self, shard: int) -> None:
        """Read remote shard ``shard`` by range again (its copy may go)."""
        with open_lock():
            self._local_shards.pop(shard, None)
            fd = self._fds.pop(shard, None)
        if fd is not None:
            os.close(fd)

    def placement(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """The shard and the stored size of each record of ``indices``."""
        rows = self._ensure_index()[np.asarray(indices, dtype=np.int64)]
        return rows["shard"], rows["size"]

    def shard_sizes(self) -> list[int]:
        """Every shard's size in bytes, as the manifest (or the listing) gives it."""
        self._ensure_index()
        return list(self._shard_sizes)

    def _read_remote(self, indices: Sequence[int], rows: np.ndarray) -> list[bytes]:
        """Records of remote shards: the ranges of each shard in one request
        (the client coalesces neighbouring ranges)."""
        out: list = [None] * len(indices)
        shards = rows["shard"].tolist()
        groups: dict[int, list[int]] = {}
        for k, shard in enumerate(shards):
            groups.setdefault(shard, []).append(k)
        local = {s: ks for s, ks in groups.items() if s in self._local_shards}
        for shard, ks in local.items():  # a downloaded copy: local reads
            for k, raw in zip(ks, self._read_many([indices[k] for k in ks])):
                out[k] = raw

        def ranged(item: tuple[int, list[int]]) -> None:
            shard, ks = item
            ranges = [(int(rows["offset"][k]), int(rows["size"][k])) for k in ks]
            url = self._shard_paths[shard]
            got = self._ranged.read(url, ranges, size=self._shard_sizes[shard],
                                    coalesce=self.coalesce)
            for k, (offset, size), raw in zip(ks, ranges, got):
                if len(raw) != size:
                    raise CorruptDataError(
                        f"record {indices[k]} is cut short: {len(raw)} of {size} bytes at "
                        f"byte offset {offset} (the shard is truncated)", path=url,
                        key=self.key_of(indices[k]), record=indices[k])
                out[k] = self._extract(raw, shard, offset)

        # Each shard's ranges are one request; the shards' requests run at once.
        parallel_map(ranged, [(s, ks) for s, ks in sorted(groups.items()) if s not in local])
        return out

    def _iter_payloads(self) -> Iterator[tuple[int, bytes]]:
        for shard in range(len(self.shard_paths)):
            yield from self.iter_shard(shard)

    def iter_shard(self, shard: int) -> Iterator[tuple[int, bytes]]:
        """(index, payload) of the records of one shard, in order: a local shard
        as the format streams it, a remote one by ranged reads."""
        self._ensure_index()
        if is_remote(self._shard_paths[shard]):
            return self._iter_ranged(shard)
        return self._iter_local_shard(shard)

    def _iter_local_shard(self, shard: int) -> Iterator[tuple[int, bytes]]:
        return self._iter_ranged(shard)

    def _iter_ranged(self, shard: int) -> Iterator[tuple[int, bytes]]:
        first, count = self.shard_ranges()[shard]
        step = 64
        for start in range(first, first + count, step):
            batch = list(range(start, min(start + step, first + count)))
            yield from zip(batch, self._read_many(batch))

    def _forget_handles(self) -> None:
        # Descriptors inherited across fork stay usable: pread has no shared
        # file position, so parent and child never disturb each other.
        pass

    def _close_handles(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}

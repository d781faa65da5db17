"""The base of writers that roll shard files (tar, TFRecord); naming in ``layout.py``."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from contextvars import ContextVar

import numpy as np

from fastdata.errors import OutputExistsError
from fastdata.formats.integrity import file_sha256, with_metadata_sha256
from fastdata.formats.output import remove_path
from fastdata.formats.record_spool import PIECE_KEYS, RowSpool
from fastdata.formats.registry import manifest_format
from fastdata.formats.sharded import index_rows
from fastdata.formats.sharded.layout import parse_output, parse_shard_size
from fastdata.formats.sharded.publish import PublishPlan, publish
from fastdata.formats.sharded.spooled_index import SPOOLED_ROW, save_index, save_metadata_index
from fastdata.formats.writer import Writer
from fastdata.records import Manifest, Record

#: Called as ``listener(number, temp_paths, final_names)`` each time a shard's
#: files are complete on disk (final_names None when they depend on the shard
#: count): a pack to a URL uploads shards while the next ones are written.
shard_listener: ContextVar[Callable | None] = ContextVar("shard_listener", default=None)


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


class ShardedWriter(Writer):  # noqa: PLR0904 - the writer and its piece interface
    """Base of writers that roll shard files (tar, TFRecord).

    Shards are written into a temporary folder beside the output and moved to
    their final names at the end (the final names may include the total shard
    count); the index, keys and finally the manifest follow, so a crash leaves
    no manifest and nothing that looks complete. An overwrite keeps the old
    dataset whole until the manifest switches (see ``publish.py``).

    The base opens each shard as a :class:`ShardFile` (``self._shard``), which
    hashes and counts what is written. Subclasses implement
    ``_append(record, crc) -> (offset, size[, metadata_offset])``, writing the
    record to ``self._shard`` and returning where its payload lies (and, for a
    record with metadata, where its JSON lies: the base lists those places in
    ``NAME.fastdata.metadata.npy``, see ``layout.py``), and may implement
    ``_begin_shard(path)`` (per-shard state) and ``_end_shard() -> dict``
    (a trailer written to ``self._shard``, extra per-shard facts); they may
    override the class method ``_shard_files(name)`` to publish side files
    (per-shard index files: published, uploaded and replaced with their
    shard) and ``_stored_size(record)`` so a byte ``shard_size`` counts their
    framing (tar headers and padding).
    """

    output_is_dir = True
    resumable = True
    stores_metadata = True
    #: Shard names carry the total ("-00000-of-00008").
    total_in_name = False
    #: Extensions of this format, first one preferred.
    extensions: tuple[str, ...] = ()

    def __init__(self, path, *, overwrite: bool = False, shard_size: str | int | None = None,
                 resume_path: str | None = None, detached_dir: str | None = None) -> None:
        self.max_records, self.max_bytes = parse_shard_size(shard_size)
        sharded = self.max_records is not None or self.max_bytes is not None
        self.layout = parse_output(path, self.extensions, sharded=sharded,
                                   total_in_name=self.total_in_name).with_current_names()
        self._given = os.path.abspath(os.fspath(path))
        self._shards: list[dict] = []
        self._shard_count = 0
        self._shard: ShardFile | None = None
        self._files: list[str] = []
        #: Manifests of the earlier naming that the publish replaced (an overwrite).
        self.replaced_legacy: list[str] = []
        # The base class makes the temp folder and the lock next to "path"; use
        # the sidecars' stem ("out.tar") so patterns with "%" never reach the
        # file system and two formats' outputs with one prefix never share a lock.
        super().__init__(os.path.join(self.layout.directory, self.layout.sidecar_stem),
                         overwrite=overwrite, resume_path=resume_path,
                         detached_dir=detached_dir)

    @classmethod
    def output_stem(cls, path, *, shard_size=None, **options) -> str:
        max_records, max_bytes = parse_shard_size(shard_size)
        layout = parse_output(path, cls.extensions,
                              sharded=max_records is not None or max_bytes is not None,
                              total_in_name=cls.total_in_name).with_current_names()
        return os.path.join(layout.directory, layout.sidecar_stem)

    def _output_name(self) -> str:
        return self._given

    @classmethod
    def remote_marker(cls, url: str) -> str:
        from fastdata.formats.sharded.remote import manifest_url

        return manifest_url(url, cls.extensions)

    @classmethod
    def remote_files(cls, url: str) -> list[str]:
        from fastdata.formats.sharded.remote import dataset_objects

        return dataset_objects(url, cls.extensions, cls._shard_files)

    def _check_existing(self) -> None:
        if self.overwrite:
            return
        for manifest in (self.layout.manifest_path, self._legacy_manifest()):
            if manifest is not None and os.path.lexists(manifest):
                raise OutputExistsError("a dataset with this name exists; pass overwrite=True "
                                        "to replace it", path=manifest)
        single = os.path.join(self.layout.directory, self.layout.shard_name(0, 1))
        if self.layout.pattern is None and os.path.lexists(single):
            raise OutputExistsError("output already exists; pass overwrite=True to replace it",
                                    path=single)

    def _legacy_manifest(self) -> str | None:
        """The manifest of this output under the earlier naming (after the prefix
        alone), when one of this format is there; another format's is not ours."""
        path = self.layout.legacy_manifest_path
        if os.path.lexists(path) and manifest_format(path) == self.format_name:
            return path
        return None

    # -- hooks ----------------------------------------------------------------

    def _begin_shard(self, path: str) -> None:
        pass

    def _append(self, record: Record, crc: int) -> tuple[int, int]:
        raise NotImplementedError

    def _end_shard(self) -> dict:
        return {}

    @classmethod
    def _shard_files(cls, name: str) -> list[str]:
        """Files making up shard ``name`` (the shard and any side files)."""
        return [name]

    def _manifest_extra(self) -> dict:
        """Format-specific entries for the manifest's ``extra`` (key schema, ...)."""
        return {}

    # -- Writer implementation --------------------------------------------------

    def _open(self, temp_path: str) -> None:
        pass

    def _init_records(self, spool: str) -> None:
        super()._init_records(spool)
        #: Per record: its index row and where its metadata JSON lies (on disk).
        self._rows = RowSpool(os.path.join(spool, "rows.bin"), SPOOLED_ROW)
        self._spools.append(self._rows)

    def _temp_shard_name(self, number: int) -> str:
        if self.piece_mode:  # named after the piece: a resumed pack adds shards between
            return f"piece-{getattr(self, '_piece', 0):06d}{self.layout.extension}"
        return f"shard-{number:06d}{self.layout.extension}"

    def _stored_size(self, record: Record) -> int:
        """Bytes ``record`` will take in its shard (framing included); what a
        byte ``shard_size`` counts."""
        return len(record.payload)

    def stored_size_of(self, key: str, label: int, size: int, encoding: str,
                       metadata_size: int = 0) -> int:
        """Bytes a record of ``size`` payload bytes (and ``metadata_size`` bytes
        of metadata JSON) takes in a shard (a pack's plan cuts byte-sized
        shards with it before any image is read)."""
        # A negative index of its own each time: the formats cache the last
        # record they sized by its index.
        self._sized = getattr(self, "_sized", 0) + 1
        metadata = bytes(metadata_size) if metadata_size > 0 else None
        return self._stored_size(Record(-self._sized, key, label, bytes(size), encoding,
                                        metadata=metadata))

    def _write(self, record: Record, crc: int) -> None:
        if self._shard is not None and not self.piece_mode and (
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
        offset, length, *meta_at = self._append(record, crc)
        meta = record.metadata
        meta_place = (meta_at[0], len(meta)) if meta is not None and meta_at else (0, 0)
        self._rows.append((len(self._shards), offset, length, record.label, crc, *meta_place))
        self._shard_count += 1

    def _finish_shard(self) -> None:
        extra = self._end_shard()
        shard, self._shard = self._shard, None
        shard.close()
        self._shards.append({"temp": shard.path, "count": self._shard_count,
                             "sha256": shard.sha256, "first": self._shard_first, **extra})
        listener = shard_listener.get()
        if listener is not None:
            number = len(self._shards) - 1
            temp = os.path.basename(shard.path)
            listener(number, [os.path.join(self.temp_path, name)
                              for name in self._shard_files(temp)], self.final_shard_names(number))

    # -- pieces (resumable packs): a piece is one shard, or none when all its
    # images were skipped ------------------------------------------------------

    def _end_piece(self, number: int) -> dict:
        if self._shard is None:
            return {"shard": None}
        renamed_before = len(self._renamed_rows())
        first_row = len(self._rows) - self._shard_count
        self._finish_shard()
        info = self._shards[-1]
        temp = os.path.basename(info["temp"])
        files = {name: file_sha256(os.path.join(self.temp_path, name))
                 for name in self._shard_files(temp)[1:]}
        rows = self._rows.rows(first_row)
        state = {"shard": {k: v for k, v in info.items() if k not in ("temp", "first")}
                 | {"temp": temp, "size": os.path.getsize(info["temp"])},
                 "side_files": files,
                 "rows": [list(r) for r in rows[["offset", "size", "label", "crc32"]].tolist()],
                 "renamed": [list(r[:2]) + [r[3]]
                             for r in self._renamed_rows()[renamed_before:]]}
        if rows["meta_size"].any():  # where the piece's metadata lies
            state["metadata_rows"] = [list(r) for r in
                                      rows[["meta_offset", "meta_size"]].tolist()]
        return state

    def _renamed_rows(self) -> list:
        """(key, stem, shard, reason) of records stored under another name (tar)."""
        return []

    def _reopen(self, temp_path: str) -> None:
        if not os.path.isdir(temp_path):
            from fastdata.formats.writer import PieceLost

            raise PieceLost("the partial output is gone", path=temp_path)

    def _check_piece(self, number: int, state: dict, records: list) -> None:
        from fastdata.formats.writer import PieceLost

        shard = state.get("shard")
        if shard is None:
            if records:
                raise PieceLost(f"piece {number} has records but no shard", path=self.temp_path)
            return
        path = os.path.join(self.temp_path, shard["temp"])
        try:
            whole = (os.path.getsize(path) == shard["size"]
                     and file_sha256(path) == shard["sha256"]
                     and all(file_sha256(os.path.join(self.temp_path, name)) == digest
                             for name, digest in state.get("side_files", {}).items()))
        except OSError:
            whole = False
        meta_rows = state.get("metadata_rows", [[0, 0]] * len(records))
        sizes = [0 if r.metadata is None else len(r.metadata) for r in records]
        if (not whole or len(state["rows"]) != len(records)
                or [size for _, size in meta_rows] != sizes):
            raise PieceLost(f"piece {number} is not whole in the partial output", path=path)

    def _adopt_piece(self, number: int, state: dict, records: list) -> None:
        shard = state.get("shard")
        if shard is None:
            return
        number_now = len(self._shards)
        extra = {k: v for k, v in shard.items() if k not in ("temp", "size", "count", "sha256")}
        self._shards.append({"temp": os.path.join(self.temp_path, shard["temp"]),
                             "count": shard["count"], "sha256": shard["sha256"],
                             "first": self.count, **extra})
        places = state.get("metadata_rows", [[0, 0]] * len(state["rows"]))
        self._rows.extend((number_now, *row, *place)
                          for row, place in zip(state["rows"], places))
        self._adopt_renamed(number_now, state.get("renamed", []))

    def _adopt_renamed(self, shard: int, renamed: list) -> None:
        """Take back the renamed keys of an adopted shard (tar)."""

    def _payloads(self, number: int, state: dict, records: list):
        if state.get("shard") is None:
            return
        with open(os.path.join(self.temp_path, state["shard"]["temp"]), "rb") as f:
            for offset, length, *_ in state["rows"]:
                f.seek(offset)
                yield self._payload_of(f.read(length))

    def _payload_of(self, stored: bytes) -> bytes:
        """A record's payload from the bytes its index row points at."""
        return stored

    def final_shard_names(self, number: int) -> list[str] | None:
        """The published names of shard ``number``'s files, when they do not
        depend on how many shards there will be (else None)."""
        pattern = self.layout.pattern
        if pattern is not None and "{total" in pattern:
            return None
        return self._shard_files(self.layout.shard_name(number))

    def _discard(self) -> None:
        if self._shard is not None:
            try:
                self._shard.close(sync=False)
            except OSError:
                pass
            self._shard = None

    def _close(self, manifest: Manifest) -> Manifest:
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
        self._save_index()
        with open(os.path.join(self.temp_path, "keys.json"), "wb") as f:
            key_pieces = self._keys.write_json(f, PIECE_KEYS)
        np.save(os.path.join(self.temp_path, "keys-pieces.npy"), key_pieces, allow_pickle=False)
        extra = {"index": os.path.basename(self.layout.index_path),
                 "index_pieces": {"rows": index_rows.PIECE_ROWS,
                                  "file": os.path.basename(self.layout.index_pieces_path)},
                 "keys": os.path.basename(self.layout.keys_path),
                 "keys_pieces": {"keys": PIECE_KEYS,
                                 "file": os.path.basename(self.layout.keys_pieces_path)},
                 "prefix": self.layout.prefix, **self._manifest_extra()}
        if self.has_metadata:
            self._save_metadata_index()
            extra["metadata"] = {"records": self.metadata_records,
                                 "index": os.path.basename(self.layout.metadata_path),
                                 "index_pieces": {
                                     "rows": index_rows.PIECE_ROWS,
                                     "file": os.path.basename(self.layout.metadata_pieces_path)},
                                 **self._metadata_extra()}
        manifest = with_metadata_sha256(manifest, self._sidecar_digests())
        manifest = dataclasses.replace(
            manifest,
            bytes=dict(manifest.bytes, on_disk=on_disk),
            shards=shards,
            extra=extra,
        )
        with open(os.path.join(self.temp_path, "manifest.json"), "w", encoding="utf-8") as f:
            f.write(manifest.to_json())
        return manifest

    def _metadata_extra(self) -> dict:
        """Where the format keeps each record's metadata, for the manifest's
        ``extra["metadata"]`` (the tar member, the TFRecord feature)."""
        return {}

    def _save_index(self) -> None:
        """``index.npy`` and its pieces' checksums (``index-crc.npy``)."""
        save_index(self.temp_path, self._rows)

    def _save_metadata_index(self) -> None:
        """``metadata.npy`` and its pieces' checksums (``metadata-crc.npy``)."""
        save_metadata_index(self.temp_path, self._rows, self.fact_blocks())

    def _sidecars(self) -> list[tuple[str, str]]:
        """(name in the temporary folder, final name) of every sidecar but the manifest."""
        layout = self.layout
        found = [("index.npy", os.path.basename(layout.index_path)),
                 ("index-crc.npy", os.path.basename(layout.index_pieces_path)),
                 ("keys.json", os.path.basename(layout.keys_path)),
                 ("keys-pieces.npy", os.path.basename(layout.keys_pieces_path))]
        if self.has_metadata:
            found += [("metadata.npy", os.path.basename(layout.metadata_path)),
                      ("metadata-crc.npy", os.path.basename(layout.metadata_pieces_path))]
        return found

    def _sidecar_digests(self) -> dict[str, str]:
        """SHA-256 of the index, keys (and metadata index) files as written, by
        their final names."""
        return {final: file_sha256(os.path.join(self.temp_path, temp))
                for temp, final in self._sidecars()}

    def _publish(self) -> None:
        layout = self.layout
        total = len(self._shards)
        moves = []
        for number, info in enumerate(self._shards):
            temp_name = os.path.basename(info["temp"])
            final_name = layout.shard_name(number, total)
            moves += zip(self._shard_files(temp_name), self._shard_files(final_name))
        moves += self._sidecars()
        legacy = self._legacy_manifest() if self.overwrite else None
        publish(PublishPlan(
            directory=layout.directory, temp_dir=self.temp_path, moves=tuple(moves),
            manifest=("manifest.json", os.path.basename(layout.manifest_path)),
            overwrite=self.overwrite, shard_files=self._shard_files,
            owns_shard=lambda name: layout.owns(name, self.extensions),
            sidecars=(os.path.basename(layout.index_path), os.path.basename(layout.keys_path),
                      os.path.basename(layout.metadata_path),
                      os.path.basename(layout.index_pieces_path),
                      os.path.basename(layout.metadata_pieces_path),
                      os.path.basename(layout.keys_pieces_path), *layout.legacy_sidecars),
            legacy_manifest=os.path.basename(legacy) if legacy else None,
        ))
        self.replaced_legacy = [legacy] if legacy else []
        self._files = [os.path.join(layout.directory, final) for _, final in moves]
        self._files.append(layout.manifest_path)
        remove_path(self.temp_path)

    @property
    def output_path(self) -> str:
        """What to pass to ``open_dataset``: the manifest sidecar."""
        return self.layout.manifest_path

    @property
    def files(self) -> list[str]:
        """Every file the publish put in place: shards (with their side files), the
        index and keys, and the manifest last."""
        return list(self._files)

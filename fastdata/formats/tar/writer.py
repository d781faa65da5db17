"""Tar shard writer: records as webdataset-style samples (schema in ``schema.py``)."""

from __future__ import annotations

import json
import os

from fastdata.errors import FastDataError
from fastdata.formats.sharded.writer import ShardedWriter
from fastdata.formats.tar.info import (
    INFO_NAME,
    check_split,
    default_split,
    read_info,
    stage_remote_info,
    update_info,
)
from fastdata.formats.tar.schema import (
    END_OF_ARCHIVE,
    EXTENSIONS,
    JSON_EXT,
    LABEL_EXT,
    MEMBER_SCHEMA,
    image_extension,
    member_header,
    padding,
    unique_stem,
)
from fastdata.formats.writer import UploadStep
from fastdata.records import Manifest, Record, RenamedKey


class TarWriter(ShardedWriter):
    """Writes records as webdataset-style tar shards (see the module doc).

    Args:
        path: output: ``out.tar``, ``out-%06d.tar``, ``out-{000000..000099}.tar``
            (see fastdata.formats.sharded.layout for naming and sidecars).
        overwrite: replace an existing dataset of that name.
        shard_size: records per shard (``10000``) or bytes per shard (``"256MB"``,
            counted on disk: headers and padding included).
        write_json: also write a ``KEY.json`` member ``{"key", "label"}`` for
            each sample without metadata (a sample with metadata always has a
            ``KEY.json``: its metadata, exactly; see ``schema.py``).
        source_extensions: name image members after the source file's
            extension, lower-cased (``KEY.jpeg``), where it names the stored
            encoding, instead of the encoding's one extension (``KEY.jpg``),
            which is what webdataset, timm and Hugging Face look for.
        split: this output's split in the folder's ``_info.json`` (timm's
            dataset info, see ``info.py``); None: the output's prefix
            (``train-%06d.tar`` -> ``train``), or no entry when timm could not
            use that name.
    """

    format_name = "tar"
    extensions = EXTENSIONS

    def __init__(self, path, *, overwrite: bool = False, shard_size: str | int | None = None,
                 write_json: bool = False, source_extensions: bool = False,
                 split: str | None = None, resume_path: str | None = None,
                 detached_dir: str | None = None) -> None:
        self.write_json = bool(write_json)
        self.source_extensions = bool(source_extensions)
        self._split = None if split is None else check_split(split)
        self._info_shards: list[tuple[str, int]] = []
        self._stems: dict[str, str] = {}  # member stem -> key, in the current shard
        self._planned: tuple[int, tuple] | None = None
        self._renamed: list[tuple[str, str, int, str]] = []  # key, stem, shard, reason
        super().__init__(path, overwrite=overwrite, shard_size=shard_size,
                         resume_path=resume_path, detached_dir=detached_dir)

    # -- member layout ----------------------------------------------------------

    def _plan(self, record: Record) -> tuple[str, str | None, list[bytes], int, int, int]:
        """(sample stem, why it is not the key's, chunks to write, offset of the
        image data in them, total size, offset of the ``.json`` data in them)."""
        if self._planned is not None and self._planned[0] == record.index:
            return self._planned[1]
        stem, renamed = unique_stem(record.key, self._stems)
        ext = image_extension(record.key, record.encoding,
                              source_extensions=self.source_extensions)
        size = len(record.payload)
        head = member_header(f"{stem}.{ext}", size)
        label = str(int(record.label)).encode("ascii")
        chunks = [head, record.payload, bytes(padding(size)),
                  member_header(f"{stem}.{LABEL_EXT}", len(label)), label,
                  bytes(padding(len(label)))]
        meta = record.metadata
        if meta is None and self.write_json:
            meta = json.dumps({"key": record.key, "label": int(record.label)},
                              ensure_ascii=False).encode("utf-8")
        meta_at = 0
        if meta is not None:
            meta_head = member_header(f"{stem}.{JSON_EXT}", len(meta))
            meta_at = sum(len(c) for c in chunks) + len(meta_head)
            chunks += [meta_head, meta, bytes(padding(len(meta)))]
        plan = (stem, renamed, chunks, len(head), sum(len(c) for c in chunks), meta_at)
        self._planned = (record.index, plan)
        return plan

    # -- timm's _info.json beside the shards -----------------------------------------

    @property
    def info_split(self) -> str | None:
        """The split this output is written as in ``_info.json`` (None: none)."""
        return self._split if self._split is not None else default_split(self.layout.prefix)

    @property
    def info_path(self) -> str:
        return os.path.join(self.layout.directory, INFO_NAME)

    @classmethod
    def stage_remote(cls, folder: str, staging: str):
        return stage_remote_info(folder, staging)

    @classmethod
    def upload_step(cls, name: str) -> UploadStep | None:
        # It names shards: uploaded after them.
        return UploadStep.NAMES_DATA if name == INFO_NAME else None

    def _check_existing(self) -> None:
        super()._check_existing()
        if self.info_split is not None:
            read_info(self.info_path)  # someone else's file: refused before any packing

    def _close(self, manifest: Manifest) -> Manifest:
        manifest = super()._close(manifest)
        self._info_shards = [(s["path"], s["count"]) for s in manifest.shards]
        return manifest

    def _publish(self) -> None:
        super()._publish()
        split = self.info_split
        if split is None:
            return
        try:
            path = update_info(self.layout.directory, split, self._info_shards,
                               owns=lambda name: self.layout.owns(name, self.extensions))
        except OSError as exc:
            raise FastDataError(f"the dataset is complete, but timm's dataset info could not "
                                f"be updated ({exc.strerror or exc}); pack again with "
                                f"--overwrite once the folder is writable",
                                path=self.info_path) from None
        self._files.insert(len(self._files) - 1, path)  # the manifest stays last

    # -- ShardedWriter hooks ----------------------------------------------------------

    def _manifest_extra(self) -> dict:
        return {"member_schema": MEMBER_SCHEMA, "label_ext": LABEL_EXT,
                "json_member": self.write_json}

    def _metadata_extra(self) -> dict:
        return {"member": JSON_EXT}

    def _stored_size(self, record: Record) -> int:
        return self._plan(record)[4]

    def _renamed_rows(self) -> list:
        return self._renamed

    def _adopt_renamed(self, shard: int, renamed: list) -> None:
        self._renamed.extend((key, stem, shard, reason) for key, stem, reason in renamed)

    def renamed_keys(self) -> list[RenamedKey]:
        total = len(self._shards)
        return [RenamedKey(key, stem, self.layout.shard_name(shard, total), reason)
                for key, stem, shard, reason in self._renamed]

    def _begin_shard(self, path: str) -> None:
        self._stems = {}
        self._planned = None  # planned against the previous shard's names

    def _append(self, record: Record, crc: int) -> tuple[int, int, int]:
        stem, renamed, chunks, data_at, total, meta_at = self._plan(record)
        self._planned = None
        start = self._shard.position
        self._shard.write(b"".join(chunks))
        self._stems[stem] = record.key
        if renamed:
            self._renamed.append((record.key, stem, len(self._shards), renamed))
        return start + data_at, len(record.payload), start + meta_at

    def _end_shard(self) -> dict:
        self._shard.write(END_OF_ARCHIVE)
        return {}

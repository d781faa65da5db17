"""A packed dataset as a source: what ``fastdata convert`` reads.

Any dataset a fastdata reader opens is a :class:`~fastdata.Source`: a
fastdata dataset of every registered format (an LMDB folder, an ``.h5``, a
tar/TFRecord manifest, shard or shard pattern), and tars and TFRecords
written by other tools (webdataset, TensorFlow, the ``tfrecord`` package).
Each record becomes one entry, in record order, with the dataset's key and
label, its stored payload as ``data`` (the bytes exactly, never decoded) and
its metadata dict. Records of a raw dataset are decoded pixels: their entries
say so with ``raw_shape``, so a conversion stores them raw, bit for bit.

Records are read in batches of a few tens of megabytes (``read_many``, one
transaction or a few contiguous reads), never the whole dataset at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fastdata.errors import SourceError, UnknownFormatError
from fastdata.formats.remote_files import absolute
from fastdata.packers.source import SourceEntry

#: Payload bytes a batch of records holds, about (from the manifest's average).
BATCH_BYTES = 32 << 20
#: The most records one batch reads.
MAX_BATCH = 1024


class DatasetSource:
    """The records of a packed dataset, as a :class:`~fastdata.Source`.

    Args:
        path (str | os.PathLike | list): the dataset: an LMDB folder, an HDF5
            file, a sharded dataset's ``NAME.fastdata.json``, a shard, a shard pattern
            (``out-%06d.tar``, ``out-{000000..000009}.tar``), or a list of
            shard files written by another tool.
        verify: check each record's checksum as it is read.
        allow_outside: follow links leading outside the dataset's folder
            (see :mod:`fastdata.contained`).
        reader_settings: the format reader's own settings, by name (for
            TFRecords of another tool ``{"feature_keys": {"image": ..., "label": ...}}``).

    Classes are the dataset's (its manifest's). Data written by another tool
    has no manifest: its classes are what the reader knows, the label
    numbers as text (``"0"`` to the largest label), so labels stay as
    they were.

    Raises:
        UnknownFormatError, ManifestError, CorruptDataError: the dataset
            cannot be opened (missing, not a dataset, damaged); one line
            naming it.
        SourceError: raw records of a shape fastdata cannot store.
    """

    kind = "dataset"

    def __init__(self, path, *, verify: bool = True, allow_outside: bool = False,
                 reader_settings: Mapping[str, Any] | None = None) -> None:
        from fastdata.dataset.resolve import open_reader

        self.path = path if isinstance(path, (list, tuple)) else os.fspath(path)
        first = self.path[0] if isinstance(self.path, (list, tuple)) and self.path else self.path
        self.root = absolute(first) if first else ""  # a URL stays a URL
        try:
            self.reader = open_reader(self.path, verify=verify, allow_outside=allow_outside,
                                      settings=reader_settings)
        except UnknownFormatError as exc:
            if isinstance(first, str) and os.path.isdir(first):
                raise UnknownFormatError(f"{exc.message}; to pack a folder of images, use "
                                         f"fastdata pack", path=exc.path) from None
            raise
        manifest = self.reader.manifest
        self.format = self.reader.format_name
        self.classes = list(manifest.classes)
        self.foreign = bool(isinstance(manifest.extra, dict) and manifest.extra.get("foreign"))
        self.raw_shape = _raw_shape(manifest.raw_shape, self.root)
        self.batch_size = _batch_size(manifest.bytes.get("payload"), len(self.reader))

    def __len__(self) -> int:
        return len(self.reader)

    def __iter__(self) -> Iterator[SourceEntry]:
        for start in range(0, len(self), self.batch_size):
            yield from self.entries_at(range(start, min(len(self), start + self.batch_size)))

    def __getitem__(self, index: int) -> SourceEntry:
        return self.entries_at([index])[0]

    def entries_at(self, indices: Sequence[int]) -> list[SourceEntry]:
        """The entries of records ``indices``, in that order, read together
        (in record order, for the format's sake)."""
        wanted = list(indices)
        order = sorted(set(wanted))
        payloads = dict(zip(order, self.reader.read_many(order)))
        metadata = dict(zip(order, self._metadata(order)))
        from fastdata.formats.reader import key_at  # numpy, so not at import time

        # Each key read alone (a sharded pack reads the piece of its keys file
        # that holds it): reader.keys would hold every key, ~70 B a record.
        labels = self.reader.labels
        return [SourceEntry(key_at(self.reader, i), int(labels[i]), data=bytes(payloads[i]),
                            metadata=metadata[i], raw_shape=self.raw_shape)
                for i in wanted]

    def _metadata(self, indices: list[int]) -> list[dict | None]:
        """Each record's metadata as its dataset stored it; None: it has none."""
        reader = self.reader
        if not reader.has_metadata:
            return [None] * len(indices)
        record = getattr(reader, "record", None)
        if record is not None and record.columns:  # a join's values go along
            return [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in found.items()}
                    or None for found in reader.metadata_many(indices)]
        stored = reader.metadata_bytes_many(indices, check=reader.verify)
        return [None if data is None else reader.parse_metadata(i, data)
                for i, data in zip(indices, stored)]

    def describe(self) -> dict[str, Any]:
        manifest = self.reader.manifest
        origin: dict[str, Any] = {"path": self.root, "format": self.format, "count": len(self)}
        if self.foreign:
            origin["foreign"] = True  # another tool's data: classes are the label numbers
        fingerprint = (manifest.source or {}).get("fingerprint")
        if fingerprint:
            origin["fingerprint"] = fingerprint
        if manifest.created_at:
            origin["created_at"] = manifest.created_at
        return {"root": self.root, "files": len(self), "ignored": 0, "kind": self.kind,
                "converted_from": origin}

    def warnings(self) -> list[str]:
        return []

    def files(self) -> list[str]:
        """The files and folders that hold the records (shards; the LMDB
        folder; the HDF5 file)."""
        readers = getattr(self.reader, "parts", None) or [self.reader]
        return [f for r in readers for f in (r.shard_paths if r.sharded else [r.path])]


def writes_over(source: DatasetSource, spec, output: str) -> bool:
    """Whether packing into ``output`` in format ``spec`` would write a file
    that holds ``source``'s records: the same LMDB folder or HDF5 file, or a
    name of the output's shards (any shard count) in the source's folder."""
    held = [os.path.realpath(f) for f in source.files()]
    if not spec.sharded:
        return os.path.realpath(output) in held
    from fastdata.formats.sharded.layout import parse_output

    writer_cls = spec.load_writer()
    layout = parse_output(output, writer_cls.extensions, sharded=False,
                          total_in_name=writer_cls.total_in_name)
    folder = os.path.realpath(layout.directory)
    return any(os.path.dirname(f) == folder
               and layout.owns(os.path.basename(f), writer_cls.extensions) for f in held)


def _raw_shape(shape, where: str) -> tuple[int, int, int] | None:
    """A raw dataset's record shape, as entries carry it; None for encoded data."""
    if shape is None:
        return None
    if len(shape) != 3 or shape[2] != 3:
        raise SourceError(f"raw records of shape {list(shape)} cannot be converted: fastdata "
                          f"stores raw pixels as (height, width, 3)", path=where)
    return (int(shape[0]), int(shape[1]), int(shape[2]))


def _batch_size(payload_bytes, count: int) -> int:
    """Records per read: about BATCH_BYTES of payload, 1 to MAX_BATCH."""
    if not count or not isinstance(payload_bytes, int) or payload_bytes <= 0:
        return MAX_BATCH
    return max(1, min(MAX_BATCH, BATCH_BYTES * count // payload_bytes))


__all__ = ["BATCH_BYTES", "MAX_BATCH", "DatasetSource", "writes_over"]

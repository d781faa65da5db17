"""TFRecord writer: records as tf.train.Example shards with index files (schema in ``schema.py``)."""

from __future__ import annotations

import crc32c

from fastdata.formats.sharded.writer import ShardedWriter
from fastdata.formats.tfrecord.example import encode_example_parts, parse_example
from fastdata.formats.tfrecord.schema import (
    _CRC,
    _LENGTH,
    EXTENSIONS,
    FOOTER_SIZE,
    FORMAT_KEY,
    HEADER_SIZE,
    HEIGHT_KEY,
    IMAGE_KEY,
    LABEL_KEY,
    METADATA_KEY,
    SCHEMA,
    SHARD_INDEX_SUFFIX,
    SOURCE_KEY_KEY,
    WIDTH_KEY,
    mask_crc,
    masked_crc32c,
    write_shard_index,
)
from fastdata.records import Record


def example_features(record: Record) -> dict[str, object]:
    """The Example features fastdata writes for ``record``."""
    features = {
        IMAGE_KEY: record.payload,
        FORMAT_KEY: record.encoding.encode("ascii"),
        LABEL_KEY: int(record.label),
        HEIGHT_KEY: int(record.height),
        WIDTH_KEY: int(record.width),
        SOURCE_KEY_KEY: record.key.encode("utf-8"),
    }
    if record.metadata is not None:
        features[METADATA_KEY] = record.metadata
    return features


def metadata_offset(parts: list[bytes], metadata: bytes) -> int:
    """Where ``metadata`` lies in the serialized Example whose chunks are
    ``parts`` (``encode_example_parts``): its feature's map entry comes first
    (``METADATA_KEY`` sorts first), and the JSON ends that entry."""
    alone, alone_size = encode_example_parts({METADATA_KEY: metadata})
    # parts[0] and alone[0]: the head of each Example (tag and length).
    return len(parts[0]) + (alone_size - len(alone[0])) - len(metadata)


class TFRecordWriter(ShardedWriter):
    """Writes records as tf.train.Example TFRecord shards with index files.

    Args:
        path: ``out.tfrecord``, a printf/brace pattern, or a plain name.
        overwrite: replace an existing dataset of that name.
        shard_size: records ("10000") or bytes ("256MB") per shard; None
            writes a single ``out.tfrecord``.
    """

    format_name = "tfrecord"
    extensions = EXTENSIONS
    total_in_name = True

    def __init__(self, path, *, overwrite: bool = False, shard_size: str | int | None = None,
                 resume_path: str | None = None, detached_dir: str | None = None) -> None:
        self._index_rows: list[tuple[int, int]] = []
        self._last_encoded: tuple[int, list[bytes], int] | None = None
        super().__init__(path, overwrite=overwrite, shard_size=shard_size,
                         resume_path=resume_path, detached_dir=detached_dir)

    def _begin_shard(self, path: str) -> None:
        self._index_rows = []

    def _encoded(self, record: Record) -> tuple[list[bytes], int]:
        # A byte shard_size needs the size before the write: encode once, reuse.
        cached = self._last_encoded
        if cached is not None and cached[0] == record.index:
            return cached[1], cached[2]
        parts, size = encode_example_parts(example_features(record))
        self._last_encoded = (record.index, parts, size)
        return parts, size

    def _stored_size(self, record: Record) -> int:
        return HEADER_SIZE + self._encoded(record)[1] + FOOTER_SIZE

    def _append(self, record: Record, crc: int) -> tuple[int, int, int]:
        parts, size = self._encoded(record)
        self._last_encoded = None
        length = _LENGTH.pack(size)
        # The chunks go to the file as they are (CRC computed incrementally),
        # so the payload is never copied into a joined record.
        c = 0
        for part in parts:
            c = crc32c.crc32c(part, c)
        footer = _CRC.pack(mask_crc(c))
        offset = self._shard.position
        self._shard.write(length + _CRC.pack(masked_crc32c(length)))
        self._shard.writelines(parts)
        self._shard.write(footer)
        framed = HEADER_SIZE + size + FOOTER_SIZE
        self._index_rows.append((offset, framed))
        meta = record.metadata
        meta_at = 0 if meta is None else offset + HEADER_SIZE + metadata_offset(parts, meta)
        return offset, framed, meta_at

    def _end_shard(self) -> dict:
        write_shard_index(self._shard.path + SHARD_INDEX_SUFFIX, self._index_rows)
        return {}

    def _payload_of(self, stored: bytes) -> bytes:
        example = parse_example(stored[HEADER_SIZE:len(stored) - FOOTER_SIZE])
        return example[IMAGE_KEY][1][0]

    @classmethod
    def _shard_files(cls, name: str) -> list[str]:
        return [name, name + SHARD_INDEX_SUFFIX]

    def _metadata_extra(self) -> dict:
        return {"feature": METADATA_KEY}

    def _manifest_extra(self) -> dict:
        return {
            "schema": SCHEMA,
            "record": "tf.train.Example",
            "feature_keys": {"image": IMAGE_KEY, "format": FORMAT_KEY, "label": LABEL_KEY,
                             "height": HEIGHT_KEY, "width": WIDTH_KEY, "key": SOURCE_KEY_KEY},
            "shard_index": f"<shard>{SHARD_INDEX_SUFFIX}: tfrecord2idx text, one "
                           f"'offset length' line per framed record",
        }

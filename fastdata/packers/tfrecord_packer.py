"""TFRecord writer, and the TFRecord schema (the loader imports these constants).

Layout: ``out.tfrecord`` (one shard), or ``out-00000-of-00008.tfrecord``...
with a shard size, plus the sharded-dataset sidecars (``out.fastdata.json``,
``out.fastdata.index.npy``, ``out.fastdata.keys.json``) and, beside every
shard, ``<shard>.idx``.

Each shard is a plain TFRecord file, a sequence of framed records::

    uint64 length (little endian)
    uint32 masked CRC32C of the 8 length bytes
    length bytes: a serialized tf.train.Example
    uint32 masked CRC32C of the data

with ``masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32)``.

Every Example holds the feature keys of TensorFlow's ImageNet pipelines:

=====================  ==========  ===========================================
feature                type        value
=====================  ==========  ===========================================
``image/encoded``      bytes       the payload (the original file bytes)
``image/format``       bytes       its encoding: b"jpeg", b"png", ... or b"raw"
``image/class/label``  int64       the class index (0-based, as in the manifest)
``image/height``       int64       image height in pixels (0 when unknown)
``image/width``        int64       image width in pixels (0 when unknown)
``image/key``          bytes       the source key (relative path), UTF-8
=====================  ==========  ===========================================

Map entries are written sorted by key (as protobuf's deterministic
serialization does) and int64 lists packed, so the bytes are reproducible.

``<shard>.idx`` is the text index of the ``tfrecord`` package's
``tfrecord2idx`` (and DALI's ``fn.readers.tfrecord(index_path=...)``): one
line ``"<offset> <length>"`` per record, where offset is the byte offset of the
framed record and length its whole framed size (12 + data + 4 bytes). The
dataset index (``.fastdata.index.npy``) points at the same framed records.

The protobuf encoding is written here by hand (no TensorFlow, no generated
classes): Example → Features → map<string, Feature>, Feature a oneof of
BytesList (1), FloatList (2) and Int64List (3).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import crc32c

from fastdata.packers.shards import ShardedWriter
from fastdata.records import Record

# -- feature keys (the on-disk contract) ---------------------------------------

IMAGE_KEY = "image/encoded"
FORMAT_KEY = "image/format"
LABEL_KEY = "image/class/label"
HEIGHT_KEY = "image/height"
WIDTH_KEY = "image/width"
SOURCE_KEY_KEY = "image/key"

#: Names of the roles a reader can map to other feature names (``feature_keys``).
DEFAULT_FEATURE_KEYS: dict[str, str] = {
    "image": IMAGE_KEY,
    "label": LABEL_KEY,
    "key": SOURCE_KEY_KEY,
}

SCHEMA = "fastdata-tfrecord-1"

# -- framing ---------------------------------------------------------------------

#: Bytes before the data: uint64 length + uint32 masked CRC32C of it.
HEADER_SIZE = 12
#: Bytes after the data: uint32 masked CRC32C of it.
FOOTER_SIZE = 4
CRC_MASK_DELTA = 0xA282EAD8
#: Suffix of the per-shard text index (tfrecord2idx / DALI format).
SHARD_INDEX_SUFFIX = ".idx"

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")

# -- protobuf wire format -----------------------------------------------------------

WIRE_VARINT = 0
WIRE_FIXED64 = 1
WIRE_LEN = 2
WIRE_START_GROUP = 3
WIRE_END_GROUP = 4
WIRE_FIXED32 = 5

# Field numbers of example.proto.
EXAMPLE_FEATURES = 1   # Example.features: Features
FEATURES_FEATURE = 1   # Features.feature: map<string, Feature>
MAP_KEY = 1            # map entry key
MAP_VALUE = 2          # map entry value
FEATURE_BYTES = 1      # Feature.bytes_list: BytesList
FEATURE_FLOAT = 2      # Feature.float_list: FloatList
FEATURE_INT64 = 3      # Feature.int64_list: Int64List
LIST_VALUE = 1         # {Bytes,Float,Int64}List.value

_MASK64 = (1 << 64) - 1


def masked_crc32c(data) -> int:
    """TFRecord's masked CRC32C of ``data`` (any bytes-like object)."""
    return mask_crc(crc32c.crc32c(data))


def mask_crc(crc: int) -> int:
    """TFRecord's mask of a CRC32C: rotate right by 15 bits, add a constant."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + CRC_MASK_DELTA) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    value &= _MASK64  # negative int64s are written as their 64-bit two's complement
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _length_delimited(field: int, parts: list[bytes], size: int) -> tuple[list[bytes], int]:
    """Wrap a message given as chunks; chunks are not joined, so a large
    payload is copied once (when the whole record is joined), not per level."""
    head = _tag(field, WIRE_LEN) + _varint(size)
    return [head, *parts], size + len(head)


def _feature(value) -> tuple[list[bytes], int]:
    """A serialized Feature for bytes/str/int/float or a sequence of one of them."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if all(isinstance(v, (bytes, bytearray, memoryview, str)) for v in values):
        parts: list[bytes] = []
        size = 0
        for v in values:
            v = v.encode("utf-8") if isinstance(v, str) else bytes(v)
            p, n = _length_delimited(LIST_VALUE, [v], len(v))
            parts += p
            size += n
        inner = _length_delimited(FEATURE_BYTES, parts, size)
    elif all(isinstance(v, int) for v in values):
        packed = b"".join(_varint(int(v)) for v in values)
        body = _length_delimited(LIST_VALUE, [packed], len(packed)) if values else ([], 0)
        inner = _length_delimited(FEATURE_INT64, *body)
    elif all(isinstance(v, (int, float)) for v in values):
        packed = struct.pack(f"<{len(values)}f", *values)
        body = _length_delimited(LIST_VALUE, [packed], len(packed)) if values else ([], 0)
        inner = _length_delimited(FEATURE_FLOAT, *body)
    else:
        raise TypeError(f"feature values must be bytes, str, int or float, not {values!r:.80}")
    return inner


def encode_example_parts(features: Mapping[str, object]) -> tuple[list[bytes], int]:
    """Serialize a tf.train.Example as a list of chunks and their total size.

    Args:
        features: feature name → value: bytes/str (BytesList), int (Int64List),
            float (FloatList), or a list of one of these types.

    Returns:
        (chunks, size): ``b"".join(chunks)`` is the serialized Example.
    """
    entries: list[bytes] = []
    size = 0
    for name in sorted(features):  # deterministic: map entries sorted by key
        key = name.encode("utf-8")
        kparts, ksize = _length_delimited(MAP_KEY, [key], len(key))
        fparts, fsize = _feature(features[name])
        vparts, vsize = _length_delimited(MAP_VALUE, fparts, fsize)
        eparts, esize = _length_delimited(FEATURES_FEATURE, kparts + vparts, ksize + vsize)
        entries += eparts
        size += esize
    return _length_delimited(EXAMPLE_FEATURES, entries, size)


def encode_example(features: Mapping[str, object]) -> bytes:
    """Serialize a tf.train.Example (see :func:`encode_example_parts`)."""
    return b"".join(encode_example_parts(features)[0])


def frame_record(data: bytes) -> bytes:
    """One TFRecord framed record holding ``data``."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), data,
                     _CRC.pack(masked_crc32c(data))))


def example_features(record: Record) -> dict[str, object]:
    """The Example features fastdata writes for ``record``."""
    return {
        IMAGE_KEY: record.payload,
        FORMAT_KEY: record.encoding.encode("ascii"),
        LABEL_KEY: int(record.label),
        HEIGHT_KEY: int(record.height),
        WIDTH_KEY: int(record.width),
        SOURCE_KEY_KEY: record.key.encode("utf-8"),
    }


def write_shard_index(path: str, rows: Sequence[tuple[int, int]]) -> None:
    """Write a tfrecord2idx text index: one ``"offset length"`` line per record."""
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("".join(f"{offset} {length}\n" for offset, length in rows))


class TFRecordWriter(ShardedWriter):
    """Writes records as tf.train.Example TFRecord shards with index files.

    Args:
        path: ``out.tfrecord``, a printf/brace pattern, or a plain name.
        overwrite: replace an existing dataset of that name.
        shard_size: records ("10000") or bytes ("256MB") per shard; None
            writes a single ``out.tfrecord``.
    """

    format_name = "tfrecord"
    extensions = (".tfrecord", ".tfrecords")
    total_in_name = True

    def __init__(self, path, *, overwrite: bool = False, shard_size: str | int | None = None
                 ) -> None:
        self._index_rows: list[tuple[int, int]] = []
        self._last_encoded: tuple[int, list[bytes], int] | None = None
        super().__init__(path, overwrite=overwrite, shard_size=shard_size)

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

    def _append(self, record: Record, crc: int) -> tuple[int, int]:
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
        return offset, framed

    def _end_shard(self) -> dict:
        write_shard_index(self._shard.path + SHARD_INDEX_SUFFIX, self._index_rows)
        return {}

    def _shard_files(self, name: str) -> list[str]:
        return [name, name + SHARD_INDEX_SUFFIX]

    def _manifest_extra(self) -> dict:
        return {
            "schema": SCHEMA,
            "record": "tf.train.Example",
            "feature_keys": {"image": IMAGE_KEY, "format": FORMAT_KEY, "label": LABEL_KEY,
                             "height": HEIGHT_KEY, "width": WIDTH_KEY, "key": SOURCE_KEY_KEY},
            "shard_index": f"<shard>{SHARD_INDEX_SUFFIX}: tfrecord2idx text, one "
                           f"'offset length' line per framed record",
        }

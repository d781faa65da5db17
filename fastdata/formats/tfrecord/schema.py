"""The TFRecord schema: feature keys, framing, and the per-shard index files.

Layout: ``out.tfrecord`` (one shard), or ``out-00000-of-00008.tfrecord``...
with a shard size, plus the sharded-dataset sidecars (``out.tfrecord.fastdata.json``,
``out.tfrecord.fastdata.index.npy``, ``out.tfrecord.fastdata.keys.json``) and,
beside every shard, ``<shard>.idx``.

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
``fastdata/metadata``  bytes       only in the Example of a record with
                                   metadata: its metadata, canonical UTF-8
                                   JSON (one value; ``json.loads`` gives the
                                   dict back). Flat values are not copied into
                                   features of their own.
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
from collections.abc import Sequence

import crc32c

from fastdata.formats.tfrecord import EXTENSIONS  # noqa: F401  (part of the schema)

# -- feature keys (the on-disk contract) ---------------------------------------

IMAGE_KEY = "image/encoded"
FORMAT_KEY = "image/format"
LABEL_KEY = "image/class/label"
HEIGHT_KEY = "image/height"
WIDTH_KEY = "image/width"
SOURCE_KEY_KEY = "image/key"
#: The feature holding a record's metadata JSON. It sorts before every other
#: feature name, so its map entry comes first in the Example (the writer
#: relies on that to find where the JSON lies).
METADATA_KEY = "fastdata/metadata"

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


def frame_record(data: bytes) -> bytes:
    """One TFRecord framed record holding ``data``."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), data,
                     _CRC.pack(masked_crc32c(data))))


def shard_index_text(rows: Sequence[tuple[int, int]]) -> str:
    """A tfrecord2idx text index: one ``"offset length"`` line per framed record."""
    return "".join(f"{offset} {length}\n" for offset, length in rows)


def write_shard_index(path: str, rows: Sequence[tuple[int, int]]) -> None:
    """Write the tfrecord2idx index of one shard (see :func:`shard_index_text`)."""
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write(shard_index_text(rows))


def shard_index_mismatch(path: str, rows: Sequence[tuple[int, int]]) -> str | None:
    """Why the tfrecord2idx index at ``path`` is not the one ``rows`` give, or None."""
    rows = list(rows)
    expected = shard_index_text(rows).encode("ascii")
    try:
        with open(path, "rb") as f:
            actual = f.read(len(expected) + 1)  # never more than a right one needs
    except OSError as exc:
        return (f"cannot be read ({exc.strerror or exc}): the tfrecord package and DALI read "
                f"it; re-pack the dataset")
    if actual == expected:
        return None
    why = f"is cut short ({len(actual)} of {len(expected)} bytes)"
    want = expected.split(b"\n")
    for k, (got, line) in enumerate(zip(actual.split(b"\n"), want)):
        if got != line:
            why = (f"has more lines than the {len(rows)} records of its shard"
                   if k == len(want) - 1 else
                   f"line {k + 1} reads {got.decode('ascii', 'replace')[:40]!r} where the "
                   f"dataset index gives {line.decode('ascii')!r}")
            break
    return (f"{why}: it is damaged or from another pack (the tfrecord package and DALI read "
            f"it); re-pack the dataset")

"""tf.train.Example in protobuf's wire format, written and parsed by hand.

No TensorFlow and no generated classes: Example -> Features -> map<string,
Feature>, Feature a oneof of BytesList (1), FloatList (2) and Int64List (3).
Writing sorts map entries by key and packs int64 lists, as protobuf's
deterministic serialisation does, so equal input gives equal bytes. Parsing
follows protobuf's rules, so it also reads what TensorFlow or the ``tfrecord``
package wrote: map entries in any order, packed or unpacked numbers, unknown
fields skipped, the last of repeated map keys winning.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from fastdata.formats.tfrecord.schema import (
    EXAMPLE_FEATURES,
    FEATURE_BYTES,
    FEATURE_FLOAT,
    FEATURE_INT64,
    FEATURES_FEATURE,
    LIST_VALUE,
    MAP_KEY,
    MAP_VALUE,
    WIRE_END_GROUP,
    WIRE_FIXED32,
    WIRE_FIXED64,
    WIRE_LEN,
    WIRE_START_GROUP,
    WIRE_VARINT,
)

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63

# -- writing --------------------------------------------------------------------------

def _encode_varint(value: int) -> bytes:
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
    return _encode_varint((field << 3) | wire)


def _length_delimited(field: int, parts: list[bytes], size: int) -> tuple[list[bytes], int]:
    """Wrap a message given as chunks; chunks are not joined, so a large
    payload is copied once (when the whole record is joined), not per level."""
    head = _tag(field, WIRE_LEN) + _encode_varint(size)
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
        packed = b"".join(_encode_varint(int(v)) for v in values)
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


# -- parsing --------------------------------------------------------------------------


# Tags (field number << 3 | wire type) the parser looks for, all one byte:
# field 1 is Example.features, Features.feature and a map entry's key; field 2
# a map entry's value (see the field numbers in schema.py).
_TAG_LEN_1 = (1 << 3) | WIRE_LEN
_TAG_LEN_2 = (2 << 3) | WIRE_LEN


class WireError(ValueError):
    """Malformed protobuf data (turned into CorruptDataError with the location)."""


# -- protobuf wire format ---------------------------------------------------------


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; returns (value, next position)."""
    if pos >= end:
        raise WireError("truncated varint")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def _skip(buf, pos: int, end: int, tag: int) -> int:
    """Skip the value of a field with ``tag`` starting at ``pos``."""
    wire = tag & 7
    if wire == WIRE_VARINT:
        return _varint(buf, pos, end)[1]
    if wire == WIRE_LEN:
        n, pos = _varint(buf, pos, end)
        pos += n
    elif wire == WIRE_FIXED64:
        pos += 8
    elif wire == WIRE_FIXED32:
        pos += 4
    elif wire == WIRE_START_GROUP:
        # Legacy groups: skip nested fields up to the matching end-group tag.
        while True:
            inner, pos = _varint(buf, pos, end)
            if inner & 7 == WIRE_END_GROUP:
                if inner >> 3 != tag >> 3:
                    raise WireError("mismatched end-group tag")
                return pos
            pos = _skip(buf, pos, end, inner)
    else:
        raise WireError(f"invalid wire type {wire}")
    if pos > end:
        raise WireError("field runs past the end of its message")
    return pos


def _len_field(buf, pos: int, end: int) -> tuple[int, int]:
    """(start, end) of a length-delimited value at ``pos``."""
    n, pos = _varint(buf, pos, end)
    stop = pos + n
    if stop > end:
        raise WireError("field runs past the end of its message")
    return pos, stop


def feature_spans(buf, start: int, end: int, wanted: Mapping[bytes, str] | None = None
                  ) -> dict[str, tuple[int, int]]:
    """Find the Feature messages of a serialized Example without decoding them.

    Args:
        buf: bytes or bytearray holding the Example.
        start, end: the Example's span within ``buf``.
        wanted: feature names (UTF-8 bytes) → name to report them under; None
            for every feature.

    Returns:
        name → (start, end) of that feature's Feature message in ``buf``.

    Raises:
        ValueError: the bytes are not a well-formed Example.
    """
    out: dict[str, tuple[int, int]] = {}
    pos = start
    while pos < end:
        tag = buf[pos]
        if tag != _TAG_LEN_1:  # not Example.features: skip it
            tag, pos = _varint(buf, pos, end)
            pos = _skip(buf, pos, end, tag)
            continue
        fs, fe = _len_field(buf, pos + 1, end)
        p = fs
        while p < fe:
            if buf[p] != _TAG_LEN_1:  # not a map entry: skip it
                t, p = _varint(buf, p, fe)
                p = _skip(buf, p, fe, t)
                continue
            # Inline one-byte lengths: this loop is the per-record cost of reading.
            n = buf[p + 1] if p + 1 < fe else 0x80
            if n < 0x80:
                es, ee = p + 2, p + 2 + n
                if ee > fe:
                    raise WireError("map entry runs past the end of Features")
            else:
                es, ee = _len_field(buf, p + 1, fe)
            p = ee
            # The usual entry: key (field 1, short) then value (field 2), nothing else.
            if ee - es >= 4 and buf[es] == _TAG_LEN_1 and buf[es + 1] < 0x80:
                ke = es + 2 + buf[es + 1]
                if ke + 2 <= ee and buf[ke] == _TAG_LEN_2:
                    n = buf[ke + 1]
                    if n < 0x80:
                        vs, ve = ke + 2, ke + 2 + n
                    else:
                        vs, ve = _len_field(buf, ke + 1, ee)
                    if ve == ee:
                        key = buf[es + 2:ke]
                        if wanted is None:
                            out[key.decode("utf-8", "replace")] = (vs, ve)
                        else:
                            name = wanted.get(key)
                            if name is not None:
                                out[name] = (vs, ve)
                                if len(out) == len(wanted) and _none_later(buf, wanted, p, end):
                                    return out
                        continue
            key, value = _map_entry(buf, es, ee)
            if wanted is None:
                out[key.decode("utf-8", "replace")] = value
            else:
                name = wanted.get(key)
                if name is not None:
                    out[name] = value
        pos = fe
    return out


def _none_later(buf, wanted: Mapping[bytes, str], pos: int, end: int) -> bool:
    """Whether no wanted name occurs in ``buf[pos:end]``: then no later map entry
    can repeat (and override) a feature already found, and the walk can stop."""
    return all(buf.find(name, pos, end) < 0 for name in wanted)


def _map_entry(buf, start: int, end: int) -> tuple[bytes, tuple[int, int]]:
    """(key, Feature span) of a map entry in any field order, repeats and extra
    fields included (the last key and value win, as protobuf has it)."""
    key = b""
    value = (end, end)  # an entry without a value holds an empty Feature
    q = start
    while q < end:
        u = buf[q]
        if u == _TAG_LEN_1:
            ks, ke = _len_field(buf, q + 1, end)
            key = bytes(buf[ks:ke])
            q = ke
        elif u == _TAG_LEN_2:
            value = _len_field(buf, q + 1, end)
            q = value[1]
        else:
            u, q = _varint(buf, q, end)
            q = _skip(buf, q, end, u)
    return key, value


def one_bytes_value(buf, start: int, end: int) -> bytes | None:
    """The value of a Feature holding a BytesList of exactly one value, laid out
    the usual way; None when it is anything else (then use decode_feature)."""
    if end - start < 4 or buf[start] != _TAG_LEN_1:
        return None
    ls, le = _len_field(buf, start + 1, end)
    if le != end or le - ls < 2 or buf[ls] != _TAG_LEN_1:
        return None
    vs, ve = _len_field(buf, ls + 1, le)
    return buf[vs:ve] if ve == le else None


def decode_feature(buf, start: int, end: int) -> tuple[str | None, list]:
    """Decode one Feature message.

    Returns:
        (kind, values): kind is "bytes", "int64", "float" or None (an empty
        Feature); values a list of bytes, ints or floats.

    Raises:
        ValueError: malformed data.
    """
    kind: str | None = None
    values: list = []
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if wire != WIRE_LEN or field not in (FEATURE_BYTES, FEATURE_FLOAT, FEATURE_INT64):
            pos = _skip(buf, pos, end, tag)
            continue
        ls, le = _len_field(buf, pos, end)
        pos = le
        new = {FEATURE_BYTES: "bytes", FEATURE_FLOAT: "float", FEATURE_INT64: "int64"}[field]
        if new != kind:  # oneof: the last member set wins; a repeated one merges
            kind, values = new, []
        _decode_list(buf, ls, le, kind, values)
    return kind, values


def _decode_list(buf, pos: int, end: int, kind: str, out: list) -> None:
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field != LIST_VALUE:
            pos = _skip(buf, pos, end, tag)
            continue
        if kind == "bytes":
            if wire != WIRE_LEN:
                raise WireError("BytesList value with a non-length-delimited wire type")
            s, pos = _len_field(buf, pos, end)
            out.append(bytes(buf[s:pos]))
        elif kind == "int64":
            if wire == WIRE_VARINT:  # unpacked
                v, pos = _varint(buf, pos, end)
                out.append(v - (1 << 64) if v >= _SIGN64 else v)
            elif wire == WIRE_LEN:  # packed
                s, e = _len_field(buf, pos, end)
                while s < e:
                    v, s = _varint(buf, s, e)
                    out.append(v - (1 << 64) if v >= _SIGN64 else v)
                pos = e
            else:
                raise WireError("Int64List value with a bad wire type")
        else:
            if wire == WIRE_FIXED32:  # unpacked
                if pos + 4 > end:
                    raise WireError("truncated float")
                out.append(struct.unpack_from("<f", buf, pos)[0])
                pos += 4
            elif wire == WIRE_LEN:  # packed
                s, e = _len_field(buf, pos, end)
                if (e - s) % 4:
                    raise WireError("packed FloatList length is not a multiple of 4")
                out.extend(struct.unpack_from(f"<{(e - s) // 4}f", buf, s))
                pos = e
            else:
                raise WireError("FloatList value with a bad wire type")


def parse_example(data: bytes) -> dict[str, tuple[str | None, list]]:
    """Every feature of a serialized tf.train.Example: name → (kind, values).

    Raises:
        ValueError: the bytes are not a well-formed Example.
    """
    data = bytes(data) if isinstance(data, memoryview) else data
    return {name: decode_feature(data, s, e)
            for name, (s, e) in feature_spans(data, 0, len(data)).items()}

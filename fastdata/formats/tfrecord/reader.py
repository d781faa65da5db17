"""TFRecord reader (no torch). The schema lives in ``schema.py``, the Example parser in ``example.py``.

Random access reads one framed record by offset through the dataset index;
streaming (:meth:`TFRecordReader.iter_shard`) walks a shard with large
sequential reads. Either way both CRC32Cs of every record are checked (the
``tfrecord`` package checks neither), so damage is reported with the shard
file and byte offset instead of turning into garbage samples.

The tf.train.Example parser is hand-written for exactly the messages involved
(Example → Features → map<string, Feature> → Bytes/Float/Int64List) and
follows protobuf's rules, so it also reads what TensorFlow or the ``tfrecord``
package wrote: map entries in any order, packed or unpacked numbers, unknown
fields skipped, the last of repeated map keys winning.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping

import crc32c

from fastdata.errors import CorruptDataError, ManifestError, StorageError
from fastdata.formats.remote_files import local_copy
from fastdata.formats.sharded.reader import ShardedReader, shard_error
from fastdata.formats.sparse import check_stored
from fastdata.formats.tfrecord.example import (
    WireError,
    decode_feature,
    feature_spans,
    one_bytes_value,
)
from fastdata.formats.tfrecord.schema import (
    DEFAULT_FEATURE_KEYS,
    EXTENSIONS,
    FOOTER_SIZE,
    HEADER_SIZE,
    SHARD_INDEX_SUFFIX,
    mask_crc,
    shard_index_mismatch,
)

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")

#: Where the documentation of ``feature_keys`` is, for error messages.
_KEYS_HINT = ("pass feature_keys={{'image': ..., 'label': ...}} naming this file's features "
              "(to TFRecordReader, fastdata.TFRecordDataset or fastdata.ShardedIterableDataset); "
              "features present: {present}")


class TFRecordReader(ShardedReader):
    """Reads TFRecord shards of tf.train.Example: fastdata's, or any others.

    Args:
        path: the ``NAME.fastdata.json`` manifest, a shard, a shard pattern,
            or a list of TFRecord files written by another tool (TensorFlow,
            the ``tfrecord`` package); those are scanned once on open.
        verify: check the data CRC32C of each record and the payload CRC32
            stored at pack time. The CRC32C of each record's length is always
            checked: a bad length cannot be read past safely.
        feature_keys: feature names to read, by role: ``{"image": ...,
            "label": ..., "key": ...}``; roles left out keep their defaults
            ("image/encoded", "image/class/label", "image/key"). The image
            feature must be a one-value BytesList and the label an Int64List;
            the key feature is optional (records are then named
            ``"<file>:<n>"``).
        chunk_size: bytes per read when streaming a shard.
        allow_outside: follow symbolic links that lead out of the dataset's
            folder (see :class:`fastdata.formats.reader.Reader`).
    """

    format_name = "tfrecord"
    extensions = EXTENSIONS
    total_in_name = True

    def __init__(self, path, *, verify: bool = True,
                 feature_keys: Mapping[str, str] | None = None,
                 chunk_size: int = 256 << 10, allow_outside: bool = False) -> None:
        keys = dict(DEFAULT_FEATURE_KEYS)
        if feature_keys:
            unknown = sorted(set(feature_keys) - set(DEFAULT_FEATURE_KEYS))
            if unknown:
                raise ValueError(f"feature_keys roles must be among "
                                 f"{', '.join(DEFAULT_FEATURE_KEYS)}; got {', '.join(unknown)}")
            keys.update({role: str(name) for role, name in feature_keys.items()})
        self.feature_keys = keys
        self.chunk_size = max(HEADER_SIZE, int(chunk_size))
        self._image_only = {keys["image"].encode("utf-8"): "image"}
        self._scan_keys = {keys[role].encode("utf-8"): role for role in ("image", "label", "key")}
        super().__init__(path, verify=verify, allow_outside=allow_outside)

    # -- framing ------------------------------------------------------------------

    def _frame(self, buf, pos: int, limit: int, path: str, offset: int, *,
               length_checked: bool = False) -> tuple[int, int]:
        """Check the record framed at ``buf[pos:limit]`` (file offset ``offset``).

        Args:
            length_checked: the caller has already checked the length CRC.

        Returns:
            (start, end) of the record's data within ``buf``.
        """
        if limit - pos < HEADER_SIZE:
            raise CorruptDataError(
                f"record header is cut short ({limit - pos} of {HEADER_SIZE} bytes): the "
                f"shard is truncated", path=path, offset=offset)
        (length,) = _U64.unpack_from(buf, pos)
        (stored,) = _U32.unpack_from(buf, pos + 8)
        if not length_checked and mask_crc(crc32c.crc32c(buf[pos:pos + 8])) != stored:
            raise CorruptDataError(
                "record length fails its CRC32C check: this is not a TFRecord file or it "
                "is damaged here", path=path, offset=offset)
        start = pos + HEADER_SIZE
        end = start + length
        if end + FOOTER_SIZE > limit:
            raise CorruptDataError(
                f"record of {length} bytes is cut short: the shard is truncated",
                path=path, offset=offset)
        if self.verify:
            (stored,) = _U32.unpack_from(buf, end)
            if mask_crc(crc32c.crc32c(memoryview(buf)[start:end])) != stored:
                raise CorruptDataError(
                    "record data fails its CRC32C check: the shard is damaged; re-pack it or "
                    "read with on_error='skip'", path=path, offset=offset)
        return start, end

    def _image(self, buf, start: int, end: int, path: str, offset: int) -> bytes:
        """The image bytes of the Example in ``buf[start:end]``."""
        try:
            span = feature_spans(buf, start, end, self._image_only).get("image")
            if span is None:
                raise ManifestError(
                    f"record has no feature {self.feature_keys['image']!r}; "
                    + _KEYS_HINT.format(present=self._present(buf, start, end)),
                    path=path, offset=offset)
            value = one_bytes_value(buf, span[0], span[1])
            if value is not None:
                return value
            kind, values = decode_feature(buf, span[0], span[1])
        except WireError as exc:
            raise CorruptDataError(f"record is not a valid tf.train.Example ({exc})",
                                   path=path, offset=offset) from None
        if kind != "bytes" or len(values) != 1:
            raise ManifestError(
                f"feature {self.feature_keys['image']!r} holds {len(values)} {kind} value(s), "
                f"not one bytes value (an encoded image)", path=path, offset=offset)
        return values[0]

    @staticmethod
    def _present(buf, start: int, end: int) -> str:
        try:
            names = sorted(feature_spans(buf, start, end))
        except WireError:
            return "(unreadable)"
        return ", ".join(names) if names else "(none)"

    # -- ShardedReader hooks ----------------------------------------------------------

    def check_files(self, on_bytes=None, shards: range | None = None) -> list[dict]:
        problems = super().check_files(on_bytes, shards)
        if self.manifest.extra.get("foreign"):
            return problems  # other tools' .idx files are theirs
        for shard in range(len(self.shard_paths)) if shards is None else shards:
            rows = self.shard_rows(shard, checked=False)
            idx = self.side_path(shard, SHARD_INDEX_SUFFIX)
            try:
                # At a URL: a copy of at most what a right index of these rows takes.
                local = local_copy(idx, limit=42 * len(rows) + 64)
            except StorageError as exc:
                reason = f"cannot be read ({exc.message}): the tfrecord package and DALI " \
                         f"read it; re-pack the dataset"
            else:
                reason = shard_index_mismatch(local, zip(rows["offset"].tolist(),
                                                         rows["size"].tolist()))
            if reason is not None:
                problems.append({"index": None, "path": idx, "reason": reason})
        return problems

    def _extract(self, raw: bytes, shard: int, offset: int) -> bytes:
        path = self._shard_paths[shard]
        start, end = self._frame(raw, 0, len(raw), path, offset)
        if end + FOOTER_SIZE != len(raw):
            raise CorruptDataError(
                f"record is {end + FOOTER_SIZE} bytes but the dataset index says {len(raw)}: "
                f"the shard does not match its index; re-pack it", path=path, offset=offset)
        return self._image(raw, start, end, path, offset)

    def _scan_shard(self, path: str) -> list[tuple[int, int, int, str]]:
        rows = []
        name = os.path.basename(path)
        keys = self.feature_keys
        for n, (offset, buf, start, end) in enumerate(self._stream(path)):
            try:
                spans = feature_spans(buf, start, end, self._scan_keys)
                for role in ("image", "label"):
                    if role not in spans:
                        raise ManifestError(
                            f"record {n} has no feature {keys[role]!r}; "
                            + _KEYS_HINT.format(present=self._present(buf, start, end)),
                            path=path, offset=offset)
                kind, labels = decode_feature(buf, *spans["label"])
                key = f"{name}:{n}"
                if "key" in spans:
                    kkind, kvalues = decode_feature(buf, *spans["key"])
                    if kkind == "bytes" and kvalues:
                        key = kvalues[0].decode("utf-8", "replace")
            except WireError as exc:
                raise CorruptDataError(f"record {n} is not a valid tf.train.Example ({exc})",
                                       path=path, offset=offset) from None
            if kind != "int64" or not labels:
                raise ManifestError(
                    f"record {n}: label feature {keys['label']!r} holds "
                    f"{len(labels)} {kind} value(s), not an int64 class index; name another "
                    f"feature with feature_keys={{'label': ...}}", path=path, offset=offset)
            rows.append((offset, end + FOOTER_SIZE - (start - HEADER_SIZE), labels[0], key))
        return rows

    # -- streaming --------------------------------------------------------------------

    def _stream(self, path: str, max_records: int | None = None
                ) -> Iterator[tuple[int, bytes, int, int]]:
        """Walk a TFRecord file with large sequential reads, checking every frame.

        Yields:
            (file offset of the record, buffer, data start, data end); the
            buffer is only valid until the next item.
        """
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise shard_error(exc, path) from None
        try:
            size = os.fstat(fd).st_size
            buf = b""
            base = 0  # file offset of buf[0]
            pos = 0
            n = 0
            while max_records is None or n < max_records:
                offset = base + pos
                left = size - offset
                if left <= 0:
                    return
                if left < HEADER_SIZE:
                    raise CorruptDataError(
                        f"record header is cut short ({left} of {HEADER_SIZE} bytes): the "
                        f"shard is truncated", path=path, offset=offset)
                if len(buf) - pos < HEADER_SIZE:
                    buf, base, pos = self._refill(fd, offset, HEADER_SIZE, size, path), offset, 0
                (length,) = _U64.unpack_from(buf, pos)
                (stored,) = _U32.unpack_from(buf, pos + 8)
                if mask_crc(crc32c.crc32c(buf[pos:pos + 8])) != stored:
                    raise CorruptDataError(
                        "record length fails its CRC32C check: this is not a TFRecord file "
                        "or it is damaged here", path=path, offset=offset)
                total = HEADER_SIZE + length + FOOTER_SIZE
                if total > left:  # checked before reading: a bad length never allocates
                    raise CorruptDataError(
                        f"record of {length} bytes is cut short ({left} bytes left): the "
                        f"shard is truncated", path=path, offset=offset)
                if len(buf) - pos < total:
                    check_stored(fd, offset, total, path=path, offset=offset,
                                 what="TFRecord record")  # a length over a hole: unread
                    buf, base, pos = self._refill(fd, offset, total, size, path), offset, 0
                start, end = self._frame(buf, pos, pos + total, path, offset,
                                         length_checked=True)
                yield offset, buf, start, end
                pos += total
                n += 1
        finally:
            os.close(fd)

    def _refill(self, fd: int, offset: int, need: int, size: int, path: str) -> bytes:
        """Read the next block from file offset ``offset``: at least ``need`` bytes.

        The block restarts at the first unfinished record and is read again by
        pread instead of gluing the old tail to new data: one copy, not two,
        and small blocks stay in the CPU cache while they are parsed.
        """
        want = min(max(self.chunk_size, need), size - offset)
        buf = os.pread(fd, want, offset)
        while len(buf) < want:  # short reads are allowed; go on until EOF
            more = os.pread(fd, want - len(buf), offset + len(buf))
            if not more:
                break
            buf += more
        if len(buf) < need:
            raise CorruptDataError("the shard ended while being read (was it truncated?)",
                                   path=path, offset=offset + len(buf))
        return buf

    def _iter_local_shard(self, shard: int) -> Iterator[tuple[int, bytes]]:
        """(index, payload) of the records of one shard, read sequentially.

        Reads the file in ``chunk_size`` blocks instead of one pread per record
        and checks every record against the dataset index.
        """
        index = self._ensure_index()
        first, count = self.shard_ranges()[shard]
        rows = index[first:first + count]
        offsets = rows["offset"].tolist()
        sizes = rows["size"].tolist()
        path = self._shard_paths[shard]
        n = 0
        for offset, buf, start, end in self._stream(path, count):
            framed = end + FOOTER_SIZE - (start - HEADER_SIZE)
            if offset != offsets[n] or framed != sizes[n]:
                raise CorruptDataError(
                    f"the dataset index puts record {first + n} at byte offset {offsets[n]} "
                    f"({sizes[n]} bytes), but in the shard it is at byte offset {offset} "
                    f"({framed} bytes): the shard does not match its index (damaged, or from "
                    f"another pack); re-pack it", path=path, key=self.key_of(first + n),
                    record=first + n, offset=offset)
            yield first + n, self._image(buf, start, end, path, offset)
            n += 1
        if n < count:
            raise CorruptDataError(
                f"shard ends after {n} of its {count} records: it is truncated",
                path=path, offset=(offsets[n] if n < len(offsets) else None))

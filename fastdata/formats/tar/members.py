"""Reading tar files written by any tool: a minimal header parser and webdataset's
grouping of members into samples.

Understands USTAR (with its prefix field), GNU long names and PAX extended
headers. The scan groups members into samples the way webdataset does: a
member's key is its name up to the first dot of its base name, its extension
the rest (lower-cased), and consecutive members with one key form one sample.
A sample's image is its first member with an image extension (``jpg jpeg png
bmp webp ppm pgm tif tiff gif``, in that order of preference); its label is
the ASCII decimal in ``KEY.cls``, or else an integer ``"label"`` field in
``KEY.json``; a ``KEY.json`` member is also the sample's metadata. Other
members are ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from fastdata.errors import CorruptDataError, FastDataError, shown_bytes
from fastdata.formats.sparse import check_stored
from fastdata.formats.tar.schema import BLOCK, IMAGE_EXTS, JSON_EXT, LABEL_EXT, padding

_ZERO_BLOCK = bytes(BLOCK)
# Type flags of members whose data is file content.
_REGULAR = (b"0", b"\0", b"7")
# Types with no data blocks whatever their size field says (tarfile's rule).
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")
# Bytes read per window while scanning headers: large enough for many small
# samples per read, small enough to seek over big images instead of reading them.
_SCAN_WINDOW = 256 << 10
# Label members (.cls, .json) larger than this are refused unread: a label is a
# few bytes, and a damaged size field must not make the scan read gigabytes.
_MAX_LABEL_MEMBER = 64 << 10
# PAX and GNU long-name headers hold a name and a few fields: a larger one is damage.
_MAX_EXT_HEADER = 1 << 20
# Labels must fit the dataset index's int64 label column.
_LABEL_RANGE = range(-(1 << 63), 1 << 63)


class TarMember:
    """A regular file inside a tar: its name and where its data lies."""

    __slots__ = ("name", "offset", "size")

    def __init__(self, name: str, offset: int, size: int) -> None:
        self.name = name
        self.offset = offset
        self.size = size

    def __repr__(self) -> str:
        return f"TarMember({self.name!r}, offset={self.offset}, size={self.size})"


class _Window:
    """Reads byte ranges of a file through one cached window."""

    def __init__(self, f, window: int) -> None:
        self.f = f
        self.window = window
        self.start = 0
        self.buf = b""

    def get(self, pos: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``pos`` (fewer only at the end of the file)."""
        off = pos - self.start
        if off < 0 or off + n > len(self.buf):
            self.f.seek(pos)
            self.buf = self.f.read(max(self.window, n))
            self.start, off = pos, 0
        return self.buf[off:off + n]


def _cstr(field: bytes) -> bytes:
    end = field.find(b"\0")
    return field if end < 0 else field[:end]


def _number(field: bytes) -> int | None:
    """A numeric header field: octal text, or GNU base-256 (high bit set)."""
    if field[:1] and field[0] & 0x80:
        value = int.from_bytes(field, "big") & ~(0x80 << 8 * (len(field) - 1))
        return -value if field[0] & 0x40 else value
    text = _cstr(field).strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        return None


def _checksum_ok(block: bytes) -> bool:
    stored = _number(block[148:156])
    if stored is None:
        return False
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32
    if stored == unsigned:
        return True
    # Some old writers summed signed chars.
    signed = unsigned - 256 * sum(1 for b in block if b > 127) + 256 * sum(
        1 for b in block[148:156] if b > 127)
    return stored == signed


def _pax_fields(data: bytes, path: str, offset: int) -> dict[str, str]:
    out = {}
    pos = 0
    while pos < len(data):
        if data[pos:pos + 1] == b"\0":
            break  # padding
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            length = 0
        if space < 0 or length <= 0 or pos + length > len(data):
            raise CorruptDataError("malformed PAX extended header", path=path, offset=offset)
        keyword, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[keyword.decode("utf-8", "surrogateescape")] = value.decode("utf-8",
                                                                       "surrogateescape")
        pos += length
    return out


def iter_members(path: str, *, window: int = _SCAN_WINDOW) -> Iterator[TarMember]:
    """Regular-file members of the tar at ``path``, in archive order.

    Understands USTAR (with its prefix field), GNU long names (type ``L``) and
    PAX extended headers (type ``x``: ``path`` and ``size``); global PAX
    headers and link/device/directory entries are skipped.

    Raises:
        CorruptDataError: a header fails its checksum, a member runs past the end
            of the file, or the file ends without the end-of-archive block
            (truncated); the message names the offset.
    """
    size = os.path.getsize(path)
    with open(path, "rb", buffering=0) as f:
        win = _Window(f, window)
        pos = 0
        long_name: str | None = None
        pax: dict[str, str] = {}
        while True:
            if pos >= size:
                raise CorruptDataError(
                    "tar ends without its end-of-archive block: the file is truncated; "
                    "re-create or re-download it", path=path, offset=pos)
            block = win.get(pos, BLOCK)
            if len(block) < BLOCK:
                raise CorruptDataError(f"tar is truncated inside a header ({len(block)} of "
                                       f"{BLOCK} bytes)", path=path, offset=pos)
            if block == _ZERO_BLOCK:
                if long_name is not None or pax:
                    raise CorruptDataError("tar ends right after an extended header",
                                           path=path, offset=pos)
                return
            if not _checksum_ok(block):
                raise CorruptDataError(
                    "tar header fails its checksum: the shard is corrupt (or not a tar "
                    "file); re-create or re-download it", path=path, offset=pos)
            typeflag = block[156:157]
            member_size = _number(block[124:136])
            if member_size is None or member_size < 0:
                raise CorruptDataError("tar header has an unreadable size field",
                                       path=path, offset=pos)
            if typeflag in _REGULAR and "size" in pax:
                try:
                    member_size = int(pax["size"])
                except ValueError:
                    raise CorruptDataError("PAX header has an unreadable size",
                                           path=path, offset=pos) from None
            data_at = pos + BLOCK
            has_data = typeflag not in _NO_DATA
            if has_data and data_at + member_size > size:
                raise CorruptDataError(
                    f"tar member of {member_size} bytes runs past the end of the file "
                    f"({size} bytes): the file is truncated", path=path, offset=pos)
            if has_data:  # a size the file only holds as a hole: refused unread
                check_stored(f.fileno(), data_at, member_size, path=path, offset=pos,
                             what="tar member")
            pos = data_at + (member_size + padding(member_size) if has_data else 0)
            if typeflag in (b"x", b"L") and member_size > _MAX_EXT_HEADER:
                raise CorruptDataError(f"tar extended header of {member_size:,} bytes (at most "
                                       f"{_MAX_EXT_HEADER:,} are read): the shard is damaged",
                                       path=path, offset=data_at - BLOCK)
            if typeflag == b"x":
                pax = _pax_fields(win.get(data_at, member_size), path, data_at)
                continue
            if typeflag == b"L":
                raw = _cstr(win.get(data_at, member_size))
                long_name = raw.decode("utf-8", "surrogateescape")
                continue
            if typeflag in (b"g", b"K"):
                continue
            if typeflag == b"S":
                raise CorruptDataError("GNU sparse tar members are not supported",
                                       path=path, offset=data_at - BLOCK)
            if typeflag in _REGULAR:
                if "path" in pax:
                    name = pax["path"]
                elif long_name is not None:
                    name = long_name
                else:
                    raw = _cstr(block[0:100])
                    if block[257:265] == b"ustar\x0000":
                        prefix = _cstr(block[345:500])
                        if prefix:
                            raw = prefix + b"/" + raw
                    name = raw.decode("utf-8", "surrogateescape")
                yield TarMember(name, data_at, member_size)
            long_name = None
            pax = {}


def split_key(name: str) -> tuple[str, str] | None:
    """webdataset's (key, extension) of a member name: split at the first dot of
    the base name, which must not be the first character; None if no dot."""
    directory, slash, base = name.rpartition("/")
    dot = base.find(".")
    if dot <= 0:
        return None
    return directory + slash + base[:dot], base[dot + 1:]


def _is_meta(name: str) -> bool:
    # webdataset skips "__...__" entries (its own metadata files).
    if not name.startswith("__"):
        return False
    first = name.split("/", 1)[0]
    return len(first) >= 4 and first.endswith("__")


def iter_sample_members(path: str) -> Iterator[tuple[str, dict[str, TarMember]]]:
    """webdataset's samples of a tar, in archive order: ``(key, {extension: member})``.

    Consecutive members with one key form a sample; extensions are lower-cased;
    webdataset's own ``__...__`` entries and names without an extension are
    skipped.

    Raises:
        CorruptDataError: the tar is damaged (see :func:`iter_members`).
        FastDataError: a sample has two members with one extension.
    """
    key: str | None = None
    group: dict[str, TarMember] = {}
    for member in iter_members(path):
        if _is_meta(member.name):
            continue
        parts = split_key(member.name)
        if parts is None:
            continue
        mkey, ext = parts[0], parts[1].lower()
        if mkey != key:
            if key is not None:
                yield key, group
            key, group = mkey, {}
        if ext in group:
            raise FastDataError(f"sample has two {ext!r} members; webdataset refuses "
                                f"such shards too", path=path, key=key, offset=member.offset)
        group[ext] = member
    if key is not None:
        yield key, group


def scan_samples(path: str) -> list[tuple[int, int, int, str, int, int]]:
    """(image data offset, size, label, key, ``.json`` data offset, its size) of
    every sample of a tar shard (0, 0 for a sample without a ``.json`` member).

    Raises:
        CorruptDataError: the tar is damaged (see :func:`iter_members`), or a
            label member is too large or holds no label that fits 64 bits.
        FastDataError: a sample has no image member, no label, or two members
            with one extension.
    """
    with open(path, "rb", buffering=0) as f:
        small = _Window(f, 64 << 10)  # for the .cls/.json contents
        return [_sample(path, key, group, small) for key, group in iter_sample_members(path)]


def _sample(path: str, key: str, group: dict[str, TarMember], small: _Window
            ) -> tuple[int, int, int, str, int, int]:
    image = next((group[e] for e in IMAGE_EXTS if e in group), None)
    if image is None:
        raise FastDataError(
            f"sample has no image member (found {', '.join(sorted(group)) or 'nothing'}; "
            f"expected one of {', '.join(IMAGE_EXTS)})", path=path, key=key)
    label = _label(path, key, group, small)
    meta = group.get(JSON_EXT)
    return (image.offset, image.size, label, key,
            *((meta.offset, meta.size) if meta is not None else (0, 0)))


def _label_bytes(path: str, key: str, member: TarMember, ext: str, small: _Window) -> bytes:
    if member.size > _MAX_LABEL_MEMBER:
        raise CorruptDataError(f"{key}.{ext} is {member.size:,} bytes, too large for a label "
                               f"(at most {_MAX_LABEL_MEMBER:,}): the shard is damaged",
                               path=path, key=key, offset=member.offset)
    return small.get(member.offset, member.size)


def _label(path: str, key: str, group: dict[str, TarMember], small: _Window) -> int:
    cls = group.get(LABEL_EXT)
    if cls is not None:
        text = _label_bytes(path, key, cls, LABEL_EXT, small)
        try:
            label = int(text.strip())
        except ValueError:
            label = None
        if label is None or label not in _LABEL_RANGE:
            raise CorruptDataError(f"{key}.{LABEL_EXT} does not hold an integer label that fits "
                                   f"64 bits (it holds {shown_bytes(text, 24)})", path=path,
                                   key=key, offset=cls.offset)
        return label
    meta = group.get(JSON_EXT)
    if meta is not None:
        try:
            label = json.loads(_label_bytes(path, key, meta, JSON_EXT, small)).get("label")
        except (ValueError, AttributeError, RecursionError):
            label = None
        if isinstance(label, int) and not isinstance(label, bool):
            if label not in _LABEL_RANGE:
                raise CorruptDataError(f"{key}.{JSON_EXT} holds a label that does not fit 64 "
                                       f"bits", path=path, key=key, offset=meta.offset)
            return label
    raise FastDataError(
        f"sample has no label: fastdata reads it from {key}.{LABEL_EXT} (ASCII decimal) or an "
        f"integer 'label' field of {key}.{JSON_EXT}. For a tar of an image folder (images in "
        f"class folders, no .cls members), extract it and pack the folder: `fastdata pack "
        f"FOLDER out.tar`; or write shards with .cls members (webdataset: 'cls': label)",
        path=path, key=key)

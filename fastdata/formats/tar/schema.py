"""The tar shard schema (webdataset layout): member names and USTAR headers.

Every shard is a plain tar file that ``tar``, Python's ``tarfile`` and
``webdataset.WebDataset`` read unchanged. Each record is one webdataset
*sample*: consecutive members sharing a key, in record order.

====================  ========================================================
member                content
====================  ========================================================
``KEY.EXT``           the stored image bytes. EXT names the stored encoding,
                      one per encoding, the name webdataset, timm and Hugging
                      Face ``datasets`` look for: ``jpg`` for every JPEG
                      (``.jpeg``, ``.JPEG``, ``.jpe`` files too), ``png``,
                      ``webp``, ``bmp``, ``gif``, ``tiff``, ``ppm``, ``pgm``,
                      ``pbm`` (``ENCODING_EXTENSIONS``); a ``.jpg`` file that
                      holds a PNG is ``KEY.png``; pre-decoded pixels are
                      ``KEY.raw`` (their shape in the manifest). The writer
                      option ``source_extensions=True`` keeps the source
                      file's extension, lower-cased, where it names the
                      stored encoding (``jpeg``, ``tif``), as earlier packs
                      did. Readers of fastdata's shards find the image
                      through the index, whatever its EXT.
``KEY.cls``           the label, ASCII decimal (``b"3"``)
``KEY.json``          a sample with metadata: its metadata, exactly as stored
                      (canonical UTF-8 JSON, the dict the source gave), so
                      webdataset's ``json`` field is that dict; the sample's
                      key and label are not merged in (they are in ``.cls``
                      and the keys sidecar, and a metadata field may have
                      either name). A sample without metadata: no member, or
                      with the writer option ``write_json=True`` (off by
                      default: an extra member costs >= 1 KiB per sample)
                      ``{"key": original key, "label": n}``, UTF-8
====================  ========================================================

KEY is the record's source key (``cat/img_001.jpg``) without its extension,
with the directories kept and every "." of the file name replaced by "_"
(``cat/img.v2.jpg`` -> ``cat/img_v2``): webdataset splits a member name at the
first dot of its base name, so a dot there would cut the key short. When two
records of one shard would get the same KEY (``a.jpg`` and ``a.png``, or
``a.b.jpg`` and ``a_b.jpg``), the later one gets the first free of ``_1``,
``_2``, ... appended (``unique_stem``). The original keys are kept in
``NAME.fastdata.keys.json``; the writer lists every record whose KEY is not its
key without the extension (``TarWriter.renamed_keys``), which the pack reports.

Headers are plain USTAR (one 512-byte block per member): mode 0o444, uid/gid
0, no user/group names, mtime 0, so equal input gives byte-identical shards.
Names longer than USTAR's 100 bytes are split into its 155-byte prefix field
at a "/"; only a name that still does not fit, or that is not ASCII, gets a
POSIX PAX extended header (``path=...``, UTF-8) before its member. Each shard
ends with two zero blocks.

The dataset index (``NAME.fastdata.index.npy``, see fastdata.formats.sharded.layout)
holds, per record, the offset and size of the image member's *data*, so a
reader gets a record with one ``pread`` and no header parsing; the metadata
index (``NAME.fastdata.metadata.npy``, in datasets with metadata) holds those
of each ``KEY.json`` member's data.

Beside the shards, ``_info.json`` lists each tar dataset of the folder as a
split (names and record counts of its shards) for timm's webdataset reader;
see ``info.py``.
"""

from __future__ import annotations

from fastdata.encodings import ENCODING_EXTENSIONS, IMAGE_EXTENSIONS
from fastdata.errors import FastDataError

BLOCK = 512
#: File extensions, the first one preferred.
EXTENSIONS = (".tar",)
#: Name of this member layout, recorded in the manifest's ``extra``.
MEMBER_SCHEMA = "webdataset-1"
#: Member extension of the label.
LABEL_EXT = "cls"
#: Member extension of the optional metadata.
JSON_EXT = "json"
#: Member extensions that hold an image (lower case, no dot), in the order a
#: reader prefers them when a sample has several.
IMAGE_EXTS: tuple[str, ...] = tuple(e[1:] for e in IMAGE_EXTENSIONS)
#: Largest member the 11-digit octal size field can describe (8 GiB - 1).
MAX_MEMBER_SIZE = 8**11 - 1
#: End of an archive: two zero blocks.
END_OF_ARCHIVE = bytes(2 * BLOCK)

# Extension (no dot) -> the encoding it names, for the "does it match" test.
_EXT_ENCODING = {"jpg": "jpeg", "jpeg": "jpeg", "jpe": "jpeg", "tif": "tiff", "tiff": "tiff"}

_MODE = b"0000444\0"
_ZERO_ID = b"0000000\0"
_MTIME = b"00000000000\0"
_MAGIC = b"ustar\x0000"


def _template() -> bytearray:
    buf = bytearray(BLOCK)
    buf[100:108] = _MODE
    buf[108:116] = _ZERO_ID   # uid
    buf[116:124] = _ZERO_ID   # gid
    buf[136:148] = _MTIME
    buf[148:156] = b" " * 8   # checksum field counts as spaces while summing
    buf[257:265] = _MAGIC     # "ustar\0" + version "00"
    buf[329:337] = _ZERO_ID   # devmajor
    buf[337:345] = _ZERO_ID   # devminor
    return buf


_TEMPLATE = bytes(_template())


def padding(size: int) -> int:
    """Zero bytes that follow ``size`` bytes of member data up to a block boundary."""
    return -size % BLOCK


def ustar_header(name: bytes, size: int, *, prefix: bytes = b"", typeflag: bytes = b"0") -> bytes:
    """One 512-byte USTAR header block.

    Args:
        name: the name field, at most 100 bytes.
        size: the member's data size in bytes.
        prefix: the prefix field (the name's leading directories), at most 155 bytes.
        typeflag: b"0" for a regular file, b"x" for a PAX extended header.

    Raises:
        FastDataError: a field does not fit.
    """
    if len(name) > 100 or len(prefix) > 155:
        raise FastDataError(f"tar name {name!r} (prefix {prefix!r}) does not fit a USTAR header")
    if not 0 <= size <= MAX_MEMBER_SIZE:
        raise FastDataError(f"tar member of {size} bytes is larger than the 8 GiB a tar "
                            f"header can hold")
    buf = bytearray(_TEMPLATE)
    buf[0:len(name)] = name
    buf[124:136] = b"%011o\0" % size
    buf[156:157] = typeflag
    buf[345:345 + len(prefix)] = prefix
    # The checksum is the unsigned byte sum with its own field read as spaces:
    # six octal digits, NUL, space (the template's space stays as the 8th byte).
    buf[148:155] = b"%06o\0" % sum(buf)
    return bytes(buf)


def split_name(name: bytes) -> tuple[bytes, bytes] | None:
    """Split ``name`` into USTAR (prefix, name) fields, or None when it cannot fit."""
    if len(name) <= 100:
        return b"", name
    # The shortest prefix that leaves a name of at most 100 bytes.
    start = len(name) - 101
    cut = name.find(b"/", max(start, 0))
    while cut != -1:
        head, tail = name[:cut], name[cut + 1:]
        if len(head) <= 155 and 0 < len(tail) <= 100:
            return head, tail
        if len(head) > 155:
            break
        cut = name.find(b"/", cut + 1)
    return None


def pax_record(keyword: str, value: str) -> bytes:
    """One PAX extended-header record ``"LEN keyword=value\\n"`` (LEN counts itself)."""
    body = f" {keyword}={value}\n".encode("utf-8")
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode("ascii") + body


def member_header(name: str, size: int) -> bytes:
    """The header block(s) of a regular file ``name`` of ``size`` bytes.

    Plain USTAR when the name is ASCII and fits (directly or split at a "/");
    otherwise a PAX extended header carrying the full UTF-8 path, followed by
    a USTAR header with a shortened ASCII name for readers that ignore PAX.
    """
    raw = name.encode("utf-8")
    fields = split_name(raw) if raw.isascii() else None
    if fields is not None:
        return ustar_header(fields[1], size, prefix=fields[0])
    pax = pax_record("path", name)
    short = name.encode("ascii", "replace")[-100:].lstrip(b"/") or b"_"
    return b"".join((ustar_header(b"././@PaxHeader", len(pax), typeflag=b"x"), pax,
                     bytes(padding(len(pax))), ustar_header(short, size)))


def key_without_extension(key: str) -> str:
    """The source key without the extension of its file name (``cat/img.v2.jpg``
    -> ``cat/img.v2``); a name whose only dot leads it keeps it (``cat/.x``)."""
    directory, _, base = key.rpartition("/")
    stem = base.rsplit(".", 1)[0] if "." in base.lstrip(".") else base
    return f"{directory}/{stem}" if directory else stem


def sample_stem(key: str) -> str:
    """The webdataset key for a source key: extension dropped, dots of the file
    name replaced by "_", directories kept (``cat/img.v2.jpg`` -> ``cat/img_v2``)."""
    directory, _, stem = key_without_extension(key).rpartition("/")
    stem = stem.replace(".", "_") or "_"
    return f"{directory}/{stem}" if directory else stem


def unique_stem(key: str, taken: dict[str, str]) -> tuple[str, str | None]:
    """The member stem of ``key`` in a shard whose stems so far are ``taken``
    (stem -> the key stored under it), and why it differs from the key without
    its extension (None when it does not): the first free of ``sample_stem(key)``,
    then ``_1``, ``_2``, ... appended."""
    natural = key_without_extension(key)
    stem = sample_stem(key)
    reasons = []
    if stem != natural:
        reasons.append("'.' in the file name became '_' (webdataset keys end at the first '.')")
    if stem in taken:
        reasons.append(f"{stem!r} was taken by {taken[stem]!r} in this shard")
        n = 1
        while f"{stem}_{n}" in taken:
            n += 1
        stem = f"{stem}_{n}"
    return stem, "; ".join(reasons) or None


def image_extension(key: str, encoding: str, *, source_extensions: bool = False) -> str:
    """The member extension for a record: the stored encoding's one
    (``ENCODING_EXTENSIONS``: ``jpg`` for every JPEG); with ``source_extensions``
    the source's, lower-cased, when it names the stored encoding."""
    base = key.rpartition("/")[2]
    ext = base.rsplit(".", 1)[1].lower() if "." in base.lstrip(".") else ""
    if source_extensions and ext and _EXT_ENCODING.get(ext, ext) == encoding:
        return ext
    return ENCODING_EXTENSIONS.get(encoding) or ext or "bin"

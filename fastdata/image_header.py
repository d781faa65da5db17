"""Image sizes read from headers, and the pixel limit checked before any decode.

A 631-byte JPEG can declare 60000x60000 pixels; a decoder allocates the whole
image (10.8 GB as RGB) before it finds out the data is not there. So both the
packer and every decoder read the declared size from the header first (a few
bytes: JPEG SOF, PNG IHDR, GIF/BMP/WebP/PNM headers; Pillow's lazy open, which
reads only the header, for the rest) and refuse an image above ``max_pixels``.

The default limit follows Pillow's decompression-bomb convention: Pillow warns
above ``PIL.Image.MAX_IMAGE_PIXELS`` (89,478,485) and refuses above twice that;
fastdata refuses above twice that too, whatever the decoder.
"""

from __future__ import annotations

import io
import struct
import warnings

from fastdata.encodings import sniff_encoding
from fastdata.errors import DecodeError

#: 2 x Pillow's default ``Image.MAX_IMAGE_PIXELS``: where ``Image.open`` raises
#: DecompressionBombError (about 13,400 x 13,400 pixels).
DEFAULT_MAX_PIXELS = 2 * 89_478_485

#: JPEG start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC).
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})  # markers without a length
_PNG_SIZE = struct.Struct(">II")


def check_max_pixels(max_pixels: int | None) -> int | None:
    """Validate a ``max_pixels`` option: a positive int, or None for no limit."""
    if max_pixels is None:
        return None
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels <= 0:
        raise ValueError(f"max_pixels must be a positive integer or None (no limit), "
                         f"not {max_pixels!r}")
    return max_pixels


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's start-of-frame marker; None if there is none
    before the image data."""
    n = len(data)
    i = 2
    while i + 4 <= n:
        if data[i] != 0xFF:  # garbage between segments: on to the next marker
            i = data.find(b"\xff", i)
            if i < 0:
                return None
            continue
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker in _STANDALONE or marker == 0xD8:
            i += 2
        elif marker == 0xDA:  # start of scan: the frame header comes before it
            return None
        elif marker in SOF_MARKERS:
            if i + 9 > n:
                return None
            return (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
        else:
            i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None


def _png_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    width, height = _PNG_SIZE.unpack_from(data, 16)
    return height, width


def _gif_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 10:
        return None
    return int.from_bytes(data[8:10], "little"), int.from_bytes(data[6:8], "little")


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 26:
        return None
    if int.from_bytes(data[14:18], "little") == 12:  # OS/2 core header: 16-bit sizes
        return int.from_bytes(data[20:22], "little"), int.from_bytes(data[18:20], "little")
    width = int.from_bytes(data[18:22], "little", signed=True)
    height = int.from_bytes(data[22:26], "little", signed=True)  # negative: top-down rows
    return abs(height), abs(width)


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return (int.from_bytes(data[27:30], "little") + 1,
                int.from_bytes(data[24:27], "little") + 1)
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8 " and len(data) >= 30:
        return (int.from_bytes(data[28:30], "little") & 0x3FFF,
                int.from_bytes(data[26:28], "little") & 0x3FFF)
    return None


def _pnm_size(data: bytes) -> tuple[int, int] | None:
    # "P6 <width> <height> ...", with "#" comments to the end of a line.
    words: list[int] = []
    text = data[2:256].split(b"\n")
    for line in text:
        for word in line.split(b"#", 1)[0].split():
            if not word.isdigit():
                return None
            words.append(int(word))
            if len(words) == 2:
                return words[1], words[0]
    return None


_PARSERS = {"jpeg": jpeg_size, "png": _png_size, "gif": _gif_size, "bmp": _bmp_size,
            "webp": _webp_size, "ppm": _pnm_size, "pgm": _pnm_size, "pbm": _pnm_size}


def _pil_size(data: bytes) -> tuple[int, int] | None:
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DecompressionBombWarning: decided below
            with Image.open(io.BytesIO(data)) as img:  # lazy: reads the header only
                return img.height, img.width
    except Image.DecompressionBombError:
        return None  # size unknown here; Pillow's own limit refuses it when decoding
    except Exception:  # not an image Pillow reads: the decoders will say so
        return None


def image_size(data, encoding: str | None = None) -> tuple[int, int] | None:
    """(height, width) an encoded image declares, read from its header only;
    None when the header cannot be read (the decoders then report why)."""
    encoding = encoding or sniff_encoding(data)
    parser = _PARSERS.get(encoding)
    if parser is None:
        return _pil_size(bytes(data))
    if not isinstance(data, bytes):
        # Only a JPEG's frame header can lie far in (after large APP segments).
        data = bytes(data if encoding == "jpeg" else data[:256])
    return parser(data)


def pixel_limit_error(size: tuple[int, int], max_pixels: int) -> str:
    """The reason an image of ``size`` (height, width) over ``max_pixels`` is refused."""
    height, width = size
    return (f"image declares {width}x{height} = {width * height:,} pixels, above the limit "
            f"of {max_pixels:,} (max_pixels={max_pixels}): a decompression bomb or a damaged "
            f"header; pass a larger max_pixels=N, or max_pixels=None for no limit, to decode "
            f"it anyway")


def check_pixels(data, max_pixels: int | None, encoding: str | None = None) -> None:
    """Refuse an image whose header declares more than ``max_pixels`` pixels,
    before anything is decoded (None: no limit).

    Raises:
        DecodeError: the declared size is above the limit.
    """
    if max_pixels is None:
        return
    size = image_size(data, encoding)
    if size is not None and size[0] * size[1] > max_pixels:
        raise DecodeError(pixel_limit_error(size, max_pixels))

"""Pack-time checks that a source file really is a usable image.

The cheap check (always on) reads the header with Pillow and looks for the end
marker of JPEG and PNG streams, which catches empty, foreign and truncated
files without decoding pixels. The full check (``verify_decode``) decodes the
whole image, JPEGs strictly: libjpeg's warnings about damaged data, which
every decoder otherwise passes over, make the image bad (see
``fastdata.decoding.strict``).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from fastdata.encodings import sniff_encoding
from fastdata.errors import BadImageError, DamagedImageError, exception_text, shown_bytes
from fastdata.image_header import DEFAULT_MAX_PIXELS, image_size, pixel_limit_error


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the header check learned about an image."""

    encoding: str
    width: int
    height: int
    mode: str


def check_image(data: bytes, *, key: str, verify_decode: bool = False,
                max_pixels: int | None = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Check that ``data`` holds a complete image and return its header facts.

    Args:
        data: the file's bytes.
        key: the file's key, for error messages.
        verify_decode: also decode every pixel (slower, catches damage inside
            the compressed data, including JPEG damage that libjpeg only warns about).
        max_pixels: refuse an image whose header declares more pixels (read
            from the header, before anything is decoded); None: no limit of
            fastdata's (Pillow's own decompression-bomb limit still applies).

    Raises:
        BadImageError: the bytes are empty, not an image, truncated or undecodable;
            the message says which.
    """
    if not data:
        raise BadImageError("empty file (0 bytes)", key=key)
    encoding = sniff_encoding(data)
    if encoding is None:
        raise BadImageError(
            f"not a recognised image format (it starts with {shown_bytes(data)})", key=key)
    if encoding == "jpeg":
        _check_jpeg_end(data, key)
    elif encoding == "png":
        _check_png_end(data, key)
    _check_pixels(data, encoding, max_pixels, key)

    from PIL import (
        Image,  # Pillow is a core dependency; imported here to keep `import fastdata` light
    )

    what = "has an unreadable header"  # until Image.open has read it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PIL warns on odd EXIF; the decode test decides
            with Image.open(io.BytesIO(data)) as img:
                info = ImageInfo(encoding, img.width, img.height, img.mode)
                if verify_decode:
                    what = "cannot be decoded"
                    _decode_all(img, data, encoding, key)
    except BadImageError:
        raise
    except Exception as exc:  # Pillow raises many types (OSError, SyntaxError, ValueError, ...)
        raise BadImageError(f"{encoding} image {what}: {exception_text(exc)}", key=key) from None
    if info.width <= 0 or info.height <= 0:
        raise BadImageError(f"image has no pixels ({info.width}x{info.height})", key=key)
    return info


def check_raw(data: bytes, shape: tuple[int, int, int], *, key: str) -> ImageInfo:
    """Check that ``data`` holds the decoded pixels ``shape`` (height, width,
    3) promises: raw records have no header, so their size is all there is to
    check.

    Raises:
        BadImageError: the shape is not (height, width, 3) of positive sizes,
            or ``data`` holds another number of bytes.
    """
    if len(shape) != 3 or int(shape[2]) != 3 or min(int(shape[0]), int(shape[1])) <= 0:
        raise BadImageError(f"raw pixels of shape {tuple(shape)} cannot be stored: raw records "
                            f"are (height, width, 3) uint8", key=key)
    h, w, c = (int(n) for n in shape)
    if len(data) != h * w * c:
        raise BadImageError(f"raw record holds {len(data)} bytes, not the {h * w * c} of its "
                            f"shape {h}x{w}x{c}", key=key)
    return ImageInfo("raw", w, h, "RGB")


def _decode_all(img, data: bytes, encoding: str, key: str) -> None:
    if encoding == "jpeg":
        from fastdata.decoding.strict import decode_jpeg_strictly

        try:
            if decode_jpeg_strictly(data):
                return
        except DamagedImageError as exc:
            raise BadImageError(exc.message, key=key) from None
    img.load()  # everything else, and JPEGs the strict decode could not check


def _check_pixels(data: bytes, encoding: str, max_pixels: int | None, key: str) -> None:
    if max_pixels is None:
        return
    size = image_size(data, encoding)
    if size is not None and size[0] * size[1] > max_pixels:
        raise BadImageError(pixel_limit_error(size, max_pixels), key=key)


def _check_jpeg_end(data: bytes, key: str) -> None:
    # The last start-of-scan marker must be followed by an end-of-image marker;
    # an EOI inside an EXIF thumbnail comes before it and does not count.
    sos = data.rfind(b"\xff\xda")
    if sos < 0:
        raise BadImageError("jpeg has no image data (no start-of-scan marker)", key=key)
    if data.find(b"\xff\xd9", sos + 2) < 0:
        raise BadImageError(
            f"jpeg is truncated: no end-of-image marker after its image data "
            f"({len(data)} bytes)", key=key)


def _check_png_end(data: bytes, key: str) -> None:
    iend = data.rfind(b"IEND")
    if iend < 0 or iend < data.rfind(b"IDAT"):
        raise BadImageError(f"png is truncated: no IEND chunk ({len(data)} bytes)", key=key)

"""Image encodings: recognising them from their first bytes and their file names.

Used on both sides: the packer records which encodings a dataset holds, the
loaders pick a decoder from it. Sniffing looks at magic bytes only, so a
``.jpg`` file that really holds a PNG is stored and decoded as the PNG it is.
"""

from __future__ import annotations

# File extensions that the image-folder source accepts (lower case, with dot).
# torchvision's ImageFolder list plus .gif.
IMAGE_EXTENSIONS: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".pgm", ".tif", ".tiff", ".gif",
)

# Canonical extension for each encoding, used when writing members by
# encoding (for example tar shards) rather than by source name.
ENCODING_EXTENSIONS: dict[str, str] = {
    "jpeg": "jpg",
    "png": "png",
    "bmp": "bmp",
    "webp": "webp",
    "ppm": "ppm",
    "pgm": "pgm",
    "pbm": "pbm",
    "tiff": "tiff",
    "gif": "gif",
    "raw": "raw",
}


def sniff_encoding(data: bytes | memoryview) -> str | None:
    """Return the image encoding of ``data`` from its magic bytes, or None.

    Args:
        data: the start of an encoded image (16 bytes are enough).

    Returns:
        One of "jpeg", "png", "gif", "bmp", "webp", "tiff", "ppm", "pgm", "pbm",
        or None when the bytes match no known image format.
    """
    head = bytes(data[:16])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:2] == b"BM":
        return "bmp"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if len(head) >= 3 and head[0:1] == b"P" and head[2:3] in (b" ", b"\n", b"\r", b"\t"):
        kind = head[1:2]
        if kind in (b"3", b"6"):
            return "ppm"
        if kind in (b"2", b"5"):
            return "pgm"
        if kind in (b"1", b"4"):
            return "pbm"
    return None


def has_image_extension(name: str) -> bool:
    """True when ``name`` ends with one of IMAGE_EXTENSIONS, in any letter case."""
    return name.lower().endswith(IMAGE_EXTENSIONS)

"""Image encodings: recognising them from their first bytes and their file names.

Used on both sides: the packer records which encodings a dataset holds, the
loaders pick a decoder from it. Sniffing looks at magic bytes only, so a
``.jpg`` file that really holds a PNG is stored and decoded as the PNG it is.
"""

from __future__ import annotations

# torchvision's ImageFolder IMG_EXTENSIONS (lower case, with dot, its order): the
# files an image-folder source packs by default, so that its samples and their
# indices are those of ``torchvision.datasets.ImageFolder(root)``.
TORCHVISION_EXTENSIONS: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
)

# Every file extension of an image that fastdata decodes (lower case, with dot):
# torchvision's plus .gif, which a source packs only when asked to
# (``extensions=``). Readers take any of them (tar members, in this order of preference).
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


def has_image_extension(name: str,
                        extensions: tuple[str, ...] = TORCHVISION_EXTENSIONS) -> bool:
    """True when ``name`` ends with one of ``extensions`` (lower case, with dot),
    in any letter case."""
    return name.lower().endswith(extensions)

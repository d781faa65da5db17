"""Decoding stored payloads into RGB uint8 pixels (no torch here).

Pixels come out as stored: EXIF orientation is not applied, matching what
torchvision's ImageFolder loader gives for the same file.
"""

from __future__ import annotations

import io

import numpy as np


def decode_rgb(data: bytes | memoryview) -> np.ndarray:
    """Decode an encoded image into a writable HWC uint8 RGB array.

    Grayscale, palette, CMYK, alpha and 16-bit images are converted to 3-channel
    8-bit RGB the way Pillow's ``convert("RGB")`` does.

    Raises:
        Exception: whatever the decoder raises for undecodable bytes; the Dataset
            turns it into a DecodeError naming the record.
    """
    return np.array(decode_pil(data))


def decode_pil(data: bytes | memoryview):
    """Decode into a PIL RGB image."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img.load()
        if img.mode == "RGB":
            return img.copy()
        if img.mode in ("I;16", "I;16B", "I;16L", "I"):
            # 16/32-bit grayscale: scale to 8 bits instead of clipping.
            arr = np.asarray(img, dtype=np.uint32)
            shift = 8 if img.mode.startswith("I;16") else 24
            gray = (arr >> shift).astype(np.uint8)
            return Image.fromarray(np.repeat(gray[..., None], 3, axis=2), "RGB")
        return img.convert("RGB")

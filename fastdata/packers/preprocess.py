"""Pack-time preprocessing: resize, crop and re-encode each image once, at pack time.

Resizing at pack time shrinks both the decode work of every epoch and the
dataset; ``raw`` storage removes decoding altogether at the cost of disk.
"""

from __future__ import annotations

import io
import re
from dataclasses import asdict, dataclass

import numpy as np

from fastdata.errors import FastDataError

ENCODINGS = ("keep", "jpeg", "png", "raw")


@dataclass(frozen=True)
class Preprocess:
    """What to do to each image before storing it.

    Attributes:
        resize: None, an int (shorter side, aspect kept) or (h, w).
        center_crop: with ``resize``: scale to cover the target, then crop the
            centre (an int resize gives a square crop); without it an (h, w)
            resize stretches to fit, as torchvision's ``Resize((h, w))`` does.
        max_size: shrink (never enlarge) so the longer side is at most this.
        encoding: "keep" (original bytes when nothing else changes; otherwise
            the original encoding: JPEG stays JPEG, raw pixels stay raw,
            anything else becomes PNG),
            "jpeg", "png", or "raw" (decoded uint8 HWC pixels, fixed shape).
        quality: JPEG quality when encoding JPEG.
        restarts: store JPEGs with a restart marker after every MCU, so that
            random crops decode only the crop's blocks
            (``fastdata.decoding.jpeg_restarts``). Re-encoded JPEGs get them
            from the encoder; original bytes are rewritten losslessly (the
            same pixels), which needs libjpeg-turbo 3.1 or later.
    """

    resize: int | tuple[int, int] | None = None
    center_crop: bool = False
    max_size: int | None = None
    encoding: str = "keep"
    quality: int = 90
    restarts: bool = False

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise FastDataError(f"unknown encoding {self.encoding!r}; choose one of "
                                f"{', '.join(ENCODINGS)}")
        if not 1 <= int(self.quality) <= 100:
            raise FastDataError(f"quality={self.quality} is out of range: give 1-100")
        if self.center_crop and self.resize is None:
            raise FastDataError("center_crop=True needs resize= (the size to crop to)")
        if self.max_size is not None and self.max_size < 1:
            raise FastDataError(f"max_size={self.max_size} must be positive")
        if self.restarts:
            self._check_restarts()

    def _check_restarts(self) -> None:
        if self.encoding in ("png", "raw"):
            raise FastDataError(f"restart markers are a JPEG feature: encoding "
                                f"{self.encoding!r} stores no JPEGs (use 'jpeg' or 'keep')")
        if self.lossless_restarts:
            from fastdata.decoding import turbojpeg

            if not turbojpeg.restarts_supported():
                found = turbojpeg.library_path() or "none found"
                raise FastDataError(
                    "adding restart markers to the original JPEG bytes without re-encoding "
                    "them needs libjpeg-turbo 3.1 or later (TurboJPEG library: "
                    f"{found}): point {turbojpeg.ENV} at its libturbojpeg, or re-encode "
                    "(--encoding jpeg, or --resize) so the encoder writes them")

    @property
    def lossless_restarts(self) -> bool:
        """Restart markers added to otherwise unchanged JPEG bytes."""
        return (self.restarts and self.encoding == "keep" and self.resize is None
                and self.max_size is None)

    @property
    def identity(self) -> bool:
        """Nothing to do: the original bytes are stored."""
        return (self.encoding == "keep" and self.resize is None and self.max_size is None
                and not self.restarts)

    def to_dict(self) -> dict:
        out = asdict(self)
        if not self.restarts:  # absent unless asked for: older manifests stay valid
            del out["restarts"]
        return out

    def rewrite(self, data: bytes, encoding: str) -> bytes:
        """The stored bytes under :attr:`lossless_restarts`: JPEGs with
        restart markers, anything else unchanged."""
        if encoding != "jpeg":
            return data
        from fastdata.decoding import jpeg_restarts, turbojpeg

        return jpeg_restarts.add_index(turbojpeg.add_restarts(data))

    def apply(self, data: bytes, encoding: str,
              raw_shape: tuple[int, int, int] | None = None) -> tuple[bytes, str, int, int]:
        """Process one image.

        Args:
            data: the original file bytes, or decoded pixels (``encoding`` "raw").
            encoding: their sniffed encoding, or "raw".
            raw_shape: for "raw": the pixels' (height, width, 3) shape.

        Returns:
            (payload, payload encoding, width, height). Under "keep" JPEG stays
            JPEG, raw stays raw, anything else becomes PNG.
        """
        if encoding == "raw":
            pixels = np.frombuffer(data, dtype=np.uint8).reshape(raw_shape)
        else:
            from fastdata.decoding.decode import decode_rgb

            pixels = decode_rgb(data)
        pixels = self._geometry(pixels)
        h, w = pixels.shape[:2]
        out_encoding = self.encoding
        if out_encoding == "keep":
            out_encoding = encoding if encoding in ("jpeg", "raw") else "png"
        if out_encoding == "raw":
            return np.ascontiguousarray(pixels).tobytes(), "raw", w, h
        return (encode(pixels, out_encoding, self.quality, restarts=self.restarts),
                out_encoding, w, h)

    def _geometry(self, pixels: np.ndarray) -> np.ndarray:
        from fastdata.decoding.decode import target_size

        h, w = pixels.shape[:2]
        if self.resize is not None:
            if self.center_crop:
                th, tw = (self.resize, self.resize) if isinstance(self.resize, int) else self.resize
                scale = max(th / h, tw / w)
                sh, sw = max(th, round(h * scale)), max(tw, round(w * scale))
                pixels = _resize_quality(pixels, (sh, sw))
                top, left = (sh - th) // 2, (sw - tw) // 2
                pixels = pixels[top: top + th, left: left + tw]
            else:
                pixels = _resize_quality(pixels, target_size(h, w, self.resize))
        if self.max_size is not None:
            h, w = pixels.shape[:2]
            if max(h, w) > self.max_size:
                scale = self.max_size / max(h, w)
                pixels = _resize_quality(pixels, (max(1, round(h * scale)),
                                                  max(1, round(w * scale))))
        return np.ascontiguousarray(pixels)


def _resize_quality(pixels: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Pack-time resize: area averaging when shrinking (best quality, done once),
    bicubic when enlarging."""
    import cv2

    h, w = hw
    if pixels.shape[:2] == (h, w):
        return pixels
    shrink = h * w < pixels.shape[0] * pixels.shape[1]
    return cv2.resize(pixels, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_CUBIC)


def encode(pixels: np.ndarray, encoding: str, quality: int = 90, *,
           restarts: bool = False) -> bytes:
    """Encode HWC uint8 RGB pixels as JPEG (4:2:0; with ``restarts``, a
    restart marker after every MCU and their index) or PNG."""
    from PIL import Image

    buf = io.BytesIO()
    img = Image.fromarray(pixels, "RGB")
    if encoding == "jpeg":
        extra = {"restart_marker_blocks": 1} if restarts else {}
        img.save(buf, "JPEG", quality=int(quality), subsampling="4:2:0", **extra)
        if restarts:
            from fastdata.decoding.jpeg_restarts import add_index

            return add_index(buf.getvalue())
    elif encoding == "png":
        img.save(buf, "PNG", compress_level=6)
    else:
        raise FastDataError(f"cannot encode as {encoding!r}")
    return buf.getvalue()


def parse_resize(text: str | int | None) -> int | tuple[int, int] | None:
    """Parse a resize given as text: "256" (shorter side) or "224x224" (HxW)."""
    if text is None or text == "":
        return None
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX×,]\s*(\d+)\s*)?", str(text))
    if not m:
        raise FastDataError(f"resize={text!r} cannot be read: give SHORT (256) or HxW (224x224)")
    if m.group(2) is None:
        value = int(m.group(1))
        if value < 1:
            raise FastDataError(f"resize={text!r} must be positive")
        return value
    h, w = int(m.group(1)), int(m.group(2))
    if h < 1 or w < 1:
        raise FastDataError(f"resize={text!r} must be positive")
    return h, w

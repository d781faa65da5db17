"""Decoders: stored payloads to RGB uint8 pixels (no torch here).

Decoding a payload with the decoders listed in ``decoder_registry`` (classes in
``decoders``), each wrapping one library:

======================  ==========================  ==============================
name                    decodes                     needs
======================  ==========================  ==============================
``simplejpeg``          JPEG                        simplejpeg (a dependency; bundles libjpeg-turbo)
``jpeg4py``             JPEG                        ``pip install jpeg4py`` + system libturbojpeg
``opencv``              JPEG PNG BMP WebP TIFF PPM  opencv-python-headless (a dependency)
``pil``                 everything Pillow reads     Pillow (a dependency)
======================  ==========================  ==============================

``decoder="auto"`` takes, for each record's encoding, the fastest installed
decoder that handles it (order measured on this project's benchmark) and falls
back to Pillow when that decoder refuses the image (for example a CMYK JPEG).
A decoder is offered only when its library imports and passes a trial use
(``Decoder.probe``, once per process, printing nothing); :func:`decoder_status`
says why each other one is not.

Every decoder gives the same output contract:

- HWC uint8, C-contiguous, writable; 3 channels RGB. Grayscale, palette, CMYK,
  alpha (dropped, not composited) and 16-bit images (scaled by >> 8) all become
  3-channel 8-bit RGB; ``keep_gray=True`` returns grayscale sources as 1 channel.
- Pixels as stored: EXIF orientation is ignored by every decoder (as
  torchvision's default PIL loader does).
- Same pixels within a tolerance: lossless formats (PNG, BMP, PPM, TIFF) are
  identical across decoders; JPEG differs by IDCT/upsampling rounding: mean
  absolute difference below 1.0 and at most a few levels per pixel for plain
  YCbCr JPEGs (tests check both).
- ``size``: an int resizes the shorter side to it (the longer side scales as
  torchvision's ``Resize(int)`` does: ``int(size * long / short)``); ``(h, w)``
  resizes to exactly that. JPEGs are first decoded at the smallest DCT scale
  (1/2, 1/4, 1/8) that stays at or above the target, then resized once
  (bilinear up to a 2.5x shrink; Gaussian-pyramid halving first beyond that,
  see :func:`resize`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import numpy as np

from fastdata.decoding.decoder_registry import AUTO_DEFAULT, AUTO_ORDER, DECODERS
from fastdata.encodings import sniff_encoding
from fastdata.errors import FastDataError
from fastdata.image_header import DEFAULT_MAX_PIXELS, check_max_pixels, check_pixels
from fastdata.lazy import load

Size = int | tuple[int, int] | None

def target_size(height: int, width: int, size: Size) -> tuple[int, int] | None:
    """The (h, w) an image of ``height`` x ``width`` is resized to, or None."""
    if size is None:
        return None
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"size must be positive, not {size}")
        if height <= width:
            return size, max(1, int(size * width / height))
        return max(1, int(size * height / width)), size
    h, w = size
    if h <= 0 or w <= 0:
        raise ValueError(f"size must be positive, not {size}")
    return int(h), int(w)


def parse_size(size) -> Size:
    """Normalise a ``size`` option: None, an int, or (h, w)."""
    if size is None or isinstance(size, int):
        return size
    if isinstance(size, Sequence) and len(size) == 2:
        return int(size[0]), int(size[1])
    if isinstance(size, Sequence) and len(size) == 1:
        return int(size[0])
    raise ValueError(f"size must be an int (shorter side) or (height, width), not {size!r}")


#: Shrink factors up to this use plain bilinear interpolation; beyond it the
#: image is first halved with a Gaussian pyramid (antialiased) step.
LINEAR_MAX_SHRINK = 2.5


def resize(array: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Resize an HWC uint8 array to ``hw``.

    Bilinear for shrinking up to 2.5x and for enlarging. Larger shrinks first
    halve the image with ``cv2.pyrDown`` (a 5x5 Gaussian, so no aliasing) while
    both sides stay at or above the target, then finish bilinearly; area
    averaging only for what is left (extreme aspect changes). After DCT scaling
    a JPEG rarely needs more than one halving. At these sizes pyrDown+bilinear
    takes ~0.12 ms where area averaging takes ~0.6 ms and PIL's bilinear ~0.9 ms.
    """
    import cv2

    h, w = hw
    if array.shape[0] == h and array.shape[1] == w:
        return array
    while array.shape[0] >= 2 * h and array.shape[1] >= 2 * w and \
            max(array.shape[0] / h, array.shape[1] / w) > LINEAR_MAX_SHRINK:
        array = cv2.pyrDown(array)
        if array.ndim == 2:
            array = array[:, :, None]
    if array.shape[0] == h and array.shape[1] == w:
        return array
    shrink = max(array.shape[0] / h, array.shape[1] / w)
    out = cv2.resize(array, (w, h), interpolation=cv2.INTER_AREA if shrink > LINEAR_MAX_SHRINK
                     else cv2.INTER_LINEAR)
    if out.ndim == 2:
        out = out[:, :, None]
    return out


def finish(array: np.ndarray, keep_gray: bool, hw: tuple[int, int] | None) -> np.ndarray:
    """Channels, final resize to ``hw`` (computed from the ORIGINAL image size,
    not the DCT-scaled one) and the memory layout of the output contract."""
    if array.ndim == 2:
        array = array[:, :, None]
    if array.shape[2] == 1 and not keep_gray:
        array = np.repeat(array, 3, axis=2)
    if hw is not None:
        array = resize(array, hw)
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = np.ascontiguousarray(array).copy() if not array.flags.writeable else \
            np.ascontiguousarray(array)
    return array


#: name -> why that decoder is not offered here (None: it is), probed once per process.
_unusable: dict[str, str | None] = {}
_cache_lock = threading.Lock()


def unusable_reason(name: str) -> str | None:
    """Why the decoder ``name`` is not offered here ("not installed", or what
    failed when it was tried), or None when it is. Probed once per process."""
    with _cache_lock:
        if name not in _unusable:
            _unusable[name] = decoder_class(name).probe()
        return _unusable[name]


def is_available(name: str) -> bool:
    """Whether the decoder ``name`` is installed and works here."""
    return unusable_reason(name) is None


def available_decoders() -> list[str]:
    """Names of the decoders installed and working here."""
    return [name for name in DECODERS if is_available(name)]


def decoder_status() -> dict[str, str | None]:
    """Every registered decoder: None when offered, else why not (for ``fastdata
    info`` and ``fastdata bench``)."""
    return {name: unusable_reason(name) for name in DECODERS}


def decoder_status_line(status: dict[str, str | None]) -> str:
    """``simplejpeg, opencv, pil; not offered: jpeg4py (REASON)``: one line."""
    offered = ", ".join(n for n, why in status.items() if why is None) or "none"
    missing = "; ".join(f"{n} ({why})" for n, why in status.items() if why is not None)
    return offered + (f"; not offered: {missing}" if missing else "")


def decoder_class(name: str):
    """The decoder class registered as ``name``."""
    return load(DECODERS[name])


def check_decoder(name: str) -> str:
    """Validate a decoder name ("auto" or one of DECODERS) and that it is usable here.

    Raises:
        FastDataError: unknown name, not installed, or installed but unusable
            (says why, and what to install).
    """
    if name == "auto":
        return name
    if name not in DECODERS:
        raise FastDataError(f"unknown decoder {name!r}; choose auto or one of "
                            f"{', '.join(DECODERS)}")
    reason = unusable_reason(name)
    if reason == "not installed":
        raise FastDataError(f"decoder {name!r} is not installed: "
                            f"{decoder_class(name).install_hint}")
    if reason is not None:
        raise FastDataError(f"decoder {name!r} is installed but cannot be used here: {reason}; "
                            f"it needs {decoder_class(name).install_hint}")
    return name


class DecoderChain:
    """Decodes any payload with the chosen decoder, or the fastest suitable one.

    Args:
        decoder: "auto" or a decoder name.
        size: optional target size (see the module docstring).
        keep_gray: return grayscale sources with 1 channel.
        raw_shape: the HWC shape of pre-decoded (raw) payloads, else None.
        max_pixels: refuse (DecodeError) an image whose header declares more
            pixels, before any decoder allocates it; None: no limit. The
            default, 178,956,970, is where Pillow refuses decompression bombs.
    """

    def __init__(self, decoder: str = "auto", *, size: Size = None,
                 keep_gray: bool = False, raw_shape: Sequence[int] | None = None,
                 max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
        self.decoder = check_decoder(decoder)
        self.size = parse_size(size)
        self.keep_gray = keep_gray
        self.max_pixels = check_max_pixels(max_pixels)
        self.raw_shape = tuple(int(x) for x in raw_shape) if raw_shape else None
        self._by_encoding: dict[str | None, list] = {}

    def _chain(self, encoding: str | None) -> list:
        chain = self._by_encoding.get(encoding)
        if chain is None:
            if self.decoder == "auto":
                names = AUTO_ORDER.get(encoding, AUTO_DEFAULT)
            else:
                names = (self.decoder, "pil")
            chain = []
            for name in dict.fromkeys(names):
                if is_available(name):
                    dec = decoder_class(name)()
                    if dec.handles(encoding) or name == self.decoder:
                        chain.append(dec)
            self._by_encoding[encoding] = chain
        return chain

    def __call__(self, data) -> np.ndarray:
        if self.raw_shape is not None:
            return self._raw(data)
        encoding = sniff_encoding(data)
        check_pixels(data, self.max_pixels, encoding)  # before any decoder allocates
        chain = self._chain(encoding)
        error: Exception | None = None
        for dec in chain:
            try:
                return dec.decode(data, size=self.size, keep_gray=self.keep_gray,
                                  encoding=encoding)
            except Exception as exc:  # fall through to the next (Pillow last)
                error = error or exc
        raise error if error is not None else ValueError("no decoder available")

    def _raw(self, data) -> np.ndarray:
        """Pre-decoded pixels: no decoding, only a view and (if asked) a resize."""
        expected = int(np.prod(self.raw_shape))
        if len(data) != expected:
            raise ValueError(f"raw record holds {len(data)} bytes, shape "
                             f"{list(self.raw_shape)} needs {expected}")
        # A writable copy: torch refuses to share read-only memory silently.
        array = np.frombuffer(data, dtype=np.uint8).reshape(self.raw_shape).copy()
        hw = target_size(array.shape[0], array.shape[1], self.size)
        if self.keep_gray is False and array.shape[2] == 1:
            array = np.repeat(array, 3, axis=2)
        return resize(array, hw) if hw is not None else array

    def __getstate__(self):
        return {"decoder": self.decoder, "size": self.size, "keep_gray": self.keep_gray,
                "raw_shape": self.raw_shape, "max_pixels": self.max_pixels, "_by_encoding": {}}


def decode_rgb(data, *, decoder: str = "auto", size: Size = None,
               keep_gray: bool = False, max_pixels: int | None = DEFAULT_MAX_PIXELS
               ) -> np.ndarray:
    """Decode an encoded image into an HWC uint8 RGB array (see the module docstring)."""
    return _shared_chain(decoder, parse_size(size), keep_gray, max_pixels)(data)


@functools.lru_cache(maxsize=32)
def _shared_chain(decoder: str, size: Size, keep_gray: bool,
                  max_pixels: int | None) -> DecoderChain:
    # One chain per option set, so per-image callers (pack-time preprocessing,
    # verifying with decoding) do not rebuild the decoder lookup for every image.
    return DecoderChain(decoder, size=size, keep_gray=keep_gray, max_pixels=max_pixels)


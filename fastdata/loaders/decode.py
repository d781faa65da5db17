"""Decoders: stored payloads to RGB uint8 pixels (no torch here).

A registry of decoders, each wrapping one library:

======================  ==========================  ==============================
name                    decodes                     needs
======================  ==========================  ==============================
``simplejpeg``          JPEG                        ``pip install simplejpeg`` (bundles libjpeg-turbo)
``jpeg4py``             JPEG                        ``pip install jpeg4py`` + system libturbojpeg
``opencv``              JPEG PNG BMP WebP TIFF PPM  opencv-python-headless (a dependency)
``pil``                 everything Pillow reads     Pillow (a dependency)
======================  ==========================  ==============================

``decoder="auto"`` takes, for each record's encoding, the fastest installed
decoder that handles it (order measured on this project's benchmark) and falls
back to Pillow when that decoder refuses the image (for example a CMYK JPEG).

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
import importlib
import io
import threading
from collections.abc import Sequence

import numpy as np

from fastdata.encodings import sniff_encoding
from fastdata.errors import FastDataError

Size = int | tuple[int, int] | None

_LOSSY = frozenset({"jpeg"})


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


def _finish(array: np.ndarray, keep_gray: bool, hw: tuple[int, int] | None) -> np.ndarray:
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


class Decoder:
    """One decoding library. Subclasses implement ``_decode``."""

    name = ""
    #: Encodings handled; None means whatever the library can open.
    encodings: frozenset[str] | None = None
    install_hint = ""
    #: The module this decoder needs; it is available when that imports.
    module = ""

    @classmethod
    def available(cls) -> bool:
        if not cls.module:
            return True
        try:
            importlib.import_module(cls.module)
        except (ImportError, OSError):  # OSError: a wrapper whose native library is missing
            return False
        return True

    def handles(self, encoding: str | None) -> bool:
        return self.encodings is None or encoding in self.encodings

    def decode(self, data, *, size: Size = None, keep_gray: bool = False,
               encoding: str | None = None) -> np.ndarray:
        """Decode ``data`` into an HWC uint8 array (see the module docstring)."""
        return self._decode(data, size=size, keep_gray=keep_gray,
                            encoding=encoding or sniff_encoding(data))

    def _decode(self, data, *, size, keep_gray, encoding) -> np.ndarray:
        raise NotImplementedError


class PILDecoder(Decoder):
    name = "pil"
    install_hint = "pip install Pillow"

    def _decode(self, data, *, size, keep_gray, encoding):
        img, hw = self.open(data, size=size)
        return pil_to_array(img, keep_gray, hw)

    @staticmethod
    def open(data, *, size: Size = None):
        """(loaded PIL image, final (h, w) or None), DCT-downscaled when ``size`` allows."""
        from PIL import Image

        img = Image.open(io.BytesIO(data))
        hw = target_size(img.height, img.width, size)
        if hw is not None and img.format == "JPEG":
            # draft() picks the smallest DCT scale whose result is >= the request.
            img.draft(img.mode, (hw[1], hw[0]))
        img.load()
        return img, hw


def pil_to_array(img, keep_gray: bool, hw: tuple[int, int] | None) -> np.ndarray:
    """Convert a PIL image of any mode into the decoder output contract."""
    mode = img.mode
    if mode in ("L", "RGB"):
        array = np.asarray(img)
    elif mode == "LA":
        array = np.asarray(img.getchannel("L"))
    elif mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16-bit grayscale: keep the high byte, as OpenCV does.
        wide = np.asarray(img).astype(np.uint32, copy=False)
        array = (np.minimum(wide, 65535) >> 8).astype(np.uint8)
    elif mode == "F":
        array = np.clip(np.asarray(img), 0, 255).astype(np.uint8)
    elif mode in ("1", "P", "PA") and keep_gray and _palette_is_gray(img):
        array = np.asarray(img.convert("L"))
    else:
        array = np.asarray(img.convert("RGB"))
    if array.ndim == 2 and not keep_gray:
        array = np.repeat(array[:, :, None], 3, axis=2)
    return _finish(np.array(array, copy=True) if not array.flags.writeable else array,
                   keep_gray, hw)


def _palette_is_gray(img) -> bool:
    return img.mode == "1"


class OpenCVDecoder(Decoder):
    name = "opencv"
    encodings = frozenset({"jpeg", "png", "bmp", "webp", "tiff", "ppm", "pgm", "pbm"})
    install_hint = "pip install opencv-python-headless"
    module = "cv2"

    def _decode(self, data, *, size, keep_gray, encoding):
        import cv2

        buf = np.frombuffer(data, dtype=np.uint8)
        flags = cv2.IMREAD_IGNORE_ORIENTATION | (cv2.IMREAD_ANYCOLOR if keep_gray
                                                 else cv2.IMREAD_COLOR)
        hw = None
        if size is not None:
            h, w = _jpeg_header_size(data) if encoding == "jpeg" else (0, 0)
            if h and not keep_gray:
                hw = target_size(h, w, size)
                reduced = {8: cv2.IMREAD_REDUCED_COLOR_8, 4: cv2.IMREAD_REDUCED_COLOR_4,
                           2: cv2.IMREAD_REDUCED_COLOR_2}.get(dct_factor(h, w, hw))
                if reduced is not None:
                    flags = reduced | cv2.IMREAD_IGNORE_ORIENTATION
        array = cv2.imdecode(buf, flags)
        if array is None:
            raise ValueError(f"OpenCV cannot decode this {encoding or 'unknown'} image")
        if array.dtype != np.uint8:  # IMREAD_ANYCOLOR keeps 16 bits: take the high byte
            array = (array >> 8).astype(np.uint8) if array.dtype == np.uint16 else \
                np.clip(array, 0, 255).astype(np.uint8)
        if array.ndim == 3:
            if array.shape[2] == 4:
                array = array[:, :, :3]
            array = cv2.cvtColor(array, cv2.COLOR_BGR2RGB)
        if size is not None and hw is None:
            hw = target_size(array.shape[0], array.shape[1], size)
        return _finish(array, keep_gray, hw)


class SimpleJPEGDecoder(Decoder):
    name = "simplejpeg"
    encodings = frozenset({"jpeg"})
    install_hint = "pip install simplejpeg"
    module = "simplejpeg"

    def _decode(self, data, *, size, keep_gray, encoding):
        import simplejpeg

        h, w, colorspace, _sub = simplejpeg.decode_jpeg_header(data)
        if colorspace not in ("YCbCr", "Gray", "RGB"):
            raise ValueError(f"simplejpeg does not convert {colorspace} JPEGs")
        gray = colorspace == "Gray"
        hw = target_size(h, w, size)
        min_h = min_w = 0
        if hw is not None:
            # Ask for the same power-of-two DCT scale the other decoders use
            # (libjpeg-turbo would otherwise pick n/8 scales such as 3/8), so
            # every decoder gives the same pixels within the stated tolerance.
            factor = dct_factor(h, w, hw)
            min_h, min_w = -(-h // factor), -(-w // factor)
        array = simplejpeg.decode_jpeg(
            data, colorspace="GRAY" if gray else "RGB", min_height=min_h, min_width=min_w)
        return _finish(array, keep_gray, hw)


class JPEG4PyDecoder(Decoder):
    name = "jpeg4py"
    encodings = frozenset({"jpeg"})
    install_hint = ("pip install jpeg4py, and the libturbojpeg system library "
                    "(Debian/Ubuntu: apt-get install libturbojpeg0)")

    @classmethod
    def available(cls) -> bool:
        # jpeg4py imports without libturbojpeg and fails on first use: try one decode.
        try:
            import jpeg4py
            from PIL import Image

            buf = io.BytesIO()
            Image.new("RGB", (8, 8)).save(buf, "JPEG")
            jpeg4py.JPEG(np.frombuffer(buf.getvalue(), dtype=np.uint8)).decode()
        except Exception:  # ImportError, OSError, or the wrapper's own errors
            return False
        return True

    def _decode(self, data, *, size, keep_gray, encoding):
        import jpeg4py

        array = jpeg4py.JPEG(np.frombuffer(data, dtype=np.uint8)).decode()
        return _finish(array, keep_gray, target_size(array.shape[0], array.shape[1], size))


def dct_factor(height: int, width: int, hw: tuple[int, int]) -> int:
    """The largest of 8, 4, 2 (else 1) that keeps a JPEG at or above ``hw`` when
    decoded at 1/factor scale."""
    th, tw = hw
    for factor in (8, 4, 2):
        if -(-height // factor) >= th and -(-width // factor) >= tw:
            return factor
    return 1


def _jpeg_header_size(data) -> tuple[int, int]:
    """(height, width) from a JPEG's SOF marker, or (0, 0)."""
    mv = memoryview(data)
    i, n = 2, len(mv)
    while i + 9 < n:
        if mv[i] != 0xFF:
            i += 1
            continue
        marker = mv[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 1 if marker == 0xFF else 2
            continue
        length = (mv[i + 2] << 8) | mv[i + 3]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return (mv[i + 5] << 8) | mv[i + 6], (mv[i + 7] << 8) | mv[i + 8]
        i += 2 + length
    return 0, 0


DECODERS: dict[str, type[Decoder]] = {
    cls.name: cls for cls in (SimpleJPEGDecoder, JPEG4PyDecoder, OpenCVDecoder, PILDecoder)
}

# Fastest first, per encoding (measured with `fastdata bench`, see bench/RESULTS.md).
_AUTO_ORDER = {
    "jpeg": ("simplejpeg", "jpeg4py", "opencv", "pil"),
    "png": ("opencv", "pil"),
}
_AUTO_DEFAULT = ("opencv", "pil")

_available_cache: dict[str, bool] = {}
_cache_lock = threading.Lock()


def is_available(name: str) -> bool:
    with _cache_lock:
        if name not in _available_cache:
            _available_cache[name] = DECODERS[name].available()
        return _available_cache[name]


def available_decoders() -> list[str]:
    """Names of the decoders installed here."""
    return [name for name in DECODERS if is_available(name)]


def check_decoder(name: str) -> str:
    """Validate a decoder name ("auto" or one of DECODERS) and that it is installed.

    Raises:
        FastDataError: unknown name, or not installed (says what to install).
    """
    if name == "auto":
        return name
    if name not in DECODERS:
        raise FastDataError(f"unknown decoder {name!r}; choose auto or one of "
                            f"{', '.join(DECODERS)}")
    if not is_available(name):
        raise FastDataError(f"decoder {name!r} is not installed: {DECODERS[name].install_hint}")
    return name


class DecoderChain:
    """Decodes any payload with the chosen decoder, or the fastest suitable one.

    Args:
        decoder: "auto" or a decoder name.
        size: optional target size (see the module docstring).
        keep_gray: return grayscale sources with 1 channel.
    """

    def __init__(self, decoder: str = "auto", *, size: Size = None,
                 keep_gray: bool = False, raw_shape: Sequence[int] | None = None) -> None:
        self.decoder = check_decoder(decoder)
        self.size = parse_size(size)
        self.keep_gray = keep_gray
        self.raw_shape = tuple(int(x) for x in raw_shape) if raw_shape else None
        self._by_encoding: dict[str | None, list[Decoder]] = {}

    def _chain(self, encoding: str | None) -> list[Decoder]:
        chain = self._by_encoding.get(encoding)
        if chain is None:
            if self.decoder == "auto":
                names = _AUTO_ORDER.get(encoding, _AUTO_DEFAULT)
            else:
                names = (self.decoder, "pil")
            chain = []
            for name in dict.fromkeys(names):
                if is_available(name):
                    dec = DECODERS[name]()
                    if dec.handles(encoding) or name == self.decoder:
                        chain.append(dec)
            self._by_encoding[encoding] = chain
        return chain

    def __call__(self, data) -> np.ndarray:
        if self.raw_shape is not None:
            return self._raw(data)
        encoding = sniff_encoding(data)
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
                "raw_shape": self.raw_shape, "_by_encoding": {}}


def decode_rgb(data, *, decoder: str = "auto", size: Size = None,
               keep_gray: bool = False) -> np.ndarray:
    """Decode an encoded image into an HWC uint8 RGB array (see the module docstring)."""
    return _shared_chain(decoder, parse_size(size), keep_gray)(data)


@functools.lru_cache(maxsize=32)
def _shared_chain(decoder: str, size: Size, keep_gray: bool) -> DecoderChain:
    # One chain per option set, so per-image callers (pack-time preprocessing,
    # verify --decode) do not rebuild the decoder lookup for every image.
    return DecoderChain(decoder, size=size, keep_gray=keep_gray)


def decode_pil(data, *, size: Size = None):
    """Decode into a PIL RGB image (resized when ``size`` is given)."""
    from PIL import Image

    img, hw = PILDecoder.open(data, size=size)
    if img.mode != "RGB" or hw is not None:
        return Image.fromarray(pil_to_array(img, False, hw), "RGB")
    return img

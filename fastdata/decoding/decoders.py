"""The decoder classes: one per decoding library, all with one output contract
(see ``fastdata.decoding.decode``), and :func:`decode_pil` (Pillow's decode as
a PIL image). They are listed, by name, in
``fastdata.decoding.decoder_registry``; a new decoder is one class here and
one entry there.
"""

from __future__ import annotations

import importlib
import importlib.util
import io

import numpy as np

from fastdata.decoding.decode import Size, finish, target_size
from fastdata.decoding.probe import Unusable, run_probe
from fastdata.encodings import sniff_encoding
from fastdata.image_header import DEFAULT_MAX_PIXELS, check_max_pixels, check_pixels, image_size


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
        """Whether this decoder can be used here (see :meth:`probe`)."""
        return cls.probe() is None

    @classmethod
    def probe(cls) -> str | None:
        """Why this decoder cannot be used here, or None when it can.

        "not installed" when its module is absent; otherwise a short reason
        (the module does not import, or :meth:`_check` failed). Prints nothing,
        also when the failed library's objects are collected later.
        """
        if cls.module:
            try:
                if importlib.util.find_spec(cls.module) is None:
                    return "not installed"
            except (ImportError, ValueError) as exc:  # a module without a usable spec
                return f"{cls.module} cannot be located: {type(exc).__name__}: {exc}"
        return run_probe(cls._import_and_check)

    @classmethod
    def _import_and_check(cls) -> None:
        if cls.module:
            try:
                importlib.import_module(cls.module)
            except (ImportError, OSError) as exc:  # OSError: its native library is missing
                raise Unusable(f"{cls.module} is installed but does not import: "
                               f"{type(exc).__name__}: {exc}") from None
        cls._check()

    @classmethod
    def _check(cls) -> None:
        """Use the imported library once; raise when it cannot decode here."""

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
    elif mode == "1" and keep_gray:
        array = np.asarray(img.convert("L"))
    else:
        array = np.asarray(img.convert("RGB"))
    if array.ndim == 2 and not keep_gray:
        array = np.repeat(array[:, :, None], 3, axis=2)
    return finish(np.array(array, copy=True) if not array.flags.writeable else array,
                   keep_gray, hw)


def decode_pil(data, *, size: Size = None, max_pixels: int | None = DEFAULT_MAX_PIXELS):
    """Decode into a PIL RGB image (resized when ``size`` is given); an image
    declaring more than ``max_pixels`` pixels is refused (DecodeError) first."""
    from PIL import Image

    check_pixels(data, check_max_pixels(max_pixels))
    img, hw = PILDecoder.open(data, size=size)
    if img.mode != "RGB" or hw is not None:
        return Image.fromarray(pil_to_array(img, False, hw), "RGB")
    return img


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
            h, w = (image_size(data, "jpeg") or (0, 0)) if encoding == "jpeg" else (0, 0)
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
        return finish(array, keep_gray, hw)


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
        return finish(array, keep_gray, hw)


class JPEG4PyDecoder(Decoder):
    name = "jpeg4py"
    encodings = frozenset({"jpeg"})
    install_hint = ("pip install jpeg4py, and the libturbojpeg system library "
                    "(Debian/Ubuntu: apt-get install libturbojpeg0)")
    module = "jpeg4py"

    @classmethod
    def _check(cls) -> None:
        # jpeg4py imports without libturbojpeg and fails on first use. Load the
        # library first: a JPEG built without it fails in __init__, and its
        # __del__ then raises AttributeError whenever it is collected.
        import jpeg4py
        from PIL import Image

        try:
            jpeg4py.initialize()
        except OSError as exc:
            raise Unusable(f"jpeg4py imports but libturbojpeg cannot be loaded: {exc}") \
                from None
        buf = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buf, "JPEG")
        jpeg4py.JPEG(np.frombuffer(buf.getvalue(), dtype=np.uint8)).decode()

    def _decode(self, data, *, size, keep_gray, encoding):
        import jpeg4py

        array = jpeg4py.JPEG(np.frombuffer(data, dtype=np.uint8)).decode()
        return finish(array, keep_gray, target_size(array.shape[0], array.shape[1], size))


def dct_factor(height: int, width: int, hw: tuple[int, int]) -> int:
    """The largest of 8, 4, 2 (else 1) that keeps a JPEG at or above ``hw`` when
    decoded at 1/factor scale."""
    th, tw = hw
    for factor in (8, 4, 2):
        if -(-height // factor) >= th and -(-width // factor) >= tw:
            return factor
    return 1

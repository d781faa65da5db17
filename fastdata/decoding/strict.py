"""Strict decoding for the checks that look for damage (``pack --verify-decode``,
``fastdata verify --decode``); the normal read path never calls this.

libjpeg recovers from damage inside a JPEG's entropy-coded data: it emits a
warning ("Corrupt JPEG data: 1234 extraneous bytes before marker 0xd9",
"Premature end of JPEG file") and returns an image with grey or smeared
blocks. Pillow drops the warning, OpenCV prints it to stderr, and both return
the image, so a decode that "succeeds" proves nothing about a JPEG.
simplejpeg's ``strict=True`` raises the first warning instead; this module
turns those that say the data is damaged into a ``DamagedImageError``.

What it cannot check (simplejpeg missing, a JPEG kind it does not decode, an
error libjpeg cannot recover from, or a warning that is not about damaged
data, such as an unknown JFIF revision) is left to the caller's full decode,
which still fails on fatal damage.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastdata.decoding.decode import DecoderChain
from fastdata.encodings import sniff_encoding
from fastdata.errors import DamagedImageError
from fastdata.image_header import DEFAULT_MAX_PIXELS, check_pixels

#: libjpeg's warnings about damaged data all start with one of these (jerror.h:
#: JWRN_HIT_MARKER, JWRN_EXTRANEOUS_DATA, JWRN_HUFF_BAD_CODE,
#: JWRN_ARITH_BAD_CODE, JWRN_MUST_RESYNC, JWRN_BOGUS_ICC, JWRN_JPEG_EOF).
DAMAGE_WARNINGS = ("Corrupt JPEG data", "Premature end of JPEG file")

#: simplejpeg's output colour space for each JPEG colour space (decode in the
#: image's own space: nothing is converted that could fail for other reasons).
_COLORSPACE = {"Gray": "GRAY", "CMYK": "CMYK", "YCCK": "CMYK"}


def decode_jpeg_strictly(data) -> bool:
    """Decode a whole JPEG with libjpeg's warnings raised as errors.

    Returns:
        True when it decoded without a warning; False when it was not checked
        here (see the module docstring): decode it another way.

    Raises:
        DamagedImageError: libjpeg reported damaged data; the message quotes it.
    """
    try:
        import simplejpeg
    except ImportError:
        return False
    try:
        _h, _w, colorspace, _sub = simplejpeg.decode_jpeg_header(data)
        simplejpeg.decode_jpeg(data, colorspace=_COLORSPACE.get(colorspace, "RGB"),
                               strict=True)
    except Exception as exc:  # ValueError from libjpeg; anything else: not checked here
        warning = str(exc).strip()
        if warning.startswith(DAMAGE_WARNINGS):
            raise DamagedImageError(
                f"jpeg data is damaged: libjpeg reports {warning!r} "
                f"(a plain decode returns wrong pixels)") from None
        return False
    return True


class StrictDecoder:
    """Decodes a stored payload for ``fastdata verify --decode``: JPEGs strictly
    (``decode_jpeg_strictly``), everything else, and JPEGs not checked there,
    with the ``auto`` decoder chain. The pixels are not returned.

    Args:
        raw_shape: the HWC shape of pre-decoded (raw) payloads, else None.
        max_pixels: refuse an image declaring more pixels before decoding it.
    """

    def __init__(self, *, raw_shape: Sequence[int] | None = None,
                 max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
        self._chain = DecoderChain(raw_shape=raw_shape, max_pixels=max_pixels)

    def __call__(self, data) -> None:
        chain = self._chain
        if chain.raw_shape is None and sniff_encoding(data) == "jpeg":
            check_pixels(data, chain.max_pixels, "jpeg")  # before anything allocates
            if decode_jpeg_strictly(data):
                return
        chain(data)

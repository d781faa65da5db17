"""Region decoding of JPEGs through libjpeg-turbo's TurboJPEG 3 API (ctypes; no torch).

TurboJPEG 3 (libjpeg-turbo 3.0 and later) decodes a rectangle of a JPEG at a
DCT scale: rows below the rectangle are never decoded, rows above are
entropy-decoded but skip the inverse DCT, colour conversion and upsampling,
and columns outside it skip the same work. This is what lets a random crop be
decoded without decoding the whole image.

The library is looked for, in order, at:

1. ``FASTDATA_TURBOJPEG``: a path to ``libturbojpeg.so`` (or ``.dylib``/``.dll``);
2. the copy bundled in the ``turbojpeg`` wheel (``pip install turbojpeg``, or
   the ``turbo`` extra), whose Python module is not used;
3. the system's ``libturbojpeg`` when it is 3.0 or later (Debian 12's 2.1 is not).

Every call checks its return code and raises :class:`TurboJPEGError` with the
library's message; a warning (corrupt but decodable data) counts as an error,
so the caller can fall back to a full decode that decides for itself.
A TurboJPEG handle is not thread-safe: each thread of each process gets its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import glob
import importlib.util
import os
import threading
from dataclasses import dataclass

import numpy as np

ENV = "FASTDATA_TURBOJPEG"
INSTALL_HINT = ("pip install turbojpeg (it bundles libjpeg-turbo 3), or point "
                f"{ENV} at a libturbojpeg of libjpeg-turbo 3.0 or later")

# turbojpeg.h (TurboJPEG 3): the values this module uses.
_TJINIT_DECOMPRESS, _TJINIT_TRANSFORM = 1, 2
_TJPARAM_RESTARTBLOCKS = 18
_TJXOPT_OPTIMIZE = 1 << 8
_TJPARAM_STOPONWARNING, _TJPARAM_SUBSAMP, _TJPARAM_JPEGWIDTH, _TJPARAM_JPEGHEIGHT = 0, 4, 5, 6
_TJPARAM_COLORSPACE = 8
_TJPF_RGB, _TJPF_GRAY = 0, 6
_TJCS_RGB, _TJCS_YCBCR, _TJCS_GRAY = 0, 1, 2
_TJSAMP_GRAY = 3
#: iMCU width per subsampling (444, 422, 420, gray, 440, 411, 441).
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)


class TurboJPEGError(ValueError):
    """libturbojpeg refused or could not fully decode an image."""


class _ScalingFactor(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int),
                ("h", ctypes.c_int)]


class _Transform(ctypes.Structure):  # tjtransform
    _fields_ = [("r", _Region), ("op", ctypes.c_int), ("options", ctypes.c_int),
                ("data", ctypes.c_void_p), ("customFilter", ctypes.c_void_p)]


@dataclass(frozen=True)
class JpegInfo:
    """What a JPEG's header says: size, chroma subsampling, colour space."""

    width: int
    height: int
    subsampling: int  # a TJSAMP value; -1 when unusual
    colorspace: int  # a TJCS value

    @property
    def gray(self) -> bool:
        return self.colorspace == _TJCS_GRAY

    @property
    def region_decodable(self) -> bool:
        """Whether TurboJPEG can decode a part of it (known subsampling, and a
        colour space it converts to RGB)."""
        return self.subsampling >= 0 and self.colorspace in (_TJCS_RGB, _TJCS_YCBCR, _TJCS_GRAY)


def _candidates() -> list[str]:
    """Library paths to try, in order (see the module docstring)."""
    paths = []
    env = os.environ.get(ENV)
    if env:
        paths.append(env)
    spec = importlib.util.find_spec("turbojpeg")
    if spec is not None and spec.origin:
        # auditwheel puts the bundled library in <site-packages>/turbojpeg.libs.
        libs = os.path.join(os.path.dirname(spec.origin), "turbojpeg.libs")
        paths += sorted(glob.glob(os.path.join(libs, "libturbojpeg*")))
    system = ctypes.util.find_library("turbojpeg")
    if system:
        paths.append(system)
    return paths


@functools.cache
def _library() -> ctypes.CDLL | None:
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "tj3SetCroppingRegion"):  # TurboJPEG 3
            _declare(lib)
            return lib
    return None


def _declare(lib: ctypes.CDLL) -> None:
    vp, i, sz, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
    lib.tj3Init.restype = vp
    lib.tj3Init.argtypes = [i]
    lib.tj3Destroy.argtypes = [vp]
    lib.tj3DecompressHeader.argtypes = [vp, cp, sz]
    lib.tj3Get.argtypes = [vp, i]
    lib.tj3Set.argtypes = [vp, i, i]
    lib.tj3SetScalingFactor.argtypes = [vp, _ScalingFactor]
    lib.tj3SetCroppingRegion.argtypes = [vp, _Region]
    lib.tj3Decompress8.argtypes = [vp, cp, sz, vp, i, i]
    lib.tj3GetErrorStr.restype = cp
    lib.tj3GetErrorStr.argtypes = [vp]
    lib.tj3Transform.argtypes = [vp, cp, sz, i, ctypes.POINTER(vp), ctypes.POINTER(sz),
                                 ctypes.POINTER(_Transform)]
    lib.tj3Free.argtypes = [vp]


def available() -> bool:
    """Whether a TurboJPEG 3 library was found (region decoding is possible)."""
    return _library() is not None


def library_path() -> str | None:
    """The file of the TurboJPEG library in use, or None."""
    lib = _library()
    return None if lib is None else lib._name


class _Handles(threading.local):
    pid = -1
    handle = None


_handles = _Handles()


def _handle(lib: ctypes.CDLL):
    # One per thread, and a new one in a forked child (never share across processes).
    if _handles.handle is None or _handles.pid != os.getpid():
        handle = lib.tj3Init(_TJINIT_DECOMPRESS)
        if not handle:
            raise TurboJPEGError("tj3Init failed: out of memory?")
        lib.tj3Set(handle, _TJPARAM_STOPONWARNING, 1)
        _handles.handle, _handles.pid = handle, os.getpid()
    return _handles.handle


@contextlib.contextmanager
def _session():
    """``(lib, handle)`` for one call. A handle that reported an error is
    destroyed: libjpeg can be left mid-stream (a header cut short, say), and
    every later call on it would fail ("two SOI markers")."""
    lib = _lib()
    handle = _handle(lib)
    try:
        yield lib, handle
    except TurboJPEGError:
        _handles.handle = None
        lib.tj3Destroy(handle)
        raise


def _check(lib, handle, status: int, what: str) -> None:
    if status != 0:
        message = lib.tj3GetErrorStr(handle) or b"unknown error"
        raise TurboJPEGError(f"libturbojpeg {what}: {message.decode('utf-8', 'replace')}")


def _lib():
    lib = _library()
    if lib is None:
        raise TurboJPEGError(f"no TurboJPEG 3 library: {INSTALL_HINT}")
    return lib


def read_header(data) -> JpegInfo:
    """Parse a JPEG's header (no pixels decoded)."""
    buf = bytes(data) if not isinstance(data, bytes) else data
    with _session() as (lib, handle):
        _check(lib, handle, lib.tj3DecompressHeader(handle, buf, len(buf)),
               "cannot read the header")
        return JpegInfo(width=lib.tj3Get(handle, _TJPARAM_JPEGWIDTH),
                        height=lib.tj3Get(handle, _TJPARAM_JPEGHEIGHT),
                        subsampling=lib.tj3Get(handle, _TJPARAM_SUBSAMP),
                        colorspace=lib.tj3Get(handle, _TJPARAM_COLORSPACE))


def scaled(length: int, eighths: int) -> int:
    """A side of ``length`` pixels decoded at ``eighths``/8 (TurboJPEG rounds up)."""
    return -(-length * eighths // 8)


def decode_region(data, info: JpegInfo, box: tuple[int, int, int, int], eighths: int = 8,
                  *, gray: bool = False) -> np.ndarray:
    """Decode the part of a JPEG that covers ``box`` at ``eighths``/8 scale.

    Args:
        data: the JPEG bytes, whose header :func:`read_header` gave ``info``.
        box: ``(left, top, width, height)`` in the image's full-size pixels.
        eighths: the DCT scale in eighths (1 to 8).
        gray: one channel (for grayscale JPEGs kept gray), else RGB.

    Returns:
        HWC uint8 pixels of the box at that scale: ``box`` times ``eighths/8``,
        its edges rounded outwards to whole pixels of the scaled image.
    """
    buf = bytes(data) if not isinstance(data, bytes) else data
    left, top, width, height = box
    full_w, full_h = scaled(info.width, eighths), scaled(info.height, eighths)
    x0, y0 = left * eighths // 8, top * eighths // 8
    x1 = min(full_w, scaled(left + width, eighths))
    y1 = min(full_h, scaled(top + height, eighths))
    # The region's left edge must fall on an iMCU boundary of the scaled image.
    # With subsampled chroma, libjpeg-turbo's fancy upsampling treats the
    # region's edges as the image's (the next chroma sample is not read), so
    # one iMCU more on the left and one chroma sample more on the right keep
    # the box's edge pixels equal to a full decode's.
    mcu = scaled(_MCU_WIDTH[_TJSAMP_GRAY if info.gray else info.subsampling], eighths)
    ax = max(0, x0 - x0 % mcu - mcu)
    ex = min(full_w, x1 + 2)
    out = _decompress(buf, eighths, _Region(ax, y0, ex - ax, y1 - y0), 1 if gray else 3)
    return out[:, x0 - ax:x1 - ax]


def _decompress(buf: bytes, eighths: int, region: _Region, channels: int) -> np.ndarray:
    """tj3Decompress8 of ``region`` (in scaled pixels) at ``eighths``/8 scale."""
    g = int(np.gcd(eighths, 8))
    out = np.empty((region.h, region.w, channels), dtype=np.uint8)
    with _session() as (lib, handle):
        # tj3DecompressHeader again: the handle's header state is what the scale
        # and region are checked against, and another call may have changed it.
        _check(lib, handle, lib.tj3DecompressHeader(handle, buf, len(buf)),
               "cannot read the header")
        _check(lib, handle, lib.tj3SetScalingFactor(handle, _ScalingFactor(eighths // g, 8 // g)),
               f"cannot scale by {eighths}/8")
        _check(lib, handle, lib.tj3SetCroppingRegion(handle, region),
               f"cannot crop to x={region.x} y={region.y} w={region.w} h={region.h}")
        try:
            status = lib.tj3Decompress8(handle, buf, len(buf), out.ctypes.data,
                                        region.w * channels,
                                        _TJPF_GRAY if channels == 1 else _TJPF_RGB)
            _check(lib, handle, status, "cannot decode the image")
        finally:
            lib.tj3SetCroppingRegion(handle, _Region(0, 0, 0, 0))
    return out


def add_restarts(data) -> bytes:
    """``data`` losslessly rewritten with a restart marker after every MCU
    (the same DCT coefficients, so the same pixels; other markers kept), with
    Huffman tables optimised for it (the markers cost fewer bytes than the
    tables save on most cameras' files).

    Only libjpeg-turbo 3.1 and later write the markers in a lossless
    transform (:func:`restarts_supported`); 3.0 returns the JPEG unchanged.
    """
    buf = bytes(data) if not isinstance(data, bytes) else data
    lib = _lib()
    handle = lib.tj3Init(_TJINIT_TRANSFORM)
    if not handle:
        raise TurboJPEGError("tj3Init failed: out of memory?")
    out = ctypes.c_void_p()
    size = ctypes.c_size_t(0)
    try:
        lib.tj3Set(handle, _TJPARAM_STOPONWARNING, 1)
        _check(lib, handle, lib.tj3Set(handle, _TJPARAM_RESTARTBLOCKS, 1),
               "cannot set a restart interval")
        _check(lib, handle, lib.tj3Transform(handle, buf, len(buf), 1, ctypes.byref(out),
                                             ctypes.byref(size),
                                             ctypes.byref(_Transform(options=_TJXOPT_OPTIMIZE))),
               "cannot rewrite the JPEG")
        return ctypes.string_at(out, size.value)
    finally:
        if out:
            lib.tj3Free(out)
        lib.tj3Destroy(handle)


@functools.cache
def restarts_supported() -> bool:
    """Whether :func:`add_restarts` writes restart markers (libjpeg-turbo 3.1+)."""
    if _library() is None:
        return False
    import io

    from PIL import Image

    from fastdata.decoding.jpeg_restarts import restart_layout

    sample = io.BytesIO()
    Image.new("RGB", (32, 32), (90, 120, 200)).save(sample, "JPEG")
    try:
        return restart_layout(add_restarts(sample.getvalue())) is not None
    except TurboJPEGError:
        return False

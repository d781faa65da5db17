"""Decoding a random-resized crop without decoding the whole JPEG (no torch).

Two ways, tried in order by :func:`decode`:

- **cut** (``FUSED_CUT``): a JPEG with a restart marker after every MCU
  (``fastdata pack --jpeg-restarts``) has the crop's MCUs copied into a
  smaller JPEG (``fastdata.decoding.jpeg_restarts``), which is decoded whole:
  no byte outside the crop is entropy-decoded. simplejpeg decodes it at full
  scale (so no TurboJPEG 3 is needed); TurboJPEG 3, when installed, at a
  reduced DCT scale.
- **region** (``FUSED_REGION``): any other baseline or progressive JPEG,
  through TurboJPEG 3's cropping region (``fastdata.decoding.turbojpeg``):
  rows below the crop are not decoded, rows above and columns beside it are
  entropy-decoded only.

Both decode at the smallest of the DCT scales 1/8, 1/4, 1/2 that leaves the
crop at least the output size (else full scale), then resize once, and at
full scale give the same pixels as a whole-image decode followed by the crop.
None means neither could (CMYK, corrupt data): the caller decodes the whole
image, whose decoder then decides.
"""

from __future__ import annotations

import numpy as np

from fastdata.decoding import jpeg_restarts, turbojpeg
from fastdata.decoding.decode import LINEAR_MAX_SHRINK, resize

FUSED_CUT = "restart-marker cut (only the crop's MCUs decoded)"
FUSED_REGION = "TurboJPEG 3 crop-region decode"


def path(data) -> str:
    """Which way :func:`decode` takes for a JPEG ``data`` (a ``FUSED_*``)."""
    return FUSED_CUT if jpeg_restarts.restart_layout(data) is not None else FUSED_REGION


def decode(crop, data, chain, seed: int, epoch: int, index: int) -> np.ndarray | None:
    """``crop`` (a RandomResizedCrop) of the JPEG ``data`` for record ``index``,
    flipped and resized, or None when only a whole-image decode can do it."""
    layout = jpeg_restarts.restart_layout(data)
    if layout is not None:
        return _decode_cut(crop, data, layout, chain, (seed, epoch, index))
    if not turbojpeg.available():
        return None
    return _decode_region(crop, data, chain, (seed, epoch, index))


def _check_pixels(width: int, height: int, max_pixels: int | None) -> None:
    """Refuse bombs before allocating (the header says the size)."""
    if max_pixels is not None and width * height > max_pixels:
        from fastdata.errors import DecodeError
        from fastdata.image_header import pixel_limit_error

        raise DecodeError(pixel_limit_error((height, width), max_pixels))


def _decode_cut(crop, data, layout, chain, draw) -> np.ndarray | None:
    import simplejpeg

    _check_pixels(layout.width, layout.height, chain.max_pixels)
    left, top, w, h, flip = crop.box(layout.width, layout.height, *draw)
    eighths = crop.eighths(w, h) if turbojpeg.available() else 8
    part, (x, y, _, _) = jpeg_restarts.cut(data, layout, (left, top, w, h), eighths)
    gray = layout.components == 1 and chain.keep_gray
    try:
        if eighths == 8:
            pixels = simplejpeg.decode_jpeg(part, colorspace="GRAY" if gray else "RGB")
            region = pixels[top - y:top - y + h, left - x:left - x + w]
        else:
            region = turbojpeg.decode_region(part, turbojpeg.read_header(part),
                                             (left - x, top - y, w, h), eighths, gray=gray)
    except ValueError:  # simplejpeg's and TurboJPEG's errors (corrupt data, a warning)
        return None
    return _finish(crop, region, (left, top, w, h), eighths, flip)


def _decode_region(crop, data, chain, draw) -> np.ndarray | None:
    try:
        info = turbojpeg.read_header(data)
    except turbojpeg.TurboJPEGError:
        return None
    _check_pixels(info.width, info.height, chain.max_pixels)
    if not info.region_decodable:
        return None
    left, top, w, h, flip = crop.box(info.width, info.height, *draw)
    eighths = crop.eighths(w, h)
    try:
        region = turbojpeg.decode_region(data, info, (left, top, w, h), eighths,
                                         gray=info.gray and chain.keep_gray)
    except turbojpeg.TurboJPEGError:
        return None
    return _finish(crop, region, (left, top, w, h), eighths, flip)


def _finish(crop, region: np.ndarray, box, eighths: int, flip: bool) -> np.ndarray:
    """The decoded ``region`` of ``box`` resized to the crop's size and flipped."""
    if eighths == 8:  # whole pixels: the same crop and resize as RandomResizedCrop.apply
        return flipped(resize(region, crop.size), flip)
    # The scaled region's edges were rounded outwards to whole pixels:
    # resample exactly the box's part of it, or the crop would be shifted
    # and enlarged by up to 7 full-size pixels a side at 1/8 scale.
    left, top, w, h = box
    x = left * eighths / 8 - left * eighths // 8
    y = top * eighths / 8 - top * eighths // 8
    return flipped(_resample(region, (x, y, w * eighths / 8, h * eighths / 8), crop.size), flip)


def flipped(image: np.ndarray, flip: bool) -> np.ndarray:
    """``image`` (HWC uint8) as a C-contiguous array, mirrored left-right when
    ``flip``. Flipping after the resize, as torchvision's RandomResizedCrop
    then RandomHorizontalFlip do, moves 224x224 pixels instead of the crop's;
    cv2.flip, because numpy copies a reversed 3-channel view byte by byte
    (~0.6 ms for a 400x360 crop)."""
    import cv2

    if not flip:
        return np.ascontiguousarray(image)
    out = cv2.flip(np.ascontiguousarray(image), 1)
    return out[:, :, None] if out.ndim == 2 else out


def _resample(region: np.ndarray, box: tuple[float, float, float, float],
              size: tuple[int, int]) -> np.ndarray:
    """The sub-pixel ``box`` (x, y, w, h) of ``region`` resized to ``size``:
    bilinear, as :func:`~fastdata.decoding.decode.resize` does for the shrinks
    of at most 2.5x a DCT scale mostly leaves; a larger one (in the side the
    scale did not limit) takes that resize of the box rounded to whole pixels.
    :func:`flipped` makes the result contiguous."""
    import cv2

    x, y, w, h = box
    out_h, out_w = size
    sx, sy = w / out_w, h / out_h
    if max(sx, sy) > LINEAR_MAX_SHRINK:
        x0, y0 = round(x), round(y)
        return resize(region[y0:max(y0 + 1, round(y + h)), x0:max(x0 + 1, round(x + w))], size)
    # Output pixel centres mapped into the region (cv2.resize's convention, shifted).
    matrix = np.array([[sx, 0.0, x + 0.5 * sx - 0.5], [0.0, sy, y + 0.5 * sy - 0.5]])
    out = cv2.warpAffine(region, matrix, (out_w, out_h),
                         flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                         borderMode=cv2.BORDER_REPLICATE)
    return out[:, :, None] if out.ndim == 2 else out

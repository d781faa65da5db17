"""Random resized crops, reproducible from (seed, epoch, record index).

:class:`RandomResizedCrop` samples boxes by the rules of torchvision's
``RandomResizedCrop.get_params`` (10 tries of a random area and log-uniform
aspect ratio, then a central crop clamped to the ratio range) plus a
horizontal flip, but draws its randomness from the record's own stream
(:class:`~fastdata.decoding.record_rng.RecordRNG`, a hash of ``(seed, epoch,
index)``): the crop of record i in epoch e is the same whatever worker, rank
or process decodes it, and after a resume.

:meth:`RandomResizedCrop.decode` decodes a JPEG's crop region only
("fused", ``fastdata.decoding.fused_crop``): the crop's MCUs alone when the
JPEG has a restart marker after each (``fastdata pack --jpeg-restarts``),
else through libjpeg-turbo's TurboJPEG 3 cropping region when it is
installed; at the smallest of the DCT scales 1/8, 1/4, 1/2 that leaves the
crop at least the output size (else full scale), then resized once. Other
encodings, raw records, an explicit ``decoder=``, or neither way available:
the whole image is decoded, then cropped, resized and flipped
(:meth:`RandomResizedCrop.apply`), with the same boxes.

Why not the 3/8 ... 7/8 scales libjpeg-turbo also offers: its SIMD inverse DCTs
are the 8x8 and the 1/2, 1/4, 1/8 ones; the others run in plain C and decode
*slower* than full size (bench/RESULTS.md, "Training crops").
No torch here: numpy only (and OpenCV, through the loaders' ``resize``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastdata.decoding import fused_crop, jpeg_restarts, turbojpeg
from fastdata.decoding.record_rng import RecordRNG
from fastdata.encodings import sniff_encoding

#: torchvision's number of tries before the central-crop fallback.
TRIES = 10
#: The reduced DCT scales (eighths) with SIMD inverse DCTs in libjpeg-turbo.
FAST_EIGHTHS = (1, 2, 4)

#: Why a crop is decoded from the whole image (``RandomResizedCrop.unfused_reason``).
UNFUSED_OFF = "fused=False"
UNFUSED_RAW = "raw records"
UNFUSED_DECODER = "an explicit decoder= (crop-region decoding needs decoder='auto')"
UNFUSED_LIBRARY = f"TurboJPEG 3 is not installed ({turbojpeg.INSTALL_HINT})"
UNFUSED_ENCODING = "not a JPEG"


@dataclass(frozen=True)
class RandomResizedCrop:
    """A random crop of random area and aspect ratio, flipped with probability
    ``hflip``, resized to ``size``.

    Args:
        size: the output (h, w); an int gives a square, as torchvision's does.
        scale: the crop's area as a fraction of the image's, drawn uniformly.
        ratio: the crop's width / height, drawn log-uniformly.
        hflip: the probability of a horizontal flip (0 for none).
        fused: decode only the crop region of JPEGs when TurboJPEG 3 is
            installed (see the module docstring); False always decodes the
            whole image first. Both give the same boxes and flips.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    fused: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _parse_size(self.size))
        object.__setattr__(self, "scale", _parse_range(self.scale, "scale"))
        object.__setattr__(self, "ratio", _parse_range(self.ratio, "ratio"))
        if self.scale[0] < 0.0 or self.scale[1] <= 0.0:
            raise ValueError(f"scale must be fractions of the image's area, not {self.scale}")
        if self.ratio[0] <= 0.0:
            raise ValueError(f"ratio must be positive, not {self.ratio}")
        if not 0.0 <= float(self.hflip) <= 1.0:
            raise ValueError(f"hflip must be a probability in [0, 1], not {self.hflip}")
        object.__setattr__(self, "hflip", float(self.hflip))

    def describe(self) -> dict:
        """The settings that draw from a record's randomness (its box and flip),
        for a resume state: another scale, ratio or flip probability gives
        other crops of the samples not yet read. The output size and ``fused``
        change no draw."""
        return {"scale": list(self.scale), "ratio": list(self.ratio), "hflip": self.hflip}

    def box(self, width: int, height: int, seed: int, epoch: int, index: int
            ) -> tuple[int, int, int, int, bool]:
        """``(left, top, crop_w, crop_h, flip)`` for record ``index`` of an
        image ``width`` x ``height`` in ``epoch`` of a run seeded ``seed``."""
        if width <= 0 or height <= 0:
            raise ValueError(f"cannot crop an image of {width}x{height} pixels")
        rng = RecordRNG(seed, epoch, index)  # raises for a negative one
        top, left, h, w = self._params(rng, width, height)
        flip = bool(self.hflip > 0.0 and rng.random() < self.hflip)
        return left, top, w, h, flip

    def _params(self, rng: RecordRNG, width: int, height: int
                ) -> tuple[int, int, int, int]:
        """torchvision's ``get_params`` with the record's draws: ``(i, j, h, w)``."""
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(TRIES):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                i = int(rng.integers(0, height - h + 1))
                j = int(rng.integers(0, width - w + 1))
                return i, j, h, w
        # The central crop, clamped to the ratio range (torchvision's fallback).
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w = width
            h = int(round(w / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h = height
            w = int(round(h * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def decode(self, data, chain, seed: int, epoch: int, index: int) -> np.ndarray:
        """Record ``index``'s crop, flipped and resized, from its stored bytes.

        Args:
            data (bytes | memoryview): the stored payload.
            chain (DecoderChain): the Dataset's ``DecoderChain`` (decoder choice, gray policy,
                pixel limit, raw shape), used for everything but fused JPEGs.
        """
        if self._options_reason(data, chain) is None:
            # None also when neither a cut nor TurboJPEG can (UNFUSED_LIBRARY).
            array = fused_crop.decode(self, data, chain, seed, epoch, index)
            if array is not None:
                return array
        return self.apply(chain(data), seed, epoch, index)

    def unfused_reason(self, data, chain) -> str | None:
        """Why :meth:`decode` decodes this payload whole (one of the
        ``UNFUSED_*`` reasons), or None when it decodes the crop region alone
        (unless TurboJPEG then refuses the file: a CMYK or corrupt JPEG)."""
        reason = self._options_reason(data, chain)
        if reason is None and not turbojpeg.available() \
                and jpeg_restarts.restart_layout(data) is None:
            return UNFUSED_LIBRARY  # (a cut needs only simplejpeg)
        return reason

    def _options_reason(self, data, chain) -> str | None:
        """The reasons for a whole-image decode that the options and the
        payload's encoding give, before any library or header is looked at."""
        if not self.fused:
            return UNFUSED_OFF
        if chain.raw_shape is not None:
            return UNFUSED_RAW
        if chain.decoder != "auto":
            return UNFUSED_DECODER
        if sniff_encoding(data) != "jpeg":
            return UNFUSED_ENCODING
        return None

    def eighths(self, crop_w: int, crop_h: int) -> int:
        """The DCT scale (in eighths: 1, 2, 4 or 8) a crop of ``crop_w`` x
        ``crop_h`` pixels is decoded at: the smallest that keeps it at least
        the output size."""
        out_h, out_w = self.size
        for eighths in FAST_EIGHTHS:
            if crop_w * eighths >= 8 * out_w and crop_h * eighths >= 8 * out_h:
                return eighths
        return 8

    def apply(self, array: np.ndarray, seed: int, epoch: int, index: int) -> np.ndarray:
        """Crop, resize and flip a decoded HWC uint8 image (the resize the
        loaders use for ``size=``); returns a C-contiguous HWC array."""
        from fastdata.decoding.decode import resize

        left, top, w, h, flip = self.box(array.shape[1], array.shape[0], seed, epoch, index)
        region = array[top:top + h, left:left + w]
        return fused_crop.flipped(resize(region, self.size), flip)


def _parse_size(size) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (int(size), int(size))
    if not (isinstance(size, Sequence) and len(size) == 2):
        raise ValueError(f"size must be an int or (height, width), not {size!r}")
    h, w = int(size[0]), int(size[1])
    if h <= 0 or w <= 0:
        raise ValueError(f"size must be positive, not {size!r}")
    return h, w


def _parse_range(pair, name: str) -> tuple[float, float]:
    if not (isinstance(pair, Sequence) and len(pair) == 2):
        raise ValueError(f"{name} must be a (min, max) pair, not {pair!r}")
    lo, hi = float(pair[0]), float(pair[1])
    if lo > hi:
        raise ValueError(f"{name} must be (min, max) with min <= max, not {pair!r}")
    return lo, hi

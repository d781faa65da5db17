"""How a record becomes an image: one value shared by every way of reading.

``fastdata.Decode(size=..., crop=..., decoder=..., keep_gray=..., max_pixels=...,
output=...)`` is checked once, when it is made, and means the same to the
torch Datasets (map-style and streaming) and to DALI::

    decode = fastdata.Decode(crop=fastdata.RandomResizedCrop(224))
    ds = fastdata.open_dataset("train.lmdb", decode=decode)
    dali = fastdata.dali.DALILoader("train.lmdb", decode=decode)

A crop is a :class:`~fastdata.decoding.random_crop.RandomResizedCrop`
(training) or a :class:`CenterCrop` (evaluation: after the ``size`` resize).
No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal, get_args

import numpy as np

from fastdata.image_header import DEFAULT_MAX_PIXELS, check_max_pixels

#: What a Dataset's samples hold: a uint8 CHW torch tensor, a uint8 HWC numpy
#: array, an RGB PIL image, or the stored payload's bytes, undecoded.
#: What a sample's image is: a uint8 CHW tensor, a uint8 HWC array, an RGB
#: PIL image, or the stored payload undecoded.
Output = Literal["tensor", "numpy", "pil", "bytes"]
OUTPUTS = get_args(Output)


def hw_pair(value, name: str) -> tuple[int, int]:
    """(h, w) from an int (a square) or a pair, checked positive."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int or (height, width), not {value!r}")
    if isinstance(value, (int, np.integer)):
        pair = (int(value), int(value))
    elif isinstance(value, Sequence) and len(value) == 2:
        pair = (int(value[0]), int(value[1]))
    else:
        raise ValueError(f"{name} must be an int or (height, width), not {value!r}")
    if pair[0] <= 0 or pair[1] <= 0:
        raise ValueError(f"{name} must be positive, not {value!r}")
    return pair


@dataclass(frozen=True)
class CenterCrop:
    """The central ``size`` (h, w; an int gives a square) of each image, cut
    after the ``Decode(size=...)`` resize: ``Decode(size=256, crop=CenterCrop(224))``
    is the usual evaluation transform. An image smaller than the crop is
    refused (a decode error naming the record): resize it first."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", hw_pair(self.size, "CenterCrop size"))

    def apply(self, array: np.ndarray) -> np.ndarray:
        """The crop of HWC pixels ``array``."""
        h, w = self.size
        height, width = array.shape[:2]
        if height < h or width < w:
            raise ValueError(f"the image is {height}x{width}, smaller than the "
                             f"{h}x{w} CenterCrop; give Decode(size=...) at least the crop's size")
        top, left = (height - h) // 2, (width - w) // 2
        return np.ascontiguousarray(array[top:top + h, left:left + w])


def _check_crop(crop, size, output: str):
    from fastdata.decoding.random_crop import RandomResizedCrop

    if crop is None:
        return None
    if isinstance(crop, (int, np.integer, tuple, list)) and not isinstance(crop, bool):
        raise ValueError(f"crop must be a fastdata.CenterCrop or fastdata.RandomResizedCrop, "
                         f"not {crop!r}: write crop=fastdata.CenterCrop({crop!r})")
    if not isinstance(crop, (RandomResizedCrop, CenterCrop)):
        raise ValueError(f"crop must be a fastdata.CenterCrop or fastdata.RandomResizedCrop, "
                         f"not {crop!r}")
    if isinstance(crop, RandomResizedCrop) and size is not None:
        raise ValueError("pass size= or crop=RandomResizedCrop(...), not both: the random crop "
                         "resizes each crop to its own size")
    if output == "bytes":
        raise ValueError("crop= needs decoded output: use output='tensor', 'numpy' or 'pil'")
    return crop


@dataclass(frozen=True)
class Decode:
    """How each record is decoded, for every way of reading.

    Args:
        size: decode straight to this size: an int for the shorter side (the
            aspect ratio kept), or (h, w). JPEGs use DCT scaling first. None
            keeps each image's size.
        crop: a :class:`fastdata.RandomResizedCrop` (a random box each epoch,
            flipped, resized to its size; excludes ``size``) or a
            :class:`fastdata.CenterCrop` (after the ``size`` resize).
        decoder: "auto" (the fastest installed for each encoding) or one of
            ``fastdata.decoding.decoder_registry.DECODERS``; DALI decodes with
            its own decoder and takes "auto" only.
        keep_gray: grayscale images keep 1 channel instead of 3 (torch
            Datasets only).
        max_pixels: a record whose image header declares more pixels is
            refused before decoding; None: no limit. The default, 178,956,970,
            is where Pillow refuses decompression bombs.
        output: "tensor" (uint8 CHW torch tensor), "numpy" (uint8 HWC array),
            "pil" (RGB PIL image) or "bytes" (the stored payload, undecoded);
            torch Datasets only (DALI gives tensors).

    A copy with a value changed, checked again: ``dataclasses.replace(decode, size=256)``.

    Raises:
        ValueError, FastDataError: an option is out of range, two contradict,
            or the decoder named is not installed.
    """

    size: int | tuple[int, int] | None = None
    crop: object = None
    decoder: str = "auto"
    keep_gray: bool = False
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    output: Output = "tensor"

    def __post_init__(self) -> None:
        from fastdata.decoding.decode import check_decoder, parse_size

        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, not {self.output!r}")
        size = parse_size(self.size)
        if isinstance(size, int) and size <= 0 or isinstance(size, tuple) and min(size) <= 0:
            raise ValueError(f"size must be positive, not {self.size!r}")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "crop", _check_crop(self.crop, size, self.output))
        object.__setattr__(self, "decoder", check_decoder(self.decoder))
        object.__setattr__(self, "keep_gray", bool(self.keep_gray))
        object.__setattr__(self, "max_pixels", check_max_pixels(self.max_pixels))

    @property
    def random_crop(self):
        """The RandomResizedCrop of training crops, or None."""
        return None if isinstance(self.crop, CenterCrop) else self.crop

    @property
    def center_crop(self) -> tuple[int, int] | None:
        """(h, w) of the centre crop after the resize, or None."""
        return self.crop.size if isinstance(self.crop, CenterCrop) else None


#: Decode's option names.
DECODE_NAMES = tuple(f.name for f in fields(Decode))

"""The options of a DALI pipeline over a packed dataset, checked once when made."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DEVICES = ("auto", "gpu", "cpu")
READERS = ("auto", "dali", "external")
LAYOUTS = ("CHW", "HWC")


@dataclass(frozen=True, kw_only=True)
class DALIOptions:
    """How a pipeline reads, decodes and processes a dataset: the resolved form
    of ``build_pipeline``'s and ``DALILoader``'s options (made by
    :func:`dali_options` from a :class:`fastdata.Decode` and a
    :class:`fastdata.Order`; the fields below are what the pipeline code reads).

    Attributes:
        batch_size: samples per batch.
        size: an int resizes the shorter side (aspect kept), (height, width)
            resizes to exactly that; None keeps each image's size.
        device: "gpu", "cpu" or "auto" (GPU when DALI sees one).
        device_id: the CUDA device for "gpu"; None takes torch's current one.
        num_threads: DALI's CPU threads.
        shard_id, num_shards: this pipeline's part of the data; None takes the
            torch.distributed rank and world size (0 and 1 outside a group).
        shuffle: shuffle each epoch.
        seed: the random seed (the same on every rank, so shards stay disjoint).
        mean, std: per-channel values on the 0-1 or 0-255 scale; with them the
            images are normalised to float32.
        layout: "CHW" or "HWC".
        crop: centre crop (int or (height, width)) after the resize, or a
            ``fastdata.RandomResizedCrop``: training crops (see ``build_pipeline``).
        drop_last: leave out each epoch's last partial batch.
        reader: "auto", "dali" (DALI's own reader) or "external" (fastdata's).
        py_workers: processes running the external source (0: the pipeline's thread).
        py_start_method: "fork" or "spawn" for those workers; None picks one
            that suits the device.
        prefetch: batches DALI prepares ahead (``run_ahead``).
        shuffle_buffer: the shuffle buffer of DALI's readers (the order's ``window``).
        block: the order's shuffle block for the external source.
        index_dir: where generated DALI index files go (None: the user's cache).
        reader_options: keywords of ``fastdata.formats.open_reader``.

    Raises:
        ValueError: an option is out of range or two of them contradict.
    """

    batch_size: int
    size: int | tuple[int, int] | None = None
    device: str = "auto"
    device_id: int | None = None
    num_threads: int = 2
    shard_id: int | None = None
    num_shards: int | None = None
    shuffle: bool = False
    seed: int = 0
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    layout: str = "CHW"
    crop: int | tuple[int, int] | Any | None = None  # Any: a RandomResizedCrop
    drop_last: bool = False
    reader: str = "auto"
    py_workers: int = 0
    py_start_method: str | None = None
    prefetch: int = 2
    shuffle_buffer: int = 1024
    block: int | str = 1
    window: int | None = None
    index_dir: str | os.PathLike | None = None
    reader_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1, not {self.batch_size}")
        _choice("layout", self.layout, LAYOUTS)
        _choice("reader", self.reader, READERS)
        _choice("device", self.device, DEVICES)
        if (self.mean is None) != (self.std is None):
            raise ValueError("give both mean and std, or neither")
        if self.py_workers < 0:
            raise ValueError(f"py_workers must be 0 or more, not {self.py_workers}")
        size = self.size
        if isinstance(size, int):
            if size <= 0:
                raise ValueError(f"size must be positive, not {size}")
        elif size is not None:
            size = _hw(size, "size")
        random = _random_crop(self.crop)
        if random is not None and size is not None:
            raise ValueError("pass size= or crop=RandomResizedCrop(...), not both: the random "
                             "crop resizes to its own size")
        # Normalised once, so the pipeline code reads plain ints and tuples.
        normal = {"batch_size": int(self.batch_size), "size": size,
                  "crop": random if random is not None else _hw(self.crop, "crop"),
                  "mean": _channels(self.mean, "mean"), "std": _channels(self.std, "std"),
                  "reader_options": dict(self.reader_options or {})}
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    @property
    def size_hw(self) -> tuple[int, int] | None:
        """(height, width) to resize to, None for a shorter-side (or no) resize."""
        return None if isinstance(self.size, int) else self.size

    @property
    def random_crop(self) -> Any | None:
        """The RandomResizedCrop of training crops, or None."""
        return None if self.crop is None or isinstance(self.crop, tuple) else self.crop

    @property
    def centre_crop(self) -> tuple[int, int] | None:
        """(height, width) of the centre crop after the resize, or None."""
        return self.crop if isinstance(self.crop, tuple) else None

    @property
    def mean255(self) -> list[float] | None:
        """``mean`` on the 0-255 scale."""
        return _scale255(self.mean)

    @property
    def std255(self) -> list[float] | None:
        """``std`` on the 0-255 scale."""
        return _scale255(self.std)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")


def _channels(values: Sequence[float] | None, name: str) -> tuple[float, ...] | None:
    if values is None:
        return None
    out = tuple(np.asarray(values, dtype=np.float64).reshape(-1).tolist())  # lists, arrays
    if not out:
        raise ValueError(f"{name} must hold one value per channel")
    return out


def _scale255(values: tuple[float, ...] | None) -> list[float] | None:
    # 0-1 values are scaled, as fastdata's CUDAPrefetcher and torchvision's Normalize take them.
    if values is None:
        return None
    return [v * 255.0 for v in values] if max(values) <= 1.0 else list(values)


def _random_crop(value: Any) -> Any | None:
    """``value`` when it is a RandomResizedCrop, else None."""
    from fastdata.decoding.random_crop import RandomResizedCrop

    return value if isinstance(value, RandomResizedCrop) else None


def _hw(value: Any, name: str) -> tuple[int, int] | None:
    from fastdata.decoding.options import hw_pair

    return None if value is None else hw_pair(value, name)


#: DALILoader's and build_pipeline's own keywords (besides decode= and order=).
OWN = ("device", "device_id", "num_threads", "mean", "std", "layout", "reader", "py_workers",
       "py_start_method", "index_dir", "reader_options")


def dali_options(decode=None, order=None, *, run_ahead: int = 2, where: str = "DALILoader",
                 stacklevel: int = 4, **options: Any) -> DALIOptions:
    """The pipeline's options from a :class:`fastdata.Decode`, a
    :class:`fastdata.Order`, ``run_ahead`` (batches DALI prepares ahead) and
    the DALI keywords (:data:`OWN`). For one release the old flat names
    (``batch_size``, ``size``, ``crop`` as an int, ``shuffle``, ``seed``,
    ``drop_last``, ``shard_id``, ``num_shards``, ``shuffle_buffer``,
    ``prefetch``) still work, with a DeprecationWarning.

    Raises:
        ValueError: an unknown keyword, or a decode option DALI does not have.
    """
    from fastdata.decoding.options import CenterCrop, Decode
    from fastdata.deprecated import renamed, take_read_options
    from fastdata.order.options import Order

    if "prefetch" in options:
        renamed(where, "prefetch", "run_ahead=", stacklevel=stacklevel)
        run_ahead = options.pop("prefetch")
    crop = options.get("crop")
    if crop is not None and not hasattr(crop, "decode") and not isinstance(crop, CenterCrop):
        options["crop"] = CenterCrop(crop)  # the old int / (h, w) centre crop
    decode, order = take_read_options(where, options, decode, order, stacklevel=stacklevel)
    unknown = set(options) - set(OWN)
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword(s) {', '.join(sorted(unknown))}; "
                        f"it takes decode=, order=, run_ahead= and {', '.join(OWN)}")
    decode = Decode() if decode is None else decode
    order = Order() if order is None else order
    _dali_decodes(decode)
    if order.block == "shard":
        raise ValueError("DALI reads records, not whole shards: give Order(block=) a record "
                         "count")
    crop = decode.crop.size if isinstance(decode.crop, CenterCrop) else decode.crop
    return DALIOptions(
        batch_size=order.loader_batch, size=decode.size, crop=crop, shuffle=order.shuffle,
        seed=order.seed, drop_last=order.drop_last, shard_id=order.rank,
        num_shards=order.world_size, prefetch=int(run_ahead),
        shuffle_buffer=1024 if order.window is None else order.window,
        block=1 if order.block is None else order.block, window=order.window, **options)


def _dali_decodes(decode) -> None:
    """Refuse the decode options DALI's pipelines do not have."""
    from fastdata.image_header import DEFAULT_MAX_PIXELS

    if decode.output != "tensor":
        raise ValueError(f"DALI gives tensors: Decode(output={decode.output!r}) is for the "
                         f"torch Datasets")
    if decode.decoder != "auto":
        raise ValueError(f"DALI decodes with its own decoder (nvJPEG or libjpeg-turbo): "
                         f"Decode(decoder={decode.decoder!r}) is for the torch Datasets")
    if decode.keep_gray:
        raise ValueError("DALI decodes to RGB: Decode(keep_gray=True) is for the torch Datasets")
    if decode.max_pixels != DEFAULT_MAX_PIXELS:
        raise ValueError("DALI's decoders take no pixel limit: Decode(max_pixels=) is for the "
                         "torch Datasets")

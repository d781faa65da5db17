"""The options of a DALI pipeline over a packed dataset, checked once when made."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import numpy as np

from fastdata.decoding.options import Decode
from fastdata.order.options import Order

Device = Literal["auto", "gpu", "cpu"]
DALIReader = Literal["auto", "dali", "external"]
Layout = Literal["CHW", "HWC"]
StartMethod = Literal["fork", "spawn"]
DEVICES = get_args(Device)
READERS = get_args(DALIReader)
LAYOUTS = get_args(Layout)
#: DALI's readers shuffle within this many records when the order gives no window.
DEFAULT_READER_WINDOW = 1024


@dataclass(frozen=True, kw_only=True)
class DALIOptions:
    """How a pipeline reads, decodes and processes a dataset: what
    ``build_pipeline`` and ``DALILoader`` were given, checked once.

    Attributes:
        decode: the :class:`fastdata.Decode` (size, crop); DALI's pipelines
            refuse the options they do not have (decoder, keep_gray,
            max_pixels, output).
        order: the :class:`fastdata.Order` (batch size, shuffle, seed,
            drop_last, rank/world_size, block/window).
        device: "gpu", "cpu" or "auto" (GPU when DALI sees one).
        device_id: the CUDA device for "gpu"; None takes torch's current one.
        num_threads: DALI's CPU threads.
        mean, std: per-channel values on the 0-1 or 0-255 scale; with them the
            images are normalised to float32.
        layout: "CHW" or "HWC".
        reader: "auto", "dali" (DALI's own reader) or "external" (fastdata's).
        py_workers: processes running the external source (0: the pipeline's thread).
        py_start_method: "fork" or "spawn" for those workers; None picks one
            that suits the device.
        run_ahead: batches DALI prepares ahead (its prefetch queue depth).
        index_dir: where generated DALI index files go (None: the user's cache).

    Raises:
        ValueError: an option is out of range, or one DALI does not have.
    """

    decode: Decode | None = None
    order: Order | None = None
    device: Device = "auto"
    device_id: int | None = None
    num_threads: int = 2
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    layout: Layout = "CHW"
    reader: DALIReader = "auto"
    py_workers: int = 0
    py_start_method: StartMethod | None = None
    run_ahead: int = 2
    index_dir: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        from fastdata.keywords import check_read_values

        check_read_values(self.decode, self.order)
        # None: the defaults, as every way of reading takes them.
        object.__setattr__(self, "decode", Decode() if self.decode is None else self.decode)
        object.__setattr__(self, "order", Order() if self.order is None else self.order)
        _dali_decodes(self.decode)
        if self.order.block == "shard":
            raise ValueError("DALI reads records, not whole shards: give Order(block=) a "
                             "record count")
        _choice("layout", self.layout, LAYOUTS)
        _choice("reader", self.reader, READERS)
        _choice("device", self.device, DEVICES)
        if (self.mean is None) != (self.std is None):
            raise ValueError("give both mean and std, or neither")
        if self.py_workers < 0:
            raise ValueError(f"py_workers must be 0 or more, not {self.py_workers}")
        if self.run_ahead < 1:
            raise ValueError(f"run_ahead must be at least 1 for DALI, not {self.run_ahead}")
        # Normalised once, so the pipeline code reads plain tuples.
        for name, value in {"mean": _channels(self.mean, "mean"),
                            "std": _channels(self.std, "std")}.items():
            object.__setattr__(self, name, value)

    @property
    def batch_size(self) -> int:
        """Records per batch (the order's; None there: 64)."""
        return self.order.loader_batch

    @property
    def reader_window(self) -> int:
        """The shuffle buffer of DALI's own readers: the order's window, else 1024."""
        return DEFAULT_READER_WINDOW if self.order.window is None else int(self.order.window)

    @property
    def size_hw(self) -> tuple[int, int] | None:
        """(height, width) to resize to, None for a shorter-side (or no) resize."""
        size = self.decode.size
        return None if size is None or isinstance(size, int) else tuple(size)

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


def options_from(arguments: Mapping[str, Any]) -> DALIOptions:
    """The options from a call's arguments (``locals()`` of ``build_pipeline``
    or ``DALILoader``, which take the same ones)."""
    return DALIOptions(**{f.name: arguments[f.name] for f in fields(DALIOptions)})

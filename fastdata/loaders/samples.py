"""The sample pipeline every Dataset shares: stored payload -> (image, label).

Map-style and streaming Datasets differ in how they fetch records; from the
payload on they are the same: decode (``decoder``, ``size``, ``keep_gray``),
convert to the ``output`` type, apply the transforms, and deal with a record
that cannot be read or decoded (raise an error naming it, or skip and count it
under ``on_error="skip"``). :class:`SamplePipeline` is that part, together with
the torchvision-style metadata (``classes``, ``class_to_idx``, ...).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Literal, get_args

import numpy as np
import torch

from fastdata.decoding.decode import DecoderChain
from fastdata.decoding.decoders import decode_pil
from fastdata.decoding.options import OUTPUTS, CenterCrop, Decode
from fastdata.errors import CorruptDataError, DecodeError, exception_text
from fastdata.formats.reader import Reader
from fastdata.loaders.sizes import MixedSizeNotice
from fastdata.meter.table import StageTable, clock
from fastdata.redaction import redact

__all__ = ["OUTPUTS", "Failed", "SamplePipeline", "array_to_output", "convert_payload"]

#: What a record that cannot be read or decoded does: raise, or be left out.
OnError = Literal["raise", "skip"]
ON_ERROR = get_args(OnError)

_DEFAULT_CHAIN = DecoderChain()


def convert_payload(data: bytes | memoryview, output: str, decode: DecoderChain | None = None):
    """Turn a stored payload into the image type ``output`` names."""
    if output == "bytes":
        return bytes(data)
    decode = decode or _DEFAULT_CHAIN
    if output == "pil" and decode.size is None and decode.decoder in ("auto", "pil") \
            and not decode.keep_gray:
        return decode_pil(data, max_pixels=decode.max_pixels)
    return array_to_output(decode(data), output)


def array_to_output(array, output: str):
    """Decoded HWC uint8 pixels as the image type ``output`` names ("bytes":
    the pixels' bytes)."""
    if output == "numpy":
        return array
    if output == "tensor":
        return torch.from_numpy(array).permute(2, 0, 1)
    if output == "bytes":
        return array.tobytes()
    from PIL import Image

    return Image.fromarray(array.squeeze(-1) if array.shape[2] == 1 else array)


class Failed:
    """A decode failure carried to the place that reports it with the record's name."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class SamplePipeline:
    """Decoding, output type, transforms, error policy and metadata of a Dataset
    that reads its records with a fastdata ``reader``.

    Subclasses call :meth:`_init_samples` from their ``__init__``.
    """

    reader: Reader

    def _init_samples(self, reader: Reader, decoding: Decode | None, *,
                      transform: Callable | None, target_transform: Callable | None,
                      on_error: OnError, with_metadata: bool = False) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        decoding = Decode() if decoding is None else decoding  # its type checked on the way in
        #: How records are decoded (:class:`fastdata.Decode`).
        self.decoding = decoding
        self.crop = decoding.crop
        self.decode = DecoderChain(decoding.decoder, size=decoding.size,
                                   keep_gray=decoding.keep_gray,
                                   raw_shape=reader.manifest.raw_shape,
                                   max_pixels=decoding.max_pixels)
        self.reader = reader
        self.transform = transform
        self.target_transform = target_transform
        self.output = decoding.output
        self.on_error = on_error
        #: Samples are ``(image, label, metadata)`` (see :meth:`metadata`).
        self.with_metadata = bool(with_metadata)
        self.skipped = 0
        self.mixed_sizes = MixedSizeNotice()
        #: The stall meter's stage times (fastdata.loader() shares one with its workers).
        self._meter = StageTable()

    # -- torchvision-style metadata --------------------------------------------

    @property
    def path(self) -> str:
        return self.reader.path

    @property
    def manifest(self):
        return self.reader.manifest

    @property
    def classes(self) -> list[str]:
        return list(self.reader.manifest.classes)

    @property
    def targets(self) -> list[int]:
        """Labels of every record in stored order, as torchvision's ImageFolder has them."""
        return self.reader.labels.tolist()

    @property
    def keys(self) -> list[str]:
        """Source keys (paths relative to the packed folder), one per record."""
        return self.reader.keys

    @property
    def class_to_idx(self) -> dict[str, int]:
        return self.reader.manifest.class_to_idx

    @property
    def has_metadata(self) -> bool:
        """Whether the records carry metadata (the source gave some)."""
        return self.reader.has_metadata

    def metadata(self, index: int) -> dict:
        """Record ``index``'s metadata: the dict the source gave (boxes, captions,
        ...), as JSON gives it back; an empty dict when it has none."""
        return self.reader.metadata(index)

    def shaping(self) -> dict:
        """What draws from each sample's randomness besides the order, for a
        resume state (:func:`fastdata.order.state.order_description`): a
        random crop's settings and seed; empty without one."""
        if self.crop is None or isinstance(self.crop, CenterCrop):
            return {}
        return {"crop": {**self.crop.describe(), "seed": int(self.seed)}}

    # -- payload -> sample ------------------------------------------------------

    def _convert(self, data, index: int):
        """Record ``index``'s payload as the ``output`` type (raises whatever
        the decoder raises)."""
        if self.crop is None:
            return convert_payload(data, self.output, self.decode)
        return array_to_output(self._pixels(data, index), self.output)

    #: The epoch whose crops this process draws while it iterates one (a stream
    #: resumed from a state reads that state's epoch, set_epoch() or not);
    #: None: ``epoch``.
    _drawing_epoch: int | None = None

    def _pixels(self, data, index: int):
        """Record ``index``'s decoded HWC uint8 pixels, with ``crop`` applied
        (its box drawn from the seed, the epoch and the index)."""
        if isinstance(self.crop, CenterCrop):
            return self.crop.apply(self.decode(data))
        if self.crop is not None:
            epoch = self.epoch if self._drawing_epoch is None else self._drawing_epoch
            return self.crop.decode(data, self.decode, self.seed, epoch, index)
        return self.decode(data)

    def _convert_all(self, indices: list[int], payloads: list, fn: Callable,
                     into: np.ndarray | None = None, check: bool = False) -> list:
        """``fn(payload, index)`` over the records (in the decode thread pool
        unless they are raw pixels), after their CRC32 check when ``check``; a
        failure kept as ``Failed`` for its record; results of ``into``'s item
        shape are also copied to ``into[k]``. Map-style datasets and streams
        decode their batches and groups here."""
        n = len(self.reader)
        # The batch's CRCs in one lookup: the decode threads compare, holding
        # the GIL as briefly as they can.
        crcs = self.reader.crcs_of([i % n for i in indices]) if check else None

        def one(item):
            k, index, payload = item
            try:
                if check:
                    self.reader.check(index % n, payload, None if crcs is None else crcs[k])
                out = fn(payload, index % n)
            except Exception as exc:  # raised later with the record's name
                return Failed(exc)
            if into is not None and out.shape == into.shape[1:]:
                into[k] = out
            return out

        items = list(zip(range(len(indices)), indices, payloads))
        if (self.decode.raw_shape is not None and self.crop is None) or self.output == "bytes":
            return [one(item) for item in items]  # nothing to decode: no thread hand-offs
        start = clock()
        out = self._decoders.map(one, items)
        self._meter.add("decode", clock() - start)
        return out

    def _timed_read(self, read: Callable, indices):
        """``read(indices)``, its time counted as fetching (a dataset at a URL)
        or reading (a local one) by the stall meter."""
        start = clock()
        out = read(indices)
        self._meter.add("fetch" if self.reader.url else "read", clock() - start)
        return out

    def _sample(self, index: int, image, label: int):
        """``(image, label)`` with the transforms applied, or None when ``image``
        is a :class:`Failed` that ``on_error="skip"`` leaves out.

        Raises:
            DecodeError: ``image`` failed and ``on_error`` is "raise".
        """
        if isinstance(image, Failed):
            if isinstance(image.error, CorruptDataError):  # its CRC32, checked in a decode thread
                self._corrupt(image.error, index)
                return None
            if self.on_error == "raise":
                exc = image.error
                raise DecodeError(
                    f"record {index} cannot be decoded ({exception_text(exc)}); "
                    f"pass on_error='skip' to leave such records out",
                    path=self.path, key=self.reader.key_of(index), record=index) from exc
            self._skip(index, "undecodable")
            return None
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def _corrupt(self, exc: CorruptDataError, index: int | None) -> None:
        """A record that could not be read: re-raise, or skip and count it."""
        if self.on_error == "raise":
            raise exc
        self._skip(index, "corrupt")

    def _skip(self, index: int | None, why: str) -> None:
        self.skipped += 1
        if index is None:
            what = "the rest of a damaged shard"
        else:
            key = self.reader.key_of(index)  # None when the keys cannot be read
            what = f"record {index}" + (f" (key {key!r})" if key is not None else "")
        warnings.warn(f"{redact(self.path)}: skipping {why} {what}; {self.skipped} skipped so far",
                      RuntimeWarning, stacklevel=4)

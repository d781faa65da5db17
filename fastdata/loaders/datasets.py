"""Torch Datasets over packed containers: the same sample everywhere.

A sample is ``(image, label)`` (``(image, label, metadata)`` with
``with_metadata=True``); the image is a uint8 CHW tensor by default.
Map-style datasets implement ``__getitems__`` so a DataLoader fetches a whole
batch in one call (one transaction, one pass over the file).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Literal, get_args

import numpy as np
import torch
from torch.utils.data import Dataset

from fastdata.decoding.options import Decode
from fastdata.errors import CorruptDataError, FastDataError
from fastdata.formats import FORMATS
from fastdata.formats.reader import Reader
from fastdata.keywords import check_read_values, explain_keywords
from fastdata.loaders.buffers import batch_tensor
from fastdata.loaders.decode_pool import DecodePool, decode_threads_for_worker
from fastdata.loaders.samples import Failed, OnError, SamplePipeline, array_to_output
from fastdata.loaders.sizes import fixed_shape, stacked_by_caller
from fastdata.meter.table import clock
from fastdata.order.options import Order

#: A map-style dataset's RAM cache: stored payloads, or decoded pixels.
Cache = Literal["ram", "decoded"]


class PackedDataset(SamplePipeline, Dataset):
    """Map-style Dataset over a random-access packed container.

    Reads any registered format (its reader comes from the registry); the
    named subclasses (``LMDBDataset``, ...) pin one format through
    ``reader_class``. :func:`open_dataset` picks the class from the file.

    Args:
        path: the packed dataset (a view or a version record too), or a
            :class:`fastdata.DatasetRef`: the version read, whether each
            record's CRC32 is checked (``verify``), links followed
            (``allow_outside``) and the format reader's settings.
        decode: how records are decoded (:class:`fastdata.Decode`: ``size``,
            ``crop``, ``decoder``, ``keep_gray``, ``max_pixels``, ``output``);
            None: each image whole, as a uint8 CHW tensor.
        order: the order :class:`fastdata.EpochBatches` and ``fastdata.loader``
            read it in (:class:`fastdata.Order`); its seed also draws a random
            crop's boxes. ``ds[i]`` is record i whatever the order.
        transform: applied to the image (after the ``output`` conversion).
        target_transform: applied to the label.
        on_error: "raise" (default) raises on a corrupt or undecodable record,
            naming the file, index and key; "skip" leaves it out of the batch
            (``__getitem__`` moves on to the next record) and counts it in
            ``skipped``.
        cache: None; "ram": copy every stored payload once, up front, into
            shared memory used by all DataLoader workers (one copy in total;
            refused with a clear message when memory is short); "decoded":
            decode (and resize) every record once, up front, into one shared
            (N, H, W, 3) uint8 array; needs ``size=(h, w)`` or raw records, and
            ``output="bytes"`` then gives the decoded pixels.
        progress: progress bar while filling the cache (None: on a terminal).
        with_metadata: samples are ``(image, label, metadata)``, metadata the
            record's dict (``{}`` when it has none; see :meth:`metadata`).
            Batch them with ``fastdata.collate``, which keeps the dicts as a list.
        decode_threads: threads decoding a batch in ``__getitems__``; None uses
            the usable cores divided by the DataLoader workers.

    A random crop's box of record i is drawn from ``(seed, epoch, i)``: the
    same in any worker and after a restart; the epoch follows the
    :class:`fastdata.EpochBatches` that reads the dataset (or :meth:`set_epoch`).
    """

    #: The reader class; None: the one the dataset's format registers.
    reader_class: type[Reader] | None = None

    @explain_keywords()
    def __init__(
        self,
        path: str | os.PathLike,
        *,
        decode: Decode | None = None,
        order: Order | None = None,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        on_error: OnError = "raise",
        cache: Cache | None = None,
        progress: bool | None = None,
        with_metadata: bool = False,
        decode_threads: int | None = None,
    ) -> None:
        check_read_values(decode, order)
        if cache is not None and cache not in get_args(Cache):
            raise ValueError(f"cache must be None, 'ram' or 'decoded', not {cache!r}")
        if cache == "decoded" and decode is not None and decode.crop is not None:
            raise ValueError("cache='decoded' stores one fixed size per record and crop= "
                             "draws a new crop each epoch; use cache='ram' with crop=")
        self._init_samples(open_pinned(path, self.reader_class), decode,
                           transform=transform, target_transform=target_transform,
                           on_error=on_error, with_metadata=with_metadata)
        #: The order batches are read in (:class:`fastdata.Order`).
        self.order = Order() if order is None else order
        self.seed = self.order.seed
        # With crop=, in shared memory: DataLoader workers, persistent ones
        # included, read the value set_epoch() last wrote in the main process.
        # Without it the epoch changes nothing, and a shared tensor would cost
        # a file descriptor per dataset.
        self._epoch = torch.zeros((), dtype=torch.int64)
        if self.crop is not None:
            self._epoch.share_memory_()
        self.decode_threads = decode_threads
        self._decoders = DecodePool(decode_threads)
        # Shards at a URL: reads run ahead of the batches fastdata's sampler gives.
        self._sampler_reads = None
        if cache is None and self.reader.url is not None and self.reader.sharded:
            from fastdata.loaders.sampler_reads import SamplerReads

            self._sampler_reads = SamplerReads(self.reader, self.order)
        self.cache = None
        if cache == "ram":
            from fastdata.loaders.cache import SharedPayloadCache

            self.cache = SharedPayloadCache(self.reader, progress=progress,
                                            skip_damaged=on_error == "skip")
        elif cache == "decoded":
            from fastdata.loaders.cache import SharedPixelCache

            self.cache = SharedPixelCache(self.reader, self.decode, progress=progress,
                                          threads=decode_threads_for_worker(decode_threads))

    def __len__(self) -> int:
        return len(self.reader)

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch mixed into ``crop``'s boxes; call it before each epoch,
        as with DistributedSampler. Workers, persistent ones too, see it
        (without ``crop`` the epoch changes nothing)."""
        if int(epoch) < 0:
            raise ValueError(f"epoch must be non-negative, not {epoch}")
        self._epoch.fill_(int(epoch))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.path!r}, records={len(self)}, "
                f"classes={len(self.classes)}, output={self.output!r})")

    # -- access ---------------------------------------------------------------

    def __getitem__(self, index: int):
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} records")
        index %= n
        for attempt in range(n):
            i = (index + attempt) % n
            sample = self._load([i])
            if sample:
                return sample[0]
        raise FastDataError("every record failed to load", path=self.path)

    def __getitems__(self, indices: Sequence[int]) -> Sequence:
        """A whole batch in one call; the DataLoader uses this when present.

        With tensor output and no per-sample transform, a batch whose images
        share one shape comes back as a :class:`fastdata.loaders.collate.Batch`
        (one stacked uint8 tensor); ``fastdata.collate`` passes it through.
        """
        start = clock()
        batch = self._getitems(indices, stacked_by_caller(self, sys._getframe(1)))
        self._meter.made(start, len(batch), remote=bool(self.reader.url))
        return batch

    def _getitems(self, indices: Sequence[int], warn_sizes: bool = False) -> Sequence:
        """:meth:`__getitems__` without the stall meter's count of a batch (a
        mixture counts its own)."""
        indices = list(indices)
        stack = (self.output == "tensor" and self.transform is None
                 and self.target_transform is None and len(indices) > 1)
        return self._load(indices, stack=stack, warn_sizes=stack and warn_sizes)

    def _load(self, indices: list[int], stack: bool = False, warn_sizes: bool = False,
              into=None) -> Sequence:
        """Samples of ``indices`` (a Batch when ``stack`` and the shapes allow):
        each record is read once and decoded once. ``into`` (rows of a larger
        batch: ``shape`` and item assignment, as a mixture gives it) takes the
        decoded images instead of a batch tensor of their own when they have
        its item shape: the Batch then has ``images`` None."""
        decoded_cache = getattr(self.cache, "kind", None) == "decoded"
        # The CRC32s of records bound for the decode threads are checked there,
        # in parallel, not by this thread while the others wait for the batch.
        deferred = self.cache is None and self.reader.verify \
            and not (stack and self._raw_as_stored())
        try:
            metas = self.reader.metadata_many(indices) if self.with_metadata else None
            payloads = None if decoded_cache else self._read(indices, check=not deferred)
        except CorruptDataError as exc:
            if len(indices) == 1 or self.on_error == "raise":
                self._corrupt(exc, indices[0])
                return []
            # Find the bad records one by one and keep the good ones.
            return [s for i in indices for s in self._load([i])]
        if decoded_cache:
            rows = [i % len(self) for i in indices]
            if stack:
                images = batch_tensor((len(rows), *self.cache.shape[1:]))
                np.take(self.cache.pixels, rows, axis=0, out=images.numpy())
                return self._batch(images, rows, metas)
            images = [array_to_output(self.cache.pixels[i].copy(), self.output) for i in rows]
            return self._samples(rows, images, metas)
        if stack and self._raw_as_stored():
            # Pre-decoded: the payloads are the pixels, copied once into the batch.
            shape = self.decode.raw_shape
            nbytes = int(np.prod(shape))
            if all(len(p) == nbytes for p in payloads):
                images = batch_tensor((len(payloads), *shape))
                flat = memoryview(images.numpy()).cast("B")
                for k, data in enumerate(payloads):
                    flat[k * nbytes:(k + 1) * nbytes] = data
                return self._batch(images, indices, metas)
        if self.output in ("bytes", "pil"):
            return self._samples(indices, self._convert_all(indices, payloads, self._convert,
                                                            check=deferred), metas)
        shape = fixed_shape(self.decode, self.crop) if stack else None
        if shape is not None:
            # The decode threads copy each image into the batch as it is done,
            # instead of this thread stacking them all afterwards.
            theirs = into is not None and tuple(into.shape) == (len(indices), *shape)
            images = None if theirs else batch_tensor((len(indices), *shape))
            arrays = self._convert_all(indices, payloads, self._pixels,
                                       into=into if theirs else images.numpy(), check=deferred)
            if all(not isinstance(a, Failed) and a.shape == shape for a in arrays):
                return self._batch(images, indices, metas)
        else:
            arrays = self._convert_all(indices, payloads, self._pixels, check=deferred)
        if stack and not any(isinstance(a, Failed) for a in arrays):
            if len({a.shape for a in arrays}) == 1:
                images = batch_tensor((len(arrays), *arrays[0].shape))
                np.stack(arrays, out=images.numpy())
                return self._batch(images, indices, metas)
            if warn_sizes:
                self.mixed_sizes.batch([(a.shape[2], *a.shape[:2]) for a in arrays], self.path)
        return self._samples(indices, [a if isinstance(a, Failed)
                                       else array_to_output(a, self.output) for a in arrays],
                             metas)

    def _batch(self, images: torch.Tensor, indices: Sequence[int], metas: list | None):
        from fastdata.loaders.collate import Batch

        labels = self.reader.labels[np.asarray(indices, dtype=np.int64) % len(self)]
        return Batch(None if images is None else images.permute(0, 3, 1, 2),
                     torch.from_numpy(labels.astype(np.int64, copy=True)), metas)

    def _samples(self, indices: list[int], images: list, metas: list | None) -> list:
        """(image, label) pairs with the transforms applied (and the metadata
        after them when ``metas`` is given); a decode failure raises a
        DecodeError naming the record, or is skipped and counted."""
        # One look-up for the batch: a version's or a view's labels map
        # positions through their parts, once per call.
        labels = np.asarray(self.reader.labels[np.asarray(indices, dtype=np.int64)]).tolist() \
            if indices else []
        start = clock()
        samples = [self._sample(i, image, label)
                   for i, image, label in zip(indices, images, labels)]
        if self.transform is not None or self.target_transform is not None:
            self._meter.add("transform", clock() - start)
        if metas is not None:
            samples = [None if s is None else (*s, m) for s, m in zip(samples, metas)]
        return [s for s in samples if s is not None]

    def _raw_as_stored(self) -> bool:
        """Raw RGB records that need no resize: no ``size``, or the size they have."""
        from fastdata.decoding.decode import target_size

        shape = self.decode.raw_shape
        if self.crop is not None or shape is None or len(shape) != 3 \
                or not (shape[2] == 3 or self.decode.keep_gray):
            return False
        hw = target_size(shape[0], shape[1], self.decode.size)
        return hw is None or tuple(hw) == tuple(shape[:2])

    def _read(self, indices: list[int], check: bool = True) -> list:
        if self.cache is None:  # the RAM cache's records were checked when it was filled
            if self._sampler_reads is not None:
                ahead = self._timed_read(self._sampler_reads.payloads, indices)
                if ahead is not None:
                    return ahead
            verify = check and self.reader.verify
            return self._timed_read(lambda i: self.reader.read_many(i, check=verify), indices)
        n = len(self)
        start = clock()
        out = self.cache.read_many([i + n if i < 0 else i for i in indices])
        self._meter.add("read", clock() - start)
        self._meter.count("ram_records", len(indices))
        return out

    def close(self) -> None:
        """Stop this process's decode threads and close its file handles; both
        come back on next use. Call it before forking workers for another
        DataLoader so that no thread of ours is running at fork time."""
        self._decoders.close()
        if self._sampler_reads is not None:
            self._sampler_reads.close()
        self.reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def open_pinned(path, reader_class):
    """The dataset at ``path`` (a path, URL or ``fastdata.DatasetRef``) opened
    through the resolver (its current version, a view, a version record);
    refused when ``reader_class`` pins another format.

    Raises:
        FastDataError: the dataset is of another format than the pinned one.
    """
    from fastdata.dataset.resolve import open_reader

    reader = open_reader(path)
    if reader_class is not None and reader.format_name != reader_class.format_name:
        reader.close()
        raise FastDataError(f"this is a {reader.format_name} dataset, not "
                            f"{reader_class.format_name}; open it with fastdata.open_dataset, "
                            f"which picks the class", path=reader.path)
    return reader


class _LazyReaderClass:
    """Resolves a format's reader class on first use, so importing this module
    does not import lmdb, h5py and every other format library."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt

    def __get__(self, obj, owner):
        return FORMATS[self.fmt].load_reader()


class LMDBDataset(PackedDataset):
    """Map-style Dataset over a fastdata LMDB folder.

    Reader setting: ``DatasetRef(path, reader_settings={"readahead": True})``
    suits sequential reads (the default, False, suits shuffled ones).
    """

    reader_class = _LazyReaderClass("lmdb")


class HDF5Dataset(PackedDataset):
    """Map-style Dataset over a fastdata HDF5 file."""

    reader_class = _LazyReaderClass("hdf5")


class TFRecordDataset(PackedDataset):
    """Map-style Dataset over TFRecord shards, by position through the index.

    For streaming reads use :class:`fastdata.ShardedIterableDataset`.
    """

    reader_class = _LazyReaderClass("tfrecord")


class TarDataset(PackedDataset):
    """Map-style Dataset over webdataset-style tar shards, by position through the index.

    For streaming reads use :class:`fastdata.ShardedIterableDataset`.
    """

    reader_class = _LazyReaderClass("tar")


#: Format name -> its named Dataset class (formats without one read through
#: PackedDataset). The torch layer keeps this: a format names no layer above it.
DATASET_CLASSES: dict[str, type[PackedDataset]] = {
    "lmdb": LMDBDataset, "hdf5": HDF5Dataset, "tfrecord": TFRecordDataset, "tar": TarDataset}


def register_dataset(format_name: str, cls: type[PackedDataset]) -> None:
    """Make ``cls`` the Dataset class :func:`open_dataset` gives for a format."""
    DATASET_CLASSES[format_name] = cls


def dataset_class(spec) -> type[PackedDataset]:
    """The Dataset class of format ``spec``: its registered one, else PackedDataset."""
    return DATASET_CLASSES.get(spec.name, PackedDataset)

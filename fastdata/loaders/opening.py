"""``open_dataset``: one call for every way of reading a packed dataset
(map-style, a stream, or several mixed)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastdata.decoding.options import Decode
from fastdata.deprecated import take_read_options
from fastdata.formats import detect_format
from fastdata.loaders.datasets import dataset_class
from fastdata.order.options import Order


def open_dataset(
    path: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    streaming: bool = False,
    decode: Decode | None = None,
    order: Order | None = None,
    transform: Callable | None = None,
    target_transform: Callable | None = None,
    on_error: str = "raise",
    verify: bool = True,
    with_metadata: bool = False,
    cache: str | None = None,
    **reader_options: Any,
):
    """Open a packed dataset for training, map-style or as a stream.

    Args:
        path: a packed dataset: an ``.lmdb`` folder, an ``.h5`` file, a tar or
            TFRecord manifest (or shard pattern), a local path or a URL. Or
            several, mixed (:func:`fastdata.mix`): a mapping of source name ->
            ``{"path": ..., "weight": ...}``, or a mixture file; the options
            ``samples_per_epoch``, ``classes`` and ``schedule`` then go to
            ``mix``.
        streaming: False (default): a map-style Dataset (the Dataset class its
            format calls for: ``ds[i]``, random access, ``fastdata.EpochBatches``
            for the order); True: a :class:`fastdata.ShardedIterableDataset`
            that reads sharded formats (tar, TFRecord) front to back in the
            order's blocks (the way to read from object storage).
        decode: how records are decoded (:class:`fastdata.Decode`: size, crop,
            decoder, keep_gray, max_pixels, output).
        order: the order it is read in (:class:`fastdata.Order`: shuffle,
            seed, batch_size, drop_last, rank, world_size, block, window):
            given here once, it is the order ``fastdata.loader`` and
            ``fastdata.EpochBatches`` read in.
        transform: applied to each image.
        target_transform: applied to each label.
        on_error: "raise" (default) or "skip" (a record that cannot be read
            or decoded is left out and counted in ``skipped``).
        verify: check each record's checksum as it is read.
        with_metadata: samples are ``(image, label, metadata)``.
        cache: map-style only: None, "ram" or "decoded" (see :class:`PackedDataset`).
        **reader_options: format options passed to the reader, and the
            options one way of reading has (map-style ``decode_threads``,
            ``progress``; streaming ``read_ahead``, ``remote_read``).

    Returns:
        (PackedDataset | ShardedIterableDataset | MixedDataset): A map-style
        Dataset (a :class:`PackedDataset`), a :class:`fastdata.ShardedIterableDataset`
        with ``streaming=True``, or a :class:`fastdata.MixedDataset` for several.
    """
    from fastdata.mixture_file import is_mixture_file

    if isinstance(path, Mapping) or is_mixture_file(path):
        if streaming or cache is not None:
            raise ValueError("a mixture is read map-style, by random access into each source: "
                             "leave streaming= and cache= out")
        from fastdata.loaders.mixed import mix

        return mix(path, decode=decode, order=order, transform=transform,
                   target_transform=target_transform, on_error=on_error, verify=verify,
                   with_metadata=with_metadata, **reader_options)
    # The old flat names, warned about here, where the caller's line is.
    decode, order = take_read_options("open_dataset", reader_options, decode, order,
                                      order_names=None if streaming else {"seed": "seed"})
    common = dict(decode=decode, order=order, transform=transform,
                  target_transform=target_transform, on_error=on_error, verify=verify,
                  with_metadata=with_metadata, **reader_options)
    if streaming:
        if cache is not None:
            raise ValueError("cache= is for map-style reading; a stream reads each shard "
                             "front to back (open it with streaming=False to cache it)")
        from fastdata.loaders.iterable import ShardedIterableDataset

        return ShardedIterableDataset(path, **common)
    if isinstance(path, (list, tuple)):
        raise ValueError("a list of shard files is read as a stream: pass streaming=True, "
                         "or open the set's manifest")
    return dataset_class(detect_format(path))(path, cache=cache, **common)

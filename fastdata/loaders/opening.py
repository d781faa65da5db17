"""``open_dataset``: one call for every way of reading a packed dataset
(map-style, a stream, or several mixed)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastdata.dataset.ref import DatasetRef
from fastdata.decoding.options import Decode
from fastdata.keywords import explain_keywords
from fastdata.loaders.datasets import Cache, dataset_class
from fastdata.loaders.read_ahead import RemoteRead
from fastdata.loaders.samples import OnError
from fastdata.mixture_file import ClassMode, is_mixture_file
from fastdata.order.options import Order


@explain_keywords()
def open_dataset(
    path: str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, Any] | DatasetRef,
    *,
    streaming: bool = False,
    decode: Decode | None = None,
    order: Order | None = None,
    transform: Callable | None = None,
    target_transform: Callable | None = None,
    on_error: OnError = "raise",
    with_metadata: bool = False,
    cache: Cache | None = None,
    decode_threads: int | None = None,
    progress: bool | None = None,
    read_ahead: int | None = None,
    remote_read: RemoteRead | None = None,
    samples_per_epoch: int | None = None,
    classes: ClassMode | Sequence[str] | None = None,
    schedule: Callable | None = None,
):
    """Open a packed dataset for training, map-style or as a stream.

    Args:
        path: a packed dataset: an ``.lmdb`` folder, an ``.h5`` file, a tar or
            TFRecord manifest (or shard pattern), a view or a version record,
            a local path or a URL; or a :class:`fastdata.DatasetRef`, which
            also says the version read, whether records are checked, links
            followed, and the format reader's settings. Or several, mixed
            (:func:`fastdata.mix`): a mapping of source name -> ``{"path":
            ..., "weight": ...}``, or a mixture file.
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
            ``fastdata.EpochBatches`` read in. None: ``Order()``, the
            dataset's own order, not shuffled.
        transform: applied to each image.
        target_transform: applied to each label.
        on_error: "raise" (default) or "skip" (a record that cannot be read
            or decoded is left out and counted in ``skipped``).
        with_metadata: samples are ``(image, label, metadata)``.
        cache: map-style only: None, "ram" or "decoded" (see :class:`PackedDataset`).
        decode_threads: map-style only: threads decoding a batch (see
            :class:`PackedDataset`).
        progress: map-style only: a progress bar while a cache fills.
        read_ahead: a stream only (see :class:`ShardedIterableDataset`); None: 4.
        remote_read: a stream only: "auto" (None), "ranges" or "shards" (see
            :class:`ShardedIterableDataset`).
        samples_per_epoch: a mixture only (see :func:`fastdata.mix`).
        classes: a mixture only (see :func:`fastdata.mix`).
        schedule: a mixture only (see :func:`fastdata.mix`).

    Returns:
        (PackedDataset | ShardedIterableDataset | MixedDataset): A map-style
        Dataset (a :class:`PackedDataset`), a :class:`fastdata.ShardedIterableDataset`
        with ``streaming=True``, or a :class:`fastdata.MixedDataset` for several.

    Raises:
        ValueError: an option of another way of reading (``cache=`` for a
            stream, ``read_ahead=`` for a map-style dataset, ...), naming it.
    """
    common = {"decode": decode, "order": order, "transform": transform,
              "target_transform": target_transform, "on_error": on_error,
              "with_metadata": with_metadata}
    mapped = {"cache": cache, "decode_threads": decode_threads, "progress": progress}
    streamed = {"read_ahead": read_ahead, "remote_read": remote_read}
    mixed = {"samples_per_epoch": samples_per_epoch, "classes": classes, "schedule": schedule}
    if isinstance(path, Mapping) or is_mixture_file(path):
        _refuse("a mixture (read map-style, by random access into each source)",
                streaming=streaming or None, **mapped, **streamed)
        from fastdata.loaders.mixed import mix

        return mix(path, **common, **mixed)
    from fastdata.dataset.resolve import format_of

    if streaming:
        _refuse("a stream (streaming=True)", **mapped, **mixed)
        from fastdata.loaders.iterable import ShardedIterableDataset

        return ShardedIterableDataset(path, **common,
                                      **{k: v for k, v in streamed.items() if v is not None})
    _refuse("a map-style dataset (streaming=False)", **streamed, **mixed)
    if isinstance(getattr(path, "path", path), (list, tuple)):
        raise ValueError("a list of shard files is read as a stream: pass streaming=True, "
                         "or open the set's manifest")
    return dataset_class(format_of(path))(path, **common, **mapped)


def _refuse(what: str, **given) -> None:
    """Refuse the options ``given`` (not None) that ``what`` does not take."""
    named = [name for name, value in given.items() if value is not None]
    if named:
        raise ValueError(f"{', '.join(n + '=' for n in named)} {'is' if len(named) == 1 else 'are'}"
                         f" not an option of {what}: leave {'it' if len(named) == 1 else 'them'}"
                         f" out")

"""A stream's samples a batch at a time, decoded straight into the batch tensor.

``fastdata.loader()`` reads a :class:`ShardedIterableDataset` this way: the
DataLoader then neither asks for each sample nor stacks them (its
``batch_size=None``), which is what per-sample Python costs on small images.
A worker's batches are the ones it would collate itself: the stream hands
whole batches of the order to its workers in turn, so the batches, their
order and every resume point are the same as with per-sample iteration.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset

from fastdata.errors import CorruptDataError
from fastdata.loaders.buffers import batch_tensor
from fastdata.loaders.collate import Batch
from fastdata.loaders.sizes import fixed_shape
from fastdata.meter.table import clock


def take_group(records: Iterator, position, size: int) -> tuple[list, list[int], Exception | None]:
    """The next ``size`` of a stream's ``records`` (fewer at the end), the
    position handed on after each, and the error that cut the group short
    (None): the records before a damaged one are kept, to be given first."""
    items, taken, error = [], [], None
    try:
        for item in records:
            items.append(item)
            taken.append(position.taken)
            if len(items) == size:
                break
    except Exception as exc:  # raised by the caller after the records before it
        error = exc
    return items, taken, error


class TakenPoint:
    """The stream's position after each batch made, and after the last one the
    training loop took: with batches made ahead in this process (a background
    thread, a GPU prefetcher), ``state_dict()`` is the loop's point."""

    def __init__(self, position) -> None:
        self.point = position.to_dict()          # nothing taken yet: the start
        self._made: deque[dict] = deque()

    def made(self, position) -> None:
        self._made.append(position.to_dict())

    def took(self) -> None:
        if self._made:
            self.point = self._made.popleft()


class StreamBatches(IterableDataset):
    """A :class:`ShardedIterableDataset`'s batches (``stream.batches()``); every
    other attribute (``state_dict``, ``set_epoch``, ``plan``, ...) is the
    stream's own. ``count_taken``: batches may be made ahead of the loop in
    this process, and whoever hands them to it calls :meth:`took` for each, so
    that ``state_dict()`` stays the loop's point (``fastdata.loader()``)."""

    def __init__(self, stream, count_taken: bool = False) -> None:
        if stream.batch_size is None:
            raise ValueError("a stream read in batches needs its batch size: open it with "
                             "order=fastdata.Order(batch_size=...)")
        self.stream = stream
        self.count_taken = count_taken

    def __iter__(self):
        return self.stream._start(stacked=False, batched=True, count_taken=self.count_taken)

    def took(self) -> None:
        """The training loop took the next batch."""
        taken = self.stream._taken
        if taken is not None:
            taken.took()

    def __len__(self) -> int:
        """Batches this rank yields this epoch."""
        return self.stream.plan().batches()

    def __getattr__(self, name: str):
        if name == "stream":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.stream, name)

    def __repr__(self) -> str:
        return f"{type(self.stream).__name__}({self.stream.path!r}).batches()"


def batchable(ds) -> bool:
    """Whether ``ds``'s samples can be made a batch at a time: tensors, no
    per-sample Python transform."""
    return ds.output == "tensor" and ds.transform is None and ds.target_transform is None




def stream_batches(ds, records: Iterator, position, size: int, drop_last: bool
                   ) -> Iterator[Batch | list]:
    """Batches of ``size`` of ``records`` (``ds._records``' output); a short
    last one unless ``drop_last``. A batch whose images differ in size is a
    list of samples (``fastdata.collate`` says how to get one size)."""
    shape = fixed_shape(ds.decode, ds.crop)
    labels = ds.reader.labels
    meter = ds._meter
    while True:
        start = clock()
        items, taken, error = take_group(records, position, size)
        if items and (len(items) == size or not drop_last or error is not None):
            position.taken = taken[-1]
            batch = _make(ds, items, shape, labels)
            meter.made(start, 0 if batch is None else len(batch), remote=bool(ds.reader.url))
            if batch is not None:
                if ds._taken is not None:
                    ds._taken.made(position)
                yield batch
        if error is not None:
            raise error
        if len(items) < size:
            return


def _make(ds, items: list, shape, labels) -> Batch | list | None:
    into = None if shape is None else batch_tensor((len(items), *shape))
    images = ds._convert_all([it[0] for it in items], [it[1] for it in items], ds._pixels,
                             into=None if into is None else into.numpy())
    keep, metas = [], []
    for k, ((index, _data, meta), image) in enumerate(zip(items, images)):
        if isinstance(meta, CorruptDataError):
            ds._corrupt(meta, index)
            continue
        if ds._sample(index, image, 0) is None:  # a failure: raised, or skipped and counted
            continue
        keep.append(k)
        metas.append({} if meta is None else meta)
    if not keep:
        return None
    indices = np.asarray([items[k][0] for k in keep], dtype=np.int64)
    batch_labels = torch.from_numpy(labels[indices].astype(np.int64, copy=True))
    kept = [images[k] for k in keep]
    metadata = metas if ds.with_metadata else None
    if into is not None and all(a.shape == shape for a in kept):
        pixels = into if len(keep) == len(items) else into[torch.as_tensor(keep)]
        return Batch(pixels.permute(0, 3, 1, 2), batch_labels, metadata)
    if len({a.shape for a in kept}) == 1:
        stacked = batch_tensor((len(kept), *kept[0].shape))
        np.stack(kept, out=stacked.numpy())
        return Batch(stacked.permute(0, 3, 1, 2), batch_labels, metadata)
    samples = [(torch.from_numpy(a).permute(2, 0, 1), int(y)) for a, y in zip(kept, batch_labels)]
    return samples if metadata is None else [(*s, m) for s, m in zip(samples, metadata)]

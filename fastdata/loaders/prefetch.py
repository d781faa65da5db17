"""Feeding batches to the GPU: CUDA prefetching and a tuned DataLoader factory.

``CUDAPrefetcher`` copies each batch from pinned host memory to the GPU on a
side stream, one or more batches ahead of the training loop, and turns uint8
images into normalised float tensors there (a uint8 batch is 4x smaller to
copy than a float one). Without CUDA it is a plain pass-through that does the
same conversion on the CPU, so one training script runs on a laptop too.
"""

from __future__ import annotations

import collections
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastdata.loaders.buffers import FloatBuffers
from fastdata.loaders.collate import collate
from fastdata.loaders.stream_batches import StreamBatches, batchable

_warned_no_cuda = False


def _as_tensor(values, device, dtype) -> torch.Tensor | None:
    if values is None:
        return None
    t = torch.as_tensor(values, dtype=torch.float32)
    if float(t.max()) <= 1.0:  # given on the 0-1 scale, as torchvision's Normalize takes
        t = t * 255.0
    return t.to(device=device, dtype=dtype).view(1, -1, 1, 1)


class CUDAPrefetcher:
    """Wraps a DataLoader; yields batches already on the GPU and normalised.

    Args:
        loader (Iterable): any iterable of batches: ``(images, labels, ...)`` tuples/lists,
            dicts, or bare tensors. The first tensor of a tuple (or the one under
            ``image_key`` in a dict) is the image batch.
        device: the CUDA device. Without CUDA the prefetcher runs on the CPU
            (one warning) and only converts and normalises.
        mean: per-channel means on the 0-1 scale (ImageNet: (0.485, 0.456,
            0.406)) or the 0-255 scale. Without ``mean`` and ``std``, uint8
            images are only converted to ``dtype`` and scaled to 0-1.
        std: per-channel standard deviations, on the scale of ``mean``
            (ImageNet: (0.229, 0.224, 0.225)).
        channels_last: return images in channels-last memory format.
        dtype: torch.float32 or torch.float16 (or torch.bfloat16).
        depth: batches in flight ahead of the consumer.
        image_key: the image entry of dict batches.
        convert: convert uint8 images to float at all (False: copy only).
        background: make batches this many ahead in a thread
            (:class:`~fastdata.loaders.background.BackgroundBatches`), for a
            loader without worker processes; 0 (default): as the loop asks.
    """

    def __init__(
        self,
        loader,
        device: str | torch.device = "cuda",
        *,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        channels_last: bool = False,
        dtype: torch.dtype = torch.float32,
        depth: int = 2,
        image_key: str = "image",
        convert: bool = True,
        background: int = 0,
    ) -> None:
        global _warned_no_cuda
        self.loader = loader
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        if self.device.type == "cuda" and not self.cuda:
            if not _warned_no_cuda:
                warnings.warn("CUDA is not available: CUDAPrefetcher passes batches through "
                              "and normalises them on the CPU", RuntimeWarning, stacklevel=2)
                _warned_no_cuda = True
            self.device = torch.device("cpu")
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        self.depth = depth
        if background < 0:
            raise ValueError(f"background must be 0 or more, not {background}")
        self.background = int(background)
        self._batches = loader
        if self.background:
            from fastdata.loaders.background import BackgroundBatches

            # Without CUDA the conversion runs in that thread too, beside the
            # training step instead of before it. A loader with a resume state
            # is refused there.
            self._batches = BackgroundBatches(
                loader, self.background,
                then=None if self.cuda else lambda batch: self._move(batch, [True]))
        self.channels_last = channels_last
        self.dtype = dtype
        self._buffers = FloatBuffers()
        self.image_key = image_key
        self.convert = convert
        self._mean = _as_tensor(mean, self.device, dtype)
        self._inv_std = None if std is None else 1.0 / _as_tensor(std, self.device, dtype)
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")

    #: How ``fastdata.loader()`` chose to run the loader (None: made directly).
    choice = None

    def __len__(self) -> int:
        return len(self.loader)

    def __repr__(self) -> str:
        workers = getattr(self.loader, "num_workers", None)
        how = str(self.choice) if self.choice is not None else \
            f"num_workers={workers}, background={self.background}"
        return f"CUDAPrefetcher(device={str(self.device)!r}, {how})"

    # -- conversion -------------------------------------------------------------

    def _images(self, x: torch.Tensor) -> torch.Tensor:
        if not self.convert or x.dtype != torch.uint8 or x.dim() != 4:
            return x
        if x.is_cuda:
            x = x.to(self.dtype)
        else:
            # On the CPU into a reused buffer: a fresh 38 MB one costs more
            # page faults than the conversion itself. Per-channel arithmetic
            # is 3x faster on NCHW memory than on fastdata's channels-last.
            x = self._buffers.take(x, self.dtype, nchw=self._mean is not None).copy_(x)
        if self._mean is not None:
            x = x.sub_(self._mean).mul_(self._inv_std)
        else:
            x = x.mul_(1.0 / 255.0)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def _move(self, batch, first: list[bool]):
        if isinstance(batch, torch.Tensor):
            t = batch.to(self.device, non_blocking=True)
            if first[0]:
                first[0] = False
                t = self._images(t)
            return t
        if isinstance(batch, dict):
            out = {}
            for k, v in batch.items():
                if k == self.image_key and isinstance(v, torch.Tensor):
                    out[k] = self._images(v.to(self.device, non_blocking=True))
                    first[0] = False
                else:
                    out[k] = self._move(v, [False])
            return out
        if isinstance(batch, (list, tuple)):
            items = [self._move(v, first) for v in batch]
            return type(batch)(items) if isinstance(batch, list) else tuple(items)
        return batch

    @staticmethod
    def _record(batch, stream) -> None:
        # Tell the caching allocator these tensors are used on the consumer's
        # stream, so their memory is not reused while it still reads them.
        if isinstance(batch, torch.Tensor):
            if batch.is_cuda:
                batch.record_stream(stream)
        elif isinstance(batch, dict):
            for v in batch.values():
                CUDAPrefetcher._record(v, stream)
        elif isinstance(batch, (list, tuple)):
            for v in batch:
                CUDAPrefetcher._record(v, stream)

    # -- iteration ----------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        yield from self._passes()
        # A whole pass read: a stream goes on to its next epoch, as the
        # map-style EpochBatches does (set_epoch() may still say which).
        after = getattr(getattr(self.loader, "dataset", None), "_after_pass", None)
        if callable(after):
            after()

    def _passes(self) -> Iterator[Any]:
        # A stream read ahead in this process counts the batches the loop took.
        took = getattr(getattr(self.loader, "dataset", None), "took", None)
        took = took if callable(took) else (lambda: None)
        if not self.cuda:
            for batch in self._batches:
                if not self.background:    # else converted in the background thread
                    batch = self._move(batch, [True])
                took()
                yield batch
            return
        side = torch.cuda.Stream(device=self.device)
        pending: collections.deque = collections.deque()
        it = iter(self._batches)

        def launch() -> bool:
            try:
                batch = next(it)
            except StopIteration:
                return False
            with torch.cuda.stream(side):
                moved = self._move(batch, [True])
                done = torch.cuda.Event()
                done.record(side)
            pending.append((moved, done))
            return True

        for _ in range(self.depth):
            if not launch():
                break
        while pending:
            moved, done = pending.popleft()
            current = torch.cuda.current_stream(self.device)
            current.wait_event(done)
            self._record(moved, current)
            launch()
            took()
            yield moved


def loader(
    dataset,
    *,
    device: str | torch.device | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    channels_last: bool = False,
    dtype: torch.dtype = torch.float32,
    num_workers: int | None = None,
    run_ahead: int = 2,
    **dataloader_options: Any,
):
    """A DataLoader with sensible settings for ``dataset``, wrapped in a
    :class:`CUDAPrefetcher` when the batches go to a GPU.

    The batches come in the dataset's order (the :class:`fastdata.Order` it
    was opened with: shuffle, seed, batch_size, drop_last, ranks), so the order
    is given in one place. A map-style dataset is read in the order engine's
    batches (:class:`fastdata.EpochBatches`): one order per (seed, epoch)
    whatever the workers, equal batches on every torch.distributed rank, the
    next epoch after each pass, and a position a ``StatefulDataLoader`` saves
    and restores. A stream orders itself.

    Args:
        dataset (torch.utils.data.Dataset): a fastdata Dataset (map-style or
            streaming) or any torch Dataset.
        device: "cuda", "cuda:1", "cpu"; default: "cuda" when available, else
            "cpu". Either way batches come out the same kind: float ``dtype``,
            normalised with ``mean``/``std`` (on the CPU when there is no GPU).
        mean: passed to the prefetcher (:class:`CUDAPrefetcher`).
        std: passed to the prefetcher.
        channels_last: passed to the prefetcher.
        dtype: passed to the prefetcher.
        num_workers: default: chosen from the dataset and the usable cores
            (:mod:`fastdata.loaders.choice`): fastdata's own decoding runs on
            threads in this process with a background thread, up to 8 cores
            (one more worker process per 8 cores beyond); a stream, one
            worker per 8 cores; per-sample Python (a transform, PIL output,
            a foreign dataset), one worker per core up to 8. The choice is
            the returned object's ``choice`` (in its repr, and logged at debug
            level on the "fastdata" logger).
        run_ahead: batches made ahead of the training loop by each producer:
            each DataLoader worker (``prefetch_factor``), or, with
            ``num_workers=0``, a background thread (fastdata decodes with the
            GIL released); 0: each batch made when asked for. A stream read
            so still gives the loop's position: its ``state_dict()`` counts
            the batches handed to the loop, not those made ahead (a stream
            with a per-sample transform is not run ahead).
        **dataloader_options: anything else DataLoader takes; overrides ours.
            For one release the old ``batch_size``, ``shuffle``, ``seed`` and
            ``drop_last`` (now the dataset's ``order=``) and ``background``
            (now ``run_ahead``) still work, with a DeprecationWarning.

    Returns:
        (CUDAPrefetcher): The DataLoader (``.loader``) in a :class:`CUDAPrefetcher`,
        on ``device``.
    """
    from torch.utils.data import IterableDataset

    from fastdata.machine import usable_cores

    from fastdata.deprecated import renamed

    iterable = isinstance(dataset, IterableDataset)
    if "background" in dataloader_options:
        renamed("loader", "background", "run_ahead=")
        run_ahead = dataloader_options.pop("background")
    if run_ahead < 0:
        raise ValueError(f"run_ahead must be 0 or more, not {run_ahead}")
    order = _loader_order(dataset, dataloader_options, iterable)
    from fastdata.loaders.choice import LoadingChoice, choose_loading

    if num_workers is None:
        choice = choose_loading(dataset, usable_cores(), run_ahead, iterable)
    else:
        # A stream read per sample is not run ahead: see below.
        choice = LoadingChoice(int(num_workers), 0 if num_workers else run_ahead,
                               "num_workers given")
    num_workers = choice.num_workers
    logging.getLogger("fastdata").debug("fastdata.loader(%s): %s", type(dataset).__name__,
                                        choice)
    if device is None:
        # The same call gives the same kind of batch on every machine.
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = torch.device(device).type == "cuda"
    options: dict[str, Any] = dict(
        num_workers=num_workers,
        # Pinned host memory makes the prefetcher's copies asynchronous.
        pin_memory=on_gpu and torch.cuda.is_available(),
        # Keep workers (and their open files and decoder pools) between epochs.
        persistent_workers=num_workers > 0,
    )
    if num_workers > 0 and run_ahead > 0:
        options["prefetch_factor"] = run_ahead
    if not iterable or getattr(dataset, "with_metadata", False):
        # Batches stacked once by __getitems__; metadata dicts kept as lists.
        options["collate_fn"] = collate
    own_sampler = {"sampler", "batch_sampler"} & set(dataloader_options)
    if iterable or own_sampler:
        if "batch_sampler" not in dataloader_options:
            options.update(batch_size=order.loader_batch, drop_last=order.drop_last)
        if not iterable and "sampler" not in dataloader_options:
            options["shuffle"] = order.shuffle
    else:
        from fastdata.loaders.sampler import EpochBatches

        # One order for the job (ranks, workers, resume): the engine's batches.
        options["batch_sampler"] = EpochBatches(dataset, order)
    options.update(dataloader_options)
    _match_stream_batches(dataset, options.get("batch_size"))
    data_loader = DataLoader(_stream_in_batches(dataset, options), **options)
    if iterable and not isinstance(data_loader.dataset, StreamBatches):
        choice = replace(choice, background=0)  # per sample: its position must be the loop's
    prefetcher = CUDAPrefetcher(data_loader, device, mean=mean, std=std,
                                channels_last=channels_last, dtype=dtype,
                                background=choice.background if data_loader.num_workers == 0
                                else 0)
    prefetcher.choice = choice
    return prefetcher


def _loader_order(dataset, options: dict, iterable: bool):
    """The order ``loader()`` reads ``dataset`` in: the dataset's, changed by
    the loader's deprecated order keywords (popped from ``options``)."""
    from fastdata.deprecated import moved
    from fastdata.order.options import Order

    old = {k: options.pop(k) for k in ("batch_size", "shuffle", "seed", "drop_last")
           if k in options}
    if old.get("seed", 0) is None or old.get("shuffle", False) is None:
        old = {k: v for k, v in old.items() if v is not None}  # None meant "the default"
    mine = getattr(dataset, "order", None)
    base = mine if isinstance(mine, Order) else Order()
    given = isinstance(mine, Order) and getattr(dataset, "order_given", True)
    if old:
        moved("loader", old, "the dataset's order=fastdata.Order", stacklevel=4)
        if not given and not iterable and "shuffle" not in old:
            old["shuffle"] = True  # loader()'s old default for map-style datasets
        return base.changed(**old)
    if not given and not iterable:
        warnings.warn("fastdata.loader() shuffles a map-style dataset opened without order= "
                      "for one more release; from the next, the dataset's order decides: open "
                      "it with order=fastdata.Order(shuffle=True) (or shuffle=False)",
                      DeprecationWarning, stacklevel=3)
        return base.changed(shuffle=True)
    return base


def _stream_in_batches(dataset, options: dict):
    """What the DataLoader reads: a fastdata stream of tensors makes its batches
    itself (``stream.batches()``), decoded into one tensor, instead of the
    DataLoader asking for and stacking each sample: the same batches, since
    its workers take whole batches of the order in turn."""
    from fastdata.loaders.iterable import ShardedIterableDataset

    if not isinstance(dataset, ShardedIterableDataset) or not batchable(dataset) or \
            options.get("batch_size") is None or options.get("collate_fn", collate) is not collate:
        return dataset
    options.update(batch_size=None, drop_last=False, collate_fn=collate)
    # In this process batches may be made ahead: the loop's takes are counted.
    return dataset.batches(count_taken=not options.get("num_workers"))


def _match_stream_batches(dataset, batch_size) -> None:
    """A ShardedIterableDataset hands whole batches to its workers in turn when
    it knows the DataLoader's batch size: give it this loader's, or refuse a
    different one (the job's order would then depend on the worker count)."""
    from fastdata.loaders.iterable import ShardedIterableDataset

    if not isinstance(dataset, ShardedIterableDataset) or batch_size is None:
        return
    if dataset.batch_size is None:
        dataset.batch_size = int(batch_size)
    elif dataset.batch_size != batch_size:
        raise ValueError(f"the dataset was made with batch_size={dataset.batch_size} but the "
                         f"loader's batch_size is {batch_size}; give both the same value")

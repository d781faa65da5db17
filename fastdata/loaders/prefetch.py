"""Feeding batches to the GPU: CUDA prefetching.

``CUDAPrefetcher`` copies each batch from pinned host memory to the GPU on a
side stream, one or more batches ahead of the training loop, and turns uint8
images into normalised float tensors there (a uint8 batch is 4x smaller to
copy than a float one). Without CUDA it is a plain pass-through that does the
same conversion on the CPU, so one training script runs on a laptop too.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from fastdata.keywords import explain_keywords
from fastdata.loaders.buffers import FloatBuffers
from fastdata.loaders.loop_position import LoopPosition
from fastdata.loaders.meter_setup import table_of
from fastdata.meter.loop import Meter
from fastdata.meter.table import clock

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
        run_ahead: make batches this many ahead in a thread
            (:class:`~fastdata.loaders.background.BackgroundBatches`), for a
            loader without worker processes; 0 (default): as the loop asks.
        advise: at the end of each pass, print one line to stderr from the
            stall meter (:func:`fastdata.stats`: the data wait, the bound
            stage, what to try), and start the meter's counts again.
    """

    @explain_keywords({"background": "run_ahead="})
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
        run_ahead: int = 0,
        advise: bool = False,
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
        if run_ahead < 0:
            raise ValueError(f"run_ahead must be 0 or more, not {run_ahead}")
        self.run_ahead = int(run_ahead)
        self._batches = loader
        # The loop's point in the order: counted here, where batches reach the loop.
        self._position = LoopPosition(loader)
        #: The stall meter (:func:`fastdata.stats`): the loop's waits, and the
        #: stage times of the dataset's producers.
        self.meter = Meter(table_of(getattr(loader, "dataset", loader)), gpu=self.cuda)
        self.advise = bool(advise)
        self._copies: collections.deque = collections.deque()
        if self.run_ahead:
            from fastdata.loaders.background import BackgroundBatches

            # Without CUDA the conversion runs in that thread too, beside the
            # training step instead of before it. A loader with a resume state
            # is refused there.
            self._batches = BackgroundBatches(
                loader, self.run_ahead, then=None if self.cuda else self._converted)
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
            f"num_workers={workers}, run_ahead={self.run_ahead}"
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

    def _converted(self, batch):
        """``batch`` moved and converted on the CPU, timed as the ``convert`` stage."""
        start = clock()
        out = self._move(batch, [True])
        self.meter.table.add("convert", clock() - start, busy=True)
        return out

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

    def state_dict(self) -> dict:
        """The training loop's point in the job's order, for a checkpoint: the
        batches this loader has handed to the loop, not those made ahead. It
        resumes exactly with :meth:`load_state_dict`, with the same or another
        number of ranks and workers. Only for a loader that fastdata orders
        (``fastdata.loader()`` over a fastdata dataset); TypeError otherwise.
        See :mod:`fastdata.loaders.loop_position`."""
        return self._position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (a :meth:`state_dict`, or a dataset's or
        EpochBatches' own). Call it before iterating: the next pass starts there.

        Raises:
            ValueError: the state belongs to another dataset or order.
        """
        self._position.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        position = self._position
        position.begin()
        yield from self.meter.loop.wrap(self._passes(position.took))
        position.ended()
        if self.advise:
            from fastdata.loaders.stats import print_advice

            print_advice(self)
        # A whole pass read: a stream goes on to its next epoch, as the
        # map-style EpochBatches does (set_epoch() may still say which).
        after = getattr(getattr(self.loader, "dataset", None), "_after_pass", None)
        if callable(after):
            after()

    def _passes(self, handed) -> Iterator[Any]:
        # A stream read ahead in this process counts the batches the loop took.
        stream_took = getattr(getattr(self.loader, "dataset", None), "took", None)

        def took() -> None:
            handed()
            if callable(stream_took):
                stream_took()
        if not self.cuda:
            for batch in self._batches:
                if not self.run_ahead:    # else converted in the background thread
                    batch = self._converted(batch)
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
                began = torch.cuda.Event(enable_timing=True)
                began.record(side)
                moved = self._move(batch, [True])
                done = torch.cuda.Event(enable_timing=True)
                done.record(side)
            pending.append((moved, done))
            self._copies.append((began, done))
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
            self._copied()
            took()
            yield moved

    def _copied(self) -> None:
        """Add the GPU time of the finished copies to the ``copy`` stage."""
        copies = self._copies
        while copies and copies[0][1].query():
            began, done = copies.popleft()
            self.meter.table.add("copy", began.elapsed_time(done) / 1e3)

"""Batches made in a thread ahead of the training loop, for loaders without worker processes.

With ``num_workers=0`` a DataLoader makes each batch when the loop asks for
it, so loading and the training step take turns: while the step runs (or
waits for the GPU) no image is decoded. fastdata's Datasets decode in threads
that release the GIL, so running the loader in one more thread, a few batches
ahead, overlaps the two without worker processes and without the shared
memory segment each worker's batch is sent through.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

#: How often a producer blocked on a full queue looks whether the consumer left.
_POLL_S = 0.05
#: How long an interrupted consumer (Ctrl-C, a timeout) waits for the thread:
#: a loader stuck in a read must not turn the interruption into a hang.
_INTERRUPTED_JOIN_S = 5.0
_BATCH, _ERROR, _END = "batch", "error", "end"


class BackgroundBatches:
    """Iterates ``loader`` in a thread, at most ``depth`` batches ahead.

    The batches and their order are the loader's; an exception raised while
    making one is raised in the consumer, after the batches made before it.
    Leaving the loop early (``break``, an exception) stops the thread once the
    batch it is making is done; interrupted while waiting for a batch (Ctrl-C,
    a timeout), the loop waits at most 5 s for the thread. Each ``iter()``
    starts its own thread when the first batch is asked for, so ``set_epoch``
    called before the loop applies.

    Use it for a loader with ``num_workers=0`` (``fastdata.loader`` does so by
    itself for map-style datasets); worker processes already run ahead. A
    loader with a ``state_dict()`` (torchdata's ``StatefulDataLoader``) is
    refused: the thread runs ahead, so its state would count batches the loop
    has not taken. For the same reason a ``ShardedIterableDataset``'s own
    ``state_dict()`` is ahead under this wrapper; ``resume_point(batches=steps)``,
    which counts the loop's steps, is not.

    Args:
        loader (Iterable): any iterable of batches, usually a DataLoader.
        depth: finished batches waiting for the consumer (at least 1).
        then (Callable | None): applied to each batch in the thread (a conversion that would
            otherwise run in the training loop's thread).
    """

    def __init__(self, loader, depth: int = 2, then=None) -> None:
        if int(depth) < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        if callable(getattr(loader, "state_dict", None)):
            raise ValueError(
                f"{type(loader).__name__} keeps a state_dict() for resuming, which a thread "
                "running ahead would move past batches the training loop has not taken: "
                "iterate it directly (with num_workers > 0 its workers run ahead and the "
                "state stays exact)")
        self.loader = loader
        self.depth = int(depth)
        self.then = then
        from fastdata.loaders.meter_setup import table_of
        from fastdata.meter.loop import Meter

        #: The stall meter (:func:`fastdata.stats`).
        self.meter = Meter(table_of(getattr(loader, "dataset", loader)))

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return self.meter.loop.wrap(self._batches())

    def _batches(self) -> Iterator[Any]:
        ready: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        device = _cuda_device(self.loader)

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=_POLL_S)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                if device is not None:
                    # Pinned copies and CUDA work in this thread go to the consumer's GPU.
                    import torch

                    torch.cuda.set_device(device)
                for batch in self.loader:
                    if self.then is not None:
                        batch = self.then(batch)
                    if not put((_BATCH, batch)):
                        return
            except BaseException as exc:  # raised again in the consumer, with its traceback
                put((_ERROR, exc))
                return
            put((_END, None))

        thread = threading.Thread(target=produce, name="fastdata-batches", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = ready.get()
                if kind == _END:
                    break
                if kind == _ERROR:
                    raise value
                yield value
        except GeneratorExit:  # the loop was left: the thread ends after its batch
            stop.set()
            thread.join()
            raise
        except BaseException:  # the loader's error, or raised while waiting (Ctrl-C, an alarm)
            stop.set()
            thread.join(_INTERRUPTED_JOIN_S)
            raise
        thread.join()


def _cuda_device(loader) -> int | None:
    """The consumer thread's CUDA device, when CUDA is in use or the loader
    pins memory (a new thread would otherwise work on device 0: every rank of
    a job would make a context there). As torch's own pinning thread does."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    if torch.cuda.is_initialized() or getattr(loader, "pin_memory", False):
        return torch.cuda.current_device()
    return None

"""The threads that decode a batch in parallel (the decoders release the GIL)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from fastdata.machine import usable_cores


def decode_threads_for_worker(requested: int | None) -> int:
    """Threads for batch decoding: the usable cores shared among DataLoader workers."""
    if requested is not None:
        return max(1, int(requested))
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    workers = info.num_workers if info is not None else 1
    return max(1, usable_cores() // max(1, workers))


class DecodePool:
    """A process's decode threads, started on first use in each process: a
    pool never crosses fork, and a pickled one (sent to a DataLoader worker)
    arrives without threads.

    Args:
        requested: the number of threads (None: :func:`decode_threads_for_worker`).
    """

    def __init__(self, requested: int | None = None) -> None:
        self.requested = requested
        self._executor = None
        self._pid: int | None = None
        self._threads = 1

    def map(self, fn: Callable, items: list) -> list:
        """``[fn(x) for x in items]`` on this process's threads (this one
        included). Each thread claims the next unclaimed item until none is
        left: one task per thread, not per image, so small images do not pay
        more in task hand-offs than they take to decode, and a thread that drew
        cheap images (small crops) takes more of them instead of waiting for
        one that drew expensive ones."""
        executor = self._started()
        if executor is None or len(items) < 2:
            return [fn(x) for x in items]
        out: list = [None] * len(items)
        claim = itertools.count()  # next() on it is atomic under the GIL

        def drain() -> None:
            k = next(claim)
            while k < len(items):
                out[k] = fn(items[k])
                k = next(claim)

        futures = [executor.submit(drain) for _ in range(min(self._threads, len(items)) - 1)]
        try:
            drain()
        finally:
            for f in futures:
                f.result()
        return out

    def threads_here(self) -> int:
        """The decode threads of this process (started if need be)."""
        self._started()
        return self._threads

    def _started(self):
        pid = os.getpid()
        if self._pid != pid:
            self._executor, self._pid = None, pid
            self._threads = decode_threads_for_worker(self.requested)
            if self._threads > 1:
                from concurrent.futures import ThreadPoolExecutor

                self._executor = ThreadPoolExecutor(self._threads,
                                                    thread_name_prefix="fastdata-decode")
        return self._executor

    def close(self) -> None:
        """Stop this process's threads (started again on next use)."""
        executor, self._executor, self._pid = self._executor, None, None
        if executor is not None:
            executor.shutdown(wait=True)

    def __getstate__(self) -> dict:
        return {"requested": self.requested, "_executor": None, "_pid": None, "_threads": 1}


"""Preparing a pack's images in worker processes, in order.

The pool starts at once (before any thread of the pack exists, so nothing is
mid-call at fork); results come back in the order of the entries, in chunks
of 8, at most :data:`CHUNKS_AHEAD` per worker out at a time, and a stopped
pack drains what its workers still send before letting them go.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

from fastdata.packers.options import PackOptions
from fastdata.packers.prepare import Prepared, SkippedFile, prepare, start_pool


class PreparedStream:
    """Every entry prepared, in order, by worker processes when
    ``workers`` > 1. The pool starts here, at once (before any thread of ours
    exists); ``close()`` stops it."""

    def __init__(self, entries, options: PackOptions, workers: int) -> None:
        self._stop = threading.Event()
        jobs = ((entry, options.verify_decode, options.preprocess, options.max_pixels)
                for entry in _until(entries, self._stop))
        self._pool = start_pool(workers)
        self._chunks = None
        if self._pool is None:
            self._results = map(prepare, jobs)
        else:  # chunks of 8 jobs, as imap(chunksize=8) makes, but an iterator we can drain
            # Pool.imap's task thread would queue every job at once (and the
            # results wait for the writer): a chunk goes out only when there is room.
            self._room = threading.Semaphore(workers * CHUNKS_AHEAD)
            self._chunks = self._pool.imap(_prepare_chunk, self._when_room(_chunked(jobs, 8)))
            self._results = self._taken()

    def _when_room(self, chunks) -> Iterator[tuple]:
        for chunk in chunks:
            while not self._room.acquire(timeout=0.1):
                if self._stop.is_set():
                    return
            yield chunk

    def _taken(self) -> Iterator[Prepared | SkippedFile]:
        for chunk in self._chunks:
            self._room.release()
            yield from chunk

    def __iter__(self) -> Iterator[Prepared | SkippedFile]:
        return iter(self._results)

    def close(self, *, terminate: bool = False) -> None:
        """Stop the pool: let the workers finish (all work is done) or, after an
        error, stop feeding them, take what they still send, then let them go;
        ``terminate`` them only if that does not end in time."""
        self._stop.set()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        drained = False
        try:
            drained = not terminate or self._drain(_DRAIN_SECONDS)
        finally:  # a second Ctrl-C while draining still ends the workers
            if drained:
                pool.close()
            else:
                pool.terminate()
            pool.join()

    def _drain(self, seconds: float) -> bool:
        """Take the results still coming (the stopped feed bounds them). A worker
        blocked sending a result that nobody reads makes ``Pool.terminate()`` wait
        for ever. False when they do not all arrive within ``seconds``."""
        import multiprocessing

        end = time.monotonic() + seconds
        while True:
            try:
                self._chunks.next(timeout=max(0.0, end - time.monotonic()))
            except StopIteration:
                return True
            except multiprocessing.TimeoutError:
                return False
            except Exception:  # noqa: BLE001 - a job's error: not the one being reported
                continue


def _prepare_chunk(jobs: tuple) -> list[Prepared | SkippedFile]:
    """``prepare`` over a chunk of jobs, in a worker process."""
    return [prepare(job) for job in jobs]


def _chunked(items, size: int) -> Iterator[tuple]:
    it = iter(items)
    while chunk := tuple(itertools.islice(it, size)):
        yield chunk


#: Chunks of 8 jobs out per worker (sent, being prepared, or prepared and not
#: yet written): what a pack holds of its source does not grow with it.
CHUNKS_AHEAD = 16
#: How long a stopped pack waits for the work already handed to its workers.
_DRAIN_SECONDS = 20.0


def _until(entries, stop: threading.Event):
    """``entries`` until ``stop`` is set: the pool's task thread, which feeds jobs
    ahead of the workers, stops feeding once the pack stops."""
    for entry in entries:
        if stop.is_set():
            return
        yield entry

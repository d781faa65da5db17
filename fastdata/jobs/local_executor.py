"""The local executor of jobs (see ``executor.py``): pieces run in worker
processes of this machine (forked, as the pack's pool), or in this process
with one worker.

A worker that dies (killed, out of memory) breaks the pool: a new pool is
started and the pieces that were out are run again, each at most
``TASK_RETRIES`` more times (a piece that kills every worker it runs on
stops the job, named).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
from collections import deque

from fastdata.errors import FastDataError
from fastdata.jobs.processes import signals_blocked, start_method, worker_init

#: Runs of a piece after the first whose worker died.
TASK_RETRIES = 3
#: Pieces in flight per worker: one running, one queued behind it.
PIECES_PER_WORKER = 2


class LocalExecutor:
    """``workers`` processes of this machine (None: one per usable core)."""

    name = "local"
    remote = False

    def __init__(self, workers: int | None = None) -> None:
        if workers is None:
            from fastdata.machine import usable_cores

            workers = usable_cores()
        if workers < 1:
            raise FastDataError(f"workers={workers} is not allowed: give at least 1")
        self.workers = workers
        self.where = f"{workers} local process{'es' if workers != 1 else ''}"
        self._pool: cf.ProcessPoolExecutor | None = None

    def results(self, fn, pieces, common: tuple, *, in_order: bool):
        """``(number, fn(number, arg, *common))`` for each ``(number, arg)``
        of ``pieces``: in their order, or as they finish."""
        if self.workers == 1:
            for number, arg in pieces:
                yield number, fn(number, arg, *common)
            return
        pieces = iter(pieces)
        out: dict[cf.Future, tuple[int, object]] = {}
        queue: deque[cf.Future] = deque()
        deaths: dict[int, int] = {}

        def submit(number: int, arg) -> None:
            fresh = self._pool is None
            pool = self._started()
            # A fork pool starts its processes at its first submit.
            with signals_blocked() if fresh else contextlib.nullcontext():
                future = pool.submit(fn, number, arg, *common)
            out[future] = (number, arg)
            queue.append(future)

        def submit_more() -> None:
            while len(out) < PIECES_PER_WORKER * self.workers:
                number, arg = next(pieces, (None, None))
                if number is None:
                    return
                submit(number, arg)

        submit_more()
        while out:
            future = queue[0] if in_order else next(cf.as_completed(out))
            try:
                result = future.result()
            except cf.process.BrokenProcessPool:
                self._rerun_after_death(out, queue, deaths, submit)
                continue
            number, _ = out.pop(future)
            queue.remove(future)
            submit_more()
            yield number, result

    def _rerun_after_death(self, out: dict, queue: deque, deaths: dict, submit) -> None:
        """A worker died: every piece that was out is run again in a new
        pool, in the same order (results do not depend on where they ran)."""
        self._stop(wait=False)
        again = [out[f] for f in queue]
        out.clear()
        queue.clear()
        for number, arg in again:
            deaths[number] = deaths.get(number, 0) + 1
        worst = max(again, key=lambda item: deaths[item[0]])[0]
        if deaths[worst] > TASK_RETRIES:
            raise FastDataError(f"piece {worst}: every worker process that ran it died "
                                f"({deaths[worst]} times; out of memory?)")
        for number, arg in again:
            submit(number, arg)

    def _started(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing as mp

            self._pool = cf.ProcessPoolExecutor(
                self.workers, mp_context=mp.get_context(start_method()),
                initializer=worker_init)
        return self._pool

    def _stop(self, *, wait: bool) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)

    def close(self) -> None:
        self._stop(wait=True)

"""The Dask executor of jobs (see ``executor.py``): each piece one task on
the cluster of a Dask scheduler, a few per worker thread in flight.

A task whose worker died is rerun by Dask (``KilledWorker`` after its
allowed failures: every worker that ran it died); a task that raised an
``OSError`` is retried ``TASK_RETRIES`` times. distributed is imported
(``dask_connect.py``) only when a job is given a scheduler.
"""

from __future__ import annotations

import contextlib
import pickle
import time
import uuid
from collections import deque
from collections.abc import Callable

from fastdata.errors import FastDataError
from fastdata.jobs.dask_connect import (
    CONNECT_SECONDS,
    connect,
    import_distributed,
    quiet_distributed,
)
from fastdata.jobs.executor import ClusterLost

#: Reruns of a task that raised (a passing file-system error on a worker); a
#: task whose worker died is rerun by Dask whatever this says.
TASK_RETRIES = 2
#: Pieces in flight per worker thread: one running, one queued behind it.
PIECES_PER_THREAD = 2
#: Tries again to scatter a piece's input that failed (its worker died).
SCATTER_RETRIES = 5
#: How long a stopped job waits for its tasks still running on workers.
DRAIN_SECONDS = 20.0


def known_keys(job: str, dask_worker=None) -> list[str]:
    """The keys of the job ``job`` (its id is in each) that this worker
    still has, in any state (queued, running, cancelled but still running,
    done); run with ``Client.run``, which passes ``dask_worker``."""
    return [str(key) for key in dask_worker.state.tasks if f"-{job}-" in str(key)]


def run_piece(fn, number: int, held: bytes, *args):
    """A piece's task on a worker: ``fn(number, arg, *args)``, its ``arg``
    scattered pickled, as one bytes object (distributed serializes a
    scattered list one element at a time: about 0.35 s for a pack's piece of
    10,000 entries on 2 cores, against 0.015 s pickled)."""
    return fn(number, pickle.loads(held), *args)


class _ArgumentLost(Exception):
    """A piece's task was cancelled: the worker holding its argument died."""


class DaskExecutor:
    """A connection to a Dask scheduler, and the tasks of one job on it."""

    name = "dask"
    remote = True

    def __init__(self, scheduler, on_event: Callable[[str], None] | None = None) -> None:
        self._dd = import_distributed()
        self._quiet = contextlib.ExitStack()
        if isinstance(scheduler, str):
            self.address, self._own = scheduler, True
            # Our own client: its connection trouble is ours to report, in one line.
            self._quiet.enter_context(quiet_distributed())
            try:
                self.client = connect(self._dd, scheduler)
            except BaseException:
                self._quiet.close()
                raise
        elif isinstance(scheduler, self._dd.Client):
            self.client, self._own = scheduler, False
            self.address = scheduler.scheduler.address
        else:
            raise FastDataError("scheduler= takes a Dask scheduler's address "
                                "('tcp://HOST:8786') or a distributed.Client, not a "
                                f"{type(scheduler).__name__}")
        self._job = uuid.uuid4().hex[:12]
        self.where = f"the Dask scheduler at {self.address}"
        self._futures: dict[int, object] = {}
        self._held: dict[int, object] = {}  # each piece's scattered argument
        self._threads, self._counted_at = 0, 0.0
        self._gone = False  # the scheduler was lost
        self._closed = False
        try:
            if on_event is not None and self._thread_count() == 0:
                on_event(f"the Dask scheduler at {self.address} has no workers yet; the "
                         "job starts when they connect")
            self._check_workers()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __enter__(self) -> "DaskExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Cancel this job's tasks still out, wait for those running, and
        close the client if it is this executor's own."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._futures and not self._gone and self.client.status == "running":
                self.client.cancel(list(self._futures.values()))
                self._drain()
        finally:
            self._futures.clear()
            self._held.clear()
            try:
                if self._own:
                    self.client.close(timeout=2 if self._gone else CONNECT_SECONDS)
            except (OSError, TimeoutError):
                pass  # a client of a lost scheduler may not close cleanly; nothing is lost
            finally:
                self._quiet.close()

    def _drain(self) -> None:
        """Wait a while until no worker has this job's tasks: Dask lets a
        running task end, a queued one may start before the cancel reaches its
        worker, and neither may write into files that the failed job is
        about to remove. Twice in a row, as a cancel and a task for the
        same worker can cross."""
        end = time.monotonic() + DRAIN_SECONDS
        clear = 0
        while time.monotonic() < end and clear < 2:
            try:
                known = self.client.run(known_keys, self._job, on_error="ignore")
            except Exception:  # noqa: BLE001 - the scheduler went too: nothing to ask
                return
            busy = any(isinstance(keys, list) and keys for keys in known.values())
            clear = 0 if busy else clear + 1
            time.sleep(0.05)

    def results(self, fn, pieces, args: tuple, *, in_order: bool):
        """``(number, fn(number, arg, *args))`` for each ``(number, arg)`` of
        ``pieces``, a few per worker thread in flight: in the order of
        ``pieces``, or as they finish.

        Each piece's ``arg`` goes to a worker by itself (scattered), and its
        task names it: the scheduler keeps the last 1,000 messages it sent
        each worker, and a task that carried its argument (a pack ships its
        source entries) would keep them all there. A worker lost with a
        piece's argument before its task ran has the piece sent again.
        """
        pieces = iter(pieces)
        # A task's key names the piece function and the job (its dashboard name).
        prefix = f"fastdata-{getattr(fn, '__name__', 'piece').replace('_', '-')}-{self._job}"
        queue: deque[int] = deque()
        finished = None if in_order else self._dd.as_completed(loop=self.client.loop)
        sent: dict[int, object] = {}  # the argument of each piece in flight, for a resend
        resent: dict[int, int] = {}

        def submit(number: int) -> None:
            attempt = resent.get(number, 0)
            held = self._scatter(pickle.dumps(sent[number], protocol=5))
            future = self.client.submit(run_piece, fn, number, held, *args, pure=False,
                                        key=f"{prefix}-{number}-{attempt}",
                                        retries=TASK_RETRIES)
            self._futures[number] = future
            self._held[number] = held
            if finished is not None:
                finished.add(future)

        def submit_more() -> None:
            while len(self._futures) < self._window():
                number, arg = next(pieces, (None, None))
                if number is None:
                    return
                sent[number] = arg
                submit(number)
                if finished is None:
                    queue.append(number)

        submit_more()
        while self._futures:
            future = self._futures[queue[0]] if finished is None else next(finished)
            number = self._number(future)
            try:
                result = self._result(future, number)
            except _ArgumentLost:
                resent[number] = resent.get(number, 0) + 1
                if resent[number] > TASK_RETRIES:
                    raise FastDataError(
                        f"piece {number}: every Dask worker that ran it or held its input "
                        f"died ({resent[number]} times; out of memory?)") from None
                submit(number)
                continue
            if finished is None:
                queue.popleft()
            # The scheduler forgets the task and its argument.
            del self._futures[number], self._held[number], sent[number]
            submit_more()
            yield number, result

    def _scatter(self, arg):
        """``arg`` on a worker, as a future; waits for a worker to join."""
        failed = 0
        while True:
            try:
                return self.client.scatter([arg], hash=False, timeout=CONNECT_SECONDS)[0]
            except TimeoutError:
                if self.client.status != "running":
                    raise self._lost("it does not answer") from None
                # No worker yet (the job waits for them, as its tasks would).
            except (OSError, self._dd.comm.CommClosedError):
                # The worker it went to died, and the scheduler did not know
                # yet: another try goes to the next worker.
                failed += 1
                if self.client.status != "running" or failed > SCATTER_RETRIES:
                    raise self._lost("the connection closed") from None
                time.sleep(0.2 * failed)

    def _number(self, future) -> int:
        return int(str(future.key).rsplit("-", 2)[1])

    def _result(self, future, number: int):
        """The task's result, its error as one clear line, or SchedulerLost."""
        try:
            return future.result()
        except FastDataError:
            raise
        except Exception as exc:  # noqa: BLE001 - anything a task or the connection raised
            if self._argument_lost(future, exc):
                raise _ArgumentLost() from None
            if future.status != "error" or self.client.status != "running":
                # Cancelled, or its result could not be fetched: the connection went.
                raise self._lost("the connection closed") from None
            cause = exc if isinstance(exc, ImportError) else exc.__cause__
            if isinstance(cause, ImportError) or "deserializ" in str(exc):
                raise FastDataError(
                    f"the Dask cluster at {self.address} cannot load fastdata's tasks ("
                    f"{cause if isinstance(cause, ImportError) else 'a deserialization error'}"
                    "): install fastdata, the same version, on the scheduler and on every "
                    "worker") from None
            if isinstance(exc, self._dd.KilledWorker):
                self._check_workers(f"piece {number}: ")
                raise FastDataError(
                    f"piece {number}: every Dask worker that ran it died (out of "
                    f"memory?): {exc}") from None
            if isinstance(exc, OSError):
                raise FastDataError(f"piece {number} failed on a Dask worker: "
                                    f"{exc}") from exc
            raise

    def _argument_lost(self, future, exc: Exception) -> bool:
        """Whether ``future``'s task was cancelled, the cluster still there:
        the worker holding its argument died (the client may learn that the
        argument is lost only after the task's cancel, so its state is not
        asked). Sending the piece again is right whatever the cause."""
        return (future.status == "cancelled" and self.client.status == "running"
                and getattr(exc, "reason", "") != "scheduler-connection-lost")

    def _check_workers(self, prefix: str = "") -> None:
        """Refuse workers that cannot import fastdata: they would die
        unpacking its tasks (a worker that joins later is asked when one dies).

        Raises:
            FastDataError: naming them and what to install.
        """
        lacking = self._workers_without_fastdata()
        if lacking:
            raise FastDataError(
                f"{prefix}the Dask worker(s) at {', '.join(lacking[:3])}"
                f"{' ...' if len(lacking) > 3 else ''} cannot import fastdata, so they die "
                f"unpacking its tasks: install fastdata, the same version, on every worker "
                f"and on the scheduler")

    def _workers_without_fastdata(self) -> list[str]:
        """The workers where fastdata cannot be imported (asked with a function
        that needs only the standard library, so it runs where fastdata does
        not); none when they cannot be asked."""
        def has_fastdata() -> bool:
            return __import__("importlib.util").util.find_spec("fastdata") is not None

        try:
            found = self.client.run(has_fastdata, on_error="ignore")
        except Exception:  # noqa: BLE001 - only a better message is at stake
            return []
        return sorted(w for w, ok in found.items() if ok is False)

    def _window(self) -> int:
        """Pieces in flight: bounded, so memory is, and enough to keep every
        worker thread busy (counted again every few seconds: workers come and go)."""
        if time.monotonic() - self._counted_at > 2.0:
            self._threads = self._thread_count()
        return max(2, PIECES_PER_THREAD * self._threads)

    def _thread_count(self) -> int:
        self._counted_at = time.monotonic()
        if self.client.status != "running":
            return self._threads  # lost: the next result says so
        try:
            return sum(self.client.nthreads().values())
        except (OSError, TimeoutError):
            raise self._lost("it does not answer") from None

    def _lost(self, why: str) -> ClusterLost:
        self._gone = True
        return ClusterLost(self.where, why)

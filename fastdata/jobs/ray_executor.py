"""The Ray executor of jobs (see ``executor.py``): each piece one Ray task
on the cluster at an address, a few per CPU in flight.

A task whose worker died (killed, out of memory, its node lost) is rerun
by Ray, up to ``TASK_RETRIES`` times, as is a task that raised an
``OSError`` (a passing file-system error). ray is imported only here, and
only when a job is given a Ray cluster (the optional extra ``[ray]``).
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Callable

from fastdata.errors import FastDataError
from fastdata.jobs.executor import ClusterLost

#: Reruns of a task whose worker died, or that raised an OSError.
TASK_RETRIES = 3
#: Pieces in flight per CPU of the cluster: one running, one queued behind it.
PIECES_PER_CPU = 2
#: How long a stopped job waits for its cancelled tasks to end.
DRAIN_SECONDS = 20.0
#: Seconds to wait for a cluster that does not answer.
CONNECT_SECONDS = 10.0
#: How long the head may not answer before the job stops with its --resume
#: line (Ray itself ends a driver whose head is gone for 60 s).
HEAD_SILENT_SECONDS = 10.0


def import_ray():
    try:
        import ray
    except ImportError:
        raise FastDataError("running on a Ray cluster needs the ray package: install "
                            "fastdata's extra (pip install -e '.[ray]')") from None
    return ray


class RayExecutor:
    """A connection to a Ray cluster, and the tasks of one job on it. A
    process already connected (``ray.init`` called by the user) keeps its
    connection; else this one connects, and disconnects when closed."""

    name = "ray"
    remote = True

    def __init__(self, address: str, on_event: Callable[[str], None] | None = None) -> None:
        self._ray = ray = import_ray()
        self._refs: dict = {}
        self._gone = False
        self._own = not ray.is_initialized()
        self.where = f"the Ray cluster at {address}"
        if self._own:
            _probe(address)
            try:
                ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False,
                         configure_logging=True)
            except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
                raise FastDataError(f"cannot reach {self.where} ({exc}); start one with "
                                    "'ray start --head' and give its address") from None
        self._cpus, self._counted_at = 0.0, 0.0
        self._head = _gcs_address(ray) or address
        if on_event is not None and self._cpu_count() == 0:
            on_event(f"{self.where} has no CPUs yet; the job starts when workers join")

    def results(self, fn, pieces, common: tuple, *, in_order: bool):
        """``(number, fn(number, arg, *common))`` for each ``(number, arg)``
        of ``pieces``, a few per CPU in flight: in the order of ``pieces``,
        or as they finish."""
        ray = self._ray
        task = ray.remote(fn).options(max_retries=TASK_RETRIES, retry_exceptions=[OSError],
                                      name=f"fastdata-{getattr(fn, '__name__', 'piece')}")
        pieces = iter(pieces)
        queue: deque = deque()

        def submit_more() -> None:
            while len(self._refs) < self._window():
                number, arg = next(pieces, (None, None))
                if number is None:
                    return
                self._wait_for_head()  # a submit to a lost head waits for it
                ref = task.remote(number, arg, *common)
                self._refs[ref] = number
                queue.append(ref)

        submit_more()
        while self._refs:
            ref = self._first_done([queue[0]] if in_order else list(self._refs))
            number = self._refs[ref]
            result = self._result(ref, number)
            del self._refs[ref]
            queue.remove(ref)
            submit_more()
            yield number, result

    def _wait_for_head(self) -> None:
        """Return once the head answers; ClusterLost after
        ``HEAD_SILENT_SECONDS`` of silence."""
        since = time.monotonic()
        while not _answers(self._head):
            if time.monotonic() - since > HEAD_SILENT_SECONDS:
                raise self._lost(f"its head at {self._head} does not answer")
            time.sleep(0.5)

    def _first_done(self, refs: list):
        """The first of ``refs`` to finish; ClusterLost once the head has not
        answered for ``HEAD_SILENT_SECONDS`` (Ray's own wait would outlast it)."""
        silent_since = None
        while True:
            try:
                ready, _ = self._ray.wait(refs, num_returns=1, timeout=1.0)
            except Exception as exc:  # noqa: BLE001 - the connection's errors vary by version
                raise self._lost(str(exc) or type(exc).__name__) from None
            if ready:
                return ready[0]
            if _answers(self._head):
                silent_since = None
            elif silent_since is None:
                silent_since = time.monotonic()
            elif time.monotonic() - silent_since > HEAD_SILENT_SECONDS:
                raise self._lost(f"its head at {self._head} does not answer")

    def _result(self, ref, number: int):
        """The task's result, its error as one clear line, or ClusterLost."""
        errors = self._ray.exceptions
        try:
            return self._ray.get(ref)
        except errors.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, FastDataError):
                raise cause from None
            if isinstance(cause, ImportError):
                raise FastDataError(
                    f"{self.where} cannot load fastdata's tasks ({cause}): install "
                    "fastdata, the same version, on every node") from None
            if isinstance(cause, OSError):
                raise FastDataError(f"piece {number} failed on a Ray worker: {cause}"
                                    ) from cause
            raise (cause if isinstance(cause, Exception) else exc) from None
        except (errors.WorkerCrashedError, errors.NodeDiedError, errors.OutOfMemoryError
                ) as exc:
            raise FastDataError(f"piece {number}: every Ray worker that ran it died "
                                f"({TASK_RETRIES + 1} tries; out of memory?): "
                                f"{str(exc).splitlines()[0]}") from None
        except errors.TaskCancelledError:
            raise self._lost("its tasks were cancelled") from None
        except (errors.RaySystemError, ConnectionError, errors.GetTimeoutError) as exc:
            raise self._lost(str(exc).splitlines()[0] if str(exc) else "no answer") from None

    def _window(self) -> int:
        """Pieces in flight: bounded, so memory is, and enough to keep every
        CPU busy (counted again every few seconds: nodes come and go)."""
        # Asked only of a head that answers: Ray's call would wait for a lost one.
        if time.monotonic() - self._counted_at > 2.0 and _answers(self._head):
            self._cpus = self._cpu_count()
        return max(2, int(PIECES_PER_CPU * self._cpus))

    def _cpu_count(self) -> float:
        self._counted_at = time.monotonic()
        try:
            return float(self._ray.cluster_resources().get("CPU", 0))
        except Exception as exc:  # noqa: BLE001 - the connection's errors vary by version
            raise self._lost(str(exc) or "it does not answer") from None

    def _lost(self, why: str) -> ClusterLost:
        self._gone = True
        return ClusterLost(self.where, why)

    def close(self) -> None:
        """Cancel this job's tasks still out (a running one's worker is
        stopped: it must not write into files that the failed job is about to
        remove), wait for them, and disconnect if the connection is ours."""
        ray, refs = self._ray, list(self._refs)
        self._refs.clear()
        try:
            if refs and not self._gone:
                for ref in refs:
                    try:
                        ray.cancel(ref, force=True)
                    except Exception:  # noqa: BLE001 - done already, or the cluster went
                        pass
                try:
                    ray.wait(refs, num_returns=len(refs), timeout=DRAIN_SECONDS)
                except Exception:  # noqa: BLE001 - the cluster went too: nothing to wait for
                    pass
        finally:
            if self._own and ray.is_initialized():
                ray.shutdown()


def _gcs_address(ray) -> str | None:
    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - an older Ray, or a client connection
        return None


def _answers(address: str) -> bool:
    """Whether HOST:PORT takes a TCP connection within a second."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
    except (OSError, ValueError):
        return "://" in address or not host  # not a HOST:PORT to ask
    return True


def _probe(address: str) -> None:
    """A refused or silent HOST:PORT fails here at once, in one line (Ray's
    own connect retries for a minute); ``auto`` and ``ray://`` are left to Ray."""
    if address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise FastDataError(f"cannot reach the Ray cluster at {address} ({why}); start one "
                            "with 'ray start --head' and give its address (HOST:6379)"
                            ) from None

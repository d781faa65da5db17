"""Worker processes on this machine, started safely: forked with the
parent's SIGINT/SIGTERM handlers kept out of them (the pack's pool and the
local executor of jobs start theirs here)."""

from __future__ import annotations

import contextlib
import signal
import sys

#: Signals a worker must not handle with the parent's handlers.
_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_HAS_SIGMASK = hasattr(signal, "pthread_sigmask")


def start_method() -> str:
    import multiprocessing as mp

    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


@contextlib.contextmanager
def signals_blocked():
    """Keep SIGINT and SIGTERM blocked while workers are started: a worker
    forked while the parent turns SIGTERM into KeyboardInterrupt would run
    that handler until its initializer replaces it, and could swallow the
    pool's own shutdown signal; each worker unblocks them in
    :func:`worker_init` once its own handlers are set."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS) if _HAS_SIGMASK else None
    try:
        yield
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def worker_init() -> None:
    """A worker's own signal handlers (the initializer of every pool here)."""
    # Ctrl-C goes to the whole process group: let the parent alone handle it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _HAS_SIGMASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    if "cv2" in sys.modules:
        # Forked from a parent that loaded OpenCV: its thread pool's threads do
        # not exist here, and setNumThreads would wait for them forever
        # (OpenCV's parallel calls themselves work after fork).
        return
    try:
        import cv2

        cv2.setNumThreads(1)  # one process per core already
    except ImportError:
        pass

"""Trying a decoding library once, quietly, to learn whether it can be used here.

A wrapper whose native library is missing can fail half-way through building
an object whose ``__del__`` then raises when the object is collected (jpeg4py
without libturbojpeg: ``AttributeError: 'JPEG' object has no attribute
'decompressor'``). Python prints such errors as "Exception ignored in ...",
at the probe, at a later garbage collection or at exit, in every process that
probes. :func:`run_probe` turns the failure into a reason string and keeps
that noise out of stderr.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable


class Unusable(Exception):
    """Raised by a decoder's check with the whole reason it cannot be used here."""


def run_probe(check: Callable[[], None]) -> str | None:
    """Run ``check`` once; None when it passed, else why the decoder is unusable.

    What a failed check leaves behind is collected before this returns, and the
    errors its ``__del__`` methods raise on this thread meanwhile are dropped:
    they repeat the failure already recorded. Unraisable errors of other
    threads, and of a check that passed, still reach ``sys.unraisablehook``.

    Args:
        check: raises :class:`Unusable` (its message is the reason) or any
            other exception (the reason is its type and message).
    """
    caught: list = []
    previous = sys.unraisablehook
    thread = threading.get_ident()

    def hook(unraisable) -> None:
        if threading.get_ident() == thread:
            caught.append(unraisable)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        reason = _reason(check)
        if reason is not None:
            # Objects of the failed call caught in reference cycles: their
            # __del__ would raise at some later collection or at exit.
            gc.collect()
    finally:
        if sys.unraisablehook is hook:  # unless someone replaced it meanwhile
            sys.unraisablehook = previous
    if reason is None:
        for unraisable in caught:  # not the failure's echo: show it as Python would
            previous(unraisable)
    return reason


def _reason(check: Callable[[], None]) -> str | None:
    # Returning from an except clause drops the traceback, and with it the
    # frames that held the failed objects: their __del__ runs before this
    # returns, so still under run_probe's hook.
    try:
        check()
    except Unusable as exc:
        return str(exc)
    # A probe runs third-party code on its first use: whatever it raises means
    # "not usable here", and the reason is kept for `fastdata info`/`bench`.
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

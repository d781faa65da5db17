"""Decoders that import but cannot decode, for tests/test_decoder_probe.py.

``setup("broken")`` registers :class:`BrokenDecoder`, which fails its probe
the way jpeg4py does without libturbojpeg (an object that fails in
``__init__`` and whose ``__del__`` then raises AttributeError), plus a
half-built one left in a reference cycle, which only a garbage collection
frees. ``setup("jpeg4py")`` points the real jpeg4py at a library that does not
exist, so that it fails as it does on a machine without libturbojpeg0 even on
one that has it. Child processes import this module (tests/ on PYTHONPATH);
DataLoader workers started by spawn run :func:`worker_init`.
"""

from __future__ import annotations

import os

from fastdata.decoding.decoder_registry import AUTO_ORDER, DECODERS
from fastdata.decoding.decoders import Decoder, JPEG4PyDecoder

LIBRARY_ERROR = "libbroken.so.0: cannot open shared object file"
_SET_UP: set[str] = set()


class _Handle:
    """A wrapper object as jpeg4py's JPEG is: its library is loaded in
    ``__init__``, after which the attribute that ``__del__`` reads is set."""

    def __init__(self) -> None:
        raise OSError(LIBRARY_ERROR)

    def __del__(self) -> None:
        if self.decompressor is not None:  # AttributeError: never set
            pass


class BrokenDecoder(Decoder):
    name = "broken"
    encodings = frozenset({"jpeg"})
    install_hint = "pip install brokenjpeg"
    module = "json"  # any module that imports: the decoder counts as installed

    @classmethod
    def _check(cls) -> None:
        cyclic = _Handle.__new__(_Handle)  # half-built, kept alive by a cycle
        cyclic.me = cyclic
        _Handle()

    def _decode(self, data, *, size, keep_gray, encoding):
        raise AssertionError("an unusable decoder was offered")


def setup(kind: str) -> str:
    """Make the decoder ``kind`` ("broken" or "jpeg4py") unusable here, ahead
    of the working JPEG decoders in auto's order; its name. Each probe of it
    appends this process's id to the file $PROBE_LOG, when that is set."""
    if kind in _SET_UP:  # a forked worker inherits its parent's set-up
        return kind
    _SET_UP.add(kind)
    if kind == "jpeg4py":
        import jpeg4py._cffi

        # Where jpeg4py looks for libturbojpeg: a file that is nowhere.
        jpeg4py._cffi.initialize.__defaults__ = (("libturbojpeg-missing.so.0",),)
        _log_probes(JPEG4PyDecoder)
        return kind
    DECODERS["broken"] = "broken_decoder:BrokenDecoder"
    AUTO_ORDER["jpeg"] = ("broken", *AUTO_ORDER["jpeg"])
    _log_probes(BrokenDecoder)
    return "broken"


def _log_probes(cls: type[Decoder]) -> None:
    probe = cls.probe

    def logged() -> str | None:
        if os.environ.get("PROBE_LOG"):
            with open(os.environ["PROBE_LOG"], "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()}\n")
        return probe()

    cls.probe = staticmethod(logged)


def worker_init(kind: str, worker_id: int) -> None:
    """``worker_init_fn`` (through functools.partial) of a spawned worker: the
    same set-up as its parent made."""
    setup(kind)

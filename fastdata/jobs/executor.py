"""Where a job's pieces run: this machine's processes, a Dask cluster or a
Ray cluster, chosen by one pair of options that every job takes
(``scheduler=`` / ``--scheduler`` for Dask, ``ray=`` / ``--ray`` for Ray).

An executor runs ``fn(number, arg, *common)`` for each ``(number, arg)`` of a
job's pieces, a bounded number in flight, and yields ``(number, result)`` in
the pieces' order or as they finish. ``fn`` is a top-level function of
picklable arguments, so any worker that imports fastdata runs it. A piece
whose worker died is run again (each executor's own retry); a lost cluster
raises :class:`ClusterLost`, which the job turns into its ``--resume`` line.

Each executor is a thin adapter in a module of its own; only those modules
import dask or ray, and only when a job asks for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from fastdata.errors import FastDataError

#: The environment variable that names a Ray cluster when ``ray=`` is not given.
RAY_ENV = "FASTDATA_RAY"


class ClusterLost(FastDataError):
    """The cluster (its Dask scheduler, its Ray head) went away during a job."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"lost {where} ({why})")
        self.where, self.why = where, why


class Executor(Protocol):
    """What every executor does (see the module's docstring)."""

    #: "local", "dask" or "ray".
    name: str
    #: Where the pieces run, for messages: "the Dask scheduler at tcp://...".
    where: str
    #: Whether the workers are other machines' processes (which see files only
    #: through a shared file system).
    remote: bool

    def results(self, fn: Callable, pieces: Iterable[tuple[int, Any]], common: tuple, *,
                in_order: bool) -> Iterator[tuple[int, Any]]: ...

    def close(self) -> None: ...

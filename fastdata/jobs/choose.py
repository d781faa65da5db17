"""Choosing a job's executor from the options every job takes:
``scheduler=`` (Dask), ``ray=`` (Ray, or ``$FASTDATA_RAY``), else this
machine's processes (see ``executor.py``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fastdata.errors import FastDataError
from fastdata.jobs.executor import RAY_ENV, Executor


def open_executor(*, scheduler: Any = None, ray: Any = None, workers: int | None = None,
                  on_event: Callable[[str], None] | None = None,
                  pieces: int | None = None) -> Executor:
    """The executor the options name: a Dask scheduler (its address or a
    ``distributed.Client``), a Ray cluster (its address, ``"auto"``, or
    ``True`` for the address in ``$FASTDATA_RAY``), else ``workers``
    processes of this machine (None: one per usable core, and no more than
    the job's ``pieces``; one runs them in this process).

    Raises:
        FastDataError: both a scheduler and a Ray cluster, a cluster that
            cannot be reached, a missing optional package.
    """
    cluster = cluster_asked(scheduler=scheduler, ray=ray) or {}
    scheduler, ray = cluster.get("scheduler"), cluster.get("ray")
    if scheduler is not None:
        from fastdata.jobs.dask_executor import DaskExecutor

        return DaskExecutor(scheduler, on_event)
    if ray is not None:
        from fastdata.jobs.ray_executor import RayExecutor

        return RayExecutor(ray, on_event)
    from fastdata.jobs.local_executor import LocalExecutor

    if workers is None and pieces is not None:
        from fastdata.machine import usable_cores

        workers = max(1, min(usable_cores(), pieces))
    return LocalExecutor(workers)


def cluster_asked(*, scheduler: Any = None, ray: Any = None) -> dict | None:
    """The cluster that ``scheduler=`` and ``ray=`` (or ``$FASTDATA_RAY``)
    name, as ``{"scheduler": ...}`` or ``{"ray": ADDRESS}``; None for this
    machine.

    Raises:
        FastDataError: both are given, or ``ray=`` is not an address.
    """
    ray = _ray_address(ray)
    if scheduler is not None and ray is not None:
        raise FastDataError("give either a Dask scheduler (--scheduler) or a Ray cluster "
                            f"(--ray, or ${RAY_ENV}), not both")
    if scheduler is not None:
        return {"scheduler": scheduler}
    return {"ray": ray} if ray is not None else None


def _ray_address(ray: Any) -> str | None:
    """``ray=`` as an address: None (not asked for, and no ``$FASTDATA_RAY``),
    or the address to connect to."""
    if ray is False:
        return None
    if ray is None:
        return os.environ.get(RAY_ENV, "").strip() or None
    if ray is True:
        found = os.environ.get(RAY_ENV)
        if not found:
            raise FastDataError(f"ray=True takes the Ray cluster's address from ${RAY_ENV}, "
                                "which is not set: give the address (ray='HOST:6379', or "
                                "'auto' for the cluster 'ray start' runs on this machine)")
        return found
    if isinstance(ray, str) and ray.strip():
        return ray.strip()
    raise FastDataError(f"ray= takes a Ray cluster's address ('HOST:6379', 'ray://HOST:10001' "
                        f"or 'auto'), not {ray!r}")

"""Connecting to a Dask scheduler for a cluster pack (``cluster.py``): a
client, or one clear line within about ``CONNECT_SECONDS`` saying why not.
Imports distributed only when called.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import time

from fastdata.errors import FastDataError

#: Seconds to wait for a scheduler that does not answer.
CONNECT_SECONDS = 10.0


def import_distributed():
    try:
        import distributed
    except ImportError:
        raise FastDataError("packing on a Dask cluster needs the distributed package: "
                            "pip install distributed") from None
    return distributed


def connect(dd, address: str):
    """A client (of distributed, ``dd``) of the scheduler at ``address``, or
    one clear error within about ``CONNECT_SECONDS``."""
    _probe(dd, address)
    try:
        return dd.Client(address, timeout=CONNECT_SECONDS, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise _unreachable(address, str(exc) or type(exc).__name__) from None


def _probe(dd, address: str) -> None:
    """Ask ``address`` who it is before a Client connects: a refused port
    fails at once (distributed would retry until its timeout), and a port
    that is no scheduler's (its dashboard, a worker) is named as such (a
    Client would fail on it in ways that are hard to read, then hang closing).
    All within ``CONNECT_SECONDS``."""
    host, port = _tcp_host_port(dd, address)
    if host is None:
        return  # tls:// needs the security settings that only a Client reads
    deadline = time.monotonic() + CONNECT_SECONDS
    try:
        socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise _unreachable(address, exc.strerror or str(exc) or type(exc).__name__) from None
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own
            identity = pool.submit(asyncio.run, _identity(
                dd, address, max(1.0, deadline - time.monotonic()))).result()
    except OSError as exc:  # timeouts, closed connections
        if isinstance(exc, TimeoutError) or "Timed out" in str(exc):
            raise _unreachable(address, f"no answer within {CONNECT_SECONDS:.0f} s: is it "
                                        "the scheduler's port (8786 by default)?") from None
        raise _unreachable(address, str(exc) or type(exc).__name__) from None
    except Exception:  # noqa: BLE001 - whatever the other end made of the handshake
        raise _unreachable(address, "what listens there does not speak Dask's protocol") \
            from None
    kind = identity.get("type") if isinstance(identity, dict) else None
    if kind != "Scheduler":
        raise _unreachable(address, f"a Dask {kind or 'server'} answers there, not a "
                                    "scheduler")


def _tcp_host_port(dd, address: str) -> tuple[str | None, int | None]:
    """(host, port) of a tcp:// address; (None, None) for a tls:// one."""
    try:
        scheme, location = dd.comm.parse_address(address)
        if scheme not in ("tcp", "tls"):
            raise ValueError(scheme)
        host, port = dd.comm.parse_host_port(location)
        return (host, port) if scheme == "tcp" else (None, None)
    except (ValueError, TypeError):
        raise FastDataError(f"{address!r} is not a Dask scheduler address; give "
                            "tcp://HOST:PORT (a scheduler listens on 8786 by default; from "
                            "Python, a distributed.Client also does)") from None


async def _identity(dd, address: str, seconds: float):
    """What the server at ``address`` says it is (a scheduler: type "Scheduler")."""
    async def ask():
        comm = await dd.comm.connect(address, timeout=seconds)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    return await asyncio.wait_for(ask(), seconds)


def _unreachable(address: str, why: str) -> FastDataError:
    return FastDataError(f"cannot reach the Dask scheduler at {address} ({why}); start one "
                         "with 'dask scheduler' and workers with 'dask worker ADDRESS', or "
                         "check the address")


@contextlib.contextmanager
def quiet_distributed():
    """distributed logs, with tracebacks, the connection trouble that this
    module reports itself in one line (a lost scheduler, a failed connect)."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


#: Loggers of distributed's client side (distributed gives some their own level).
_NOISY_LOGGERS = ("distributed", "distributed.client", "distributed.batched",
                  "distributed.comm", "distributed.core", "tornado", "tornado.application")

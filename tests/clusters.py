"""Real clusters for the tests of jobs, started on 127.0.0.1 by the tests: a
Dask scheduler with 2 worker processes, and a Ray head with 2 CPUs (``ray
start``, its own processes), each as a context manager that stops it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import optional
import pytest

REPO = str(Path(__file__).resolve().parent.parent)
#: Ray's token authentication is for clusters reachable by others; these
#: listen on 127.0.0.1 only, for one test run.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@contextlib.contextmanager
def dask_cluster():
    """A client of a LocalCluster: 2 single-thread worker processes."""
    import copyreg

    # distributed makes every exception pickle through tblib (copyreg), which
    # other tests' restricted unpicklers refuse (DALI's): the table is put back.
    saved = dict(copyreg.dispatch_table)
    dd = optional.require("distributed")
    try:
        with dd.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                             host="127.0.0.1", dashboard_address=":0") as cluster, \
                dd.Client(cluster) as client:
            yield client
    finally:
        copyreg.dispatch_table.clear()
        copyreg.dispatch_table.update(saved)


@contextlib.contextmanager
def ray_cluster(port: int):
    """A Ray head on 127.0.0.1:``port`` with 2 CPUs, its workers importing
    this checkout; yields its address. This process talks to it with the
    same environment (``RAY_ENV``), set for the block. The head runs in the
    foreground of a process group of its own (``ray start --block``), which
    is stopped at the end: ``ray stop`` would stop every Ray cluster of the
    machine."""
    optional.require("ray")
    env = {**os.environ, **RAY_ENV,
           "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH"))
                                         if p)}
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    command = [ray_bin if os.path.exists(ray_bin) else shutil.which("ray") or "ray",
               "start", "--head", "--block", "--node-ip-address=127.0.0.1",
               f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
               "--disable-usage-stats"]
    head = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    try:
        _wait_for_head(head, port)
        yield f"127.0.0.1:{port}"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        _kill_leftovers(port)


def _wait_for_head(head: subprocess.Popen, port: int) -> None:
    """Until the head answers on ``port`` (its GCS), or fail with its output."""
    import socket

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start failed: {head.stderr.read()[-2000:]!r}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            time.sleep(1.0)  # the GCS listens before the raylet has registered
            return
        time.sleep(0.2)
    raise RuntimeError("the Ray head did not answer within 120 s")


def _kill_leftovers(port: int) -> None:
    """Workers of this head that outlived its process group (Ray starts
    some in sessions of their own): those whose command line names its port."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or ())
        if f"127.0.0.1:{port}" in cmdline and proc.pid != os.getpid():
            with contextlib.suppress(psutil.Error):
                proc.kill()


def kill_ray_head(port: int) -> None:
    """Kill the process group of the head that ``ray_cluster(port)`` started
    (its GCS, raylet and workers), as a lost node would go."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or ())
        if "--block" in cmdline and f"--port={port}" in cmdline:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                os.killpg(os.getpgid(proc.pid), signal.SIGKILL)


def ray_task_pids(name: str) -> list[int]:
    """Processes of Ray workers running a task named ``name`` now (Ray sets
    the process title to ``ray::NAME`` while the task runs)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or ())
        if f"ray::{name}" in cmdline and "IDLE" not in cmdline:
            found.append(proc.pid)
    return found


@pytest.fixture(scope="module")
def staging(tmp_path_factory):
    """$FASTDATA_STAGING_DIR: the folder a cluster's workers share."""
    folder = tmp_path_factory.mktemp("staging")
    saved = os.environ.get("FASTDATA_STAGING_DIR")
    os.environ["FASTDATA_STAGING_DIR"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("FASTDATA_STAGING_DIR", None)
    else:
        os.environ["FASTDATA_STAGING_DIR"] = saved


@pytest.fixture(scope="module")
def dask(staging):
    """A client of a local Dask cluster, for one test module."""
    with dask_cluster() as client:
        yield client


@pytest.fixture(scope="module")
def ray_address(staging):
    """The address of a Ray head on a free port, for one test module."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ray_cluster(port) as address:
        yield address


class When(threading.Thread):
    """Runs ``action`` once ``condition()`` holds (checked every 2 ms, for at
    most a minute); ``fired`` says, after the block, whether it ran."""

    def __init__(self, condition, action) -> None:
        super().__init__(daemon=True)
        self.condition, self.action = condition, action
        self.done = threading.Event()
        self.fired = False

    def run(self) -> None:
        deadline = time.monotonic() + 60
        while not self.done.is_set() and time.monotonic() < deadline:
            if self.condition():
                self.action()
                self.done.set()
                return
            time.sleep(0.002)

    def __enter__(self) -> "When":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        fired = self.done.is_set()
        self.done.set()
        self.join()
        self.fired = fired


def local_workers_since():
    """A function giving the children of this process started after this
    call: a job's local workers, never a server a fixture started (moto,
    the emulators, a cluster), which are children too."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children()}
    return lambda: [p for p in me.children() if p.pid not in before]


def killing_a_local_worker() -> When:
    """A :class:`When` that kills one of the job's local workers (started
    after the call) once two have been at their pieces for 0.3 s."""
    workers, seen = local_workers_since(), []

    def working_a_while() -> bool:  # a worker amid its pieces, not starting nor done
        if len(workers()) < 2:
            return False
        seen.append(time.monotonic())
        return seen[-1] - seen[0] > 0.3

    return When(working_a_while, lambda: os.kill(workers()[0].pid, signal.SIGKILL))

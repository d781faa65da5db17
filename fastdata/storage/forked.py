"""Remote I/O in processes forked after obstore was used: through a helper.

obstore runs its requests on a tokio runtime, and tokio does not survive
fork(): a child forked after the parent made a request hangs on its first own
request (tokio-rs/tokio#4301). A DataLoader forks its workers by default,
usually after the parent opened the dataset. So a process that inherited a
used runtime sends its requests to a helper: a fresh interpreter started with
fork+exec (``python -c``), which has a runtime of its own, one per process
and started on first need (up to ``MAX_HELPERS`` per process, for requests
made at once). Requests and results cross a pipe (:func:`send`,
:func:`receive`); the helper's side is fastdata.storage.helper. A helper exits
when its pipe closes, that is with its process.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading

_runtime_pid: int | None = None  # the process whose requests obstore has run
#: Idle helpers of this process; up to MAX_HELPERS run requests at once.
_idle: list = []
_count = 0
_pool_pid: int | None = None
_pool_lock = threading.Condition()
MAX_HELPERS = 2


#: Thread pools by name: (the process that made it, the pool).
_pools: dict = {}


def process_threads(name: str, size: int):
    """This process's pool of ``size`` threads named ``name``, made on first
    use; threads never cross fork, so a forked child makes its own."""
    found = _pools.get(name)
    if found is None or found[0] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor

        found = _pools[name] = (os.getpid(), ThreadPoolExecutor(size, thread_name_prefix=name))
    return found[1]


def map_all(name: str, size: int, fn, items: list) -> list:
    """``fn`` of each item on this process's pool ``name`` (of ``size``
    threads); the first error is raised after all have ended, so nothing is
    left running behind it."""
    pool = process_threads(name, size)
    futures = [pool.submit(fn, item) for item in items]
    errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


def mark_runtime() -> None:
    """Note that this process is about to use obstore itself."""
    global _runtime_pid
    if _runtime_pid is None:
        _runtime_pid = os.getpid()


def forked() -> bool:
    """Whether this process inherited a runtime another process started."""
    return _runtime_pid is not None and _runtime_pid != os.getpid()


def via_helper(op: str, *args):
    """Run storage operation ``op`` (one of fastdata.storage.helper.OPS) in one
    of this process's helpers (a thread waits for an idle one when MAX_HELPERS
    are busy)."""
    helper = _acquire()
    try:
        return helper.call(op, args)
    finally:
        with _pool_lock:
            _idle.append(helper)
            _pool_lock.notify()


def _acquire() -> "_Helper":
    global _idle, _count, _pool_pid
    with _pool_lock:
        if _pool_pid != os.getpid():  # helpers of a parent are not ours
            _idle, _count, _pool_pid = [], 0, os.getpid()
        while not _idle and _count >= MAX_HELPERS:
            _pool_lock.wait()
        if _idle:
            return _idle.pop()
        _count += 1
    try:
        return _Helper()
    except BaseException:
        with _pool_lock:
            _count -= 1
        raise


class _Helper:
    def __init__(self) -> None:
        self.pid = os.getpid()
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent,
                                                         env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from fastdata.storage.helper import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.lock = threading.Lock()

    def call(self, op: str, args: tuple):
        with self.lock:
            send(self.proc.stdin, (op, args))
            reply = receive(self.proc.stdout)
        if reply is None:
            from fastdata.errors import StorageError

            raise StorageError(f"the storage helper process exited (code "
                               f"{self.proc.poll()}) during {op}")
        ok, value = reply
        if not ok:
            raise value
        return value


def send(pipe, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(struct.pack("<Q", len(data)) + data)
    pipe.flush()


def receive(pipe):
    head = pipe.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(pipe.read(size))


"""CPU accounting for the benchmark: this process, its child processes, the whole machine.

Everything about other processes is read from /proc (Linux); elsewhere the
functions return 0, nothing or None, and the figures cover this process and
its reaped children only.
"""

from __future__ import annotations

import functools
import os
from collections import deque

_PROC = "/proc"


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):  # not on Unix
        return 100


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (user + system), in seconds.

    getrusage has microsecond resolution; os.times (the fallback off Unix)
    counts clock ticks of 10 ms, too coarse for short epochs.
    """
    try:
        import resource
    except ImportError:  # not on Unix
        t = os.times()
        return t[0] + t[1] + t[2] + t[3]
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine has used since boot (Linux), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    values = [int(x) for x in fields[1:9]]
    busy = sum(values) - values[3] - values[4]
    return busy / ticks


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        with open(f"{_PROC}/{pid}/stat", encoding="ascii", errors="replace") as f:
            # The command name may hold spaces and parentheses: split after the last ")".
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


@functools.cache
def _has_children_files() -> bool:
    # /proc/<pid>/task/<tid>/children needs CONFIG_PROC_CHILDREN; the main
    # thread's id is the process id, so its file tells whether the kernel has them.
    return os.path.exists(f"{_PROC}/{os.getpid()}/task/{os.getpid()}/children")


def _children_from_task_files(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"{_PROC}/{pid}/task")
    except OSError:  # the process has ended
        return []
    out: list[int] = []
    for tid in tasks:
        try:
            with open(f"{_PROC}/{pid}/task/{tid}/children", encoding="ascii") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):  # the thread has ended
            continue
    return out


def _children_by_scan() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process (the slow way: one read per process)."""
    tree: dict[int, list[int]] = {}
    try:
        names = os.listdir(_PROC)
    except OSError:
        return tree
    for name in names:
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None and len(fields) > 1:
                tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def child_pids(pid: int | None = None) -> list[int]:
    """Live descendants of process ``pid`` (default: this one), nearest first, from /proc.

    Descendants, not only children: workers started through a fork server are
    the server's children. Processes that have exited but are not yet reaped
    (zombies) are listed too. Returns [] off Linux.
    """
    root = os.getpid() if pid is None else pid
    if not os.path.isdir(_PROC):
        return []
    if _has_children_files():  # cheap: a few small reads, fit for inside a timed epoch
        children_of = _children_from_task_files
    else:
        tree = _children_by_scan()

        def children_of(p: int) -> list[int]:
            return tree.get(p, [])

    out: list[int] = []
    seen = {root}
    todo = deque([root])
    while todo:
        for child in children_of(todo.popleft()):
            if child not in seen:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) process ``pid`` has used, from /proc;
    0 when it has gone or off Linux."""
    fields = _stat(pid)
    try:
        return (int(fields[11]) + int(fields[12])) / _clock_ticks() if fields else 0.0
    except (IndexError, ValueError):
        return 0.0


def children_cpu_seconds() -> float:
    """CPU time of every live descendant process of this one, from /proc (0 off Linux).

    Added to :func:`cpu_seconds` (this process and its reaped children) it
    counts each child of this process once: a child's time moves into
    ``cpu_seconds`` when it is reaped, and leaves this sum at the same moment.
    """
    return sum(process_cpu_seconds(pid) for pid in child_pids())


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` exists, a zombie included (it has not been reaped)."""
    if os.path.isdir(_PROC):
        return os.path.exists(f"{_PROC}/{pid}")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but belongs to someone else
        return True
    return True

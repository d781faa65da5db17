"""Whole-file walks in a child process, for readers whose C library can die on a
damaged file instead of raising (``Reader.walk_in_child``: LMDB; see the note
in fastdata.formats.lmdb.reader for why a checksum cannot guard it instead).

``fastdata verify`` and the RAM cache fill read every record once, so that is
where damage is met; there the walk runs in a fresh interpreter
(``python -m fastdata.loaders.isolate SPEC``: a new process, not a fork, so no
thread, lock or CUDA state of the caller comes along, and the caller's
``__main__`` is never re-run). The child sends JSON lines back: progress,
problems as found, and a result. If it dies from a signal (an assertion's
abort, SIGSEGV, SIGBUS), the caller gets a CorruptDataError naming the data
file and how far the walk got, with whatever the child reported until then.
The RAM cache's child writes straight into the shared-memory block.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

from fastdata import errors
from fastdata.errors import CorruptDataError, FastDataError

#: Records between two progress messages of the child.
_PROGRESS_EVERY = 64
#: Signals by which a C library dies on bad memory or a failed assertion: damage.
_FAULTS = {signal.SIGABRT, signal.SIGBUS, signal.SIGSEGV, signal.SIGILL, signal.SIGFPE}


def verify_in_child(reader, *, decode: bool, on_problem: Callable[[dict], None],
                    on_progress: Callable[[int], None]) -> int:
    """``fastdata verify``'s checks of ``reader``'s dataset, run in a child
    process; the records checked. A death of the child is one more problem."""
    checked: list[int] = []

    def on_message(message: dict) -> None:
        if "problem" in message:
            on_problem(message["problem"])
        elif "result" in message:
            checked.append(message["result"]["checked"])

    try:
        done = _run(reader, {"task": "verify", "decode": decode}, on_message, on_progress)
    except _NoChild:
        from fastdata.loaders.verify import check_dataset

        return check_dataset(reader, decode=decode, on_problem=on_problem,
                             on_progress=on_progress)
    except _ChildDied as died:
        on_problem({"index": None, "key": None, "path": reader.crash_path(),
                    "reason": died.reason})
        return died.done
    return checked[0] if checked else done


def fill_in_child(reader, cache, bar, skip_damaged: bool) -> dict[int, str]:
    """Fill a SharedPayloadCache from a child process; the damaged records.

    Raises:
        CorruptDataError: a record is damaged (and not ``skip_damaged``), or
            reading the file killed the child.
    """
    result = {}

    def on_message(message: dict) -> None:
        if "result" in message:
            result.update(message["result"]["damaged"])

    task = {"task": "cache", "cache": cache.__getstate__(), "skip_damaged": skip_damaged}
    try:
        _run(reader, task, on_message, bar.update)
    except _NoChild:
        cache._fill(reader, bar, skip_damaged)
        return cache.damaged
    except _ChildDied as died:
        raise CorruptDataError(died.reason, path=reader.crash_path()) from None
    return {int(k): v for k, v in result.items()}


class _NoChild(Exception):
    """No child process can be started here (a sandbox, no interpreter to run):
    the walk runs in this process, as it would for any other format."""


class _ChildDied(Exception):
    def __init__(self, reason: str, done: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.done = done


def _run(reader, task: dict, on_message, on_progress) -> int:
    """Run ``task`` in a child; feed its messages to ``on_message``; records done."""
    cls = type(reader)
    spec = dict(task, reader=f"{cls.__module__}:{cls.__qualname__}", path=reader.path,
                options=reader.child_options())
    done = 0
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen([sys.executable, "-m", __name__, json.dumps(spec)],
                                    stdout=subprocess.PIPE, stderr=err, env=_child_env())
        except OSError:
            raise _NoChild() from None
        try:
            for line in proc.stdout:
                message = json.loads(line)
                if "progress" in message:
                    done += message["progress"]
                    on_progress(message["progress"])
                elif "error" in message:
                    raise _rebuild(message["error"])
                else:
                    on_message(message)
        except BaseException:
            proc.kill()  # interrupted, or the child reported an error
            raise
        finally:
            proc.stdout.close()
            code = proc.wait()
        if -code in _FAULTS:
            raise _ChildDied(_death(reader, -code, _tail(err), done), done)
        if code < 0:  # killed from outside (the OOM killer, a user): not damage
            raise FastDataError(f"the child process reading it was killed "
                                f"({_signal_name(-code)}) at or after record {done}; run it "
                                f"again", path=reader.path)
        if code != 0:
            raise FastDataError(f"the child process reading it failed (exit {code}): "
                                f"{_tail(err)}", path=reader.path)
    return done


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _death(reader, signum: int, detail: str, done: int) -> str:
    return (f"the {reader.format_name} library died reading it ({_signal_name(signum)}"
            f"{': ' + detail if detail else ''}) at or after record {done} (of {len(reader)}):"
            f" the file is damaged; re-pack it or restore it from a copy")


def _tail(err) -> str:
    err.seek(0)
    lines = err.read().decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else ""


def _rebuild(fields: dict) -> FastDataError:
    cls = getattr(errors, fields.get("type", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, FastDataError)):
        cls = FastDataError
    return cls(fields["message"], path=fields.get("path"), key=fields.get("key"),
               offset=fields.get("offset"), record=fields.get("record"))


def _child_env() -> dict[str, str]:
    # The child imports this very fastdata and whatever the caller could import.
    import fastdata

    root = os.path.dirname(os.path.dirname(os.path.abspath(fastdata.__file__)))
    paths = [p or os.getcwd() for p in sys.path]  # in order: no shadowing of the stdlib
    if root not in paths:
        paths.insert(0, root)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)))


# -- the child side ----------------------------------------------------------------


class _Emitter:
    """Progress and messages to the parent, one JSON line each (progress batched)."""

    def __init__(self) -> None:
        self.pending = 0

    def send(self, message: dict) -> None:
        self.flush()
        self._write(message)

    def update(self, n: int = 1) -> None:
        self.pending += n
        if self.pending >= _PROGRESS_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self._write({"progress": self.pending})
            self.pending = 0

    def close(self) -> None:
        self.flush()

    @staticmethod
    def _write(message: dict) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()  # what is sent survives a crash a moment later


def _child(spec: dict) -> None:
    module, _, name = spec["reader"].partition(":")
    reader_cls = getattr(importlib.import_module(module), name)
    out = _Emitter()
    try:
        with reader_cls(spec["path"], **spec["options"]) as reader:
            if spec["task"] == "verify":
                from fastdata.loaders.verify import check_dataset

                checked = check_dataset(reader, decode=spec["decode"],
                                        on_problem=lambda p: out.send({"problem": p}),
                                        on_progress=out.update)
                out.send({"result": {"checked": checked}})
            else:
                out.send({"result": {"damaged": _fill(reader, spec, out)}})
    except FastDataError as exc:
        out.send({"error": {"type": type(exc).__name__, "message": exc.message,
                            "path": exc.path, "key": exc.key, "offset": exc.offset,
                            "record": exc.record}})


def _fill(reader, spec: dict, out: _Emitter) -> dict[int, str]:
    from multiprocessing import resource_tracker

    from fastdata.loaders.cache import SharedPayloadCache

    cache = SharedPayloadCache.__new__(SharedPayloadCache)
    cache.__setstate__(spec["cache"])
    # Not a multiprocessing child: this process's own resource tracker would
    # unlink the block when it exits. The creator alone frees it.
    resource_tracker.unregister(cache._shm._name, "shared_memory")
    try:
        cache._fill(reader, out, spec["skip_damaged"])
        return cache.damaged
    finally:
        cache.close()


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))

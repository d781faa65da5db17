"""Whole-file walks in a child process, for readers whose C library can die on a
damaged file instead of raising (``Reader.walk_in_child``: LMDB; see the note
in fastdata.formats.lmdb.reader for why a checksum cannot guard it instead).

``fastdata verify`` and the RAM cache fill read every record once, so that is
where damage is met; there the walk (the caller's task, named
``"module:function"``) runs in a fresh interpreter
(``python -m fastdata.formats.isolate SPEC``: a new process, not a fork, so no
thread, lock or CUDA state of the caller comes along, and the caller's
``__main__`` is never re-run). The child sends JSON lines back: progress,
problems as found, and a result. If it dies from a signal (an assertion's
abort, SIGSEGV, SIGBUS), the caller gets a CorruptDataError naming the data
file and how far the walk got, with whatever the child reported until then.
The RAM cache's child writes straight into the shared-memory block.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

from fastdata import errors
from fastdata.errors import FastDataError
from fastdata.lazy import load

#: Records between two progress messages of the child.
_PROGRESS_EVERY = 64
#: Signals by which a C library dies on bad memory or a failed assertion: damage.
_FAULTS = {signal.SIGABRT, signal.SIGBUS, signal.SIGSEGV, signal.SIGILL, signal.SIGFPE}


class NoChild(Exception):
    """No child process can be started here (a sandbox, no interpreter to run):
    the caller walks in its own process, as it would for any other format."""


class ChildDied(Exception):
    """The child died of a fault (``reason`` says how far it got: ``done``)."""

    def __init__(self, reason: str, done: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.done = done


def walk_in_child(reader, task: str, args: dict, on_message: Callable[[dict], None],
                  on_progress: Callable[[int], None]) -> int:
    """Run ``task(reader, args, out)`` in a child over a reader of the same
    dataset; the records done. ``task`` is ``"module:function"``: the caller's
    own, so this module names no layer above it. ``out.send(message)`` reaches
    ``on_message``, ``out.update(n)`` ``on_progress``.

    Raises:
        NoChild: no child can be started (walk in this process instead).
        ChildDied: the child died of a fault: damage.
        FastDataError: the task raised one (rebuilt here), or the child was
            killed from outside or failed.
    """
    cls = type(reader)
    spec = dict(args=args, task=task, reader=f"{cls.__module__}:{cls.__qualname__}",
                path=reader.path, options=reader.child_options())
    done = 0
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen([sys.executable, "-m", __name__, json.dumps(spec)],
                                    stdout=subprocess.PIPE, stderr=err, env=_child_env())
        except OSError:
            raise NoChild() from None
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
            raise ChildDied(_death(reader, -code, _tail(err), done), done)
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
    reader_cls, task = load(spec["reader"]), load(spec["task"])
    out = _Emitter()
    try:
        with reader_cls(spec["path"], **spec["options"]) as reader:
            task(reader, spec["args"], out)
    except FastDataError as exc:
        out.send({"error": {"type": type(exc).__name__, "message": exc.message,
                            "path": exc.path, "key": exc.key, "offset": exc.offset,
                            "record": exc.record}})


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))

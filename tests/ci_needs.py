"""Skips that CI must not take.

A test whose component is missing (an emulator, the pinned library versions)
skips, with the reason, where the suite runs by hand; under ``.ci/run``, which
sets ``FASTDATA_CI=1`` and installs every component, the same thing fails the
run instead, so a broken install cannot quietly remove what it was meant to
test. A Python package that an extra brings is probed through tests/optional.py
instead: its skips fail in CI through the hooks of tests/allowed_skips.py.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess

import pytest


def in_ci() -> bool:
    return os.environ.get("FASTDATA_CI") == "1"


def missing(reason: str) -> None:
    """Skip with ``reason`` by hand; fail with it in CI."""
    if in_ci():
        pytest.fail(f"{reason}; .ci/run (FASTDATA_CI=1) must provide it")
    pytest.skip(f"{reason} (.ci/run provides it)")


#: An interpreter with timm and torchvision, where the suite's own has neither.
VISION_PYTHON = "FASTDATA_VISION_PYTHON"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def checkout_env() -> dict:
    """This process's environment with the checkout first on PYTHONPATH: another
    interpreter imports this fastdata even where it has none installed."""
    return dict(os.environ,
                PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]))


@functools.cache
def _imports_vision(python: str) -> str | None:
    """Why ``python`` cannot import timm and torchvision beside this checkout's
    fastdata, or None. Tried in a child: a torchvision built for another torch
    is found but fails to import."""
    try:
        result = subprocess.run([python, "-c", "import timm, torchvision, fastdata"],
                                env=checkout_env(),
                                capture_output=True, text=True, timeout=300)
    except OSError as err:
        return f"{python}: {err}"
    if result.returncode:
        lines = result.stderr.strip().splitlines() or ["(no output)"]
        return f"{python}: {lines[-1]}"
    return None


def vision_python() -> str:
    """An interpreter that imports timm and torchvision: this one, or
    ``$FASTDATA_VISION_PYTHON`` (``.ci/run`` builds a virtual environment for
    them: PyPI's torchvision imports only beside the torch build it was made
    for). Skips by hand, fails in CI, when neither does."""
    import sys

    why = _imports_vision(sys.executable)
    if why is None:
        return sys.executable
    other = os.environ.get(VISION_PYTHON)
    if other:
        why_other = _imports_vision(other)
        if why_other is None:
            return other
        why = f"{why}; {VISION_PYTHON}={why_other}"
    missing(f"timm and torchvision do not import ({why}); set {VISION_PYTHON} to a Python "
            "that has them")
    raise AssertionError("unreachable")


#: A line opening a block whose lines run conditionally (or not at all: a function).
_OPENS = re.compile(r"^(if|while|until|for|case|select)\b|\{$")
_CLOSES = re.compile(r"^(fi|done|esac|\})(\s|;|$)")
#: The same block closed on its opening line: ``if x; then y; fi``.
_CLOSED_ON_ITS_LINE = re.compile(r"[;&|]\s*(fi|done|esac|\})(\s|;|$)")


def top_level_commands(script: str) -> list[str]:
    """The lines a bash script runs unconditionally, in order: continuations
    joined, comments, blank lines and heredoc bodies left out, and nothing from
    inside an ``if``/``while``/``for``/``case`` block, a ``{ ... }`` group or a
    function body. Stops at the first top-level ``exit``: the rest never runs.
    A whole block on one line (``if x; then y; fi``) is conditional: left out."""
    kept, depth, heredoc = [], 0, None
    for raw in re.sub(r"[ \t]*\\\n\s*", " ", script).splitlines():
        line = raw.strip()
        if heredoc is not None:
            heredoc = None if line == heredoc else heredoc
            continue
        if not line or line.startswith("#"):
            continue
        body = re.search(r"(?<!<)<<-?\s*['\"]?(\w+)", line)    # not <<< (a string)
        heredoc = body.group(1) if body else None
        if _OPENS.search(line):
            depth += 0 if _CLOSED_ON_ITS_LINE.search(line) else 1
        elif _CLOSES.match(line):
            depth = max(depth - 1, 0)
        elif depth == 0:
            if re.match(r"exit\b", line):
                break
            kept.append(line)
    return kept


def ci_spelling(command: str) -> str:
    """A README command line as .ci/run spells it: each ``python ...`` step run
    by ``"$PY"``, each ``pip ...`` step by ``"$PY" -m pip``."""
    steps = []
    for step in (s.strip() for s in command.split("&&")):
        if step.startswith("python "):
            step = '"$PY" ' + step.removeprefix("python ")
        elif step.startswith("pip "):
            step = '"$PY" -m ' + step
        steps.append(step)
    return " && ".join(steps)

"""Objects named by ``"module:attribute"`` strings, imported when first used, so
that naming a class (a format's reader, a decoder, a task for a child process)
costs no import. No third-party imports."""

from __future__ import annotations

import importlib


def load(target: str):
    """The object a ``"module:attribute"`` string names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)

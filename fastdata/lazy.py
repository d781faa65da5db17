"""Objects named by ``"module:attribute"`` strings, imported when first used, so
that naming a class (a format's reader, a decoder, a task for a child process,
a package's public name) costs no import. No third-party imports."""

from __future__ import annotations

import importlib


def load(target: str):
    """The object a ``"module:attribute"`` string names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def exports(namespace: dict, table: dict[str, str]):
    """``(__getattr__, __dir__)`` for the package whose globals are ``namespace``:
    each name of ``table`` (name -> ``"module:attribute"``) is imported on first
    access and then kept there, so importing the package imports none of them."""
    package = namespace["__name__"]

    def __getattr__(name: str):
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = load(target)
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *table})

    return __getattr__, __dir__

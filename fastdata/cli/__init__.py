"""The ``fastdata`` command line: ``main``, the command group (``group``: with the
error handling and output every command shares), and one module per command
(pack, convert, inspect: info and verify, mixture_info: info on a mixture file,
demo: synth, bench, dedup, subset, versions: gc, join; packing: what pack and
convert share; sections: a --help in titled sections). Importing it stays
light: each command imports what it needs when it runs."""

from __future__ import annotations

# The commands register themselves on ``main`` when imported.
from fastdata.cli import bench, convert, dedup, demo, inspect, pack, subset, versions  # noqa: F401
from fastdata.cli.group import cli_terms, echo, main

__all__ = ["cli_terms", "echo", "main"]

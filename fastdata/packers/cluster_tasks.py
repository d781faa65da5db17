"""What a cluster's worker (Dask or Ray) runs for a cluster pack (see
``cluster.py``): one task per piece.

Plain top-level functions of picklable arguments, so any worker that can
import fastdata runs them; nothing here imports dask or ray. A task sees the source
and the partial output at the paths the client gave (a shared file system).
"""

from __future__ import annotations

import os
import socket
import tempfile

from fastdata.errors import FastDataError
from fastdata.formats.output import fsync_dir, fsync_file
from fastdata.formats.output import remove_path
from fastdata.packers.pieces import write_outcome
from fastdata.packers.prepare import Prepared, SkippedFile, prepare
from fastdata.packers.source import SourceEntry

#: Names of the private folders tasks write in, inside the partial output.
PRIVATE_PREFIX = ".piece-"


def pack_shard_piece(number: int, entries: list[SourceEntry], prepare_options: tuple,
                     format_name: str, output: str, writer_options: dict, partial: str,
                     source_root: str | None = None) -> tuple[list, dict]:
    """Prepare piece ``number``'s entries and write its shard into ``partial``.

    The shard is written by a detached writer into a folder of this attempt's
    own, then its files are renamed to their piece names, so a half-written
    shard never has a piece's name, and a rerun (a worker died) puts the same
    bytes there. Returns ``(outcomes, state)`` as the pack's journal records
    them: per entry ``[key, label, crc, size, source_bytes, encoding, width,
    height]`` or ``[key, reason]`` for a skipped image, and the writer's state.
    """
    from fastdata.formats import get_format

    _check_visible(partial, "OUTPUT's folder (its partial output)")
    _check_source(source_root, entries)
    writer_cls = get_format(format_name).load_writer()
    private = tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{number:06d}-", dir=partial)
    try:
        writer = writer_cls(output, detached_dir=private, **writer_options)
        writer.begin_piece(number)
        outcomes = [write_outcome(writer, prepare((entry, *prepare_options)))
                    for entry in entries]
        state = writer.end_piece(number)
        if state.get("shard") is not None:
            names = writer._shard_files(state["shard"]["temp"])
            for name in names[1:]:  # the shard itself was synced when it closed
                fsync_file(os.path.join(private, name))
            for name in names:
                os.replace(os.path.join(private, name), os.path.join(partial, name))
            fsync_dir(partial)
    finally:
        remove_path(private)
    return outcomes, state


def prepare_piece(number: int, entries: list[SourceEntry], prepare_options: tuple,
                  source_root: str | None = None) -> list[Prepared | SkippedFile]:
    """Piece ``number``'s entries prepared, in order (a single-file format's
    records, written by the client)."""
    _check_source(source_root, entries)
    return [prepare((entry, *prepare_options)) for entry in entries]


def _check_source(root: str | None, entries: list[SourceEntry]) -> None:
    if any(entry.path is not None for entry in entries):  # bytes held by entries need no files
        _check_visible(root, "SOURCE")


def _check_visible(path: str | None, what: str) -> None:
    """A worker that cannot see ``path`` would skip every image or write
    nowhere: say so, naming the machine."""
    if path is not None and not os.path.exists(path):
        raise FastDataError(
            f"not visible on worker host {socket.gethostname()}: the "
            f"workers must see {what} at the same path as the machine running the pack "
            "(a shared file system)", path=path)

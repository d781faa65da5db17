"""``fastdata verify``: check a dataset as it is now (its current version,
a version or a view) against every checksum it holds (no torch): each
part's records and files (see :mod:`fastdata.formats.verify`) and the
joined column files. The records and the shard files are checked in
pieces, in parallel (see fastdata.ops.verify_pieces), on this machine's
processes or a cluster; the report is the same wherever they ran."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from fastdata.formats.verify import VerifyResult

#: Records from which verify runs in pieces on this machine's processes
#: (below, one process checks them: starting workers would cost more).
IN_PIECES_FROM = 1 << 16


def verify_dataset(path: str | os.PathLike, *, decode: bool = False,
                   progress: bool | None = None, allow_outside: bool = False,
                   version: int | None = None, scheduler: Any = None, ray: Any = None,
                   workers: int | None = None, resume: bool = False,
                   on_event: Callable[[str], None] | None = None) -> VerifyResult:
    """Check every record of ``path`` and every file its manifest covers.

    Args:
        path: a packed dataset, a version record or a view file (or a
            ``fastdata.DatasetRef``).
        decode: also decode every image (JPEGs strictly: a JPEG that decodes
            only with libjpeg's corrupt-data warning is reported as damaged).
        progress: show a progress bar (None: only on a terminal).
        allow_outside: follow links that lead out of the dataset's folder (see
            :class:`fastdata.formats.reader.Reader`).
        version: check this version (None: the current one).
        scheduler: check in pieces on a Dask cluster, as
            :func:`fastdata.dedup` does. LMDB, whose library can die on a
            damaged file, is walked in one child process here instead (its
            death is reported as damage).
        ray: on a Ray cluster instead.
        workers: processes on this machine (None: one per usable core, in
            pieces from 65,536 records; 1: this process).
        resume: continue an interrupted run of the same job.
        on_event: called with each note.

    Returns:
        The result; damaged records and files are listed, not raised.

    Raises:
        CorruptDataError: the dataset cannot be opened (a per-record array
            fails its SHA-256, a label is not a class index, a file is
            truncated).
    """
    from fastdata.dataset.resolve import open_reader
    from fastdata.formats.verify import verify_reader
    from fastdata.jobs.choose import cluster_asked

    reader = open_reader(path, verify=True, allow_outside=allow_outside, version=version)
    cluster = cluster_asked(scheduler=scheduler, ray=ray)
    if reader.walk_in_child or not isinstance(path, (str, os.PathLike)) or (
            cluster is None and (workers == 1 or workers is None
                                 and len(reader) < IN_PIECES_FROM)):
        return verify_reader(reader, decode=decode, progress=progress)
    spec = {"path": os.fspath(path), "version": version, "allow_outside": allow_outside,
            "verify": True, "created_at": reader.manifest.created_at}
    try:
        return _verify_in_pieces(reader, spec, decode=decode, progress=progress,
                                 executor=dict(cluster or {}, workers=workers),
                                 resume=resume, on_event=on_event)
    finally:
        reader.close()


def _verify_in_pieces(reader, spec: dict, *, decode: bool, progress, executor: dict,
                      resume: bool, on_event) -> VerifyResult:
    """The checks of ``check_dataset``: the index, keys and metadata here, the
    records and files in pieces; problems in the same order."""
    from fastdata.formats.sharded.reader import ShardedReader
    from fastdata.formats.verify import check_index, check_metadata
    from fastdata.jobs.choose import open_executor
    from fastdata.jobs.runner import Job, run_job
    from fastdata.ops.verify_pieces import plan_pieces, verify_piece

    problems: list[dict] = []
    located = check_index(reader, problems.append, streamed=True)
    shards = len(reader.shard_paths) if isinstance(reader, ShardedReader) else None
    pieces = plan_pieces(len(reader) if located else 0, shards)
    job = Job("verify", {"dataset": spec, "records": len(reader), "decode": decode}, verify_piece,
              pieces, common=(spec, decode), writes_files=False,
              sizes=[p[2] - p[1] if p[0] == "records" else 0 for p in pieces])
    with contextlib.closing(open_executor(**executor, on_event=on_event,
                                          pieces=len(pieces))) as ex:
        run = run_job(job, ex, resume=resume, progress=progress, on_event=on_event)
    found = dict(zip((tuple(p) for p in pieces), run.results))
    for piece in pieces:
        if piece[0] == "records":
            problems += found[tuple(piece)]["problems"]
    if located:
        check_metadata(reader, problems.append)
    for piece in pieces:
        if piece[0] == "files":
            problems += found[tuple(piece)]["problems"]
    run.finish()
    checked = sum(r["checked"] for r in run.results)
    return VerifyResult(reader.path, reader.format_name, len(reader), checked, decode,
                        problems)

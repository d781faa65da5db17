"""Packing to a URL: pack into a local staging folder, then upload in an order
that makes the dataset visible only when it is complete.

Finished shards are uploaded in the background while the next ones are
written (``_EarlyUploads``; names that depend on the shard count wait). The
other data files follow, then what names them (sidecars, the report), and the
file that makes the dataset visible last (a sharded dataset's manifest): an
interrupted upload leaves no dataset, only objects no manifest lists. A format
whose manifest is inside its one data file needs no order: an object appears
whole or not at all. The staging folder is removed afterwards; it needs the
dataset's size in local space (``FASTDATA_STAGING_DIR``, else
``FASTDATA_CACHE_DIR``'s file system, else the temporary folder). A pack on a
Dask cluster stages in ``FASTDATA_STAGING_DIR``, a folder its workers share:
they write the shards there, and this process uploads them.

What differs between formats is the format's writer's to say (see
``fastdata.formats.writer.Writer``, "a pack to a URL"): which object means a
dataset is at the URL, which objects of an old one an overwrite may delete,
what to fetch into the staging folder first, and when each file goes up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace

from fastdata.errors import FastDataError, OutputExistsError
from fastdata.formats import MANIFEST_SUFFIX, format_for_output
from fastdata.formats.sharded.writer import shard_listener
from fastdata.formats.writer import UploadStep
from fastdata.packers.summary import report_path


def pack_to_url(pack, source, url: str, options, **pack_kwargs):
    """``pack(source, url)`` for a remote ``url``: the summary names URLs.

    Raises:
        OutputExistsError: a dataset exists at ``url`` and ``options.overwrite``
            is False (checked before anything is packed).
    """
    if url.startswith(("http://", "https://")):
        raise FastDataError("http(s):// URLs are read only: pack to a path or to an s3://, "
                            "gs:// or az:// URL", path=url)
    from fastdata.storage import basename, exists, join, upload_file

    writer = format_for_output(url, options.format).load_writer()
    if exists(writer.remote_marker(url)):
        if not options.overwrite:
            raise OutputExistsError("a dataset exists at this URL; pass overwrite=True to "
                                    "replace it", path=url)
        old_files = writer.remote_files(url)
        if old_files and old_files[-1].endswith(MANIFEST_SUFFIX):
            # and the report an earlier pack left beside that manifest
            old_files.insert(-1, report_path(old_files[-1]))
    else:
        old_files = []
    base = (os.environ.get("FASTDATA_STAGING_DIR") or os.environ.get("FASTDATA_CACHE_DIR")
            or None)
    if base:
        os.makedirs(base, exist_ok=True)
    started = time.perf_counter()
    staging = tempfile.mkdtemp(prefix=".fastdata-upload-", dir=base)
    folder = _url_folder(url)
    if old_files:
        # Objects are replaced in place, name by name: the old dataset is taken
        # out of sight first, so that no reader opens a mix of old and new.
        from fastdata.storage import delete

        delete(old_files[-1])
    from fastdata.storage.transfers import upload_gate

    gate = upload_gate(url)
    before = gate.stats()
    early = _EarlyUploads(folder, staging + ".early")
    token = shard_listener.set(early.shard_finished)
    try:
        after_pack = writer.stage_remote(folder, staging)
        local_out = os.path.join(staging, basename(url))
        try:
            summary = pack(source, local_out, options=replace(options, overwrite=False),
                           **pack_kwargs)
        finally:
            shard_listener.reset(token)
        if after_pack is not None:
            after_pack()
        uploaded = early.wait()  # shards uploaded while the next ones were written
        done = set(uploaded)
        for local in _upload_order(staging, writer):
            rel = os.path.relpath(local, staging).replace(os.sep, "/")
            target = join(folder, rel)
            if target not in done:
                upload_file(local, target)
                uploaded.append(target)
        if old_files:  # what the old dataset had and the new one does not
            from fastdata.storage import delete

            for stale in set(old_files) - set(uploaded):
                delete(stale)
        # The time includes the upload: the dataset is usable only from then on.
        return replace(summary, output=_remote_name(summary.output, staging, folder),
                       files=uploaded, seconds=time.perf_counter() - started,
                       report=_remote_name(summary.report, staging, folder),
                       upload=_upload_figures(before, gate.stats()))
    finally:
        early.close()
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(staging + ".early", ignore_errors=True)


#: Finished shards uploaded at once while the pack goes on.
UPLOADS_AT_ONCE = 4


class _EarlyUploads:
    """Uploads finished shards in a background thread while the pack goes on.
    A shard's files are uploaded under their published names when those do not
    depend on the shard count (``-of-N`` names wait for the end)."""

    def __init__(self, folder: str, holding: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.folder = folder
        # Hard links to the finished files: the writer moves its own away when
        # it publishes, possibly before the upload has read them.
        self.holding = holding
        os.makedirs(holding, exist_ok=True)
        # Several shards at once: a shard of one part would otherwise leave the
        # link idle for a round trip between uploads.
        self.pool = ThreadPoolExecutor(UPLOADS_AT_ONCE, thread_name_prefix="fastdata-upload")
        self.futures: list = []

    def shard_finished(self, number: int, temp_paths: list[str],
                       final_names: list[str] | None) -> None:
        if final_names is None:
            return
        from fastdata.storage import join, upload_file

        for temp, name in zip(temp_paths, final_names):
            held = os.path.join(self.holding, name)
            os.link(temp, held)
            target = join(self.folder, name)
            self.futures.append(self.pool.submit(_upload_one, upload_file, held, target))

    def wait(self) -> list[str]:
        """The URLs uploaded so far (raises the first failed upload's error)."""
        return [future.result() for future in self.futures]

    def close(self) -> None:
        for future in self.futures:
            future.cancel()
        self.pool.shutdown(wait=True)


def _upload_figures(before: dict, after: dict):
    """What the uploads between two of the gate's ``stats()`` did."""
    from fastdata.packers.summary import UploadFigures

    sent = after["upload_bytes"] - before["upload_bytes"]
    seconds = after["upload_seconds"] - before["upload_seconds"]
    return UploadFigures(bytes=sent, seconds=round(seconds, 3),
                         parts=after["requests"] - before["requests"],
                         parts_at_once=after["limit"],
                         mb_s=round(sent / seconds / 1e6, 1) if seconds > 0 else None,
                         connection_mb_s=None if after["connection_mb_s"] is None
                         else round(after["connection_mb_s"], 1))


def _upload_one(upload_file, held: str, target: str) -> str:
    upload_file(held, target)
    os.unlink(held)
    return target


def _url_folder(url: str) -> str:
    from fastdata.storage import dirname

    return dirname(url.rstrip("/"))


def _remote_name(local: str | None, staging: str, folder: str) -> str | None:
    if local is None:
        return None
    from fastdata.storage import join

    return join(folder, os.path.relpath(local, staging).replace(os.sep, "/"))


def _upload_order(staging: str, writer) -> list[str]:
    """Every file to upload, by ``UploadStep``: data first, the manifest last
    (the format's writer may say otherwise of a file, see ``Writer.upload_step``)."""
    ranked = []
    for root, _, names in os.walk(staging):
        for name in names:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, staging).replace(os.sep, "/")
            step = writer.upload_step(rel)
            if step is None:
                step = _step_by_name(name)
            if step is not UploadStep.NEVER:
                ranked.append((step, path))
    return [path for _, path in sorted(ranked)]


def _step_by_name(name: str) -> UploadStep:
    if name.endswith(MANIFEST_SUFFIX):
        return UploadStep.LAST
    if ".fastdata." in name or name.endswith(".report.json"):
        return UploadStep.NAMES_DATA
    return UploadStep.DATA

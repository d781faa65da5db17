"""Packing to a URL: pack into a local staging folder, then upload in an order
that makes the dataset visible only when it is complete.

Data files go first (shards and their ``.idx`` files, LMDB's ``data.mdb``, the
HDF5 file), then the report, index and keys, and the manifest last: a reader
opens a sharded dataset through its manifest, so an interrupted upload leaves
no dataset, only objects no manifest lists. LMDB and HDF5 are one object each
(the manifest is inside), and an object appears whole or not at all. The
staging folder is removed afterwards; it needs the dataset's size in local
space (``FASTDATA_CACHE_DIR``'s file system, else the temporary folder).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace

from fastdata.errors import FastDataError, OutputExistsError
from fastdata.formats import MANIFEST_SUFFIX, format_for_output

#: Files of an LMDB folder that are not uploaded (per-process lock state).
_NOT_UPLOADED = ("lock.mdb",)


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

    spec = format_for_output(url, options.format)
    if not options.overwrite and _remote_dataset_exists(url, spec, exists, join):
        raise OutputExistsError("a dataset exists at this URL; pass overwrite=True to "
                                "replace it", path=url)
    base = os.environ.get("FASTDATA_CACHE_DIR") or None
    if base:
        os.makedirs(base, exist_ok=True)
    started = time.perf_counter()
    staging = tempfile.mkdtemp(prefix=".fastdata-upload-", dir=base)
    try:
        local_out = os.path.join(staging, basename(url))
        summary = pack(source, local_out, options=replace(options, overwrite=False),
                       **pack_kwargs)
        folder = _url_folder(url, spec)
        uploaded = []
        for local in _upload_order(staging):
            rel = os.path.relpath(local, staging).replace(os.sep, "/")
            target = join(folder, rel)
            upload_file(local, target)
            uploaded.append(target)
        # The time includes the upload: the dataset is usable only from then on.
        return replace(summary, output=_remote_name(summary.output, staging, folder),
                       files=uploaded, seconds=time.perf_counter() - started,
                       report=_remote_name(summary.report, staging, folder))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _url_folder(url: str, spec) -> str:
    from fastdata.storage import dirname

    return dirname(url.rstrip("/"))


def _remote_name(local: str | None, staging: str, folder: str) -> str | None:
    if local is None:
        return None
    from fastdata.storage import join

    return join(folder, os.path.relpath(local, staging).replace(os.sep, "/"))


def _upload_order(staging: str) -> list[str]:
    """Every file to upload, data first and the manifest last."""
    files = []
    for root, _, names in os.walk(staging):
        files += [os.path.join(root, n) for n in names if n not in _NOT_UPLOADED]

    def rank(path: str) -> tuple[int, str]:
        name = os.path.basename(path)
        if name.endswith(MANIFEST_SUFFIX):
            return 3, path
        if ".fastdata." in name or name.endswith(".report.json"):
            return 2, path
        return 1, path

    return sorted(files, key=rank)


def _remote_dataset_exists(url: str, spec, exists, join) -> bool:
    if spec.name == "lmdb":
        return exists(join(url.rstrip("/"), "data.mdb"))
    if spec.sharded:
        from fastdata.formats.sharded.layout import parse_output

        layout = parse_output(url, spec.extensions, sharded=False)
        return exists(layout.manifest_path)
    return exists(url)

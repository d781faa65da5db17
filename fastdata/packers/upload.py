"""Packing to a URL: pack into a local staging folder, then upload in an order
that makes the dataset visible only when it is complete.

Finished shards are uploaded in the background while the next ones are
written (``_EarlyUploads``; names that depend on the shard count wait). The
other data files follow (LMDB's ``data.mdb``, the HDF5 file), then the report,
index and keys, and the manifest last: a reader
opens a sharded dataset through its manifest, so an interrupted upload leaves
no dataset, only objects no manifest lists. LMDB and HDF5 are one object each
(the manifest is inside), and an object appears whole or not at all. The
staging folder is removed afterwards; it needs the dataset's size in local
space (``FASTDATA_STAGING_DIR``, else ``FASTDATA_CACHE_DIR``'s file system, else
the temporary folder). A pack on a Dask cluster stages in
``FASTDATA_STAGING_DIR``, a folder its workers share: they write the shards
there, and this process uploads them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace

from fastdata.contained import name_problem
from fastdata.errors import FastDataError, OutputExistsError
from fastdata.formats import MANIFEST_SUFFIX, format_for_output
from fastdata.formats.sharded.writer import shard_listener
from fastdata.formats.tar.info import INFO_LIMIT, INFO_NAME

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
    if _remote_dataset_exists(url, spec, exists, join):
        if not options.overwrite:
            raise OutputExistsError("a dataset exists at this URL; pass overwrite=True to "
                                    "replace it", path=url)
        old_files = _old_sharded_files(url, spec)
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
    early = _EarlyUploads(folder, staging + ".early")
    token = shard_listener.set(early.shard_finished)
    try:
        info = _fetch_info(folder, staging) if spec.name == "tar" else None
        local_out = os.path.join(staging, basename(url))
        try:
            summary = pack(source, local_out, options=replace(options, overwrite=False),
                           **pack_kwargs)
        finally:
            shard_listener.reset(token)
        if info is not None:
            _drop_unchanged(staging, info)
        uploaded = early.wait()  # shards uploaded while the next ones were written
        done = set(uploaded)
        for local in _upload_order(staging):
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
                       report=_remote_name(summary.report, staging, folder))
    finally:
        early.close()
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(staging + ".early", ignore_errors=True)


class _EarlyUploads:
    """Uploads finished shards in a background thread while the pack goes on.
    A shard's files are uploaded under their published names when those do not
    depend on the shard count (tar; TFRecord's ``-of-N`` names wait for the end)."""

    def __init__(self, folder: str, holding: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.folder = folder
        # Hard links to the finished files: the writer moves its own away when
        # it publishes, possibly before the upload has read them.
        self.holding = holding
        os.makedirs(holding, exist_ok=True)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="fastdata-upload")
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


def _fetch_info(folder: str, staging: str) -> bytes | None:
    """timm's ``_info.json`` at the URL, into the staging folder: the tar writer
    adds this output's split to it, and the upload keeps the other splits."""
    from fastdata.storage import exists, join, open_remote

    url = join(folder, INFO_NAME)
    if not exists(url):
        return None
    data = open_remote(url).read(limit=INFO_LIMIT)
    with open(os.path.join(staging, INFO_NAME), "wb") as f:
        f.write(data)
    return data


def _drop_unchanged(staging: str, fetched: bytes) -> None:
    """No upload of the info file when the pack added no split to it."""
    path = os.path.join(staging, INFO_NAME)
    with open(path, "rb") as f:
        if f.read() == fetched:
            os.remove(path)


def _upload_order(staging: str) -> list[str]:
    """Every file to upload, data first (timm's info, which names shards, after
    them) and the manifest last."""
    files = []
    for root, _, names in os.walk(staging):
        files += [os.path.join(root, n) for n in names if n not in _NOT_UPLOADED]

    def rank(path: str) -> tuple[int, str]:
        name = os.path.basename(path)
        if name.endswith(MANIFEST_SUFFIX):
            return 3, path
        if ".fastdata." in name or name.endswith(".report.json") or name == INFO_NAME:
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


def _old_sharded_files(url: str, spec) -> list[str]:
    """The objects of the sharded dataset at ``url`` (its manifest last), from
    its manifest; [] for LMDB and HDF5, whose one object a put replaces whole.

    Only names that are provably this output's own are taken, as a local
    ``--overwrite`` does: its shard naming or its sidecars, plain names in its
    folder. Whatever else the old manifest lists (another dataset's objects,
    ``..``, other prefixes) is never deleted."""
    if not spec.sharded:
        return []
    import json

    from fastdata.formats.remote_files import MANIFEST_LIMIT
    from fastdata.formats.sharded.layout import parse_output
    from fastdata.packers.summary import report_path
    from fastdata.storage import basename, join, open_remote

    layout = parse_output(url, spec.extensions, sharded=False)
    manifest = json.loads(open_remote(layout.manifest_path).read(limit=MANIFEST_LIMIT))
    manifest = manifest if isinstance(manifest, dict) else {}
    folder = layout.directory
    sidecars = {basename(p) for p in (layout.index_path, layout.keys_path, layout.metadata_path)}
    names = []
    for shard in manifest.get("shards") if isinstance(manifest.get("shards"), list) else []:
        name = shard.get("path") if isinstance(shard, dict) else None
        if _plain(name) and layout.owns(name, spec.extensions):
            names.append(join(folder, name))
            if spec.name == "tfrecord":
                names.append(join(folder, name + ".idx"))
    extra = manifest.get("extra") if isinstance(manifest.get("extra"), dict) else {}
    metadata = extra.get("metadata") if isinstance(extra.get("metadata"), dict) else {}
    names += [join(folder, n) for n in (extra.get("index"), extra.get("keys"),
                                        metadata.get("index")) if _plain(n) and n in sidecars]
    names.append(report_path(layout.manifest_path))
    return names + [layout.manifest_path]


def _plain(name) -> bool:
    """A plain file name directly in the dataset's folder (see fastdata.contained)."""
    return isinstance(name, str) and "/" not in name and name_problem(name, remote=True) is None

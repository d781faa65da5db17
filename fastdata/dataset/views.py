"""Writing a view file, and registering it with its dataset (no torch).

A view file (``VIEW.fastdata.json``) is a dataset record of kind
``fastdata-view``: parts with selections, named relative to the view's
folder, which holds them (a view lives beside its dataset or above it). A
new view is created exclusively (or, with ``overwrite``, replaces another
view file whole, never a file that is not one). It registers with its
dataset, ``NAME.versions/views/ID.json``, naming its file and the part and
column files it reads, so ``fastdata gc`` keeps them wherever the view
lives. A dataset that cannot be written (an http(s) URL) keeps no
registration; gc then knows only views in the dataset's folder.
"""

from __future__ import annotations

import json
import os
import posixpath

from fastdata.dataset.record import DatasetRecord, new_id, now
from fastdata.errors import FastDataError, OutputExistsError


def name_in(view_path: str, target: str) -> str:
    """``target`` (an absolute path or URL) as a view at ``view_path`` names
    it: relative to the view's folder, "/"-separated.

    Raises:
        FastDataError: it is outside the view's folder (or URL prefix).
    """
    from fastdata.formats.remote_files import is_remote

    if is_remote(view_path) != is_remote(target):
        raise FastDataError("a view and its dataset are both local or both at URLs",
                            path=view_path)
    if is_remote(view_path):
        folder = view_path.rsplit("/", 1)[0] + "/"
        name = target[len(folder):] if target.startswith(folder) else None
    else:
        rel = os.path.relpath(os.path.abspath(target),
                              os.path.dirname(os.path.abspath(view_path)))
        name = None if rel.split(os.sep)[0] == ".." else rel.replace(os.sep, "/")
    if not name or name in (".", "./") or posixpath.normpath(name).startswith(".."):
        raise FastDataError(
            f"a view lives in its dataset's folder (or URL prefix), or above it: {target} is "
            f"outside {os.path.dirname(view_path) or '.'}; write the view beside the dataset",
            path=view_path)
    return name.rstrip("/")


def write_view(record: DatasetRecord, *, overwrite: bool = False) -> DatasetRecord:
    """Write the view ``record`` at ``record.path``, whole or not at all.

    Raises:
        OutputExistsError: a view is there and ``overwrite`` is off.
        FastDataError: a file that is not a view is there.
    """
    from fastdata.dataset.history import is_view_file
    from fastdata.formats.remote_files import exists
    from fastdata.storage import create_bytes, upload_bytes

    record = record.stamped()
    if create_bytes(record.encode(), record.path):
        return record
    if not is_view_file(record.path) and exists(record.path):
        raise FastDataError("a file that is not a view is there; a view never replaces it: "
                            "give the view another name", path=record.path)
    if not overwrite:
        raise OutputExistsError("the view file exists; pass overwrite=True (CLI: --overwrite) "
                                "to replace it", path=record.path)
    upload_bytes(record.encode(), record.path)
    return record


def register_view(dataset: str, record: DatasetRecord) -> bool:
    """Note the view ``record`` in its dataset's history (for gc); False where
    the dataset cannot be written (an http(s) URL)."""
    from fastdata.dataset.history import (
        dataset_folder,
        history_dir,
        join,
        relative_name,
    )
    from fastdata.formats.remote_files import is_remote
    from fastdata.storage import create_bytes
    from fastdata.storage.urls import dirname, is_http

    if is_remote(dataset) and is_http(dataset):
        return False
    folder = dataset_folder(dataset)
    view_folder = dirname(record.path)

    def from_dataset(rel: str) -> str:
        whole = join(view_folder, rel)
        return relative_name(folder, whole if is_remote(whole) else os.path.normpath(whole))

    paths = [from_dataset(p.path) for p in record.parts] + \
        [from_dataset(c["path"]) for c in record.columns] + \
        ([from_dataset(record.labels["path"])] if record.labels else [])
    view = record.path if is_remote(record.path) else \
        os.path.relpath(os.path.abspath(record.path), folder).replace(os.sep, "/")
    note = {"kind": "fastdata-view-ref", "view": view,
            "version": (record.of or {}).get("version"), "paths": paths, "created_at": now()}
    where = join(history_dir(dataset), "views", f"{new_id()}.json")
    if not is_remote(where):
        os.makedirs(os.path.dirname(where), exist_ok=True)
    return create_bytes(json.dumps(note, indent=1).encode() + b"\n", where)

"""The view file: a small JSON manifest that selects records of a parent
dataset without copying them (``VIEW.fastdata.json``; no torch).

    {"kind": "fastdata-view", "format": "tar", "version": 1,
     "parent": {"path": "train.tar.fastdata.json", "records": 1000000,
                "manifest_sha256": "..."},
     "records": 100000, "class_counts": [...], "payload_bytes": 11000000000,
     "selection": {"encoding": "bitmap", "records": 100000, "sha256": "...",
                   "data": "<base64 of zlib>"},
     "selected_by": {"fraction": 0.1, "seed": 0},
     "created_at": "...", "fastdata_version": "..."}

``parent.path`` is relative to the view's folder (or URL prefix) and stays
inside it: a view lives beside its parent or above it. ``manifest_sha256``
is the parent's manifest digest (:func:`manifest_digest`): a view opens only
the parent it was made from. The selection's stored form is
:mod:`fastdata.dataset.selection`'s.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from fastdata.errors import FastDataError, ManifestError

VIEW_KIND = "fastdata-view"
VIEW_VERSION = 1
#: A view file's name ends so, like a sharded dataset's manifest.
VIEW_SUFFIX = ".fastdata.json"
_KIND = re.compile(rb'^\s*\{\s*"kind"\s*:\s*"fastdata-view"')


def manifest_digest(manifest) -> str:
    """SHA-256 of a manifest's canonical JSON (sorted keys, compact): what a
    view records of the parent it selects from."""
    text = json.dumps(manifest.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_view_file(path) -> bool:
    """Whether ``path`` names a view file (a ``.fastdata.json`` whose ``kind``
    is ``fastdata-view``); reads at most its first bytes locally."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fspath(path)
    if not text.lower().endswith(VIEW_SUFFIX):
        return False
    from fastdata.formats.remote_files import head_bytes

    head = head_bytes(text)
    return head is not None and _KIND.match(head) is not None


@dataclass(frozen=True)
class ViewFile:
    """A parsed view file (see the module's docstring)."""

    path: str
    format: str
    parent: str
    parent_records: int
    parent_digest: str
    records: int
    class_counts: list[int]
    selection: dict
    payload_bytes: int | None = None
    selected_by: dict = field(default_factory=dict)
    created_at: str = ""
    fastdata_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": VIEW_KIND, "format": self.format, "version": VIEW_VERSION,
                "parent": {"path": self.parent, "records": self.parent_records,
                           "manifest_sha256": self.parent_digest},
                "records": self.records, "class_counts": self.class_counts,
                "payload_bytes": self.payload_bytes, "selected_by": self.selected_by,
                "created_at": self.created_at, "fastdata_version": self.fastdata_version,
                "selection": self.selection}


def read_view_file(path: str) -> ViewFile:
    """Parse and check the view file at ``path`` (a local path or a URL).

    Raises:
        ManifestError: not a view file, a field missing or of the wrong type,
            or written by a newer fastdata.
    """
    from fastdata.formats.remote_files import manifest_bytes

    try:
        data = json.loads(manifest_bytes(path, for_reader=True))
    except OSError as exc:
        raise FastDataError(f"cannot read the view file ({exc})", path=path) from None
    except ValueError as exc:
        raise ManifestError(f"the view file is not valid JSON ({exc})", path=path) from None
    if not isinstance(data, dict) or data.get("kind") != VIEW_KIND:
        raise ManifestError("not a fastdata view file", path=path)
    version = data.get("version")
    if not isinstance(version, int) or version < 1:
        raise ManifestError("the view file has no integer 'version'", path=path)
    if version > VIEW_VERSION:
        raise ManifestError(f"view file version {version} is newer than this fastdata reads "
                            f"(up to {VIEW_VERSION}); upgrade fastdata (in its checkout: git "
                            f"pull, then pip install -e .)", path=path)
    parent = data.get("parent")

    def need(holder, name, kind, where=""):
        value = holder.get(name) if isinstance(holder, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ManifestError(f"view file field {where}{name} is missing or not "
                                f"{kind.__name__}; make the view again (fastdata subset)",
                                path=path)
        return value

    counts = need(data, "class_counts", list)
    if not all(isinstance(c, int) and c >= 0 for c in counts):
        raise ManifestError("view file field class_counts holds a value that is not a count",
                            path=path)
    payload = data.get("payload_bytes")
    return ViewFile(
        path=path, format=need(data, "format", str), parent=need(parent, "path", str, "parent."),
        parent_records=need(parent, "records", int, "parent."),
        parent_digest=need(parent, "manifest_sha256", str, "parent."),
        records=need(data, "records", int), class_counts=counts,
        selection=need(data, "selection", dict),
        payload_bytes=payload if isinstance(payload, int) else None,
        selected_by=data.get("selected_by") if isinstance(data.get("selected_by"), dict)
        else {},
        created_at=str(data.get("created_at", "")),
        fastdata_version=str(data.get("fastdata_version", "")))


def parent_name(view_path: str, parent_path: str) -> str:
    """The parent's name as a view at ``view_path`` stores it: relative to the
    view's folder, with "/" separators.

    Raises:
        FastDataError: the parent is not inside the view's folder (or URL prefix).
    """
    from fastdata.formats.remote_files import is_remote

    if is_remote(view_path) != is_remote(parent_path):
        raise FastDataError("a view and its parent are both local or both at URLs",
                            path=view_path)
    if is_remote(view_path):
        folder = view_path.rsplit("/", 1)[0] + "/"
        name = parent_path[len(folder):] if parent_path.startswith(folder) else None
    else:
        rel = os.path.relpath(os.path.abspath(parent_path),
                              os.path.dirname(os.path.abspath(view_path)))
        name = None if rel.split(os.sep)[0] == ".." else rel.replace(os.sep, "/")
    if not name or name in (".", "./") or posixpath.normpath(name).startswith(".."):
        raise FastDataError(
            f"a view lives in its parent's folder (or URL prefix), or above it: its parent "
            f"{parent_path} is outside {os.path.dirname(view_path) or '.'}; write the view "
            f"beside the parent", path=view_path)
    return name.rstrip("/")


def write_view_file(view: ViewFile, *, overwrite: bool = False) -> None:
    """Write ``view`` at ``view.path``: a temporary name, then a rename (or
    one upload at a URL), so a view is never seen half-written.

    Raises:
        OutputExistsError: the file exists and ``overwrite`` is off.
    """
    from fastdata.errors import OutputExistsError
    from fastdata.formats.remote_files import exists, is_remote

    data = json.dumps(view.to_dict(), indent=1).encode("utf-8") + b"\n"
    if exists(view.path):
        if not is_view_file(view.path):  # a dataset's manifest, or another file
            raise FastDataError("a file that is not a view is there; a view never replaces "
                                "it: give the view another name", path=view.path)
        if not overwrite:
            raise OutputExistsError("the view file exists; pass overwrite=True (CLI: "
                                    "--overwrite) to replace it", path=view.path)
    if is_remote(view.path):
        from fastdata.storage import upload_bytes

        upload_bytes(data, view.path)
        return
    temp = f"{view.path}.tmp-{os.getpid()}"
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, view.path)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

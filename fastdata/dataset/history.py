"""A dataset's versions, kept beside it in ``NAME.versions/`` (no torch).

    train.lmdb                      the first pack: version 1's only part
    train.lmdb.versions/
      HEAD                          the current version's number
      v000001.json                  version 1: parts [train.lmdb]
      v000002.json                  version 2: parts [train.lmdb, parts/000002.lmdb]
      parts/000002.lmdb             the records an append added
      columns/000003.jsonl          the columns a join added

A version record is immutable: it names its parent's number and digest, the
change, and every part (a complete dataset of the format, its manifest
digest) and column file (its SHA-256). Its own digest is the SHA-256 of its
bytes. A change writes a new record (never replacing one: an existing
number is refused), then replaces ``HEAD``: readers that opened an earlier
version keep reading its parts, which no change touches. Part and column
names are relative to the dataset's folder (or URL prefix) and stay in it.
``NAME`` is the dataset's path, without ``.fastdata.json`` for a sharded
one (``d.tar.fastdata.json`` keeps ``d.tar.versions/``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from fastdata.errors import FastDataError, ManifestError

VERSION_KIND = "fastdata-version"
VERSION_SCHEMA = 1
_KIND = re.compile(rb'^\s*\{\s*"kind"\s*:\s*"fastdata-version"')
_RECORD = re.compile(r"^v(\d{6})\.json$")


def base_path(path) -> str:
    """The dataset's path or URL without ``.fastdata.json`` and a final "/"."""
    from fastdata.formats.remote_files import absolute

    text = absolute(path).rstrip("/\\")
    return text[: -len(".fastdata.json")] if text.endswith(".fastdata.json") else text


def history_dir(path) -> str:
    return base_path(path) + ".versions"


def _join(folder: str, *names: str) -> str:
    from fastdata.storage.urls import join

    return join(folder, *names)


def record_path(path, number: int) -> str:
    """Where version ``number`` of the dataset at ``path`` is recorded."""
    return _join(history_dir(path), f"v{number:06d}.json")


def dataset_folder(path) -> str:
    from fastdata.storage.urls import dirname

    return dirname(base_path(path))


@dataclass(frozen=True)
class Part:
    """One complete dataset of the version's format: ``path`` relative to the
    dataset's folder, its records and its manifest's digest."""

    path: str
    records: int
    manifest_sha256: str


@dataclass(frozen=True)
class Version:
    """A parsed version record (see the module's docstring).

    Attributes:
        number: 1 for the first pack, then one more per change.
        parent, parent_sha256: the version it was made from (None for 1).
        change: ``"pack"``, ``"append"``, ``"join"``.
        summary: what changed, in words.
        records, classes, class_counts: of the whole version.
        parts: the parts, read one after another.
        columns: joined column files (``{"path", "sha256", "columns", ...}``).
        path: the record's own path (set when read).
        sha256: the record's digest (set when read or written).
    """

    number: int
    format: str
    change: str
    summary: str
    records: int
    classes: list[str]
    class_counts: list[int]
    parts: list[Part]
    parent: int | None = None
    parent_sha256: str | None = None
    columns: list[dict] = field(default_factory=list)
    labels: dict | None = None
    created_at: str = ""
    fastdata_version: str = ""
    path: str = ""
    sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": VERSION_KIND, "format": self.format, "schema": VERSION_SCHEMA,
                "number": self.number, "parent": self.parent,
                "parent_sha256": self.parent_sha256, "change": self.change,
                "summary": self.summary, "created_at": self.created_at,
                "fastdata_version": self.fastdata_version, "records": self.records,
                "classes": self.classes, "class_counts": self.class_counts,
                "parts": [p.__dict__ for p in self.parts], "columns": self.columns,
                "labels": self.labels}


def is_version_file(path) -> bool:
    """Whether ``path`` is a version record (``.../NAME.versions/vNNNNNN.json``)."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fspath(path)
    name = text.replace("\\", "/").rsplit("/", 1)[-1]
    if not _RECORD.match(name) or ".versions" not in text:
        return False
    from fastdata.formats.remote_files import head_bytes

    head = head_bytes(text)
    return head is not None and _KIND.match(head) is not None


def head_number(path) -> int | None:
    """The current version's number of the dataset at ``path``; None when it
    has never changed (no ``NAME.versions/HEAD``)."""
    from fastdata.formats.remote_files import is_remote, read_bytes

    head = _join(history_dir(path), "HEAD")
    try:
        raw = read_bytes(head, limit=64)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FastDataError(f"cannot read the dataset's version pointer ({exc})",
                            path=head) from None
    except FastDataError as exc:
        if is_remote(head) and _missing(exc):
            return None
        raise
    text = raw.decode("ascii", "replace").strip()
    if not text.isdigit():
        raise ManifestError(f"the version pointer holds {text[:20]!r}, not a number; write "
                            f"the current version's number there", path=head)
    return int(text)


def _missing(exc: FastDataError) -> bool:
    message = str(exc).lower()
    return "404" in message or "not found" in message or "no such" in message


def read_version(where: str) -> Version:
    """The version record at ``where`` (a path or URL), parsed and checked.

    Raises:
        ManifestError: not a version record, or a field missing or wrong.
    """
    from fastdata.formats.remote_files import manifest_bytes

    try:
        raw = manifest_bytes(where, for_reader=True)
    except OSError as exc:
        raise FastDataError(f"cannot read the version record ({exc.strerror or exc})",
                            path=where) from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ManifestError(f"the version record is not valid JSON ({exc})", path=where) \
            from None
    if not isinstance(data, dict) or data.get("kind") != VERSION_KIND:
        raise ManifestError("not a fastdata version record", path=where)
    if not isinstance(data.get("schema"), int) or data["schema"] > VERSION_SCHEMA:
        raise ManifestError("the version record was written by a newer fastdata; upgrade "
                            "fastdata (in its checkout: git pull, then pip install -e .)",
                            path=where)
    try:
        parts = [Part(str(p["path"]), int(p["records"]), str(p["manifest_sha256"]))
                 for p in data["parts"]]
        version = Version(
            number=int(data["number"]), format=str(data["format"]),
            change=str(data["change"]), summary=str(data.get("summary", "")),
            records=int(data["records"]), classes=[str(c) for c in data["classes"]],
            class_counts=[int(c) for c in data["class_counts"]], parts=parts,
            parent=data.get("parent"), parent_sha256=data.get("parent_sha256"),
            columns=list(data.get("columns") or []), labels=data.get("labels"),
            created_at=str(data.get("created_at", "")),
            fastdata_version=str(data.get("fastdata_version", "")),
            path=where, sha256=hashlib.sha256(raw).hexdigest())
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"the version record lacks or mangles a field ({exc}); restore "
                            f"it from a copy", path=where) from None
    if sum(p.records for p in parts) != version.records or not parts:
        raise ManifestError("the version record's parts do not add up to its records",
                            path=where)
    return version


def versions(path) -> list[Version]:
    """Every recorded version of the dataset at ``path``, oldest first (the
    local history folder's listing, or at a URL the chain from HEAD back)."""
    from fastdata.formats.remote_files import is_remote

    head = head_number(path)
    if head is None:
        return []
    folder = history_dir(path)
    if is_remote(folder):
        numbers = range(1, head + 1)
    else:
        numbers = sorted(int(m.group(1)) for m in map(_RECORD.match, os.listdir(folder)) if m)
    found = []
    for n in numbers:
        try:
            found.append(read_version(record_path(path, n)))
        except FastDataError:
            if n == head:
                raise
    return found


def write_version(path, version: Version) -> Version:
    """Record ``version`` (a new number: an existing record is never
    replaced), then point HEAD at it. Returns it with its path and digest.

    Raises:
        FastDataError: that number is recorded already (another process
            changed the dataset meanwhile: run the change again).
    """
    from fastdata import __version__
    from fastdata.formats.remote_files import exists, is_remote

    where = record_path(path, version.number)
    version = Version(**{**version.__dict__, "path": where, "sha256": "",
                         "created_at": version.created_at or now(),
                         "fastdata_version": __version__})
    raw = json.dumps(version.to_dict(), indent=1).encode("utf-8") + b"\n"
    folder = history_dir(path)
    if is_remote(folder):
        from fastdata.storage import upload_bytes

        if exists(where):
            raise _taken(where, version.number)
        upload_bytes(raw, where)
        upload_bytes(f"{version.number}\n".encode(), _join(folder, "HEAD"))
    else:
        os.makedirs(folder, exist_ok=True)
        try:
            fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise _taken(where, version.number) from None
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        temp = _join(folder, f"HEAD.tmp-{os.getpid()}")
        with open(temp, "wb") as f:
            f.write(f"{version.number}\n".encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, _join(folder, "HEAD"))
    return Version(**{**version.__dict__, "sha256": hashlib.sha256(raw).hexdigest()})


def _taken(where: str, number: int) -> FastDataError:
    return FastDataError(f"version {number} is recorded already: another process changed the "
                         f"dataset meanwhile; run the change again (it builds on the new "
                         f"version)", path=where)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

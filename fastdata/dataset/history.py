"""A dataset's history, kept beside it in ``NAME.versions/`` (no torch).

    train.lmdb                          the first pack: version 1's only part
    train.lmdb.versions/
      HEAD                              a hint: the latest version's number
      v000001.json                      version 1: parts [train.lmdb]
      v000002.json                      version 2: parts [train.lmdb, parts/ID/part.lmdb]
      parts/ID/part.lmdb                the records an append added (ID: 32 hex digits)
      columns/ID/c0000.npy              the columns a join added
      views/ID.json                     a view made of the dataset (for gc)

A version record is created once and never replaced: its creation is the
commit (see :mod:`fastdata.dataset.commit`). ``HEAD`` only says where to
start looking: the current version is the highest record from ``HEAD`` on,
so a change that stopped between its record and ``HEAD`` is still seen,
and a stale ``HEAD`` costs one more look, never a wrong answer. ``NAME`` is
the dataset's path, without ``.fastdata.json`` for a sharded one.

What finding the current version costs: locally, one small read and a few
``stat`` calls. At a URL, a dataset that never changed costs one GET
(``HEAD``: a 404, a 403 from a store that hides missing objects, or a page
that is not a pointer all read as "never changed"); a changed one costs
three (``HEAD``, the next record's 404, the record).
"""

from __future__ import annotations

import json
import os
import re

from fastdata.dataset.record import DatasetRecord, parse_record
from fastdata.errors import (
    AccessDeniedError,
    FastDataError,
    ManifestError,
    MissingObjectError,
)

_RECORD = re.compile(r"^v(\d{6})\.json$")
_VERSION_KIND = re.compile(rb'^\s*\{\s*"kind"\s*:\s*"fastdata-version"')
_VIEW_KIND = re.compile(rb'^\s*\{\s*"kind"\s*:\s*"fastdata-view"')
_HEAD_KIND = "fastdata-head"
_TOMBSTONE = re.compile(rb'^\s*\{\s*"kind"\s*:\s*"fastdata-version"\s*,\s*"removed"')
#: The most a record may take (a bitmap selection of 10^9 records is ~170 MB).
RECORD_LIMIT = 512 << 20


# -- names -----------------------------------------------------------------------------

def base_path(path) -> str:
    """The dataset's path or URL without ``.fastdata.json`` and a final "/"."""
    from fastdata.formats.remote_files import absolute

    text = absolute(path).rstrip("/\\")
    return text.removesuffix(".fastdata.json")


def history_dir(path) -> str:
    return base_path(path) + ".versions"


def join(folder: str, *names: str) -> str:
    from fastdata.storage.urls import join as url_join

    return url_join(folder, *names)


def record_path(path, number: int) -> str:
    """Where version ``number`` of the dataset at ``path`` is recorded."""
    return join(history_dir(path), f"v{number:06d}.json")


def head_path(path) -> str:
    return join(history_dir(path), "HEAD")


def dataset_folder(path) -> str:
    """The folder (or URL prefix) a version record's names are relative to."""
    from fastdata.storage.urls import dirname

    return dirname(base_path(path))


def dataset_of_record(record_file: str) -> str:
    """The dataset a version record at ``record_file`` belongs to."""
    return record_file.rsplit(".versions", 1)[0]


def relative_name(folder: str, path: str) -> str:
    """``path`` relative to ``folder``, "/"-separated (both local or both URLs)."""
    from fastdata.formats.remote_files import absolute

    text = absolute(path)
    if "://" in text:
        return text[len(folder.rstrip("/")) + 1:]
    return os.path.relpath(text, folder).replace(os.sep, "/")


# -- what a file is ----------------------------------------------------------------------

def is_version_file(path) -> bool:
    """Whether ``path`` is a version record (``.../NAME.versions/vNNNNNN.json``)."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fspath(path)
    name = text.replace("\\", "/").rsplit("/", 1)[-1]
    if not _RECORD.match(name) or ".versions" not in text:
        return False
    return _starts(text, _VERSION_KIND)


def is_view_file(path) -> bool:
    """Whether ``path`` is a view file (a ``.fastdata.json`` of kind
    ``fastdata-view``); reads at most its first bytes locally."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fspath(path)
    return text.lower().endswith(".fastdata.json") and _starts(text, _VIEW_KIND)


def _starts(path: str, pattern) -> bool:
    from fastdata.formats.remote_files import head_bytes

    head = head_bytes(path)
    return head is not None and pattern.match(head) is not None


# -- reading ---------------------------------------------------------------------------

def read_record(where: str) -> DatasetRecord:
    """The version record or view file at ``where`` (a path or URL), checked.

    Raises:
        FastDataError: it cannot be read; ManifestError: it is not a record
            or does not add up.
    """
    from fastdata.formats.remote_files import is_remote, manifest_bytes

    try:
        raw = manifest_bytes(where, for_reader=True) if is_remote(where) else \
            _read_local(where)
    except (FileNotFoundError, NotADirectoryError):
        raise MissingObjectError("no such record", path=where) from None
    except OSError as exc:
        raise FastDataError(f"cannot read the record ({exc.strerror or exc})",
                            path=where) from None
    from fastdata.dataset.legacy import legacy_view

    if _TOMBSTONE.match(raw[:256]):
        raise RemovedVersionError("this version was removed by fastdata gc (its number stays "
                                  "taken); open the dataset's current version, and start again "
                                  "from a state saved on it", path=where)
    return parse_record(raw, where, legacy_view=lambda data, check: legacy_view(
        data, check, raw, read_record=read_record, is_version_file=is_version_file))


def tombstone(number: int) -> bytes:
    """What a version record becomes when gc removes the version: its number
    stays taken, so no later change can be recorded under it."""
    from fastdata.dataset.record import now

    return json.dumps({"kind": "fastdata-version", "removed": now(), "number": number}
                      ).encode() + b"\n"


def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read(RECORD_LIMIT + 1)
    if len(data) > RECORD_LIMIT:
        raise ManifestError(f"the record is larger than {RECORD_LIMIT:,} bytes; it is not one "
                            f"fastdata wrote", path=path)
    return data


def _pointer(path) -> int | None:
    """The number ``HEAD`` holds; None when there is none."""
    from fastdata.formats.remote_files import is_remote

    where = head_path(path)
    remote = is_remote(where)
    try:
        if remote:
            from fastdata.storage import open_remote

            raw = open_remote(where).first_bytes(256)  # a page past that is no pointer
        else:
            with open(where, "rb") as f:
                raw = f.read(256)
    except (FileNotFoundError, NotADirectoryError, MissingObjectError, AccessDeniedError):
        return None  # a store without ListBucket answers 403 for a missing object
    except OSError as exc:
        raise FastDataError(f"cannot read the dataset's version pointer ({exc})",
                            path=where) from None
    text = raw.decode("utf-8", "replace").strip()
    if text.isdigit():  # the first layout
        return int(text)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("kind") == _HEAD_KIND and \
            isinstance(data.get("version"), int) and data["version"] >= 1:
        return data["version"]
    if remote:  # a server answering every path (a CDN's page): no pointer there
        return None
    raise ManifestError(f"the version pointer holds {text[:20]!r}, not a version number; "
                        f"run fastdata gc DATASET to write it again", path=where)


def _record_at(path, number: int) -> bool:
    """Whether version ``number`` is recorded (at a URL: an answer that is a
    version record, not a 404, a 403 or another page)."""
    from fastdata.formats.remote_files import head_bytes, is_remote

    where = record_path(path, number)
    if not is_remote(where):
        return os.path.isfile(where)
    head = head_bytes(where)
    return head is not None and _VERSION_KIND.match(head) is not None


def head_number(path) -> int | None:
    """The current version's number of the dataset at ``path`` (the highest
    recorded from ``HEAD`` on); None when it has never changed.

    Raises:
        ManifestError: ``HEAD`` names a version that is not recorded, and
            none after it is.
    """
    start = _pointer(path)
    if start is None:
        return None
    number = start
    while _record_at(path, number + 1):
        number += 1
    if number == start and not _record_at(path, number):
        listed = _listed(path)
        if listed:
            return max(listed)
        raise ManifestError(f"the version pointer names version {start}, which is not "
                            f"recorded; run fastdata gc DATASET to repair it",
                            path=head_path(path))
    return number


def _listed(path) -> list[int]:
    """The recorded version numbers (a listing; none where it is refused)."""
    from fastdata.storage import list_names

    try:
        names = list_names(history_dir(path))
    except FastDataError:
        return []
    return sorted(int(m.group(1)) for m in map(_RECORD.match, names) if m)


class MissingVersionError(FastDataError):
    """The version asked for is not recorded (removed by gc, or never made)."""


class RemovedVersionError(MissingVersionError):
    """The version was removed by ``fastdata gc``; its number stays taken."""


def read_version(path, number: int) -> DatasetRecord:
    """Version ``number`` of the dataset at ``path``.

    Raises:
        MissingVersionError: it is not recorded (removed by gc, or never made).
    """
    try:
        record = find_version(path, number)
    except RemovedVersionError:
        current = head_number(path)
        raise RemovedVersionError(f"version {number} of the dataset was removed by fastdata "
                                  f"gc (the current one is {current}): open a version it "
                                  f"holds (fastdata info --history lists them), and start "
                                  f"again from a state saved on one", path=os.fspath(path)) \
            from None
    if record is None:
        listed = _listed(path)
        held = f"it holds versions {listed[0]} to {listed[-1]}" if listed else \
            "it holds no version records"
        raise MissingVersionError(f"version {number} of the dataset is not recorded ({held}; "
                                  f"fastdata gc removes old versions): open a version it "
                                  f"holds, and start again from a state saved on one",
                                  path=os.fspath(path))
    return record


def find_version(path, number: int) -> DatasetRecord | None:
    """Version ``number`` of the dataset at ``path``; None when it is not
    recorded (at a URL: a 404 or 403)."""
    where = record_path(path, number)
    try:
        record = read_record(where)
    except (MissingObjectError, AccessDeniedError):
        return None
    if record.kind != "version" or record.number != number:
        raise ManifestError(f"the record is not version {number}", path=where)
    return record


def versions(path) -> list[DatasetRecord]:
    """Every recorded version of the dataset at ``path``, oldest first."""
    head = head_number(path)
    if head is None:
        return []
    numbers = _listed(path) or list(range(1, head + 1))
    found = []
    for n in numbers:
        if n > head:
            continue
        try:
            found.append(read_version(path, n))
        except RemovedVersionError:
            continue
        except FastDataError:
            if n == head:
                raise
    return found

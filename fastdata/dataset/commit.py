"""One way to change a dataset: :func:`commit` (no torch).

A change (an append's new part, a join's columns) is written first, under
names no one else uses (ids). Then ``commit(dataset, change, read)`` makes
the next version record from the version the change was computed on
(``read``) and creates it only if no record of that number exists: locally
an exclusive create that never follows a link, at an object store a
conditional write. The creation is the commit. When another writer took the
number, the head is read again and the change rebased onto it (an append
onto appends that landed meanwhile, unless keys collide; a join onto other
columns, unless it names the same one), then tried again. ``HEAD`` is moved
afterwards, forward only; it is a hint (see :mod:`fastdata.dataset.history`).

A crash at any step leaves the old version or the new one current, and the
next change succeeds: before the record exists nothing names the new
files (``fastdata gc`` removes them once older than its grace period);
after it, readers find it from ``HEAD`` on, and the next commit moves
``HEAD`` past it.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Protocol

from fastdata.dataset import history
from fastdata.dataset.record import DatasetRecord, Part, manifest_digest
from fastdata.errors import FastDataError

#: Commits tried before giving up (each after another writer's landed).
ATTEMPTS = 64
#: Environment variable naming a step at which to end the process (tests of
#: crash safety set it; see :func:`step`).
CRASH_AT = "FASTDATA_TEST_CRASH_AT"


class Conflict(FastDataError):
    """The change cannot be built on what another writer committed
    meanwhile; the message says what to do."""


class Change(Protocol):
    """A change to a dataset, made into a record by :func:`commit`."""

    #: ``"append"``, ``"join"``, ...: the version record's ``change``.
    kind: str

    def apply(self, head: DatasetRecord, read: DatasetRecord) -> DatasetRecord:
        """The new version's body (parts, classes, counts, columns, labels,
        summary) from the current ``head``, for a change computed on
        ``read`` (``head`` itself, or an older version).

        Raises:
            Conflict: it cannot be built on ``head``.
        """

    def check_files(self) -> None:
        """Raise FastDataError when the files the change wrote are gone."""


def step(name: str) -> None:
    """A step boundary of a commit: the process ends here (exit status 77)
    when :data:`CRASH_AT` names it, as a crash would end it."""
    if os.environ.get(CRASH_AT) == name:
        os._exit(77)


def pack_record(reader, name: str) -> DatasetRecord:
    """Version 1 of a dataset never changed: its pack as the only part.
    The same bytes whoever makes it (the pack's manifest fixes them)."""
    manifest = reader.manifest
    digest = manifest_digest(manifest)
    part = Part(digest[:32], history.relative_name(history.dataset_folder(name), name),
                len(reader), digest)
    record = DatasetRecord(
        kind="version", format=manifest.format, records=len(reader),
        classes=list(manifest.classes), class_counts=list(manifest.class_counts),
        parts=[part], number=1, change="pack", summary="packed",
        created_at=manifest.created_at or "2000-01-01T00:00:00+00:00")
    made = replace(record.stamped(history.record_path(name, 1)),
                   fastdata_version=manifest.fastdata_version or "unknown", sha256="")
    import hashlib

    return replace(made, sha256=hashlib.sha256(made.encode()).hexdigest())


def commit(dataset: str, change: Change, read: DatasetRecord) -> DatasetRecord:
    """Record ``change`` as the dataset's next version.

    Args:
        dataset: the dataset's name (``Reader.dataset_path``).
        change: what to record (see :class:`Change`).
        read: the version the change was computed on; for a dataset never
            changed, :func:`pack_record` of it.

    Returns:
        the new version's record.

    Raises:
        Conflict: the change cannot be built on a version another writer
            committed meanwhile (the message says what to do).
        FastDataError: the dataset is at a read-only URL, or the change's
            files were removed meanwhile.
    """
    from fastdata.formats.remote_files import is_remote
    from fastdata.storage.urls import is_http

    if is_remote(dataset) and is_http(dataset):
        raise FastDataError("a dataset at an http(s) URL is read-only: change it where it is "
                            "stored (a local folder, s3://, gs:// or az://)", path=dataset)
    if read.number == 1:
        head, read = _first_version(dataset, read)
    else:
        head = read
    for _ in range(ATTEMPTS):
        number = head.number + 1
        body = change.apply(head, read)
        record = replace(body, kind="version", number=number, parent=head.number,
                         parent_sha256=head.sha256, change=change.kind, created_at="",
                         path="", sha256="").stamped(history.record_path(dataset, number))
        change.check_files()
        step("before-record")
        if _create(record.path, record.encode()):
            step("after-record")
            move_head(dataset, number)
            step("after-head")
            return record
        head = latest(dataset, number)
    raise FastDataError(f"{ATTEMPTS} other changes landed while this one was being recorded; "
                        f"run it again", path=dataset)


def _create(where: str, data: bytes) -> bool:
    from fastdata.storage import create_bytes

    if "://" not in where:
        os.makedirs(os.path.dirname(where), exist_ok=True)
    return create_bytes(data, where)


def _first_version(dataset: str, pack: DatasetRecord) -> tuple[DatasetRecord, DatasetRecord]:
    """Version 1 recorded (by this writer or another) and ``HEAD`` made; the
    head to build on and the version read, as recorded."""
    from fastdata.storage import create_bytes

    where = history.record_path(dataset, 1)
    if not _create(where, pack.encode()):
        try:
            stored = history.read_version(dataset, 1)
        except history.RemovedVersionError:  # changed since, and gc removed version 1
            return latest(dataset, 1), pack
        if [(p.id, p.manifest_sha256) for p in stored.parts] != \
                [(p.id, p.manifest_sha256) for p in pack.parts]:
            raise FastDataError("version 1 of the dataset is recorded with other files than "
                                "the pack's; the pack was replaced: restore it, or pack "
                                "again into a new name", path=where)
        pack = stored
    step("after-first-record")
    create_bytes(pointer(1), history.head_path(dataset))  # a HEAD already there stays
    return pack, pack


def pointer(number: int) -> bytes:
    """What ``HEAD`` holds when it names version ``number``."""
    return json.dumps({"kind": "fastdata-head", "version": number}).encode() + b"\n"


def move_head(dataset: str, number: int) -> None:
    """Point ``HEAD`` at version ``number`` unless it names a later one."""
    from fastdata.storage import upload_bytes

    current = history.head_number(dataset)
    if current is not None and current > number:
        return
    upload_bytes(pointer(number), history.head_path(dataset))


def latest(dataset: str, at_least: int) -> DatasetRecord:
    """The newest version of the dataset, version ``at_least`` or later."""
    return history.read_version(dataset, max(at_least, history.head_number(dataset) or 1))

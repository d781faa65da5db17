"""The dataset record: what a version or a view of a dataset reads (no torch).

A dataset is a list of parts read one after another. A part is a complete
packed dataset of the format, named by a unique id; a part may carry a
selection (the records of it that are read), so a view is the same parts
with selections, and a view of a view or of a version is data, not a
special case. Columns a join added, and labels it gave, index the parts'
records one after another, unselected (their *base* positions), so a
selection or an append never moves them.

    {"kind": "fastdata-version", "schema": 2, "format": "tar", "number": 3,
     "parent": 2, "parent_sha256": "...", "change": "append", "summary": "...",
     "records": 20, "classes": ["cat", "dog", "ant"], "class_counts": [6, 10, 4],
     "parts": [{"id": "...", "path": "d.tar.fastdata.json", "records": 12,
                "manifest_sha256": "...", "selection": null}, ...],
     "columns": [{"id": "...", "path": "d.tar.versions/columns/ID", "records": 12,
                  "columns": {"caption": {...}}, "sha256": {"c0000.utf8": "..."}}],
     "labels": null, "created_at": "...", "fastdata_version": "..."}

A view file is the same body with ``"kind": "fastdata-view"``, no number or
parent, and ``"of"``: the dataset and version it was made from. Paths are
relative to the record's root: the dataset's folder for a version, the
view's folder for a view; they stay inside it. A part's labels index its own
manifest's classes and are mapped to the record's by name, so parts packed
by writers that did not see each other's classes read right together.

Records are checked as strictly as manifests: classes unique, counts that
add up, parts unique by id and path, selections inside their part. Records
of the first layout (schema 1, and view files of version 1) are read too.
What grows with the dataset: 100-odd bytes per part, and a selection's
stored form (see :mod:`fastdata.dataset.selection`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from fastdata.errors import ManifestError

VERSION_KIND = "fastdata-version"
VIEW_KIND = "fastdata-view"
SCHEMA = 2
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_REDO = "; restore it from a copy, or make it again"


def manifest_digest(manifest) -> str:
    """SHA-256 of a manifest's canonical JSON (sorted keys, compact): what a
    record holds of each part, so a part is read only as it was."""
    text = json.dumps(manifest.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def new_id() -> str:
    """A fresh id for a part or a column set: 32 random hex digits."""
    import uuid

    return uuid.uuid4().hex


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Part:
    """One packed dataset of the record's format.

    Attributes:
        id: unique among the dataset's parts (never a version number).
        path: relative to the record's root, "/"-separated.
        records: the part's own records, all of them.
        manifest_sha256: its manifest's digest (:func:`manifest_digest`).
        selection: the stored selection of its records (see
            ``fastdata.dataset.selection``); None: every record.
    """

    id: str
    path: str
    records: int
    manifest_sha256: str
    selection: dict | None = None

    @property
    def selected(self) -> int:
        return self.records if self.selection is None else int(self.selection["records"])

    def to_dict(self) -> dict:
        return {"id": self.id, "path": self.path, "records": self.records,
                "manifest_sha256": self.manifest_sha256, "selection": self.selection}


@dataclass(frozen=True)
class DatasetRecord:
    """A version record or a view file, parsed and checked.

    Attributes:
        kind: ``"version"`` or ``"view"``.
        format: the parts' format.
        records: records read (the parts' selected records).
        classes, class_counts: of the records read.
        parts: the parts, in order.
        columns: joined column sets (each with ``path`` of its folder,
            ``records`` it covers, ``columns``, ``sha256`` per file).
        labels: labels a join gave (``path``, ``file``, ``records``,
            ``sha256``, ``classes`` its values index), or None.
        number, parent, parent_sha256, change, summary: a version's.
        of: a view's origin (``path``, ``version``, ``sha256``).
        selected_by, payload_bytes: a view's.
        path: where it was read (or is to be written).
        sha256: the digest of its bytes (set when read or written).
    """

    kind: str
    format: str
    records: int
    classes: list[str]
    class_counts: list[int]
    parts: list[Part]
    columns: list[dict] = field(default_factory=list)
    labels: dict | None = None
    number: int | None = None
    parent: int | None = None
    parent_sha256: str | None = None
    change: str = ""
    summary: str = ""
    of: dict | None = None
    selected_by: dict = field(default_factory=dict)
    payload_bytes: int | None = None
    created_at: str = ""
    fastdata_version: str = ""
    path: str = ""
    sha256: str = ""

    @property
    def base_records(self) -> int:
        """The parts' records, unselected: what joined columns index."""
        return sum(p.records for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        body = {"format": self.format, "schema": SCHEMA}
        if self.kind == "version":
            head = {"kind": VERSION_KIND, **body, "number": self.number,
                    "parent": self.parent, "parent_sha256": self.parent_sha256,
                    "change": self.change, "summary": self.summary}
        else:
            head = {"kind": VIEW_KIND, **body, "of": self.of,
                    "selected_by": self.selected_by, "payload_bytes": self.payload_bytes}
        return {**head, "created_at": self.created_at,
                "fastdata_version": self.fastdata_version, "records": self.records,
                "classes": self.classes, "class_counts": self.class_counts,
                "parts": [p.to_dict() for p in self.parts], "columns": self.columns,
                "labels": self.labels}

    def encode(self) -> bytes:
        """The bytes stored (what ``sha256`` is the digest of)."""
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False).encode("utf-8") + b"\n"

    def stamped(self, path: str = "") -> DatasetRecord:
        """This record with its creation time and fastdata's version set, and
        its digest as :meth:`encode` gives it."""
        from fastdata import __version__

        made = replace(self, created_at=self.created_at or now(), fastdata_version=__version__,
                       path=path or self.path, sha256="")
        return replace(made, sha256=hashlib.sha256(made.encode()).hexdigest())


# -- parsing ---------------------------------------------------------------------------

def parse_record(raw: bytes, where: str, *, legacy_view=None) -> DatasetRecord:
    """The record stored as ``raw`` at ``where``, checked; ``legacy_view(data,
    checker)`` reads a view file of the first layout (see
    :mod:`fastdata.dataset.legacy`).

    Raises:
        ManifestError: not a record, written by a newer fastdata, or a field
            missing, mistyped or not adding up (naming it).
    """
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"the record is not valid JSON ({type(exc).__name__})",
                            path=where) from None
    if not isinstance(data, dict) or data.get("kind") not in (VERSION_KIND, VIEW_KIND):
        raise ManifestError("not a fastdata version record or view file", path=where)
    kind = "version" if data["kind"] == VERSION_KIND else "view"
    schema = data.get("schema", data.get("version") if kind == "view" else None)
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise ManifestError("the record has no schema number" + _REDO, path=where)
    if schema > SCHEMA:
        raise ManifestError("the record was written by a newer fastdata; upgrade fastdata (in "
                            "its checkout: git pull, then pip install -e .)", path=where)
    check = _Checker(where)
    if kind == "view" and schema == 1:
        if legacy_view is None:
            raise ManifestError("a view file of the first layout; open it with "
                                "fastdata.open_reader", path=where)
        return legacy_view(data, check)
    parts = [_part(p, k, check, legacy=schema == 1) for k, p in
             enumerate(check.field(data, "parts", list))]
    record = DatasetRecord(
        kind=kind, format=check.field(data, "format", str),
        records=check.count(data, "records"),
        classes=check.field(data, "classes", list),
        class_counts=check.field(data, "class_counts", list), parts=parts,
        columns=_columns(data.get("columns"), check),
        labels=_labels(data.get("labels"), check, data),
        created_at=str(data.get("created_at", "")),
        fastdata_version=str(data.get("fastdata_version", "")),
        path=where, sha256=hashlib.sha256(raw).hexdigest())
    if kind == "version":
        record = replace(record, number=check.count(data, "number"),
                         parent=data.get("parent"), parent_sha256=data.get("parent_sha256"),
                         change=check.field(data, "change", str),
                         summary=str(data.get("summary", "")))
    else:
        of = data.get("of")
        record = replace(record, of=of if isinstance(of, dict) else None,
                         selected_by=data.get("selected_by")
                         if isinstance(data.get("selected_by"), dict) else {},
                         payload_bytes=data.get("payload_bytes")
                         if isinstance(data.get("payload_bytes"), int) else None)
    check_record(record)
    return record


class _Checker:
    """Field checks that name the record and the field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, what: str) -> ManifestError:
        return ManifestError(what + _REDO, path=self.where)

    def field(self, holder, name: str, kind: type, where: str = ""):
        value = holder.get(name) if isinstance(holder, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise self.fail(f"field {where}{name} is missing or not {kind.__name__}")
        return value

    def count(self, holder, name: str, where: str = "") -> int:
        value = self.field(holder, name, int, where)
        if value < 0:
            raise self.fail(f"field {where}{name} is negative ({value})")
        return value

    def digest(self, holder, name: str, where: str = "") -> str:
        value = self.field(holder, name, str, where)
        if not _HEX64.match(value):
            raise self.fail(f"field {where}{name} is not a SHA-256 (64 hex digits)")
        return value


def _part(data, k: int, check: _Checker, *, legacy: bool) -> Part:
    where = f"parts[{k}]."
    path = check.field(data, "path", str, where)
    if legacy:  # the first layout named parts by their path
        pid = "p" + hashlib.sha256(path.encode("utf-8")).hexdigest()[:31]
    else:
        pid = check.field(data, "id", str, where)
        if not _ID.match(pid):
            raise check.fail(f"field {where}id is not an id (letters, digits, '-', '_')")
    selection = data.get("selection")
    if selection is not None:
        if not isinstance(selection, dict):
            raise check.fail(f"field {where}selection is not an object")
        check.count(selection, "records", where + "selection.")
    return Part(pid, path, check.count(data, "records", where),
                check.digest(data, "manifest_sha256", where), selection)


def _columns(data, check: _Checker) -> list[dict]:
    if data is None:
        return []
    if not isinstance(data, list):
        raise check.fail("field columns is not a list")
    for k, entry in enumerate(data):
        where = f"columns[{k}]."
        check.field(entry, "path", str, where)
        check.count(entry, "records", where)
        check.field(entry, "columns", dict, where)
        digests = check.field(entry, "sha256", dict, where)
        for name in digests:
            check.digest(digests, name, f"{where}sha256.")
    return list(data)


def _labels(data, check: _Checker, record: dict) -> dict | None:
    if data is None:
        return None
    for name in ("path", "file"):
        check.field(data, name, str, "labels.")
    check.count(data, "records", "labels.")
    check.digest(data, "sha256", "labels.")
    if "classes" not in data:  # the first layout: the record's own classes
        data = {**data, "classes": record.get("classes")}
    check.field(data, "classes", list, "labels.")
    return data


def check_record(record: DatasetRecord) -> None:
    """Refuse a record whose fields do not add up.

    Raises:
        ManifestError: naming what does not add up.
    """
    check = _Checker(record.path)
    classes = record.classes
    if not all(isinstance(c, str) for c in classes) or len(set(classes)) != len(classes):
        raise check.fail("field classes must be distinct names")
    counts = record.class_counts
    if len(counts) != len(classes) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        raise check.fail(f"field class_counts must be {len(classes)} counts, one per class")
    if sum(counts) > record.records:
        raise check.fail(f"the class counts add up to {sum(counts):,}, more than the "
                         f"{record.records:,} records")
    if not record.parts:
        raise check.fail("the record has no parts")
    for name in ("id", "path"):
        seen = [getattr(p, name) for p in record.parts]
        if len(set(seen)) != len(seen):
            raise check.fail(f"two parts have the same {name}")
    for k, part in enumerate(record.parts):
        if part.selected > part.records:
            raise check.fail(f"parts[{k}] selects {part.selected:,} of its "
                             f"{part.records:,} records")
    if sum(p.selected for p in record.parts) != record.records:
        raise check.fail("the parts' records do not add up to the record's")
    for k, entry in enumerate(record.columns):
        if entry["records"] > record.base_records:
            raise check.fail(f"columns[{k}] covers more records than the parts hold")
    if record.labels is not None:
        if record.labels["records"] > record.base_records:
            raise check.fail("labels covers more records than the parts hold")
        names = record.labels["classes"]
        if not all(isinstance(c, str) for c in names) or not set(names) <= set(classes):
            raise check.fail("labels names classes the record does not have")
    if record.kind == "version":
        n = record.number
        if n < 1 or (n == 1) != (record.parent is None) or \
                (n > 1 and (record.parent != n - 1 or not isinstance(record.parent_sha256, str)
                            or not _HEX64.match(record.parent_sha256))):
            raise check.fail(f"version {n}'s parent is not version {n - 1} with its digest")

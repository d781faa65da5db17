"""View files of the first layout (``"version": 1``), read as records (no torch).

Such a view names one parent (a packed dataset, or a version record) and
selects from all of its records at once. It opens as the record of today's
layout: the parent's parts, re-rooted at the view's folder, the selection
split over them. The parent is read once here for its classes and parts.
"""

from __future__ import annotations

import hashlib
import posixpath

from fastdata.errors import ManifestError


def legacy_view(data: dict, check, raw: bytes, *, read_record, is_version_file):
    """The record a first-layout view file holds (``check``: the parser's
    field checker, naming the file; ``read_record`` and ``is_version_file``:
    the history's, to read a parent version record)."""
    from fastdata.contained import Folder
    from fastdata.dataset.across_parts import split_selection, stored
    from fastdata.dataset.record import DatasetRecord, Part, check_record
    from fastdata.dataset.selection import Selection, SelectionError
    from fastdata.storage.urls import dirname

    where = check.where
    parent = check.field(data, "parent", dict)
    name = check.field(parent, "path", str, "parent.")
    records = check.count(parent, "records", "parent.")
    digest = check.digest(parent, "manifest_sha256", "parent.")
    stored_selection = check.field(data, "selection", dict)
    counts = check.field(data, "class_counts", list)
    folder = dirname(where)
    parent_path = Folder(folder, where=where).path(name, "parent.path")
    try:
        selection = Selection.decode(stored_selection, records)
    except SelectionError as exc:
        raise ManifestError(f"the view's selection is damaged ({exc}); make the view again "
                            f"with fastdata subset", path=where) from None
    if is_version_file(parent_path):
        version = read_record(parent_path)
        prefix = posixpath.dirname(name.split(".versions", 1)[0])
        re_rooted = [Part(p.id, posixpath.join(prefix, p.path) if prefix else p.path,
                          p.records, p.manifest_sha256, None) for p in version.parts]
        if version.base_records != records:
            raise ManifestError("the view was made from another version of its dataset; "
                                "make the view again", path=where)
        pieces = split_selection(selection, [p.records for p in re_rooted])
        parts = [Part(p.id, p.path, p.records, p.manifest_sha256, stored(s, p.records))
                 for p, s in zip(re_rooted, pieces)]
        classes = list(version.classes)
        columns = [{**c, "path": posixpath.join(prefix, c["path"]) if prefix else c["path"]}
                   for c in version.columns]
        labels = version.labels and {
            **version.labels, "path": posixpath.join(prefix, version.labels["path"])
            if prefix else version.labels["path"]}
        of = {"path": name.split(".versions", 1)[0], "version": version.number,
              "sha256": version.sha256}
    else:
        from fastdata.formats.registry import detect_format

        with detect_format(parent_path).load_reader().open(parent_path) as reader:
            classes = list(reader.classes)
        pid = "p" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:31]
        parts = [Part(pid, name, records, digest, stored(selection, records))]
        columns, labels, of = [], None, {"path": name, "version": 1}
    record = DatasetRecord(
        kind="view", format=check.field(data, "format", str), records=selection.count,
        classes=classes, class_counts=counts, parts=parts, columns=columns, labels=labels,
        of=of, selected_by=data.get("selected_by") if isinstance(
            data.get("selected_by"), dict) else {},
        payload_bytes=data.get("payload_bytes") if isinstance(
            data.get("payload_bytes"), int) else None,
        created_at=str(data.get("created_at", "")),
        fastdata_version=str(data.get("fastdata_version", "")),
        path=where, sha256=hashlib.sha256(raw).hexdigest())
    if check.count(data, "records") != selection.count:
        raise ManifestError("the view's counts do not add up; make the view again",
                            path=where)
    check_record(record)
    return record

"""``fastdata gc``: remove what nothing can still use from a dataset's
history folder (no torch).

Kept, always: the current version and every version from ``HEAD`` on;
every part and column set a kept version or a known view names (views
register with their dataset when made, ``NAME.versions/views/ID.json``,
wherever they live; view files in the dataset's folder count too); every
file younger than the grace period (an append or a join still writing it);
the first pack's own files. Old versions go only when asked (``keep``); a
removed version's record becomes a tombstone, so its number is never taken
again by a writer that read an older version.
Nothing is followed through a symbolic link: a link is listed, never
entered. What grows with the dataset: the history folder's listing (one
entry per part file), and the kept versions' part names.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field

from fastdata.errors import FastDataError

#: Files younger than this (seconds) are kept: a change may still be writing them.
GRACE = 24 * 3600.0
_LEGACY_PART = re.compile(r"^(\d{6})[-.]")
_ID = re.compile(r"^[0-9a-f]{32}$")
_RECORD = re.compile(r"^v(\d{6})\.json$")


@dataclass(frozen=True)
class GCResult:
    """What :func:`gc` removed (or, with ``dry_run``, would remove).

    Attributes:
        kept: the versions kept.
        removed_versions: the versions removed.
        removed_files: the part and column folders (or files) removed.
        young: unrecorded files kept because they are younger than the
            grace period.
        links: symbolic links found in the history folder (never followed).
        dry_run: nothing was removed.
    """

    kept: list[int]
    removed_versions: list[int] = field(default_factory=list)
    removed_files: list[str] = field(default_factory=list)
    young: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    dry_run: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def gc(dataset: str | os.PathLike, *, keep: int | None = None, grace: float = GRACE,
       dry_run: bool = False) -> GCResult:
    """Remove from ``dataset``'s history what nothing can still use: part and
    column files no kept version or known view names, older than ``grace``
    seconds; with ``keep``, the versions older than the ``keep`` latest that
    no known view was made from.

    Raises:
        FastDataError: ``keep`` below 1, ``grace`` negative, or the history
            folder is a symbolic link.
    """
    from fastdata.dataset import history
    from fastdata.dataset.commit import move_head
    from fastdata.dataset.resolve import dataset_path
    from fastdata.storage import list_tree

    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise FastDataError(f"keep must be 1 or more (the current version stays), not {keep!r}")
    if not isinstance(grace, (int, float)) or grace < 0:
        raise FastDataError(f"grace is seconds, 0 or more, not {grace!r}")
    name = dataset_path(os.fspath(dataset))
    folder = history.history_dir(name)
    if "://" not in folder and os.path.islink(folder):
        raise FastDataError("the history folder is a symbolic link; gc never follows one: "
                            "remove the link, or run gc where the folder is", path=folder)
    listing = list_tree(folder)
    records = {}
    for n in sorted(int(m.group(1)) for n, *_ in listing if (m := _RECORD.match(n))):
        try:
            records[n] = history.read_version(name, n)
        except history.RemovedVersionError:
            continue  # removed before: its number stays taken
    numbers = sorted(records)
    current = max(numbers) if numbers else None
    pointed = _pointer_number(name)
    views = _known_views(name)
    kept = set(numbers)
    if keep is not None and numbers:
        kept = set(numbers[-keep:]) | {v for _, v in views if v in records}
        if pointed is not None:
            kept |= {n for n in numbers if n >= pointed}
    used = {_absolute(history.dataset_folder(name), p.path)
            for n in kept for p in records[n].parts}
    used |= {_absolute(history.dataset_folder(name), c["path"])
             for n in kept for c in records[n].columns}
    used |= {_absolute(history.dataset_folder(name), records[n].labels["path"])
             for n in kept if records[n].labels}
    used |= {path for path, _ in views}
    now = time.time()
    removed, young, links = [], [], [n for n, _, _, link in listing if link]
    for group, newest in _groups(folder, listing).items():
        inside = group.rstrip("/") + ("/" if "://" in group else os.sep)
        if any(u == group or u.startswith(inside) for u in used) or _legacy_used(group, used):
            continue
        if now - newest < grace:
            young.append(group)
            continue
        removed.append(group)
    removed_versions = sorted(set(numbers) - kept)
    if not dry_run:
        if current is not None and (pointed or 0) < current:
            move_head(name, current)  # never left naming a version about to go
        from fastdata.storage import upload_bytes

        for n in removed_versions:  # a tombstone: the number is never taken again
            upload_bytes(history.tombstone(n), history.record_path(name, n))
        for path in removed:
            remove_tree(path)
    return GCResult(sorted(kept), removed_versions, removed, young, links, dry_run)


def _pointer_number(name: str) -> int | None:
    from fastdata.dataset.history import _pointer

    return _pointer(name)


def _absolute(folder: str, rel: str) -> str:
    from fastdata.storage.urls import join

    if "://" in folder:
        return join(folder, rel)
    return os.path.normpath(os.path.join(folder, rel))


def _groups(folder: str, listing) -> dict[str, float]:
    """Removable units of the history folder (a part's or a column set's
    folder, a first-layout part's files, a temporary file), each with its
    newest file's time; links are never a unit's files."""
    from fastdata.storage.urls import join

    groups: dict[str, float] = {}
    for name, _, mtime, link in listing:
        if link:
            continue
        segments = name.split("/")
        if len(segments) >= 2 and segments[0] in ("parts", "columns"):
            unit = segments[1]
            if _ID.match(unit) and len(segments) > 2 or _LEGACY_PART.match(unit) or (segments[0] == "columns" and unit.isdigit()):
                key = join(folder, segments[0], unit)
            else:
                continue
        elif len(segments) == 1 and ".partial-" in name:
            key = join(folder, name)
        else:
            continue
        if "://" not in key:
            key = os.path.normpath(key)
        groups[key] = max(groups.get(key, 0.0), mtime)
    return groups


def _legacy_used(group: str, used: set[str]) -> bool:
    """Whether a first-layout part (``parts/000002.tar``, ``parts/000002-000001.tar``)
    is one a kept version names (its files share the six digits)."""
    base = os.path.basename(group.rstrip("/"))
    match = _LEGACY_PART.match(base)
    if match is None:
        return False
    stem = group[: len(group) - len(base)] + match.group(1)
    return any(u.startswith(stem) and u[len(stem):len(stem) + 1] in ("-", ".") for u in used)


def unrecorded_parts(name: str) -> list[str]:
    """Ids of parts in the history folder no version names, oldest first."""
    from fastdata.dataset import history
    from fastdata.storage import list_tree

    folder = history.history_dir(name)
    listing = list_tree(folder)
    named = {p.path for v in history.versions(name) for p in v.parts}
    found: dict[str, float] = {}
    for rel, _, mtime, link in listing:
        segments = rel.split("/")
        if link or len(segments) < 3 or segments[0] != "parts" or not _ID.match(segments[1]):
            continue
        found[segments[1]] = max(found.get(segments[1], 0.0), mtime)
    prefix = history.relative_name(history.dataset_folder(name), folder)
    return [i for i, _ in sorted(found.items(), key=lambda kv: kv[1])
            if not any(p.startswith(f"{prefix}/parts/{i}/") for p in named)]


def _known_views(name: str) -> list[tuple[str, int | None]]:
    """``(absolute part or column path, version)`` of every view the
    dataset knows of: registered ones whose file is there, and view files in
    its folder."""
    from fastdata.dataset import history
    from fastdata.storage import list_names

    folder = history.dataset_folder(name)
    found = []
    registered = history.join(history.history_dir(name), "views")
    try:
        names = list_names(registered)
    except FastDataError:
        names = []
    for entry in names:
        if not entry.endswith(".json"):
            continue
        try:
            ref = json.loads(_read(history.join(registered, entry)))
            view = _absolute(folder, str(ref["view"])) if "://" not in str(ref["view"]) \
                else str(ref["view"])
        except (FastDataError, OSError, ValueError, KeyError, TypeError):
            continue
        if not history.is_view_file(view):
            continue
        found += [(_absolute(folder, p), ref.get("version")) for p in ref.get("paths", [])]
    if "://" not in folder:
        for entry in sorted(os.listdir(folder)):
            path = os.path.join(folder, entry)
            if entry.endswith(".fastdata.json") and history.is_view_file(path):
                found += _view_paths(path)
    return found


def _view_paths(view: str) -> list[tuple[str, int | None]]:
    """The absolute part and column paths of the view file at ``view``."""
    from fastdata.dataset.history import read_record
    from fastdata.storage.urls import dirname

    try:
        record = read_record(view)
    except FastDataError:
        return []
    folder = dirname(view)
    version = (record.of or {}).get("version")
    return [(_absolute(folder, p.path), version) for p in record.parts] + \
        [(_absolute(folder, c["path"]), version) for c in record.columns]


def _read(path: str) -> bytes:
    from fastdata.formats.remote_files import read_bytes

    return read_bytes(path, limit=1 << 20)


def remove_tree(path: str) -> None:
    """Remove a file, a folder (never following a link inside it), or every
    object under a URL prefix."""
    import shutil

    if "://" in path:
        from fastdata.storage import delete, list_tree
        from fastdata.storage.urls import join

        for name, *_ in list_tree(path):
            delete(join(path, name))
        delete(path)
        return
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)

"""``fastdata gc``: remove old versions of a dataset, and the parts and
column files no kept version uses (no torch).

Nothing is removed but by this explicit call. Kept: the ``keep`` latest
versions (the current one always), and every version a view file in the
dataset's folder names (a view pins the version it was made from). A part
or column file is removed only when no kept version lists it; the first
pack (the dataset's own files) is never removed.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field

from fastdata.errors import FastDataError

_PART = re.compile(r"^(\d{6})[-.]")


@dataclass(frozen=True)
class GCResult:
    """What :func:`gc` removed (or, with ``dry_run``, would remove)."""

    kept: list[int]
    removed_versions: list[int] = field(default_factory=list)
    removed_files: list[str] = field(default_factory=list)
    dry_run: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def gc(dataset: str | os.PathLike, *, keep: int = 1, dry_run: bool = False) -> GCResult:
    """Remove the versions of ``dataset`` older than the ``keep`` latest (and
    not named by a view beside it), then the part and column files no kept
    version uses.

    Raises:
        FastDataError: ``keep`` below 1.
    """
    from fastdata.storage.urls import join
    from fastdata.dataset import history

    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise FastDataError(f"keep must be 1 or more (the current version stays), not {keep!r}")
    from fastdata.formats.registry import dataset_path

    dataset = dataset_path(os.fspath(dataset))
    found = history.versions(dataset)  # none: only parts a refused change left, if any
    numbers = [v.number for v in found]
    kept = set(numbers[-keep:]) | _viewed(dataset, numbers) if numbers else set()
    folder = history.history_dir(dataset)
    used = {p.path for v in found if v.number in kept for p in v.parts}
    used |= {c.get("path") for v in found if v.number in kept for c in v.columns}
    base = history.dataset_folder(dataset)
    removed_files = []
    for sub in ("parts", "columns"):
        for name in _names(join(folder, sub)):
            whole = join(folder, sub, name)
            rel = _relative(base, whole)
            match = _PART.match(name)
            if match is None or any(u == rel or u.startswith(_stem(rel)) for u in used):
                continue
            removed_files.append(whole)
    removed_versions = [n for n in numbers if n not in kept]
    if not dry_run:
        for n in removed_versions:
            remove(history.record_path(dataset, n))
        for path in removed_files:
            remove(path)
    return GCResult(sorted(kept), removed_versions, removed_files, dry_run)


def part_files(base: str, number: int) -> list[str]:
    """The files (or LMDB folders) of part or column set ``number``."""
    from fastdata.storage.urls import join
    from fastdata.dataset import history

    folder = history.history_dir(base)
    return [join(folder, sub, name) for sub in ("parts", "columns")
            for name in _names(join(folder, sub))
            if (m := _PART.match(name)) and int(m.group(1)) == number]


def _stem(rel: str) -> str:
    """The part a file belongs to: ``.../parts/000002`` of ``.../parts/000002-000001.tar``."""
    head, name = rel.rsplit("/", 1)
    return f"{head}/{_PART.match(name).group(1)}"


def _relative(base: str, path: str) -> str:
    if "://" in path:
        return path[len(base.rstrip("/")) + 1:]
    return os.path.relpath(path, base).replace(os.sep, "/")


def _names(folder: str) -> list[str]:
    if "://" in folder:
        from fastdata.storage import list_names

        try:
            return list_names(folder)
        except FastDataError:
            return []
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []


def remove(path: str) -> None:
    if "://" in path:
        from fastdata.storage import delete

        delete(path)
    elif os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _viewed(dataset: str, numbers: list[int]) -> set[int]:
    """The versions view files in the dataset's folder name (local folders only)."""
    from fastdata.dataset import history

    folder = history.dataset_folder(dataset)
    if "://" in folder:
        return set()
    prefix = os.path.basename(history.history_dir(dataset)) + "/v"
    named = set()
    for name in os.listdir(folder):
        if not name.endswith(".fastdata.json"):
            continue
        try:
            with open(os.path.join(folder, name), "rb") as f:
                head = f.read(4096).decode("utf-8", "replace")
        except OSError:
            continue
        if '"fastdata-view"' not in head:
            continue
        match = re.search(re.escape(prefix) + r"(\d{6})\.json", head)
        if match and int(match.group(1)) in numbers:
            named.add(int(match.group(1)))
    return named

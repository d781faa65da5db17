"""Publishing a sharded dataset (tar, TFRecord) so that, at every step, the
manifest names one complete dataset: the old one or the new one, never a mix.

Readers find every file through the manifest (shards, index, keys), and one
``os.replace`` of the manifest switches datasets. The new files keep the final
names the old ones may still use, so first the old files that a new name would
replace get a second name (a hard link, ``.NAME.old-TOKEN.EXT``) and the old
manifest is rewritten to point at those; then the new files move in, the new
manifest replaces the old one, and only then are the old files removed.

Removal is limited to what can be proved to be this output's: plain names in
the output's own folder that match its shard naming (with the format's side
files) or its sidecars, regular files only — never a path an old manifest
names outside the folder, never a folder, never a symlink. Set-aside names of
this output left by an interrupted publish are removed after the next switch.

A dataset of the earlier naming (``out.fastdata.json`` for ``out.tar``, see
``layout.py``) is replaced the same way: its files are set aside and its
manifest pointed at them, the new manifest (under the current name) appears,
and only then are the old files removed, the old manifest last (so that the
next overwrite finishes an interrupted cleanup). Readers look for the current
name first, so the output's name opens the new dataset from the switch on.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass

from fastdata.errors import OutputExistsError
from fastdata.formats.output import fsync_dir, fsync_file
from fastdata.manifest_schema import sidecar_fields

#: A set-aside name: ``.STEM.old-TOKEN`` plus the original's extension(s).
_ASIDE = re.compile(r"\.(?P<stem>.+?)\.old-(?P<token>[0-9a-f]{8})(?P<ext>\.[^/]*)?")
#: errnos of a file system without hard links (copy instead).
_NO_LINKS = {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS,
             getattr(errno, "ENOTSUP", errno.EPERM), getattr(errno, "EOPNOTSUPP", errno.EPERM)}


@dataclass(frozen=True)
class PublishPlan:
    """What to publish and how to recognise this output's own files.

    Attributes:
        directory: the output's folder.
        temp_dir: the writer's temporary folder holding every new file.
        moves: (name in ``temp_dir``, final name in ``directory``) of every new
            file except the manifest: shards, their side files, index, keys.
        manifest: (name in ``temp_dir``, final name) of the manifest.
        overwrite: whether an existing dataset may be replaced.
        shard_files: a shard name -> the files making up that shard (the
            shard first, then side files named after it).
        owns_shard: whether a file name is one of this output's shard names.
        sidecars: this output's index, keys and metadata index file names
            (both namings').
        legacy_manifest: the name of this output's manifest in the earlier naming
            when one of this format is to be replaced, else None.
    """

    directory: str
    temp_dir: str
    moves: tuple[tuple[str, str], ...]
    manifest: tuple[str, str]
    overwrite: bool
    shard_files: Callable[[str], list[str]]
    owns_shard: Callable[[str], bool]
    sidecars: tuple[str, ...]
    legacy_manifest: str | None = None

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def temp(self, name: str) -> str:
        return os.path.join(self.temp_dir, name)

    @property
    def new_names(self) -> set[str]:
        return {final for _, final in self.moves} | {self.manifest[1]}

    def owns(self, name: str) -> bool:
        """Whether ``name`` is a file this output's writer writes (a shard, a
        shard's side file or a sidecar)."""
        if name in self.sidecars:
            return True
        suffixes = [f[len("x"):] for f in self.shard_files("x")]
        return any(name.endswith(s) and self.owns_shard(name[:len(name) - len(s)])
                   for s in suffixes if len(name) > len(s))


def publish(plan: PublishPlan) -> None:
    """Move the new dataset into place; see the module doc for the order."""
    manifest_path = plan.path(plan.manifest[1])
    if os.path.lexists(manifest_path) and not plan.overwrite:
        raise OutputExistsError("a dataset with this name appeared while packing; nothing was "
                                "replaced", path=manifest_path)
    for temp, _ in plan.moves:
        fsync_file(plan.temp(temp))  # on disk before any name points at it
    fsync_file(plan.temp(plan.manifest[0]))
    olds = _old_manifests(plan)
    token = secrets.token_hex(4)
    for name, old in olds:
        _set_old_aside(plan, name, old, token)
    new_manifest = os.stat(plan.temp(plan.manifest[0]))
    moved = []
    try:
        for temp, final in plan.moves:
            os.replace(plan.temp(temp), plan.path(final))
            moved.append(final)
        fsync_dir(plan.directory)  # the new files are in place before the switch is
        os.replace(plan.temp(plan.manifest[0]), manifest_path)  # the switch
    except BaseException:
        current = _stat(manifest_path)
        if current is None or not os.path.samestat(new_manifest, current):
            # Not switched: the manifest still names the old dataset (set aside
            # where a new file took its name), so the new files it does not name go.
            for name in moved:
                _remove_file(plan.path(name))
        raise
    fsync_dir(plan.directory)
    for name, old in olds:
        remove_old(plan, old)
        if name != plan.manifest[1]:
            # The earlier naming's manifest goes last: while it is there, the next
            # overwrite finds what an interrupted cleanup left of its dataset.
            _remove_file(plan.path(name))


def _old_manifests(plan: PublishPlan) -> list[tuple[str, dict]]:
    """(name, data) of the manifests an overwrite replaces: the current name's, and
    the earlier naming's (only ever given when it is of this format)."""
    if not plan.overwrite:
        return []
    names = [plan.manifest[1]]
    if plan.legacy_manifest and plan.legacy_manifest != plan.manifest[1]:
        names.append(plan.legacy_manifest)
    found = ((name, _read_json(plan.path(name))) for name in names)
    return [(name, data) for name, data in found if data is not None]


def _set_old_aside(plan: PublishPlan, manifest: str, old: dict, token: str) -> None:
    """Give each old file that a new one will replace a second name, and point the
    old manifest (``manifest``, a name in the folder) at those names (one
    ``os.replace``): the old dataset stays whole."""
    data = copy.deepcopy(old)
    new_names = plan.new_names
    changed = False
    for entry in data.get("shards") if isinstance(data.get("shards"), list) else []:
        name = entry.get("path") if isinstance(entry, dict) else None
        if not (_plain(name) and plan.owns_shard(name)):
            continue
        files = plan.shard_files(name)
        if not os.path.lexists(plan.path(name)) or not new_names.intersection(files):
            continue
        aside = aside_name(name, token)
        for src, dst in zip(files, plan.shard_files(aside)):
            if os.path.lexists(plan.path(src)):
                _link(plan.path(src), plan.path(dst))
        entry["path"] = aside
        changed = True
    extra = data.get("extra") if isinstance(data.get("extra"), dict) else {}
    for holder, key, _ in sidecar_fields(extra):
        name = holder.get(key)
        if (_plain(name) and name in plan.sidecars and name in new_names
                and os.path.lexists(plan.path(name))):
            holder[key] = aside_name(name, token)
            _link(plan.path(name), plan.path(holder[key]))
            changed = True
    if changed:
        fsync_dir(plan.directory)  # the second names exist before the manifest uses them
        temp = plan.temp("old-manifest.json")
        with open(temp, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, sort_keys=False))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, plan.path(manifest))


def remove_old(plan: PublishPlan, old: dict) -> None:
    """After the switch: remove what the old manifest named that is provably this
    output's and not part of the new dataset, and set-aside names of this output."""
    names = set()
    shards = old.get("shards") if isinstance(old.get("shards"), list) else []
    for entry in shards:
        name = entry.get("path") if isinstance(entry, dict) else None
        if _plain(name) and plan.owns_shard(_original(name)):
            names.update(plan.shard_files(name))
    extra = old.get("extra") if isinstance(old.get("extra"), dict) else {}
    names.update(n for n in (holder.get(key) for holder, key, _ in sidecar_fields(extra))
                 if _plain(n))
    names.update(n for n in os.listdir(plan.directory) if _ASIDE.fullmatch(n))
    new_names = plan.new_names
    for name in sorted(names):
        if name not in new_names and plan.owns(_original(name)):
            _remove_file(plan.path(name))


def aside_name(name: str, token: str) -> str:
    """The hidden second name of ``name`` while a publish replaces it."""
    stem, ext = os.path.splitext(name)
    return f".{stem}.old-{token}{ext}"


def _original(name: str) -> str:
    """The name a set-aside name stands for (others unchanged)."""
    m = _ASIDE.fullmatch(name)
    return m.group("stem") + (m.group("ext") or "") if m else name


def _plain(name) -> bool:
    """A bare file name inside the folder: no folder part, not absolute, not . or .."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and os.sep not in name and (os.altsep is None or os.altsep not in name)
            and "\0" not in name)


def _link(src: str, dst: str) -> None:
    """A second name for ``src``: a hard link, or a copy where links are missing."""
    if os.path.lexists(dst):
        os.remove(dst)
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        shutil.copy2(src, dst, follow_symlinks=False)
        if not os.path.islink(dst):
            fsync_file(dst)


def _remove_file(path: str) -> None:
    """Remove ``path`` if it is a regular file (never a folder or a symlink)."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.remove(path)
    except OSError:
        pass  # the new dataset is in place; a stale old file does not change that


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _read_json(path: str) -> dict | None:
    """The old manifest as data, or None when there is none or it is unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

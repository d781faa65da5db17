"""Names a dataset's files hold stay inside the dataset.

A manifest names its shards and sidecars, a list names its images; these files
come from other people (a colleague's bucket, a hub, a shared drive) and are
opened on machines that hold credentials and private files. Every such name is
a relative, "/"-separated path inside the folder (or URL prefix) of the file
that holds it: no absolute path, no ``..`` or empty segment, no URL, no
backslash, no control character, and for a dataset at a URL no ``?`` or ``#``
(a URL would read them as a query or a fragment). A local name that resolves
through a symbolic link to a place outside the folder is refused too, unless
the user asks for it (``allow_outside=True``: links they made themselves, such
as shards spread over several disks).

The checks run before the name is used to open or fetch anything, and fail
with one :class:`~fastdata.errors.UnsafeNameError` naming the file that holds
the name and its field. No third-party imports.
"""

from __future__ import annotations

import os
import posixpath
import re

from fastdata.errors import UnsafeNameError

# C0 controls, DEL and the C1 controls: a NUL cuts a path in C, and the others
# can rewrite a terminal that prints the name.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_DRIVE = re.compile(r"^[A-Za-z]:")
#: A name that passes every check below (the names fastdata writes): tested
#: first, so a manifest of 10^5 shard names costs one match each.
_PLAIN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
#: What to do about a refused name, by what holds it.
DATASET_HINT = ("fastdata opens only files inside a dataset's folder or URL prefix; fix the "
                "name or re-pack the dataset")
LIST_HINT = ("a list's paths are relative to its folder and stay inside it; for a list of "
             "your own naming files elsewhere, pass allow_outside=True (CLI: --allow-outside)")
OUTSIDE_HINT = ("fastdata follows links only inside a dataset's folder; pass allow_outside=True "
                "(CLI: --allow-outside) to follow links you made yourself")


def is_plain_name(name: str) -> bool:
    """Whether ``name`` is one plain segment (as fastdata writes names): it
    passes :func:`name_problem` whatever the options."""
    return _PLAIN.fullmatch(name) is not None and name != ".."


def name_problem(name: str, *, remote: bool = False, canonical: bool = True) -> str | None:
    """Why ``name`` cannot be a name inside a folder, or None when it can.

    ``canonical``: the name must be written plainly (no empty or ``.``
    segment), as fastdata writes names; a list's paths (``./img/a.jpg``) are
    normalised first instead."""
    if isinstance(name, str) and _PLAIN.fullmatch(name) and name != "..":
        return None  # one segment, no control character, separator, drive or '..'
    if not isinstance(name, str) or not name:
        return "is not a file name"
    found = _CONTROL.search(name)
    if found:
        return f"holds a control character ({found.group()!r})"
    if "://" in name:
        return "is a URL"
    if name.startswith("/") or _DRIVE.match(name):
        return "is an absolute path"
    if "\\" in name:
        return "holds a backslash (a folder separator on Windows)"
    segments = (name if canonical else posixpath.normpath(name)).split("/")
    if ".." in segments:
        return "has a '..' segment, which leads out of the folder"
    if canonical and ("" in segments or "." in segments):
        return "has an empty or '.' segment (write the plain relative name)"
    if remote and ("?" in name or "#" in name):
        return "holds '?' or '#', which a URL reads as a query or a fragment"
    return None


def _shown(name) -> str:
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def check_name(name: str, *, field: str, where: str | None, remote: bool = False,
               kind: str = "manifest field", hint: str = DATASET_HINT,
               canonical: bool = True) -> str:
    """``name`` itself when it is a plain relative name (see :func:`name_problem`).

    Raises:
        UnsafeNameError: it is not; the message names ``where`` and ``field``.
    """
    problem = name_problem(name, remote=remote, canonical=canonical)
    if problem is not None:
        raise UnsafeNameError(f"{kind} {field} is {_shown(name)}, which {problem}; {hint}",
                              path=where)
    return name


def is_inside(path: str, folder: str) -> bool:
    """Whether ``path``, its links resolved, lies inside ``folder`` (resolved too)."""
    real, base = os.path.realpath(path), os.path.realpath(folder)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def check_inside(path: str, folder: str, *, field: str, where: str | None,
                 allow_outside: bool = False, kind: str = "manifest field",
                 hint: str = OUTSIDE_HINT) -> str:
    """``path`` when it resolves inside ``folder`` (or ``allow_outside``).

    Raises:
        UnsafeNameError: a symbolic link takes it out of the folder.
    """
    if allow_outside or is_inside(path, folder):
        return path
    raise UnsafeNameError(
        f"{kind} {field} leads through a symbolic link to {os.path.realpath(path)}, outside "
        f"{os.path.realpath(folder)}; {hint}", path=where)


class Folder:
    """Names resolved inside one folder (a local one or a URL prefix), after
    their checks. The resolved form of each parent folder is remembered, so a
    million names cost a million ``lstat`` calls rather than a million full
    resolutions (a manifest's shards, a list's rows).

    Args:
        folder: the folder the names are relative to.
        where: the file that holds the names, for messages.
        links_out: follow symbolic links that lead out of the folder (the
            names themselves are checked all the same).
        kind, hint, canonical: how refusals read and how names must be
            written (see :func:`check_name`).
    """

    def __init__(self, folder: str, *, where: str | None, links_out: bool = False,
                 kind: str = "manifest field", hint: str = DATASET_HINT,
                 outside_hint: str = OUTSIDE_HINT, canonical: bool = True) -> None:
        from fastdata.storage.urls import is_url

        self.folder, self.where, self.links_out = folder, where, links_out
        self.kind, self.hint, self.outside_hint = kind, hint, outside_hint
        self.canonical = canonical
        self.remote = is_url(folder)
        self._base: str | None = None
        self._parents: dict[str, bool] = {}
        self._listing: dict[str, bool] | None = None

    def path(self, name: str, field: str) -> str:
        """The path (or URL) of ``name`` inside the folder.

        Raises:
            UnsafeNameError: ``name`` is not a relative name inside the folder,
                or (locally) a symbolic link takes it out and ``links_out`` is off.
        """
        check_name(name, field=field, where=self.where, remote=self.remote, kind=self.kind,
                   hint=self.hint, canonical=self.canonical)
        if self.remote:
            from fastdata.storage.urls import join

            return join(self.folder, name)
        path = os.path.join(self.folder, *name.split("/"))
        if self.links_out:
            return path
        if self._base is None:
            self._base = os.path.realpath(self.folder)
        parent = os.path.dirname(path)
        inside = self._parents.get(parent)
        if inside is None:
            inside = self._parents[parent] = is_inside(parent, self._base)
        if not inside or os.path.islink(path):
            check_inside(path, self.folder, field=f"{field} ({_shown(name)})", where=self.where,
                         kind=self.kind, hint=self.outside_hint)
        return path


    def plain_files(self) -> dict[str, bool]:
        """The names directly in the (local) folder and whether each is a
        regular file that is no symbolic link: one listing, no call per name."""
        if self._listing is None:
            listing = {}
            try:
                with os.scandir(self.folder) as entries:
                    for entry in entries:
                        listing[entry.name] = (not entry.is_symlink()
                                               and entry.is_file(follow_symlinks=False))
            except OSError:
                pass
            self._listing = listing
        return self._listing

    def paths(self, names: list[str], field: str) -> list[str]:
        """:meth:`path` of every name (``field`` formatted with its position):
        a plain name of a regular file in the folder needs no call of its own,
        so a manifest of 10^5 shards costs one listing of the folder."""
        if self.remote or self.links_out:
            return [self.path(n, field.format(k)) for k, n in enumerate(names)]
        files = self.plain_files()
        prefix = os.path.join(self.folder, "")
        out = []
        for k, name in enumerate(names):
            if isinstance(name, str) and "/" not in name and files.get(name):
                if not is_plain_name(name):
                    check_name(name, field=field.format(k), where=self.where, remote=False,
                               kind=self.kind, hint=self.hint, canonical=self.canonical)
                out.append(prefix + name)
            else:
                out.append(self.path(name, field.format(k)))
        return out


def list_folder(folder: str, where: str, *, kind: str = "list row") -> Folder:
    """The :class:`Folder` of a list's (or table's) image paths: written as
    the list writes them (``./img/a.png``), refused with :data:`LIST_HINT`."""
    return Folder(folder, where=where, kind=kind, hint=LIST_HINT, outside_hint=LIST_HINT,
                  canonical=False)

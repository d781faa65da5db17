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
#: What to do about a refused name, by what holds it.
DATASET_HINT = ("fastdata opens only files inside a dataset's folder or URL prefix; fix the "
                "name or re-pack the dataset")
LIST_HINT = ("a list's paths are relative to its folder and stay inside it; for a list of "
             "your own naming files elsewhere, pass allow_outside=True (CLI: --allow-outside)")
OUTSIDE_HINT = ("fastdata follows links only inside a dataset's folder; pass allow_outside=True "
                "(CLI: --allow-outside) to follow links you made yourself")


def name_problem(name: str, *, remote: bool = False, canonical: bool = True) -> str | None:
    """Why ``name`` cannot be a name inside a folder, or None when it can.

    ``canonical``: the name must be written plainly (no empty or ``.``
    segment), as fastdata writes names; a list's paths (``./img/a.jpg``) are
    normalised first instead."""
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


def resolve(folder: str, name: str, *, field: str, where: str | None,
            allow_outside: bool = False) -> str:
    """The path (or URL) of ``name`` inside ``folder``, a local folder or a URL
    prefix, after its checks.

    Raises:
        UnsafeNameError: ``name`` is not a plain relative name, or (locally) a
            symbolic link takes it out of ``folder`` and ``allow_outside`` is off.
    """
    from fastdata.storage.urls import is_url, join

    remote = is_url(folder)
    check_name(name, field=field, where=where, remote=remote)
    if remote:
        return join(folder, name)
    path = os.path.join(folder, *name.split("/"))
    return check_inside(path, folder, field=f"{field} ({_shown(name)})", where=where,
                        allow_outside=allow_outside)



class FolderNames:
    """Many names checked against one folder (a list's rows): the resolved form
    of each parent folder is remembered, so a million rows cost a million
    ``lstat`` calls rather than a million full resolutions.

    Args:
        folder: the folder the names are relative to.
        where: the file that holds the names, for messages.
        allow_outside: take every name as it is (absolute and ``..`` too),
            joined to ``folder`` when relative: the caller vouches for them.
    """

    def __init__(self, folder: str, *, where: str, allow_outside: bool = False,
                 kind: str = "list row", hint: str = LIST_HINT) -> None:
        self.folder = folder
        self.base = os.path.realpath(folder)
        self.where, self.kind, self.hint = where, kind, hint
        self.allow_outside = allow_outside
        self._parents: dict[str, bool] = {}

    def path(self, name: str, field: str) -> str:
        """The path of ``name`` inside the folder, after its checks.

        Raises:
            UnsafeNameError: ``name`` leads out of the folder.
        """
        if self.allow_outside:
            return os.path.join(self.folder, name)  # an absolute name stays as it is
        check_name(name, field=field, where=self.where, kind=self.kind, hint=self.hint,
                   canonical=False)
        path = os.path.join(self.folder, *name.split("/"))
        parent = os.path.dirname(path)
        inside = self._parents.get(parent)
        if inside is None:
            inside = self._parents[parent] = is_inside(parent, self.base)
        if not inside or os.path.islink(path):
            check_inside(path, self.folder, field=f"{field} ({_shown(name)})", where=self.where,
                         kind=self.kind, hint=self.hint)
        return path

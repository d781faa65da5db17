"""Temporary files beside a file being written, and a whole file replaced
through one (no torch).

A temporary file is made new, by exclusive create under a random name in the
target's folder (``NAME.partial-XXXXXXXXXXXX``): a file or symbolic link that
someone planted at a name there is never written through, whatever the name.
The one way fastdata writes a local file whole: :func:`replace_file` (or
:func:`partial_file` and ``os.replace`` for a file written in pieces).
"""

from __future__ import annotations

import os
import secrets

from fastdata.errors import StorageError

#: A temporary file is new: an existing name, a symbolic link included, fails
#: the create (O_EXCL) and is never written through (O_NOFOLLOW where there is one).
_NEW_FILE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))


def partial_file(dest: str, mode: int = 0o666) -> tuple[int, str]:
    """A new temporary file beside ``dest`` (same filesystem, so os.replace is
    atomic), open for writing: ``(descriptor, name)``, named
    ``dest.partial-XXXXXXXXXXXX`` (random). Made by exclusive create, so
    nothing planted at a name beside ``dest`` is ever written through;
    ``mode`` as for ``os.open`` (the umask applies)."""
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, os.path.basename(dest) + ".partial-")
    for _ in range(100):
        tmp = prefix + secrets.token_hex(6)
        try:
            return os.open(tmp, _NEW_FILE, mode), tmp
        except FileExistsError:  # taken (by chance or on purpose): another name
            continue
    raise StorageError("no free temporary name beside the file after 100 tries; remove "
                       "the .partial-* files there", path=dest)


def partial_name(dest: str) -> str:
    """A new temporary file beside ``dest`` (:func:`partial_file`, readable
    by its owner only), closed: its name."""
    fd, tmp = partial_file(dest, 0o600)
    os.close(fd)
    return tmp


def written_file(dest: str, data: bytes) -> str:
    """A new temporary file beside ``dest`` (:func:`partial_file`) holding
    ``data``, flushed to disk: its name (the caller renames or links it into
    place, then removes it). A failed write leaves no temporary file."""
    fd, tmp = partial_file(dest)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _remove(tmp)
        raise
    return tmp


def replace_file(dest: str, data: bytes | str) -> None:
    """Make ``data`` (text as UTF-8) the local file ``dest``, whole or not at
    all: written into a new temporary file beside it (:func:`written_file`),
    then renamed over ``dest`` (which replaces a link there, never writes
    through it). A failed write leaves no temporary file."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = written_file(dest, data)
    try:
        os.replace(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

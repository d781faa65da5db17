"""What keeps an output safe while it is written: the per-output lock, fsync,
and the one clear error for a full disk.

- :class:`OutputLock`: an exclusive, non-blocking ``flock`` on
  ``.NAME.fastdata.lock`` beside the output, held from the writer's start to its
  publish, so two packs never write one output at once.
- :func:`fsync_file`, :func:`fsync_tree`, :func:`fsync_dir`: data reaches the disk
  before a rename makes it visible, and renames reach it before what depends on them.
- :func:`exchange_paths`: swap two folders atomically (Linux), so a folder
  output is never missing while it is replaced.
- :func:`disk_full_error`: an ``ENOSPC``/``EDQUOT`` (as an ``OSError`` or inside
  a library's message) becomes one :class:`~fastdata.errors.FastDataError`
  naming the output and the space involved.
"""

from __future__ import annotations

import errno
import os
import shutil

from fastdata.errors import FastDataError, OutputExistsError
from fastdata.machine import human_bytes

try:  # POSIX only; elsewhere outputs are written without a lock
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

LOCK_SUFFIX = ".fastdata.lock"

#: errnos that mean "no room to write" (EDQUOT is missing on some platforms).
_FULL_ERRNOS = {errno.ENOSPC} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())
#: How C libraries (HDF5, LMDB) spell those inside their own messages.
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "errno = 28")


def lock_path(directory: str, name: str) -> str:
    """The lock file of output ``name`` in ``directory`` (hidden, beside the output)."""
    return os.path.join(directory, f".{name}{LOCK_SUFFIX}")


class OutputLock:
    """An exclusive lock on one output, taken at once or not at all.

    The lock file is removed on release while still locked; a process that
    opened it before the removal finds, once it holds the lock, that the path
    no longer names its file and tries again, so two holders never coexist.

    Args:
        path: the lock file.
        output: the output it guards (named in the error).

    Raises:
        OutputExistsError: another process holds the lock.
    """

    def __init__(self, path: str, output: str) -> None:
        self.path = path
        self._fd: int | None = None
        if fcntl is None:
            return
        for _ in range(100):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise OutputExistsError(
                    "another pack is writing this output right now (it holds "
                    f"{os.path.basename(path)}); wait for it to finish or stop it, then try "
                    "again", path=output) from None
            if _same_file(fd, path):
                self._fd = fd
                return
            os.close(fd)  # released and removed by its holder meanwhile: take the new one
        raise OutputExistsError("could not take the output's lock: it keeps changing",
                                path=output)

    def release(self) -> None:
        """Remove the lock file and unlock. Safe to call more than once."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)  # closing the descriptor drops the flock


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


# -- fsync ------------------------------------------------------------------------------


def fsync_file(path: str) -> None:
    """Flush a written file's data to disk (any process's writes to it count)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make renames and new names inside folder ``path`` durable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a platform that cannot open folders: nothing to do
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):  # folders not syncable here
            raise
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync a file, or every file of a folder tree and the folders themselves."""
    if not os.path.isdir(path) or os.path.islink(path):
        fsync_file(path)
        return
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                fsync_file(full)
        fsync_dir(root)


# -- swapping two folders ------------------------------------------------------------------

#: renameat2(2) arguments (Linux): paths relative to the working folder; swap.
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
#: errnos of a kernel, libc or file system without RENAME_EXCHANGE.
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, getattr(errno, "ENOTSUP", errno.EINVAL),
                getattr(errno, "EOPNOTSUPP", errno.EINVAL)}


def exchange_paths(a: str, b: str) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``), so that ``b`` is never missing. False, and nothing
    done, where the platform or the file system cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), a, None, b)


# -- a full disk ------------------------------------------------------------------------


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk or the quota is full."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if any(text in str(exc) for text in _FULL_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(output: str, written_path: str, accepted: int = 0) -> FastDataError:
    """The error for a full disk while writing ``output``.

    Args:
        output: the output being written (named in the message).
        written_path: the temporary output so far (removed after the error).
        accepted: payload bytes the writer took so far (some may still be in
            memory); this and the size of ``written_path`` are lower bounds of
            the space the pack needs.
    """
    folder = os.path.dirname(output) or "."
    written = tree_size(written_path)
    free = free_bytes(folder)
    room = (f"{folder} has {human_bytes(free + written)} free once the partial output is "
            f"removed" if free is not None else f"the free space of {folder} is unknown")
    return FastDataError(
        f"the disk is full (no space left on device): the pack needs more than "
        f"{human_bytes(max(written, accepted))} and {room}. Free some space or write to "
        f"another folder; an existing dataset is kept", path=output)


def tree_size(path: str) -> int:
    """Bytes in a file or a folder tree (0 when it is gone)."""
    if not os.path.isdir(path):
        return os.path.getsize(path) if os.path.isfile(path) else 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # gone meanwhile: counts as nothing
    return total


def free_bytes(path: str) -> int | None:
    """Free bytes on the file system holding ``path`` (None when unknown)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def publish_output(temp: str, path: str, *, overwrite: bool, output_is_dir: bool) -> None:
    """Move the finished temporary output ``temp`` to ``path``, its bytes on
    disk before its name; an existing ``path`` is replaced only with
    ``overwrite`` (a file by one atomic rename, a folder see
    :func:`_replace_dir`).

    Raises:
        OutputExistsError: ``path`` appeared meanwhile and ``overwrite`` is off.
    """
    fsync_tree(temp)
    if os.path.lexists(path):
        if not overwrite:
            raise OutputExistsError("output appeared while packing; nothing was replaced",
                                    path=path)
        if output_is_dir or _is_dir(path):
            _replace_dir(temp, path)
        else:
            os.replace(temp, path)
    else:
        os.replace(temp, path)
    fsync_dir(os.path.dirname(path))


def _replace_dir(temp: str, path: str) -> None:
    """A folder cannot be renamed over another: swap the two in one step where
    the system can; else move the old one aside, move the new one in, and put
    the old one back if that fails (a crash between the two renames leaves
    the old dataset at ``.NAME.partial-XXXX.old``)."""
    if exchange_paths(temp, path):
        remove_path(temp)  # the old output, now under the temporary name
        return
    trash = f"{temp}.old"
    os.replace(path, trash)
    try:
        os.replace(temp, path)
    except BaseException:
        if not os.path.lexists(path):
            os.replace(trash, path)
        raise
    remove_path(trash)


def _is_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


def remove_path(path: str) -> None:
    """Remove a file, link or folder tree if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)

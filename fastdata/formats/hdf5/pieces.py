"""Side files of a resumable HDF5 pack: the payload bytes a piece leaves in memory.

The HDF5 writer appends payloads to the file in whole chunks only (see
``writer.py``), so when a piece ends some of its bytes are still in memory.
``end_piece`` writes those bytes, and only those, to ``PARTIAL.pending-N``
(N: the piece number; PARTIAL: the partial ``.h5``), fsynced, so each payload
byte goes to a side file at most once. A side file is removed once its bytes
are in the ``.h5`` up to where a resumed pack keeps it (what the file held when
the previous piece ended), so the side files hold at most about two flushes;
the pack removes the rest when it finishes or is abandoned (``suspend`` keeps
them).
"""

from __future__ import annotations

import os

from fastdata.formats.output import fsync_dir

SIDE_INFIX = ".pending-"


def side_path(temp_path: str, number: int) -> str:
    """The side file of piece ``number`` of the partial output ``temp_path``."""
    return f"{temp_path}{SIDE_INFIX}{number}"


def side_files(temp_path: str) -> dict[int, str]:
    """The side files of ``temp_path`` that exist, by piece number."""
    folder, base = os.path.split(temp_path)
    prefix = base + SIDE_INFIX
    try:
        names = os.listdir(folder or ".")
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        number = name[len(prefix):]
        if name.startswith(prefix) and number.isdigit():
            found[int(number)] = os.path.join(folder, name)
    return found


def write_side(temp_path: str, number: int, data) -> None:
    """Write piece ``number``'s side file and make it durable, name included."""
    path = side_path(temp_path, number)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(os.path.dirname(path))


def read_side(temp_path: str, number: int) -> bytes | None:
    """Piece ``number``'s side file, or None where there is none."""
    try:
        with open(side_path(temp_path, number), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def remove_side(temp_path: str, number: int) -> None:
    try:
        os.remove(side_path(temp_path, number))
    except FileNotFoundError:
        pass


def remove_sides(temp_path: str, *, keep=()) -> None:
    """Remove every side file of ``temp_path`` but those of the pieces in ``keep``."""
    for number, path in side_files(temp_path).items():
        if number not in keep:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

"""Selections over several parts: one selection of the parts' records one
after another split into one per part, and back (no torch).

A subset is computed over a dataset's base records (every part's records,
unselected, one after another) and stored per part. What grows with the
dataset: a chunk of flags at a time (:data:`CHUNK`), and the selections
themselves.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from fastdata.dataset.selection import Selection

#: Records flagged at a time.
CHUNK = 1 << 16


def mask_chunks(selection: Selection | None, count: int, lo: int = 0, hi: int | None = None,
                step: int = CHUNK) -> Iterator[np.ndarray]:
    """The flags of records ``lo..hi`` of a part of ``count`` records (None:
    every record selected), ``step`` at a time."""
    hi = count if hi is None else hi
    for start in range(lo, hi, step):
        stop = min(hi, start + step)
        if selection is None:
            yield np.ones(stop - start, bool)
            continue
        mask = np.zeros(stop - start, bool)
        for a, b in selection.runs(start, stop):
            mask[a - start:b - start] = True
        yield mask


def split_selection(selection: Selection, counts: list[int]) -> list[Selection | None]:
    """``selection`` over the parts' records one after another, as one per
    part (None where a part's records are all selected)."""
    out: list[Selection | None] = []
    first = 0
    for count in counts:
        part = Selection.from_mask_chunks(count, (
            m for m in mask_chunks(selection, selection.parent_count, first, first + count)))
        out.append(None if part.count == count else part)
        first += count
    return out


def combined_chunks(selections: list[Selection | None], counts: list[int]
                    ) -> Iterator[np.ndarray]:
    """The flags of every part's records, one part after another."""
    for selection, count in zip(selections, counts):
        yield from mask_chunks(selection, count)


def stored(selection: Selection | None, count: int) -> dict | None:
    """A part's selection as a record stores it (None: every record)."""
    return None if selection is None or selection.count == count else selection.encode()

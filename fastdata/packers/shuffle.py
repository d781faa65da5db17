"""Pack-time shuffling: a source's entries in a seeded random order.

The order is ``numpy.random.Generator(numpy.random.PCG64(seed)).permutation(n)``
over the source's ``n`` entries: record ``i`` of the pack is source entry
``order[i]``. The same seed gives the same order on every machine and Python
version (numpy's own generator, not Python's ``random``); numpy keeps the right
to change a Generator method between its releases, which the tests would show
(they pin one permutation). The permutation is
taken over every entry the source lists, before any image is checked: a file
skipped as damaged leaves a gap, and the others keep their places relative to
each other, so the order never depends on which files turn out to be bad.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterator
from typing import Any

from fastdata.errors import FastDataError
from fastdata.packers.source import ImageFolderSource, Source, SourceEntry

_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


def check_seed(seed: Any) -> int | None:
    """``seed`` as a plain int (None: no shuffle).

    Raises:
        FastDataError: not a whole number >= 0 (a bool is not one).
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise FastDataError(f"shuffle={seed} is not a seed: give a whole number from 0 up "
                            f"(the same seed gives the same order)")
    return int(seed)


def parse_seed(text: str | None) -> int | None:
    """A seed as the command line gives it (decimal digits), checked by :func:`check_seed`."""
    if text is None:
        return None
    stripped = text.strip()
    return check_seed(int(stripped) if _WHOLE_NUMBER.fullmatch(stripped) else stripped or '""')


def shuffle_order(n: int, seed: int) -> list[int]:
    """The documented permutation of ``range(n)`` for ``seed``: the order
    engine's (:func:`fastdata.order.epochs.permutation`)."""
    from fastdata.order.epochs import permutation

    return permutation(n, seed).tolist()


def shuffled(src: Source, seed: int) -> Source:
    """``src`` with its entries in the order :func:`shuffle_order` gives.

    An :class:`ImageFolderSource` becomes its ``subset`` in that order; a source
    that supports ``src[i]`` (the i-th entry of its iteration) is read by index,
    in batches of ``src.batch_size`` where it has ``entries_at(indices)`` (a
    :class:`~fastdata.packers.sources.dataset.DatasetSource`); any other is
    iterated once and its entries held in memory (paths are small, but a
    source that yields image bytes holds them all).
    """
    order = shuffle_order(len(src), seed)
    if isinstance(src, ImageFolderSource):
        return src.subset(order)
    if hasattr(src, "__getitem__"):
        return ShuffledSource(src, order, src.__getitem__)
    entries = list(src)
    if len(entries) != len(order):
        raise FastDataError(f"the source says it has {len(order)} entries but yields "
                            f"{len(entries)}; its __len__ and __iter__ must agree to shuffle it")
    return ShuffledSource(src, order, entries.__getitem__)


class ShuffledSource:
    """A :class:`Source` view: ``src``'s classes, description and warnings, its
    entries in ``order`` (fetched with ``entry(i)``, the i-th in source order)."""

    def __init__(self, src: Source, order: list[int], entry) -> None:
        self.source = src
        self.order = order
        self.classes = src.classes
        self._entry = entry

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[SourceEntry]:
        many = getattr(self.source, "entries_at", None)
        if many is None:
            return (self._entry(i) for i in self.order)
        return self._batched(many, max(1, int(getattr(self.source, "batch_size", 256))))

    def _batched(self, many, size: int) -> Iterator[SourceEntry]:
        for start in range(0, len(self.order), size):
            yield from many(self.order[start:start + size])

    def describe(self) -> dict[str, Any]:
        return self.source.describe()

    def warnings(self) -> list[str]:
        return self.source.warnings()

"""The selection ``fastdata subset`` writes, made from its pieces' results
(fastdata.ops.subset_pieces) on the machine that writes the view: the
flags, a piece at a time in piece order, less the records an excluded
dataset holds, then the draw of ``fraction``, packed into each part's
selection (runs or a bitmap, :mod:`fastdata.dataset.selection`).

What grows with the parent's records: one bit per record (each part's
bitmap, and up to as much again in runs while they are smaller), and on
disk 8 bytes per record dropped for its content; the rest is a piece's
packed flags and labels (4 bytes per flagged record, pieces of at most
2**18 records), :data:`CHUNK` records of them unpacked, and a chunk of the
merged runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from fastdata.jobs.sorted_runs import MERGE_CHUNK, MERGE_FAN_IN

#: Records of a piece combined at a time (a multiple of 8: each chunk's
#: flags start on a byte), so that what the merge holds for a piece does
#: not grow with the piece.
CHUNK = 8192

#: The index of a record dropped for its content.
INDEX = np.dtype([("index", "<i8")])


@dataclass
class Made:
    """The selection combined from the pieces: each part's stored form, the
    records selected, per class, their payload bytes (None: not known),
    and how many were dropped for their content."""

    stored: list = field(default_factory=list)
    selected: int = 0
    counts: np.ndarray | None = None
    payload: int | None = None
    excluded: int = 0


def combine(run, root, record, fraction, seed: int, stratify: bool) -> Made:
    """The pieces' flags, less the records an excluded dataset holds, then
    the draw of ``fraction``, in piece order, as each part's selection."""
    from fastdata.ops.subset_pieces import plan

    width = len(root.classes) + 1
    flagged = [r for r in run.results if "flags" in r]
    spans = plan(len(root))
    hits = _hit_runs(run) if any(r["run"] for r in flagged) else []
    draw = None
    if fraction is not None:
        groups = np.zeros(width, np.int64)
        for result in flagged:
            groups = _add(groups, np.asarray(result["groups"], np.int64))
        for span, result, gone in zip(spans, flagged, _by_piece(hits, spans)):
            if len(gone):  # the draw's groups count only what is left
                for lo, flags, labels in _chunks(run, result, span, np.zeros(0, np.int64)):
                    at = np.flatnonzero(flags) + lo
                    groups = _add(groups, -np.bincount(labels[np.isin(at, gone)] + 1,
                                                       minlength=width))
        draw = Draw(groups, float(fraction), int(seed), stratify)
    made = Made(counts=np.zeros(width - 1, np.int64), payload=0 if root.sharded else None)
    parts = Parts([p.records for p in record.parts])
    for span, result, gone in zip(spans, flagged, _by_piece(hits, spans)):
        made.excluded += len(gone)
        for lo, flags, labels in _chunks(run, result, span, gone):
            if draw is not None:
                flags, labels = draw.take(flags, labels)
            made.counts = _add(made.counts, np.bincount(labels[labels >= 0],
                                                        minlength=width - 1))
            chosen = np.flatnonzero(flags) + lo
            if made.payload is not None and len(chosen):
                made.payload += int(np.asarray(root.placement(chosen)[1], np.int64).sum())
            parts.add(flags)
    made.stored, made.selected = parts.finish(), parts.selected
    return made


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b``, the shorter padded with zeros (a label past the classes
    lengthens a count)."""
    if len(a) < len(b):
        a, b = b, a
    out = a.copy()
    out[:len(b)] += b
    return out


def _chunks(run, result: dict, span, gone) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """A piece's flags, :data:`CHUNK` records at a time: ``(first record,
    flags (bool, one per record), the flagged records' labels)``, less the
    records ``gone`` (base indices, ascending)."""
    from fastdata.jobs.files import load_array

    start, end = span
    packed = load_array(os.path.join(run.work, result["flags"]))
    labels = load_array(os.path.join(run.work, result["labels"]))
    used = 0
    for lo in range(start, end, CHUNK):
        hi = min(end, lo + CHUNK)
        flags = np.unpackbits(packed[(lo - start) // 8:-(-(hi - start) // 8)],
                              bitorder="little", count=hi - lo).astype(bool)
        count = int(np.count_nonzero(flags))
        here = labels[used:used + count].astype(np.int64)
        used += count
        out = gone[np.searchsorted(gone, lo):np.searchsorted(gone, hi)] - lo
        if len(out):
            here = here[~np.isin(np.flatnonzero(flags), out)]
            flags[out] = False
        yield lo, flags, here


def _hit_runs(run) -> list[str]:
    """Runs of the flagged records (their base indices) whose digest an
    excluded dataset holds: equal digests merged as ``fastdata dedup``
    merges them."""
    from fastdata.jobs.sorted_runs import RunWriter, combine_runs, equal_runs, merged
    from fastdata.ops.dedup_pieces import ORDER

    mine = [r["run"] for r in run.results if "flags" in r and r["run"]]
    theirs = [r["run"] for r in run.results if "flags" not in r]
    paths = combine_runs([os.path.join(run.work, p) for p in mine + theirs], ORDER,
                         run.work, fan_in=MERGE_FAN_IN, chunk_rows=MERGE_CHUNK)
    writer = RunWriter(run.work, INDEX, ("index",), prefix="hits")
    for rows in equal_runs(merged(paths, ORDER, chunk_rows=MERGE_CHUNK), ("hi", "lo")):
        dataset = rows["dataset"]  # in order within a digest: the parent's (0) first
        if dataset[0] == 0 and dataset[-1] > 0:
            writer.add(np.ascontiguousarray(rows["index"][dataset == 0]).view(INDEX))
    return writer.close()


def _by_piece(paths: list[str], spans) -> Iterator[np.ndarray]:
    """The indices the runs ``paths`` hold, ascending, one array per span."""
    from fastdata.jobs.sorted_runs import merged

    chunks = merged(paths, ("index",), chunk_rows=MERGE_CHUNK) if paths else iter(())
    held = np.zeros(0, np.int64)
    for _, end in spans:
        while not len(held) or held[-1] < end:
            chunk = next(chunks, None)
            if chunk is None:
                break
            held = np.concatenate([held, chunk["index"]])
        cut = int(np.searchsorted(held, end))
        yield held[:cut]
        held = held[cut:]


def missing_keys(run, listed: list[str] | None) -> tuple[int, list[str]]:
    """How many of the keys given the parent does not hold, and the first 20."""
    from fastdata.jobs.files import load_array

    if listed is None:
        return 0, []
    seen = np.zeros(len(listed), bool)
    for result in run.results:
        if result.get("seen"):
            seen[load_array(os.path.join(run.work, result["seen"]))] = True
    missing = np.flatnonzero(~seen)
    return len(missing), [listed[i] for i in missing[:20].tolist()]


class Draw:
    """``fraction``'s draw: exactly ``round(fraction * m)`` of the ``m``
    flagged records (of each class with ``stratify``; ``groups``: the
    flagged records per label + 1): record r of a group is kept when a
    keyed bijection of the group's size sends its rank below that number.
    Taken a piece at a time, in order: the ranks go on across pieces."""

    def __init__(self, groups: np.ndarray, fraction: float, seed: int,
                 stratify: bool) -> None:
        from fastdata.order.bijection import Bijection, mix64

        # Group g + 1 is class g's records; group 0 the unlabelled ones (label -1).
        sizes = groups if stratify else np.asarray([int(groups.sum())])
        self.keep = np.rint(sizes * fraction).astype(np.int64)
        base = int(mix64(np.uint64(seed))[0])
        self.perms = [Bijection(int(size), base ^ g) if size else None
                      for g, size in enumerate(sizes)]
        self.done = np.zeros(len(sizes), np.int64)
        self.stratify = stratify

    def take(self, flags: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = np.flatnonzero(flags)
        group = labels + 1 if self.stratify else np.zeros(len(at), np.int64)
        chosen = np.zeros(len(at), bool)
        for g in np.unique(group).tolist():
            here = group == g
            rank = self.done[g] + np.arange(int(here.sum()))
            chosen[here] = self.perms[g].at(rank) < self.keep[g]
            self.done[g] += int(here.sum())
        out = np.zeros_like(flags)
        out[at[chosen]] = True
        return out, labels[chosen]


class Parts:
    """Flags of the base records, added in order, split into each part's
    selection (:class:`PartBits`)."""

    def __init__(self, counts: list[int]) -> None:
        self.parts = [PartBits(c) for c in counts]
        self.current = 0

    def add(self, flags: np.ndarray) -> None:
        at = 0
        while at < len(flags):
            part = self.parts[self.current]
            take = min(len(flags) - at, part.count - part.filled)
            part.add(flags[at:at + take])
            at += take
            if part.filled == part.count:
                self.current += 1

    @property
    def selected(self) -> int:
        return sum(p.selected for p in self.parts)

    def finish(self) -> list[dict | None]:
        return [p.finish() for p in self.parts]


class PartBits:
    """One part's flags, added in order, as the selection a record stores:
    what ``Selection.from_mask_chunks`` makes of the same flags (runs while
    16 bytes a run take no more than the bitmap, else the bitmap), built
    with the flags packed (one bit per record) as they come."""

    def __init__(self, count: int) -> None:
        self.count, self.filled, self.selected = count, 0, 0
        self.bits = np.zeros(-(-count // 8), np.uint8)
        self.tail = np.zeros(0, bool)  # the flags not yet a whole byte
        self.last = False
        self.runs = 0
        self.starts: list | None = []
        self.stops: list | None = []

    def add(self, flags: np.ndarray) -> None:
        before = np.concatenate([[self.last], flags[:-1]])
        starts = np.flatnonzero(flags & ~before) + self.filled
        stops = np.flatnonzero(~flags & before) + self.filled
        self.runs += len(starts)
        if self.starts is not None and 16 * self.runs > self.count // 8 + 1:
            self.starts = self.stops = None  # a bitmap: the runs are not kept
        if self.starts is not None:
            self.starts.append(starts)
            self.stops.append(stops)
        joined = np.concatenate([self.tail, flags])
        whole = len(joined) // 8 * 8
        at = (self.filled - len(self.tail)) // 8
        self.bits[at:at + whole // 8] = np.packbits(joined[:whole], bitorder="little")
        self.tail = joined[whole:]
        self.filled += len(flags)
        self.selected += int(flags.sum())
        if len(flags):
            self.last = bool(flags[-1])

    def finish(self) -> dict | None:
        """The stored selection (None: every record)."""
        from fastdata.dataset.selection import Selection

        if self.selected == self.count:
            return None
        if self.starts is not None:
            stops = self.stops + ([np.asarray([self.count])] if self.last else [])
            none = np.zeros(0, np.int64)
            return Selection(self.count, starts=np.concatenate([none, *self.starts]),
                             stops=np.concatenate([none, *stops])).encode()
        if len(self.tail):
            self.bits[-1] = np.packbits(self.tail, bitorder="little")[0]
        # Selection(bits=) unpacks the bitmap (a byte per record) to count its
        # blocks, which encoding does not need: the stored form is made directly.
        bitmap = Selection.__new__(Selection)
        bitmap.parent_count, bitmap.bits, bitmap.count = self.count, self.bits, self.selected
        return bitmap.encode()

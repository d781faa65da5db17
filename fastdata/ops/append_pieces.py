"""``fastdata.append``'s key check as a job (see fastdata.jobs): which of a
source's keys a dataset holds already, found through sorted runs of key
hashes instead of a set of keys.

A piece hashes the keys of a range of the dataset's records (``key_piece``)
into one sorted run of rows (64-bit hash of the key, the side, the record's
index); the machine that runs the append hashes the source's keys the same
way, a chunk at a time, into runs of its own (:func:`source_runs`). The
runs are merged in hash order: a hash that both sides hold is a candidate,
and two keys are one only when their text is equal (so a collision of two
hashes never passes over or refuses an image). Candidates are checked in
the source's order as it is read again (:func:`confirm`), and what is
confirmed is written as a run of source positions that the append's source
streams to pass over them.

What grows with the records: 17 bytes per key (dataset and source) on disk
in the job's work folder, and 16 bytes per candidate and 16 per confirmed
key; in memory, one piece's rows in the process hashing it, ``RUN_ROWS``
rows (1.1 MB) while the source's keys are sorted, a chunk of at most
``MERGE_FAN_IN`` runs while merging, one group of equal hashes, and the
first ``SHOWN`` keys listed.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdata.errors import FastDataError
from fastdata.formats.reader import key_at
from fastdata.jobs.sorted_runs import MERGE_CHUNK, MERGE_FAN_IN
from fastdata.ops.piece_readers import described_reader

#: A key row: the key's 64-bit hash, its side, and its record index (the
#: dataset) or position in the source's order (the source).
KEY_ROW = np.dtype([("hash", "<u8"), ("side", "<u1"), ("index", "<i8")])
#: The rows' order: by hash, then the dataset's rows first, each in index order.
ORDER = ("hash", "side", "index")
DATASET, SOURCE = 0, 1
#: A candidate: a source position and the first dataset record of a key
#: with the same hash (one per distinct key of the group).
PAIR = np.dtype([("pos", "<i8"), ("index", "<i8")])
PAIR_ORDER = ("pos", "index")
#: A confirmed position of the source (a key the dataset holds).
POSITION = np.dtype([("pos", "<i8")])
#: A dataset record (of a confirmed key).
INDEX = np.dtype([("index", "<i8")])
#: Keys hashed at a time; rows a run holds (at most): 1.1 MB of key rows,
#: a bound the source's keys reach from 65,536 on, so that the memory of
#: the append does not grow past it (10^9 keys: 15,259 runs, merged in
#: three passes of ``MERGE_FAN_IN``).
KEY_BATCH, RUN_ROWS = 1 << 14, 1 << 16

#: Keys listed in a refusal or a summary.
SHOWN = 10


def key_hashes(keys: Iterable[str]) -> np.ndarray:
    """A 64-bit hash (BLAKE2b) of each key's UTF-8 text."""
    joined = b"".join(hashlib.blake2b(k.encode("utf-8", "surrogatepass"),
                                      digest_size=8).digest() for k in keys)
    return np.frombuffer(joined, "<u8")


def key_rows(keys: list[str], side: int, start: int) -> np.ndarray:
    """Rows of ``keys``, the first at index (or position) ``start``."""
    rows = np.empty(len(keys), KEY_ROW)
    rows["hash"] = key_hashes(keys)
    rows["side"] = side
    rows["index"] = np.arange(start, start + len(keys), dtype=np.int64)
    return rows


def keys_of(reader, lo: int, hi: int) -> list[str]:
    """The keys of records ``lo..hi`` of ``reader`` (those ``reader.keys``
    gives), each read with ``key_of``: a sharded pack reads the piece of the
    keys file that holds it, not the whole list; a version reads its parts'."""
    parts, record = getattr(reader, "parts", None), getattr(reader, "record", None)
    if parts is None:
        return [key_at(reader, i) for i in range(lo, hi)]
    if record is None or any(p.selection is not None for p in record.parts):
        return list(reader.keys[lo:hi])  # a view's: through its selections
    out: list[str] = []
    first = 0
    for part in parts:  # a version: its parts' records one after another
        a, b = max(lo, first), min(hi, first + len(part))
        if a < b:
            out += keys_of(part, a - first, b - first)
        first += len(part)
    return out


def key_piece(number: int, piece: tuple, work: str, spec: dict) -> dict:
    """Hash the keys of records ``piece`` (``(start, end)``) of the dataset
    ``spec`` (fastdata.ops.piece_readers.describe_dataset) into one sorted run in ``work``; a
    rerun writes the same file."""
    from fastdata.jobs.sorted_runs import write_run

    start, end = piece
    reader = described_reader(spec)
    rows = np.concatenate([key_rows(keys_of(reader, at, min(end, at + KEY_BATCH)),
                                    DATASET, at)
                           for at in range(start, end, KEY_BATCH)] or [np.empty(0, KEY_ROW)])
    name = f"keys-{number:06d}.npy"
    write_run(os.path.join(work, name), rows, ORDER)
    return {"run": name, "records": end - start}


def source_runs(keys: Iterable[str], folder: str) -> tuple[list[str], int]:
    """``keys`` (the source's, in its order) hashed into sorted runs in
    ``folder``; returns the runs and how many keys there were."""
    from fastdata.jobs.sorted_runs import RunWriter

    writer = RunWriter(folder, KEY_ROW, ORDER, rows_in_memory=RUN_ROWS, prefix="source")
    batch: list[str] = []
    count = 0
    for key in keys:
        batch.append(key)
        if len(batch) == KEY_BATCH:
            writer.add(key_rows(batch, SOURCE, count))
            count += len(batch)
            batch = []
    if batch:
        writer.add(key_rows(batch, SOURCE, count))
        count += len(batch)
    return writer.close(), count


def both_sides(paths: list[str], folder: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(dataset indices, source positions)`` of each hash both sides hold,
    from the runs ``paths`` merged in hash order."""
    from fastdata.jobs.sorted_runs import combine_runs, equal_runs, merged

    paths = combine_runs(paths, ORDER, folder, fan_in=MERGE_FAN_IN, chunk_rows=MERGE_CHUNK)
    for rows in equal_runs(merged(paths, ORDER, chunk_rows=MERGE_CHUNK), ("hash",)):
        side = rows["side"]
        if side[0] == side[-1]:  # sorted by side: one side only
            continue
        yield rows["index"][side == DATASET], rows["index"][side == SOURCE]


def candidates(paths: list[str], key_of: Callable[[int], str], folder: str) -> list[str]:
    """Runs of candidate pairs, in source order: for each source position
    whose key's hash the dataset holds, the first record of each distinct
    dataset key of that hash (one, unless two keys' hashes collide)."""
    from fastdata.jobs.sorted_runs import RunWriter

    writer = RunWriter(folder, PAIR, PAIR_ORDER, rows_in_memory=RUN_ROWS, prefix="pairs")
    for mine, theirs in both_sides(paths, folder):
        firsts: dict[str, int] = {}  # one group's keys: one, or a collision's few
        for index in mine.tolist():
            firsts.setdefault(key_of(index), index)
        pairs = np.empty(len(theirs) * len(firsts), PAIR)
        pairs["pos"] = np.repeat(theirs, len(firsts))
        pairs["index"] = np.tile(np.asarray(list(firsts.values()), np.int64), len(theirs))
        writer.add(pairs)
    return writer.close()


@dataclass
class Clashes:
    """The source's keys the dataset holds.

    Attributes:
        paths: runs of their positions in the source's order (``POSITION`` rows).
        count: how many of the source's entries have such a key.
        distinct: how many distinct keys those are.
        first: the first ``SHOWN`` of their keys, sorted, repeats included;
            ``first_distinct`` the same without repeats.
    """

    paths: list[str] = field(default_factory=list)
    count: int = 0
    distinct: int = 0
    first: list[str] = field(default_factory=list)
    first_distinct: list[str] = field(default_factory=list)

    def positions(self) -> Iterator[np.ndarray]:
        """The positions, ascending, a chunk at a time."""
        from fastdata.jobs.sorted_runs import merged

        if self.paths:
            for rows in merged(self.paths, ("pos",), chunk_rows=MERGE_CHUNK):
                yield rows["pos"]


def confirm(keys: Iterable[str], pair_paths: list[str], key_of: Callable[[int], str],
            folder: str) -> Clashes:
    """Read the source's ``keys`` again, in order, and keep each candidate
    whose key is its dataset record's key, letter for letter."""
    from fastdata.jobs.sorted_runs import RunWriter

    found = Clashes()
    if not pair_paths:
        return found
    positions = RunWriter(folder, POSITION, ("pos",), rows_in_memory=RUN_ROWS,
                          prefix="clashes")
    records = RunWriter(folder, INDEX, ("index",), rows_in_memory=RUN_ROWS,
                        prefix="clash-records")
    held: list[tuple[int, int]] = []  # (position, record), written a batch at a time
    waiting = _pairs_by_position(pair_paths)
    pos_next, indices = next(waiting, (None, None))
    for pos, key in enumerate(keys):
        if pos_next is None:
            break
        if pos != pos_next:
            continue
        hit = next((i for i in indices if key_of(i) == key), None)
        pos_next, indices = next(waiting, (None, None))
        if hit is None:
            continue
        held.append((pos, hit))
        found.count += 1
        _keep_least(found.first, key, distinct=False)
        _keep_least(found.first_distinct, key, distinct=True)
        if len(held) == KEY_BATCH:
            _flush(held, positions, records)
    _flush(held, positions, records)
    found.paths = positions.close()
    found.distinct = _distinct(records.close())
    return found


def _pairs_by_position(paths: list[str]) -> Iterator[tuple[int, list[int]]]:
    """``(position, its candidate records)`` in position order."""
    from fastdata.jobs.sorted_runs import group_chunks, merged

    for rows in group_chunks(merged(paths, PAIR_ORDER, chunk_rows=MERGE_CHUNK), ("pos",)):
        pos, index = rows["pos"], rows["index"]
        bounds = np.flatnonzero(np.diff(pos)) + 1
        for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(pos)]):
            yield int(pos[lo]), index[lo:hi].tolist()


def _flush(held: list[tuple[int, int]], positions, records) -> None:
    if held:
        pairs = np.asarray(held, np.int64)
        positions.add(pairs[:, 0].copy().view(POSITION))
        records.add(pairs[:, 1].copy().view(INDEX))
        held.clear()


def _keep_least(kept: list[str], key: str, *, distinct: bool) -> None:
    """Keep the ``SHOWN`` least keys seen in ``kept`` (a sorted list)."""
    if (distinct and key in kept) or (len(kept) == SHOWN and key >= kept[-1]):
        return
    bisect.insort(kept, key)
    del kept[SHOWN:]


def _distinct(paths: list[str]) -> int:
    """How many distinct values the runs ``paths`` of ``index`` rows hold."""
    from fastdata.jobs.sorted_runs import merged

    count, last = 0, None
    for rows in merged(paths, ("index",), chunk_rows=MERGE_CHUNK):
        values = rows["index"]
        count += int(np.count_nonzero(values[1:] != values[:-1])) + 1
        if last is not None and values[0] == last:
            count -= 1
        last = values[-1]
    return count


def shared_keys(mine, theirs, folder: str) -> tuple[int, list[str]]:
    """The keys two readers both hold (the parts of two appends): how many
    distinct ones, and the first ``SHOWN`` of them, sorted; through sorted
    runs in ``folder`` (memory: a chunk and one group of equal hashes)."""
    from fastdata.jobs.sorted_runs import RunWriter

    writer = RunWriter(folder, KEY_ROW, ORDER, rows_in_memory=RUN_ROWS, prefix="shared")
    for side, reader in ((DATASET, mine), (SOURCE, theirs)):
        for at in range(0, len(reader), KEY_BATCH):
            writer.add(key_rows(keys_of(reader, at, min(len(reader), at + KEY_BATCH)),
                                side, at))
    count, first = 0, []
    for a, b in both_sides(writer.close(), folder):
        both = {key_at(mine, i) for i in a.tolist()} & \
            {key_at(theirs, i) for i in b.tolist()}  # one group's keys
        count += len(both)
        for key in both:
            _keep_least(first, key, distinct=True)
    return count, first


class AppendSource:
    """A source's entries relabelled to the dataset's classes (its own new
    ones appended), without the entries ``clashes`` lists when ``skip``."""

    def __init__(self, source, classes: list[str], clashes, skip: bool) -> None:
        self.source = source
        self.classes = classes
        self._labels = [classes.index(c) for c in source.classes]
        if clashes.count and not skip:
            raise FastDataError(
                f"{clashes.count:,} key(s) of the source are in the dataset already "
                f"({listed(clashes.first, clashes.count)}); append only new images, or "
                f"pass skip_existing=True (CLI: --skip-existing) to pass over them")
        self.clashes = clashes
        self._count = len(source) - clashes.distinct

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        passed = self._passed()
        after = next(passed, None)  # the next position to pass over
        for pos, entry in enumerate(self.source):
            if pos == after:
                after = next(passed, None)
                continue
            label = self._labels[entry.label] if entry.label >= 0 else entry.label
            yield entry if label == entry.label else dataclasses.replace(entry, label=label)

    def _passed(self):
        for chunk in self.clashes.positions():
            yield from chunk.tolist()

    def describe(self) -> dict[str, Any]:
        return self.source.describe()

    def warnings(self) -> list[str]:
        return self.source.warnings()


def listed(first: list[str], count: int) -> str:
    """The first keys (sorted) of ``count``, as a refusal lists them."""
    return ", ".join(first[:SHOWN]) + (" ..." if count > SHOWN else "")

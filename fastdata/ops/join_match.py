"""A join's merge, after its pieces ran (no torch; see fastdata.ops.join).

The pieces' sorted runs (fastdata.ops.join_pieces) are streamed in hash
order and each group of equal hashes classified: one record and one row is
a match (its keys compared later as text); a record alone has no row; rows
alone are keys the dataset lacks; anything else (a key the dataset holds
twice, a key given twice, a hash collision) is grouped again by the keys'
text. The matches are sorted by record and checked in one pass in record
order (:func:`verify`), which also finds each column's kind and codes the
label column's class names; :func:`record_chunks` reads them back a chunk
of records at a time for the column files (fastdata.ops.join_columns).

What grows, per process: nothing with the record count past the sizes
given below. A chunk of each run while merging (``MERGE_FAN_IN`` runs of
``MERGE_CHUNK`` rows of 25 bytes, then of ``MERGE_CHUNK`` matches of 17 bytes),
``MATCH_ROWS`` matches before they are spilled, ``CHUNK`` records in record
order, and the new class names of a label column. On disk: 17 bytes per
match (sorted runs) and 24 bytes per match (in record order).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

from fastdata.errors import FastDataError
from fastdata.ops.join_errors import check_columns, raise_first_error
from fastdata.ops.join_pieces import (
    DATASET,
    LOCAL_BITS,
    MIN_PIECE_RECORDS,
    ORDER,
    SHOWN,
)
from fastdata.ops.join_stores import NOT_A_NAME, STR, gather

#: Runs a merge reads at once, and rows it loads of each at a time: no more
#: than a dataset piece holds (``MIN_PIECE_RECORDS``), so that the buffers
#: are full whatever the record count and the merge's memory (about three
#: times ``MERGE_FAN_IN * MERGE_CHUNK`` rows, 20 MB) does not grow with it.
MERGE_FAN_IN, MERGE_CHUNK = 64, MIN_PIECE_RECORDS
#: Matches held before they are spilled as a sorted run (140 KB): short runs,
#: so that from about 6 * 10^5 matches on their merge reads ``MERGE_FAN_IN``
#: of them at once and its memory (27 MB) no longer grows (a billion
#: records: 122,071 runs, merged in three passes, as with longer runs).
MATCH_ROWS = 8192
#: A match from the merge: the record, the table row's position, and
#: whether their keys were already compared as text.
MATCH = np.dtype([("index", "<i8"), ("pos", "<i8"), ("checked", "u1")])
#: A matched record: its index, the table row's position, its label's code
#: (-1: it keeps its label; else a class, see :class:`Verified`).
MATCHED = np.dtype([("index", "<i8"), ("pos", "<i8"), ("label", "<i8")])
#: Records (or matches) handled at a time in record order.
CHUNK = 8192


def key_text(key: bytes) -> str:
    """A key as stored (its UTF-8, surrogates kept) back as text."""
    return key.decode("utf-8", "surrogatepass")


def smallest(kept: np.ndarray, found, shown: int) -> np.ndarray:
    """The ``shown`` least of ``kept`` and ``found`` (distinct values)."""
    found = np.asarray(found, np.int64)
    if not len(found):
        return kept
    return np.unique(np.concatenate([kept, found]))[:shown]


class PieceStores:
    """The stores the pieces wrote (fastdata.ops.join_stores), read by record
    index (the dataset's keys) or by table row position."""

    def __init__(self, work: str, results: list[dict]) -> None:
        mine = [r for r in results if r["side"] == "dataset"]
        self.work, self.parts = work, [r for r in results if r["side"] == "table"]
        self.starts = np.array([r["start"] for r in mine], np.int64)
        self.keys = [os.path.join(work, r["keys"]) for r in mine]
        self.stored = [{name: j for j, name in enumerate(r["stored"])} for r in self.parts]

    def dataset_keys(self, index: np.ndarray) -> list[bytes]:
        """The keys of records ``index``, as stored."""
        def locate(at):
            piece = np.searchsorted(self.starts, at, side="right") - 1
            return piece, at - self.starts[piece]

        return gather(np.asarray(index, np.int64), self.keys.__getitem__, locate,
                      blobs=True)[1]

    def table(self, what: str, pos: np.ndarray, *, blobs: bool):
        """Rows of the ``"keys"``, ``"label"`` or a column's stores at ``pos``,
        and their bytes with ``blobs`` (as :func:`gather` gives them)."""
        def prefix(part: int) -> str | None:
            base = os.path.join(self.work, self.parts[part]["prefix"])
            if what in ("keys", "label"):
                return f"{base}.{what}"
            j = self.stored[part].get(what)
            return None if j is None else f"{base}.c{j:04d}"

        return gather(np.asarray(pos, np.int64), prefix,
                      lambda at: (at >> LOCAL_BITS, at & ((1 << LOCAL_BITS) - 1)),
                      blobs=blobs)


class Matcher:
    """A join's merge over the results of its pieces (``run``: a
    fastdata.jobs.runner.JobRun; ``plan``: the table's plan; ``options``: the
    join's key, columns, label column and types; ``n``: the records)."""

    def __init__(self, run, plan: dict, options: dict, n: int, table: str) -> None:
        self.run, self.plan, self.options, self.n, self.table = run, plan, options, n, table
        self.stores = PieceStores(run.work, run.results)
        self.parts = self.stores.parts
        self.missing = self.unknown = np.zeros(0, np.int64)
        self.duplicate: int | None = None
        self.names = list(dict.fromkeys(c for r in self.parts if "names" in r
                                        for c in r["names"]))
        if options["columns"] is not None:
            self.columns = list(options["columns"])
        else:
            self.columns = [c for c in self.names
                            if c not in (options["key"], options["label_column"])]

    def match(self, classes: list[str] | None) -> Verified:
        """Merge the runs in hash order, check the matches in record order,
        and raise the error an in-order read of the table meets first.

        Args:
            classes: the dataset's classes, with a label column (else None).

        Raises:
            FastDataError: the table's first error (see
                fastdata.ops.join_errors), a table without rows, a column
                it lacks, no row matching any record.
        """
        paths = self._merge()
        found = verify(self._sorted_matches(paths), self.stores, self.columns, classes,
                       os.path.join(self.run.work, "matched.bin"))
        options = self.options
        raise_first_error(self.plan, self.parts, options, self.table,
                          duplicate=self.duplicate, label_error=found.label_error)
        found.rows = sum(r["rows"] for r in self.parts)
        if not found.rows:
            raise FastDataError("the table has no rows", path=self.table)
        check_columns(self.names, options, self.table)
        if not found.matched:
            first = self.stores.dataset_keys(np.zeros(1, np.int64))[0] if self.n else b""
            raise FastDataError(f"no row of the table matches a record's key (column "
                                f"{options['key']!r}; keys look like "
                                f"{key_text(first)!r})", path=self.table)
        nulls = [(p << LOCAL_BITS) + r for p, part in enumerate(self.parts)
                 for r in part["nulls"]]
        found.missing = smallest(self.missing, found.missing, SHOWN)
        found.unknown = smallest(smallest(self.unknown, found.unknown, SHOWN), nulls, SHOWN)
        return found

    def _merge(self) -> list[str]:
        """The matches, as sorted runs by record (not yet checked by text)."""
        from fastdata.jobs.sorted_runs import (
            RunWriter,
            combine_runs,
            group_chunks,
            merged,
        )

        work = self.run.work
        paths = [os.path.join(work, r["run"]) for r in self.run.results
                 if r["side"] == "dataset"]
        paths += [os.path.join(work, name) for r in self.parts for name in r["runs"]]
        paths = combine_runs(paths, ORDER, work, fan_in=MERGE_FAN_IN,
                             chunk_rows=MERGE_CHUNK, prefix="keys-combined")
        writer = RunWriter(os.path.join(work, "matches"), MATCH, ("index",),
                           rows_in_memory=MATCH_ROWS, prefix="matches")
        for rows in group_chunks(merged(paths, ORDER, chunk_rows=MERGE_CHUNK),
                                 ("hi", "lo")):
            self._classify(rows, writer)
        return writer.close()

    def _sorted_matches(self, paths: list[str]):
        from fastdata.jobs.sorted_runs import combine_runs, merged

        folder = os.path.join(self.run.work, "matches")
        paths = combine_runs(paths, ("index",), folder, fan_in=MERGE_FAN_IN,
                             chunk_rows=MERGE_CHUNK, prefix="combined")
        return merged(paths, ("index",), chunk_rows=MERGE_CHUNK)

    def _classify(self, rows: np.ndarray, writer) -> None:
        """Whole groups of equal hashes: one record and one row is a match
        (its keys compared later, in record order); a record alone has no
        row; rows alone are keys the dataset lacks; anything else is
        resolved by the keys' text."""
        change = (rows["hi"][1:] != rows["hi"][:-1]) | (rows["lo"][1:] != rows["lo"][:-1])
        starts = np.concatenate([[0], np.flatnonzero(change) + 1])
        sizes = np.diff(np.append(starts, len(rows)))
        mine = np.add.reduceat((rows["side"] == DATASET).astype(np.int64), starts)
        theirs = sizes - mine
        pair, alone, nobody = (mine == 1) & (theirs == 1), (mine == 1) & (theirs == 0), \
            mine == 0
        at = starts[pair]
        found = np.zeros(len(at), MATCH)
        found["index"], found["pos"] = rows["pos"][at], rows["pos"][at + 1]
        writer.add(found)
        self.missing = smallest(self.missing, rows["pos"][starts[alone]], SHOWN)
        unknown = rows["pos"][np.repeat(nobody, sizes)]
        if len(unknown) > SHOWN:
            unknown = np.partition(unknown, SHOWN)[:SHOWN]
        self.unknown = smallest(self.unknown, unknown, SHOWN)
        rest = ~(pair | alone | nobody)
        if rest.any():
            self._resolve(rows[np.repeat(rest, sizes)], writer)

    def _resolve(self, rows: np.ndarray, writer) -> None:
        """Groups of equal hashes with several records or rows (a key the
        dataset holds twice, a key given twice, a collision): grouped again
        by the keys' text. A key of several records matches its last one,
        as an in-memory join's ``{key: index}`` does."""
        side = rows["side"] == DATASET
        texts: list[bytes] = [b""] * len(rows)
        for at, fetched in ((np.flatnonzero(side), self.stores.dataset_keys),
                            (np.flatnonzero(~side), lambda p: self.stores.table(
                                "keys", p, blobs=True)[1])):
            for k, text in zip(at.tolist(), fetched(rows["pos"][at])):
                texts[k] = text
        groups: dict[tuple, tuple[list, list]] = {}
        for hi, lo, s, pos, text in zip(rows["hi"].tolist(), rows["lo"].tolist(),
                                        side.tolist(), rows["pos"].tolist(), texts):
            groups.setdefault((hi, lo, text), ([], []))[0 if s else 1].append(pos)
        found = []
        for records, positions in groups.values():
            if not records:
                self.unknown = smallest(self.unknown, positions, SHOWN)
            elif not positions:
                self.missing = smallest(self.missing, records[:1], SHOWN)
            else:
                found.append((records[-1], positions[0], 1))
                if len(positions) > 1:
                    self.duplicate = positions[1] if self.duplicate is None else \
                        min(self.duplicate, positions[1])
        if found:
            writer.add(np.array(found, MATCH))


# -- the passes in record order ---------------------------------------------------------

class Verified:
    """What the pass over the matches in record order found: the matches
    whose keys are equal as text (``path``: :data:`MATCHED` rows, record
    order), each column's :class:`~fastdata.ops.join_columns.Aggregate`, the
    records and table rows left unmatched (the first ``SHOWN``), the labels'
    new classes, and (after :meth:`Matcher.match`) the table's ``rows``.

    A label code is a class of the dataset (``< classes``), or ``classes +
    k`` for the k-th new class name met; :meth:`new_classes` orders them as
    the table's rows first name them."""

    def __init__(self, path: str, columns: list[str], classes: list[str]) -> None:
        from fastdata.ops.join_columns import Aggregate

        self.path, self.matched, self.rows = path, 0, 0
        self.aggregates = {name: Aggregate() for name in columns}
        self.missing = np.zeros(0, np.int64)
        self.unknown = np.zeros(0, np.int64)
        self.label_error: int | None = None
        self._classes = {}
        for number, name in enumerate(classes):
            self._classes.setdefault(name, number)
        self.count = len(classes)
        self._new: dict[str, list[int]] = {}  # name -> [k, first position]

    def codes(self, tags: np.ndarray, blobs: list[bytes], pos: np.ndarray) -> np.ndarray:
        """The label codes of rows ``pos`` (their label stores' ``tags`` and
        bytes): -1 where a row gives no class name."""
        codes = np.full(len(tags), -1, np.int64)
        bad = np.flatnonzero(tags == NOT_A_NAME)
        if len(bad):
            first = int(pos[bad].min())
            self.label_error = first if self.label_error is None else \
                min(self.label_error, first)
        for k in np.flatnonzero(tags == STR).tolist():
            name = blobs[k].decode("utf-8", "surrogatepass")
            code = self._classes.get(name)
            if code is None:
                seen = self._new.setdefault(name, [len(self._new), int(pos[k])])
                seen[1] = min(seen[1], int(pos[k]))
                code = self.count + seen[0]
            codes[k] = code
        return codes

    def new_classes(self) -> tuple[list[str], np.ndarray]:
        """The new class names in the order the table names them, and each
        code's class (``remap[code - classes]``)."""
        ordered = sorted(self._new, key=lambda name: self._new[name][1])
        remap = np.zeros(len(ordered), np.int64)
        for rank, name in enumerate(ordered):
            remap[self._new[name][0]] = self.count + rank
        return ordered, remap


def verify(matches: Iterable[np.ndarray], stores: PieceStores, columns: list[str],
           classes: list[str] | None, path: str) -> Verified:
    """One pass over the merge's matches in record order (chunks of
    :data:`MATCH` rows): a match found by hash alone is kept if the record's
    key and the row's are the same text, else both are unmatched (a hash
    collision); each column's values are aggregated and the label column's
    names coded. The kept matches are written to ``path``."""
    found = Verified(path, columns, classes or [])
    with open(path, "wb") as out:
        for chunk in matches:
            unsure = np.flatnonzero(chunk["checked"] == 0)
            if len(unsure):
                mine = stores.dataset_keys(chunk["index"][unsure])
                theirs = stores.table("keys", chunk["pos"][unsure], blobs=True)[1]
                other = unsure[[a != b for a, b in zip(mine, theirs)]]
                if len(other):
                    found.missing = smallest(found.missing, chunk["index"][other], SHOWN)
                    found.unknown = smallest(found.unknown, chunk["pos"][other], SHOWN)
                    chunk = np.delete(chunk, other)
            rows = np.zeros(len(chunk), MATCHED)
            rows["index"], rows["pos"] = chunk["index"], chunk["pos"]
            for name in columns:
                found.aggregates[name].add(stores.table(name, chunk["pos"], blobs=False)[0])
            if classes is not None:
                tags, blobs = stores.table("label", chunk["pos"], blobs=True)
                rows["label"] = found.codes(tags["tag"], blobs, chunk["pos"])
            else:
                rows["label"] = -1
            out.write(rows.tobytes())
            found.matched += len(rows)
    return found


def record_chunks(verified: Verified, stores: PieceStores, kinds: dict[str, str],
                  records: int):
    """``(count, at, {column: (rows, blobs)}, label codes)`` for each chunk of
    ``CHUNK`` records in order (``at``: the chunk's records with a row),
    reading the matches back a chunk at a time; ``kinds``: each column's
    kind (a number's or a bool's bytes are not read)."""
    done = 0
    for start in range(0, records, CHUNK):
        count = min(CHUNK, records - start)
        rows = np.fromfile(verified.path, MATCHED, count=CHUNK,
                           offset=done * MATCHED.itemsize)
        rows = rows[:int(np.searchsorted(rows["index"], start + count))]
        done += len(rows)
        pos = rows["pos"]
        columns = {name: stores.table(name, pos, blobs=kind not in ("number", "bool"))
                   for name, kind in kinds.items()}
        yield count, rows["index"] - start, columns, rows["label"]

"""The plan of a pack: the source scanned once into a fixed list of entries, cut
into pieces.

A piece is a run of consecutive entries: for sharded formats one shard (so a
shard holds the records of ``shard_size`` entries, or of the entries whose
bytes fill ``shard_size``, one short for each image skipped), for LMDB and HDF5
a commit. Pieces are what a resumed pack keeps and what a cluster pack hands
to its workers; they depend only on the source and the options, so the output
never depends on how many processes or machines made it.

The plan is saved beside the partial output; ``--resume`` compares a fresh
scan and the options with it and refuses to continue when either changed.

What grows with the dataset: the entries file (one JSON line per entry, on
disk) and, in memory, the pieces' bounds (two integers per piece). The
entries are never held in memory together.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from itertools import zip_longest
from dataclasses import dataclass, field
from typing import Any

from fastdata.errors import FastDataError
from fastdata.packers.source import SourceEntry
from fastdata.records import metadata_json

#: Version of the saved plan (2: the entries in a file of their own).
PLAN_VERSION = 2
#: A piece of an LMDB or HDF5 pack (one commit) holds at most this many entries...
SINGLE_FILE_PIECE_ENTRIES = 1000
#: ... and at most this many source bytes.
SINGLE_FILE_PIECE_BYTES = 64 << 20
#: Up to this many entries, a refused resume names what was added, removed and
#: modified (sets of keys in memory); past it, the first entry that differs.
DIFF_DETAIL = 2_000_000


class ResumeRefused(FastDataError):
    """``--resume`` of a pack whose source or options changed."""


@dataclass(frozen=True, slots=True)
class PlanEntry:
    """What the plan knows of one source entry: enough to notice a change
    (its metadata by size and digest; -1 and "" when it has none)."""

    key: str
    label: int
    size: int
    mtime_ns: int
    metadata_size: int = -1
    metadata_digest: str = ""


@dataclass
class PackPlan:
    """The entries of a pack, in the order they are packed, and their pieces.

    ``pieces[k]`` is ``(start, end)``, the entries of piece k. The entries
    themselves are lines of the file ``entries_path`` (read with
    :meth:`entries`); ``digest`` is the SHA-256 of that file, ``labels`` the
    labels it holds.
    """

    count: int
    pieces: list[tuple[int, int]]
    classes: list[str]
    options: dict[str, Any]
    entries_path: str
    digest: str
    labels: set[int] = field(default_factory=set)

    @classmethod
    def build(cls, entries, classes: list[str], options: dict[str, Any], *, entries_path: str,
              sharded: bool, max_records: int | None = None, max_bytes: int | None = None,
              stored_size=None) -> "PackPlan":
        """The plan of ``entries`` (the source in pack order, read once, keeping
        no image bytes), its entries written to ``entries_path``. ``options``
        are what a resume must find unchanged. Sharded formats: a piece per
        shard, ``stored_size(key, label, size, encoding, metadata_size)`` the
        bytes a record takes in a shard (for a byte ``max_bytes``)."""
        if sharded:
            def framing(e: PlanEntry) -> int:
                return stored_size(e.key, e.label, max(e.size, 0), "jpeg",
                                   max(e.metadata_size, 0)) if stored_size \
                    else max(e.size, 0)
            pieces = Cutter(max_records, max_bytes, framing)
        else:
            pieces = Cutter(SINGLE_FILE_PIECE_ENTRIES, SINGLE_FILE_PIECE_BYTES,
                            lambda e: max(e.size, 0))
        sha = hashlib.sha256()
        labels: set[int] = set()
        with open(entries_path, "wb") as f:
            for entry in entries:
                planned = _plan_entry(entry)
                line = json.dumps(_entry_json(planned), ensure_ascii=True,
                                  separators=(",", ":")).encode("ascii") + b"\n"
                f.write(line)
                sha.update(line)
                labels.add(planned.label)
                pieces.add(planned)
        return cls(pieces.count, pieces.done(), list(classes), options, entries_path,
                   sha.hexdigest(), labels)

    def entries(self) -> Iterator[PlanEntry]:
        """The entries, in pack order, read from the entries file."""
        where = self.entries_path
        try:
            with open(where, encoding="ascii") as f:
                for line in f:
                    yield PlanEntry(*json.loads(line))
        except (OSError, ValueError, TypeError) as exc:
            raise ResumeRefused(f"the saved plan's entries cannot be read ({exc}); pack "
                                "again without --resume", path=where) from None

    def to_json(self) -> str:
        return json.dumps({
            "version": PLAN_VERSION, "classes": self.classes, "options": self.options,
            "pieces": self.pieces, "count": self.count, "entries_sha256": self.digest,
            "labels": sorted(self.labels),
        }, ensure_ascii=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, where: str, entries_path: str) -> "PackPlan":
        try:
            data = json.loads(text)
            if data.get("version") != PLAN_VERSION:
                raise ValueError(f"plan version {data.get('version')}")
            return cls(int(data["count"]), [tuple(p) for p in data["pieces"]],
                       data["classes"], data["options"], entries_path,
                       str(data["entries_sha256"]), set(data["labels"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ResumeRefused(f"the saved plan cannot be read ({exc}); pack again without "
                                "--resume", path=where) from None

    def check_same(self, fresh: "PackPlan", where: str) -> None:
        """Refuse to resume when the options or the source differ from ``fresh``."""
        changed = _changed_options(self.options, fresh.options)
        if changed:
            raise ResumeRefused(
                "cannot resume: the options differ from the interrupted pack's: "
                + "; ".join(changed) + ". Use the same options, or pack again without "
                "--resume", path=where)
        if self.classes != fresh.classes:
            raise ResumeRefused(
                f"cannot resume: the source's classes changed ({len(self.classes)} -> "
                f"{len(fresh.classes)}); pack again without --resume", path=where)
        if (self.count, self.digest) != (fresh.count, fresh.digest):
            diff = _source_changes(self, fresh)
            raise ResumeRefused(f"cannot resume: the source changed since the interrupted "
                                f"pack: {diff}; pack again without --resume", path=where)
        if self.pieces != fresh.pieces:  # another fastdata version cuts otherwise
            raise ResumeRefused("cannot resume: this fastdata cuts the pack into other "
                                "pieces than the one that was interrupted; pack again "
                                "without --resume", path=where)


def plan_entries(writer) -> str:
    """Where a pack writes its plan's entries as it scans: the writer's spool
    (the journal takes the file over; otherwise it goes with the writer)."""
    return os.path.join(writer.spool_folder, "plan-entries.jsonl")


class Cutter:
    """Consecutive pieces of at most ``max_records`` entries and ``max_bytes``
    (as ``framing(entry)`` counts each), cut as entries are added; a piece
    holds at least one entry; no limits: one piece."""

    def __init__(self, max_records: int | None, max_bytes: int | None,
                 framing: Callable[[PlanEntry], int]) -> None:
        self.max_records, self.max_bytes, self.framing = max_records, max_bytes, framing
        self.pieces: list[tuple[int, int]] = []
        self.count = 0
        self._start, self._in_piece, self._size = 0, 0, 0

    def add(self, entry: PlanEntry) -> None:
        stored = self.framing(entry) if self.max_bytes is not None else 0
        if self._in_piece and (
                (self.max_records is not None and self._in_piece >= self.max_records)
                or (self.max_bytes is not None and self._size + stored > self.max_bytes)):
            self.pieces.append((self._start, self.count))
            self._start, self._in_piece, self._size = self.count, 0, 0
        self._in_piece += 1
        self._size += stored
        self.count += 1

    def done(self) -> list[tuple[int, int]]:
        if self._in_piece:
            self.pieces.append((self._start, self.count))
            self._in_piece = 0
        return self.pieces


def _entry_json(e: PlanEntry) -> list:
    row = [e.key, e.label, e.size, e.mtime_ns]
    if e.metadata_digest:  # only entries with metadata: plans without stay as they were
        row += [e.metadata_size, e.metadata_digest]
    return row


def _plan_entry(entry: SourceEntry) -> PlanEntry:
    meta = _metadata_facts(getattr(entry, "metadata", None))
    if entry.data is not None:
        # Bytes held by the source: their digest stands for a file's mtime.
        digest = int.from_bytes(hashlib.sha256(entry.data).digest()[:7], "big")
        return PlanEntry(entry.key, entry.label, len(entry.data), digest, *meta)
    try:
        st = os.stat(entry.path)
        return PlanEntry(entry.key, entry.label, st.st_size, st.st_mtime_ns, *meta)
    except OSError:  # unreadable: skipped when packed
        return PlanEntry(entry.key, entry.label, -1, -1, *meta)


def _metadata_facts(metadata) -> tuple[int, str]:
    """(stored size, digest) of an entry's metadata, so that a resume notices
    metadata that changed; (-1, "") when it has none. Metadata that cannot be
    stored is digested by its repr (the pack skips that entry)."""
    if metadata is None:
        return -1, ""
    try:
        stored = metadata_json(metadata)
        size = len(stored)
    except (TypeError, ValueError):
        stored, size = repr(metadata).encode("utf-8", "backslashreplace"), -1
    return size, hashlib.sha256(stored).hexdigest()[:16]


def _changed_options(saved: dict, fresh: dict) -> list[str]:
    names = sorted(set(saved) | set(fresh))
    return [f"{name} {_show(fresh.get(name))} (was {_show(saved.get(name))})"
            for name in names if saved.get(name) != fresh.get(name)]


def _show(value) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _source_changes(saved: PackPlan, fresh: PackPlan) -> str:
    """What changed between two scans, in words ("" when nothing did)."""
    if max(saved.count, fresh.count) > DIFF_DETAIL:
        return _first_difference(saved, fresh)
    old = {e.key: e for e in saved.entries()}
    new = {e.key: e for e in fresh.entries()}
    added = [k for k in new if k not in old]
    removed = [k for k in old if k not in new]
    modified = [k for k in new if k in old and new[k] != old[k]]
    parts = []
    for words, keys in (("added", added), ("removed", removed), ("modified", modified)):
        if keys:
            parts.append(f"{len(keys)} file{'s' if len(keys) != 1 else ''} {words} "
                         f"(first: {keys[0]})")
    return ", ".join(parts) or "the order of the files changed"


def _first_difference(saved: PackPlan, fresh: PackPlan) -> str:
    """The first entry where two large scans differ, in words."""
    end = object()
    for i, (a, b) in enumerate(zip_longest(saved.entries(), fresh.entries(), fillvalue=end)):
        if a != b:
            was = "nothing" if a is end else repr(a.key)
            now = "nothing" if b is end else repr(b.key)
            return (f"{fresh.count:,} entries (was {saved.count:,}); entry {i:,} is {now} "
                    f"(was {was})")
    return f"{fresh.count:,} entries (was {saved.count:,})"

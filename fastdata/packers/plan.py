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
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from fastdata.errors import FastDataError
from fastdata.packers.source import SourceEntry
from fastdata.records import metadata_json

#: Version of the saved plan.
PLAN_VERSION = 1
#: A piece of an LMDB or HDF5 pack (one commit) holds at most this many entries...
SINGLE_FILE_PIECE_ENTRIES = 1000
#: ... and at most this many source bytes.
SINGLE_FILE_PIECE_BYTES = 64 << 20


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

    ``pieces[k]`` is ``(start, end)``, the entries of piece k.
    """

    entries: list[PlanEntry]
    pieces: list[tuple[int, int]]
    classes: list[str]
    options: dict[str, Any]

    @classmethod
    def build(cls, entries, classes: list[str], options: dict[str, Any], *,
              sharded: bool, max_records: int | None = None, max_bytes: int | None = None,
              stored_size=None) -> "PackPlan":
        """The plan of ``entries`` (the source in pack order, read once, keeping
        no image bytes). ``options`` are
        what a resume must find unchanged. Sharded formats: a piece per shard,
        ``stored_size(key, label, size, encoding, metadata_size)`` the bytes a
        record takes in a shard (for a byte ``max_bytes``)."""
        planned = [_plan_entry(e) for e in entries]
        if sharded:
            def framing(e: PlanEntry) -> int:
                return stored_size(e.key, e.label, max(e.size, 0), "jpeg",
                                   max(e.metadata_size, 0)) if stored_size \
                    else max(e.size, 0)
            pieces = cut(planned, max_records, max_bytes, framing)
        else:
            pieces = cut(planned, SINGLE_FILE_PIECE_ENTRIES, SINGLE_FILE_PIECE_BYTES,
                         lambda e: max(e.size, 0))
        return cls(planned, pieces, list(classes), options)

    def to_json(self) -> str:
        return json.dumps({
            "version": PLAN_VERSION, "classes": self.classes, "options": self.options,
            "pieces": self.pieces,
            "entries": [_entry_json(e) for e in self.entries],
        }, ensure_ascii=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, where: str) -> "PackPlan":
        try:
            data = json.loads(text)
            if data.get("version") != PLAN_VERSION:
                raise ValueError(f"plan version {data.get('version')}")
            return cls([PlanEntry(*e) for e in data["entries"]],
                       [tuple(p) for p in data["pieces"]], data["classes"], data["options"])
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
        diff = _source_changes(self.entries, fresh.entries)
        if diff:
            raise ResumeRefused(f"cannot resume: the source changed since the interrupted "
                                f"pack: {diff}; pack again without --resume", path=where)
        if self.pieces != fresh.pieces:  # another fastdata version cuts otherwise
            raise ResumeRefused("cannot resume: this fastdata cuts the pack into other "
                                "pieces than the one that was interrupted; pack again "
                                "without --resume", path=where)


def cut(entries: list[PlanEntry], max_records: int | None, max_bytes: int | None,
        framing) -> list[tuple[int, int]]:
    """Consecutive pieces of at most ``max_records`` entries and ``max_bytes``
    (as ``framing(entry)`` counts each); a piece holds at least one entry; no
    limits: one piece."""
    pieces: list[tuple[int, int]] = []
    start, count, size = 0, 0, 0
    for i, entry in enumerate(entries):
        stored = framing(entry) if max_bytes is not None else 0
        if count and ((max_records is not None and count >= max_records)
                      or (max_bytes is not None and size + stored > max_bytes)):
            pieces.append((start, i))
            start, count, size = i, 0, 0
        count += 1
        size += stored
    if count:
        pieces.append((start, len(entries)))
    return pieces


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


def _source_changes(saved: list[PlanEntry], fresh: list[PlanEntry]) -> str:
    """What changed between two scans, in words ("" when nothing did)."""
    if saved == fresh:
        return ""
    old = {e.key: e for e in saved}
    new = {e.key: e for e in fresh}
    added = [k for k in new if k not in old]
    removed = [k for k in old if k not in new]
    modified = [k for k in new if k in old and new[k] != old[k]]
    parts = []
    for words, keys in (("added", added), ("removed", removed), ("modified", modified)):
        if keys:
            parts.append(f"{len(keys)} file{'s' if len(keys) != 1 else ''} {words} "
                         f"(first: {keys[0]})")
    return ", ".join(parts) or "the order of the files changed"

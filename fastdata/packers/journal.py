"""What an interrupted pack leaves for ``--resume``: a folder beside the output,
``.NAME.pack-state/``, holding the plan (``plan.json``), the name of the partial
output (``partial``) and the journal of finished pieces (``journal.jsonl``).

A journal line is appended, flushed and fsynced after its piece is durable in
the partial output, so every line names a piece that can be taken back; a line
cut short by a crash is ignored. The folder goes when the pack is published.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from fastdata.errors import FastDataError
from fastdata.formats.output import fsync_dir, fsync_file
from fastdata.formats.output import remove_path
from fastdata.formats.writer import spool_of
from fastdata.packers.summary import ResumeCounts
from fastdata.records import PieceRecord

class PackInterrupted(FastDataError):
    """A pack stopped from outside (a lost Dask scheduler): like Ctrl-C, its
    finished pieces stay for ``--resume``."""


PLAN_FILE = "plan.json"
#: The plan's entries, one JSON line each (see plan.py).
ENTRIES_FILE = "plan-entries.jsonl"
PARTIAL_FILE = "partial"
JOURNAL_FILE = "journal.jsonl"


@dataclass
class PieceDone:
    """A journaled piece: what each of its entries became, and the writer's state."""

    number: int
    records: list[PieceRecord]
    #: Per entry: None for a record, or (key, reason) for a skipped image.
    skipped: list[tuple[str, str]]
    #: Per written record: (source_bytes, encoding, width, height).
    facts: list[tuple[int, str, int, int]]
    state: dict


def state_dir(output_stem: str) -> str:
    """The state folder of the output whose sidecars are named after ``output_stem``."""
    parent, base = os.path.split(output_stem)
    return os.path.join(parent, f".{base}.pack-state")


class PackJournal:
    """The state folder of one pack; it also counts what a resume kept and
    what it packed now (:meth:`resume_counts`)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._journal = None
        #: Set once every piece is written and the output is being published.
        self.finishing = False
        #: A resume: the pieces of the interrupted pack's plan (None: no resume).
        self._resumed_plan: int | None = None
        #: The pieces journaled by this run, and the records they hold.
        self._packed_now: set[int] = set()
        self._records_now = 0

    def exists(self) -> bool:
        return os.path.isfile(os.path.join(self.folder, PLAN_FILE))

    def start(self, plan, partial: str) -> None:
        """Begin a fresh state: the plan (its entries file moved in) and the
        partial output's name."""
        self.remove()
        os.makedirs(self.folder)
        entries = os.path.join(self.folder, ENTRIES_FILE)
        fsync_file(plan.entries_path)
        os.replace(plan.entries_path, entries)
        plan.entries_path = entries
        _write_durably(os.path.join(self.folder, PARTIAL_FILE), os.path.basename(partial))
        _write_durably(os.path.join(self.folder, PLAN_FILE), plan.to_json())
        fsync_dir(self.folder)
        fsync_dir(os.path.dirname(self.folder))

    def saved_plan(self):
        """The plan of the interrupted pack."""
        from fastdata.packers.plan import PackPlan

        with open(os.path.join(self.folder, PLAN_FILE), encoding="utf-8") as f:
            text = f.read()
        plan = PackPlan.from_json(text, self.folder, os.path.join(self.folder, ENTRIES_FILE))
        self._resumed_plan = len(plan.pieces)
        return plan

    def partial(self) -> str | None:
        """The partial output's path, when it is still there."""
        try:
            with open(os.path.join(self.folder, PARTIAL_FILE), encoding="utf-8") as f:
                name = f.read().strip()
        except OSError:
            return None
        path = os.path.join(os.path.dirname(self.folder), name)
        return path if name and os.path.lexists(path) else None

    def pieces(self) -> JournaledPieces:
        """The journaled pieces (a torn last line is left out), each read from
        the journal when asked for."""
        where: dict[int, tuple[int, int]] = {}
        path = os.path.join(self.folder, JOURNAL_FILE)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return JournaledPieces(path, where)
        with f:
            offset = 0
            for line in f:
                try:
                    number = _parse(json.loads(line)).number
                except (ValueError, KeyError, TypeError):
                    break  # cut short by a crash: nothing after it was journaled
                where[number] = (offset, len(line))
                offset += len(line)
        return JournaledPieces(path, where)

    def record(self, number: int, outcomes: list, state: dict) -> None:
        """Journal piece ``number`` durably. ``outcomes``: per entry, a record
        ``[key, label, crc, size, source_bytes, encoding, width, height]`` (and
        its metadata's JSON text when it has some) or a skip ``[key, reason]``."""
        if self._journal is None:
            self._journal = open(os.path.join(self.folder, JOURNAL_FILE), "a", encoding="utf-8")
        line = json.dumps({"piece": number, "outcomes": outcomes, "state": state},
                          ensure_ascii=True, separators=(",", ":"))
        self._journal.write(line + "\n")
        self._journal.flush()
        os.fsync(self._journal.fileno())
        self._packed_now.add(number)
        self._records_now += sum(len(outcome) != 2 for outcome in outcomes)

    def resume_counts(self, records: int) -> ResumeCounts | None:
        """What this run, a resume that ended with ``records`` records, took
        from the interrupted pack (every piece it did not journal itself, a
        piece lost from the partial output being journaled again) and what it
        packed now; None when it resumed nothing."""
        if self._resumed_plan is None:
            return None
        packed = len(self._packed_now)
        return ResumeCounts(kept_pieces=self._resumed_plan - packed,
                            kept_records=records - self._records_now,
                            packed_pieces=packed, packed_records=self._records_now)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class JournaledPieces(Mapping):
    """Journaled pieces by number, each parsed from its journal line when
    asked for: what a resume holds is two integers per piece, not its records.
    ``only`` limits it to some of them (the pieces a resume keeps)."""

    def __init__(self, path: str, where: dict[int, tuple[int, int]]) -> None:
        self.path, self._where = path, where

    def only(self, numbers) -> JournaledPieces:
        return JournaledPieces(self.path, {n: self._where[n] for n in numbers})

    def __getitem__(self, number: int) -> PieceDone:
        offset, length = self._where[number]
        with open(self.path, "rb") as f:
            f.seek(offset)
            return _parse(json.loads(f.read(length)))

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, number) -> bool:
        return number in self._where


def _parse(data: dict) -> PieceDone:
    records, skipped, facts = parse_outcomes(data["outcomes"])
    return PieceDone(int(data["piece"]), records, skipped, facts, dict(data["state"]))


def parse_outcomes(outcomes: list) -> tuple[list[PieceRecord], list, list]:
    """A piece's outcomes (see :meth:`PackJournal.record`) as its records, its
    skipped images ``(key, reason)`` and each record's ``(source_bytes,
    encoding, width, height)``."""
    records, skipped, facts = [], [], []
    for outcome in outcomes:
        if len(outcome) == 2:
            skipped.append((str(outcome[0]), str(outcome[1])))
            continue
        key, label, crc, size, source_bytes, encoding, width, height, *meta = outcome
        if len(meta) > 1 or (meta and not isinstance(meta[0], str)):
            raise ValueError("a record's metadata is not one JSON text")
        metadata = meta[0].encode("utf-8") if meta else None
        records.append(PieceRecord(key, int(label), int(crc), int(size), metadata))
        facts.append((int(source_bytes), str(encoding), int(width), int(height)))
    return records, skipped, facts


def _write_durably(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def remove_stale_partials(writer) -> None:
    """Remove the temporary outputs (``.NAME.partial-XXXX``, and their
    ``.records`` spools) that killed packs to this output left, other than
    ``writer``'s own. Only a pack holding the
    output's lock calls this, so none of them belongs to a running pack; a
    ``.old`` one (an old dataset moved aside by an interrupted overwrite) stays."""
    parent, own = os.path.split(writer.temp_path)
    spool = os.path.basename(spool_of(writer.temp_path))
    prefix = f".{os.path.basename(writer.path)}.partial-"
    for name in os.listdir(parent):
        if name.startswith(prefix) and name not in (own, spool) and not name.endswith(".old"):
            remove_path(os.path.join(parent, name))


# -- what a pack does with the state of an earlier, interrupted one ----------


def partial_to_resume(journal: PackJournal, output: str) -> str | None:
    if not journal.exists():
        return None  # killed before its plan was saved: the pack starts from the beginning
    partial = journal.partial()
    if partial is None:
        raise FastDataError("the partial output of the interrupted pack is gone; pack "
                            "again without --resume", path=output)
    return partial


def discard_earlier_partial(journal: PackJournal, note) -> None:
    """A pack without --resume starts over: the partial output of an earlier,
    interrupted pack to the same output goes (the lock says it is not running)."""
    if not journal.exists():
        return
    partial = journal.partial()
    if partial:
        remove_path(partial)
        remove_path(spool_of(partial))
    journal.remove()
    note("the partial output of an interrupted pack to this output was removed; "
               "--resume would have continued it")


def kept_for_resume(exc: BaseException) -> bool:
    """An interruption (Ctrl-C, SIGTERM, a lost Dask scheduler): the pieces
    written so far are kept for --resume. After an error (a full disk, a bad
    option) the partial output goes, as it always did: it would hold the space
    the error asks for."""
    return isinstance(exc, (KeyboardInterrupt, PackInterrupted))


def say_how_to_resume(exc: BaseException, journal: PackJournal) -> None:
    if isinstance(exc, FastDataError):
        return  # its own message says the pieces are kept
    done = len(journal.pieces())
    print(f"fastdata: {done} finished piece{'s' if done != 1 else ''} kept in "
          f"{journal.folder}; the same command with --resume continues the pack",
          file=sys.stderr)

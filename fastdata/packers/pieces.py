"""Writing a pack piece by piece, journaling each, so that an interrupted pack
can be resumed (``fastdata pack ... --resume``).

Each piece of the plan (see ``plan.py``) is either taken back from the partial
output of the interrupted run (its journal line says what its entries became,
and the writer checks it is whole) or prepared and written now, made durable
(``Writer.end_piece``) and journaled. Pieces are written in plan order, so a
resumed pack writes exactly what an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from fastdata.errors import BadImageError, FastDataError
from fastdata.formats.writer import PieceLost
from fastdata.packers.journal import PackJournal, PieceDone
from fastdata.packers.plan import PackPlan
from fastdata.packers.prepare import Prepared, SkippedFile
from fastdata.packers.source import SourceEntry
from fastdata.records import Record


def pieces_to_keep(writer, plan: PackPlan, journal: PackJournal, *, prefix_only: bool,
                   warn: Callable[[str], None]) -> Mapping[int, PieceDone]:
    """The journaled pieces a resumed pack keeps: each checked whole in the
    partial output. For a single-file format (``prefix_only``) the kept pieces
    are the whole ones from the first on, and they are taken back here."""
    journaled = journal.pieces()
    kept: list[int] = []
    lost: list[int] = []
    for number in range(len(plan.pieces)):
        piece = journaled.get(number)
        if piece is None:
            if prefix_only:
                break
            continue
        try:
            if prefix_only:
                writer.adopt_piece(number, piece.state, piece.records)
            else:
                writer.check_piece(number, piece.state, piece.records)
        except PieceLost:
            lost.append(number)
            if prefix_only:
                break
            continue
        kept.append(number)
    if prefix_only:
        writer.done_adopting()
    if lost:
        warn(f"piece {lost[0]} of the interrupted pack is not whole in its partial output"
             f"{f' (and {len(lost) - 1} more)' if len(lost) > 1 else ''}; "
             "it is packed again")
    return journaled.only(kept)


def entries_to_prepare(src, plan: PackPlan,
                       kept: Mapping[int, PieceDone]) -> Iterator[SourceEntry]:
    """The entries of the pieces not kept, in plan order (a second pass over the
    source, which gives the entries the plan was made from)."""
    skipped = sorted(plan.pieces[number] for number in kept)  # (start, end), in order
    planned = plan.entries()
    k = 0
    for i, entry in enumerate(src):
        expected = next(planned, None)
        if expected is None or entry.key != expected.key:
            raise FastDataError(f"the source gave entry {i} as {entry.key!r} on its second "
                                "pass; a Source must give the same entries each time",
                                key=entry.key)
        while k < len(skipped) and skipped[k][1] <= i:
            k += 1
        if not (k < len(skipped) and skipped[k][0] <= i):
            yield entry


def write_pieces(writer, plan: PackPlan, kept: Mapping[int, PieceDone], items: Iterator,
                 journal: PackJournal, tally, *, strict: bool, source_root: str | None,
                 adopted_already: bool, on_entries: Callable[[int], None]) -> None:
    """Every piece in plan order: kept ones taken back (and counted in
    ``tally``), the others written from ``items`` (prepared entries in the
    order of :func:`entries_to_prepare`), made durable and journaled."""
    items = iter(items)
    for number, (start, end) in enumerate(plan.pieces):
        piece = kept.get(number)
        if piece is not None:
            if not adopted_already:
                writer.adopt_piece(number, piece.state, piece.records)
            replay(piece, tally)
            on_entries(end - start)
            continue
        writer.begin_piece(number)
        outcomes = [_take(writer, next(items), tally, strict, source_root, on_entries)
                    for _ in range(start, end)]
        journal.record(number, outcomes, writer.end_piece(number))


def write_items(writer, items, tally, *, strict: bool, source_root: str | None,
                on_entries: Callable[[int], None]) -> None:
    """Write every prepared item, in order (formats that cannot resume)."""
    for item in items:
        _take(writer, item, tally, strict, source_root, on_entries)


def _take(writer, item, tally, strict: bool, source_root: str | None, on_entries) -> list:
    """Count one prepared item in ``tally`` and write it (a skipped image stops
    a strict pack); its journal outcome."""
    on_entries(1)
    if isinstance(item, SkippedFile):
        if strict:
            raise BadImageError(item.reason + " (strict=True stops at the first bad image)",
                                path=source_path(source_root, item.key), key=item.key)
        tally.skipped.append(item)
    else:
        tally.add(item)
    return write_outcome(writer, item)


def write_outcome(writer, item) -> list:
    """Write a prepared item (a skipped one is only noted); what the journal
    records of it: ``[key, label, crc, size, source_bytes, encoding, width,
    height(, metadata)]`` or ``[key, reason]``."""
    if isinstance(item, SkippedFile):
        return [item.key, item.reason]
    writer.write(Record(writer.count, item.key, item.label, item.payload,
                        item.encoding, item.width, item.height, item.metadata))
    outcome = [item.key, item.label, writer.last_crc, len(item.payload),
               item.source_bytes, item.encoding, item.width, item.height]
    if item.metadata is not None:
        # Formats that keep metadata in memory until finish take it back from here.
        outcome.append(item.metadata.decode("utf-8"))
    return outcome


def replay(piece: PieceDone, tally) -> None:
    """Count a kept piece's entries in ``tally`` as if they were packed now."""
    for record, (source_bytes, encoding, width, height) in zip(piece.records, piece.facts):
        tally.add(Prepared(record.key, record.label, source_bytes, b"", encoding, width,
                           height, record.metadata))
    tally.skipped.extend(SkippedFile(key, reason) for key, reason in piece.skipped)


def source_path(root: str | None, key: str) -> str:
    """The file of ``key`` for a message: keys are relative to the source's root
    folder, or to the folder of its list file."""
    import os

    if not root:
        return key
    return os.path.join(root if os.path.isdir(root) else os.path.dirname(root), key)

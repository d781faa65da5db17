"""``fastdata verify`` as a job (see fastdata.jobs): pieces check ranges of
records (each against its CRC-32, with ``decode`` its decoding) and ranges
of shard files (their SHA-256 and side files), in parallel; the machine
running the command checks the index, the keys and the metadata, and
merges the pieces' problems in piece order: the report a single process
gives (fastdata.formats.verify.check_dataset), problem for problem.

What grows with the dataset: nothing per record in any process (a piece
reads its records in batches); the problems found, as the report.
"""

from __future__ import annotations

from fastdata.ops.piece_readers import piece_reader

#: A piece checks at most this many records, or this many shard files.
PIECE_RECORDS, PIECE_SHARDS = 1 << 18, 64
#: The fewest records of a piece, and the pieces a job aims at below the most.
MIN_PIECE_RECORDS, TARGET_PIECES = 1024, 256


def plan_pieces(records: int, shards: int | None) -> list[list]:
    """``["records", start, end]`` pieces, then ``["files", first, last + 1]``
    (``shards`` None: one piece for every file). Depends only on the counts."""
    size = min(PIECE_RECORDS, max(MIN_PIECE_RECORDS, -(-records // TARGET_PIECES)))
    pieces = [["records", start, min(start + size, records)]
              for start in range(0, records, size)]
    if shards is None:
        return pieces + [["files", None, None]]
    step = min(PIECE_SHARDS, max(1, -(-shards // TARGET_PIECES)))
    return pieces + [["files", lo, min(lo + step, shards)] for lo in range(0, shards, step)]


def verify_piece(number: int, piece: list, work: str, spec: dict, decode: bool) -> dict:
    """Check one piece (see :func:`plan_pieces`) of the dataset ``spec``:
    ``{"checked": records checked, "problems": [...]}``."""
    from fastdata.formats.verify import check_record_range, with_key

    reader = piece_reader(spec)
    problems: list[dict] = []
    kind, lo, hi = piece
    if kind == "records":
        checked = check_record_range(reader, lo, hi, decode=decode,
                                     on_problem=problems.append, on_progress=lambda n: None)
        return {"checked": checked, "problems": problems}
    shards = None if lo is None else range(lo, hi)
    found = reader.check_files(shards=shards) if shards is not None else reader.check_files()
    return {"checked": 0, "problems": [with_key(reader, p) for p in found]}

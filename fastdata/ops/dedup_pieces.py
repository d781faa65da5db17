"""``fastdata dedup`` as a job (see fastdata.jobs): pieces hash their records
into sorted runs, a merge finds the runs of equal digests.

A piece is a range of ``PIECE_RECORDS`` records of one dataset (the last
one shorter). It reads them in stored order in batches, checks each against
its CRC-32, and writes one sorted run of rows (digest as two uint64, its
dataset, its index) into the job's work folder. The merge streams every run
in digest order (``fastdata.jobs.sorted_runs``) and keeps the rows of
repeated digests: only the duplicates become Python objects.

What grows with the datasets: 28 bytes per record on disk in the work
folder (the runs); in memory, a chunk of each run at a time while merging
(``sorted_runs.MERGE_CHUNK`` rows of at most ``MERGE_FAN_IN`` runs), one
piece's rows in the process hashing it, and the groups found.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from fastdata.ops.piece_readers import piece_reader

#: The most records of a piece: its rows (28 B each) are sorted in memory.
PIECE_RECORDS = 1 << 18
#: The fewest (the last piece of a dataset apart), and the pieces a job
#: aims at below ``PIECE_RECORDS``: enough to keep a cluster busy.
MIN_PIECE_RECORDS, TARGET_PIECES = 256, 256

#: Records read at a time by a piece.
READ_BATCH = 256
#: A digest row: the 16 digest bytes as two big-endian halves (so that
#: sorting the numbers sorts the bytes), the dataset and the record.
ROW = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("dataset", "<u4"), ("index", "<i8")])
#: The rows' order: by digest, then equal digests in dataset and index order.
ORDER = ("hi", "lo", "dataset", "index")


def piece_records(total: int) -> int:
    """Records per piece for a job over ``total`` records: about
    ``TARGET_PIECES`` pieces, within ``MIN_PIECE_RECORDS``..``PIECE_RECORDS``."""
    return min(PIECE_RECORDS, max(MIN_PIECE_RECORDS, -(-total // TARGET_PIECES)))


def plan_pieces(counts: list[int]) -> list[tuple[int, int, int]]:
    """``(dataset, start, end)`` of every piece: each dataset's records in
    ranges of :func:`piece_records`, the datasets one after another. Depends
    only on the counts, never on where the pieces run."""
    size = piece_records(sum(counts))
    return [(number, start, min(start + size, count))
            for number, count in enumerate(counts)
            for start in range(0, count, size)]


def digest_rows(digests: np.ndarray, dataset: int, start: int) -> np.ndarray:
    """Rows for ``digests`` (``(n, 16)`` uint8) of records ``start``.. of
    dataset ``dataset``."""
    rows = np.empty(len(digests), ROW)
    halves = np.ascontiguousarray(digests).view(">u8").reshape(-1, 2)
    rows["hi"], rows["lo"] = halves[:, 0], halves[:, 1]
    rows["dataset"] = dataset
    rows["index"] = np.arange(start, start + len(digests), dtype=np.int64)
    return rows


def digest_piece(number: int, piece: tuple, work: str, datasets: list[dict]) -> dict:
    """Hash the records of ``piece`` (``(dataset, start, end)``) and write
    their sorted run into ``work``; a rerun writes the same file. ``datasets``:
    how to open each dataset (``path``, ``version``, ``allow_outside``).

    Raises:
        CorruptDataError: a damaged record (named).
    """
    from fastdata.jobs.sorted_runs import write_run

    dataset, start, end = piece
    found = np.empty((end - start, 16), np.uint8)
    reader = piece_reader(datasets[dataset])
    for at in range(start, end, READ_BATCH):
        batch = range(at, min(at + READ_BATCH, end))
        for i, data in zip(batch, reader.read_many(batch, check=True)):
            found[i - start] = np.frombuffer(
                hashlib.blake2b(data, digest_size=16).digest(), np.uint8)
    name = f"digests-{number:06d}.npy"
    write_run(os.path.join(work, name), digest_rows(found, dataset, start), ORDER)
    return {"run": name, "records": end - start}


def hash_piece(number: int, piece: tuple, work: str, datasets: list[dict],
               flip: bool, firsts: list[int]) -> dict:
    """The near-duplicate hash (and with ``flip`` the mirror image's) of the
    records of ``piece``, written into ``work`` as a piece of hashes for
    ``fastdata.near_duplicates.near_pairs_from_runs`` (positions counted over
    every dataset: dataset ``d``'s record ``i`` is ``firsts[d] + i``).

    Raises:
        CorruptDataError: a damaged record (named).
        FastDataError: a record that does not decode (named).
    """
    from fastdata.errors import FastDataError
    from fastdata.near_duplicates import image_hash
    from fastdata.near_groups import write_hashes

    dataset, start, end = piece
    reader = piece_reader(datasets[dataset])
    shape = reader.manifest.raw_shape
    hashes = np.zeros((end - start, 2), np.uint64)
    for at in range(start, end, READ_BATCH):
        batch = range(at, min(at + READ_BATCH, end))
        for i, data in zip(batch, reader.read_many(batch, check=True)):
            try:
                hashes[i - start] = image_hash(data, raw_shape=shape)
            except (OSError, ValueError) as exc:
                raise FastDataError(f"record {i} does not decode for the near-duplicate "
                                    f"hash ({exc})", path=reader.path,
                                    key=reader.key_of(i), record=i) from None
    name = f"hashes-{number:06d}.npy"
    write_hashes(os.path.join(work, name), hashes[:, 0], start=firsts[dataset] + start,
                 queries=[hashes[:, 1]] if flip else [])
    return {"hashes": name, "records": end - start}

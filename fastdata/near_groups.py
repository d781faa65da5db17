"""Near-duplicate pairs over hashes kept in files, found by sorting (no
torch): every pair of records whose 63-bit hashes differ in at most
``threshold`` bits, with memory per process that does not grow with the
record count.

The index is multi-index hashing done with sorted runs. The hash's bits are
cut into ``m`` blocks and a table's key is ``j`` of them; two hashes within
``threshold`` bits differ in at most ``need`` bits of some table's key (the
``j`` blocks where they differ least: pigeonhole). Each record stands at every
key within ``radius`` bits of its own (its ball); with ``2 * radius >= need``
every such pair shares a ball key in some table. The job's pieces:

- :func:`index_piece`, one per file of hashes: per table, one row per record
  (and query): its key, hash and position, written as sorted runs.
- :func:`merge_piece`, where a table has more than ``RUNS_PER_TABLE`` runs:
  one per group of them.
- :func:`pairs_part`, one per range of a table's keys, read a block of keys at
  a time: the ball rows that land in a block come from a few blocks of the
  runs (the block xor the high bits of each offset), are moved by the offsets
  and sorted by key (one radix pass); in each group of one key every pair of
  rows is checked by popcount, many groups per numpy call. A pair is kept only
  where it first meets (its first table, its least ball key).
- the pair runs merged: one row per pair, its smallest distance
  (``fastdata.near_duplicates.near_pairs_from_runs`` runs them all).

Ball rows are made as the runs are read, never written: at radius 1 that is
22 times less disk and sorting than writing each ball key.

The scheme for ``n`` records: ``fastdata.near_duplicates.choose_scheme``.

What grows with the records: the index runs on disk (16 bytes per record,
query and table) and the pairs found. In memory per process: a piece's
hashes; ``ROWS_IN_MEMORY`` rows while writing; a block of about
``MERGE_ROWS`` ball rows; 8 bytes per run (at most ``RUNS_PER_TABLE``) and
block of keys (130 KB at 10^7 records, 16 MB at 10^9).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from fastdata.errors import FastDataError
from fastdata.jobs.sorted_runs import (
    RunFile,
    RunWriter,
    merged,
    save_chunks,
    stable_order,
    write_run,
)

#: Bits of the perceptual hash (fastdata.near_duplicates: 8x8 DCT signs less the constant).
HASH_BITS = 63
#: The widest key of a table (uint32). Wider keys only come with a ball of
#: radius 2 at threshold 8 (two bands of 32 bits: 529 rows per record and band).
KEY_BITS = 26
#: Index rows sorted in memory per run written; ball rows in a block of keys
#: (about); runs of a table a part reads (more are merged first, a piece per
#: group of them: the reads per block stay few and large); runs a merge of
#: pairs reads at once.
ROWS_IN_MEMORY = 1 << 21
MERGE_ROWS = 1 << 18
RUNS_PER_TABLE = 16
FAN_IN = 256
#: A pair found: records i < j and the distance of their hashes.
PAIR = np.dtype([("i", "<i8"), ("j", "<i8"), ("distance", "<i8")])
_BLOCK_CELLS = 1 << 17  # hashes in one (size, groups) block: in cache with its xor
_HELD_HITS = 1 << 22  # row pairs held before they are filtered
#: Values that pad a group: 63 Walsh codes, each pair 32 bits apart.
_PADS = np.asarray([sum(1 << j for j in range(64) if (i & j).bit_count() % 2) for i in
                    range(1, 64)], np.uint64)


@dataclass(frozen=True)
class Scheme:
    """The index: ``blocks`` as (first bit, width), each table's key the
    blocks it names (low block first), and the ball ``radius`` around each key."""

    blocks: tuple[tuple[int, int], ...]
    tables: tuple[tuple[int, ...], ...]
    radius: int
    #: Bytes of a row's slot (2 * position + 1 for a query): 4 below 2**31 records.
    slot_bytes: int = 8
    #: Each table's keys are read in 2**spread blocks (set for the record count).
    spread: int = 0

    def row(self) -> np.dtype:
        """An index row: its key in one table, its hash and its slot."""
        return np.dtype([("key", "<u4"), ("hash", "<u8"), ("slot", f"<u{self.slot_bytes}")])

    def width(self, table: int) -> int:
        return sum(self.blocks[b][1] for b in self.tables[table])

    def mask(self, table: int) -> int:
        """The hash bits the table's key holds."""
        return sum(((1 << w) - 1) << s for s, w in (self.blocks[b] for b in self.tables[table]))

    def key(self, hashes: np.ndarray, table: int) -> np.ndarray:
        """The table's key of each hash (uint32)."""
        key = np.zeros(len(hashes), np.uint64)
        at = 0
        for b in self.tables[table]:
            first, width = self.blocks[b]
            key |= ((hashes >> np.uint64(first)) & np.uint64((1 << width) - 1)) << np.uint64(at)
            at += width
        return key.astype(np.uint32)

    def ball(self, table: int) -> np.ndarray:
        """Every key offset (xor) of at most ``radius`` bits."""
        bits = self.width(table)
        return np.asarray([sum(1 << b for b in chosen) for r in range(self.radius + 1)
                           for chosen in combinations(range(bits), r)], np.uint32)


def write_hashes(path: str, hashes: np.ndarray, *, start: int = 0,
                 queries: Sequence[np.ndarray] = ()) -> str:
    """Write a piece of hashes (the records ``start``, ``start + 1``, ...) and
    their queries (other hashes of the same records, such as the mirror
    images') to ``path`` atomically, for
    ``fastdata.near_duplicates.near_pairs_from_runs``.

    Raises:
        ValueError: queries of another length, or values of more than 63 bits.
    """
    fields = [("position", "<i8"), ("hash", "<u8")] + [(f"query{k}", "<u8")
                                                        for k in range(len(queries))]
    rows = np.zeros(len(hashes), fields)
    rows["position"] = np.arange(start, start + len(hashes))
    for name, values in zip(rows.dtype.names[1:], [hashes, *queries]):
        values = np.asarray(values, np.uint64)
        if len(values) != len(hashes) or (len(values) and int(values.max()) >> HASH_BITS):
            raise ValueError(f"{name} for {path}: {len(hashes)} hashes of {HASH_BITS} bits, "
                             f"as the hashes are")
        rows[name] = values
    save_chunks(path, [rows], rows.dtype)
    return path


def open_piece(path: str, mmap: bool = False) -> np.ndarray:
    """A piece of hashes written by :func:`write_hashes` (``mmap``: its header
    only, nothing read).

    Raises:
        FastDataError: the file is not one (named).
    """
    try:
        rows = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise FastDataError(f"not a readable piece of hashes ({exc}); write it again "
                            "with write_hashes", path=path) from None
    if rows.ndim != 1 or (rows.dtype.names or ())[:2] != ("position", "hash"):
        raise FastDataError("not a piece of hashes (fields position, hash, query0...); "
                            "write it with write_hashes", path=path)
    return rows


def index_piece(number: int, hash_file: str, work: str, scheme: Scheme) -> list[list[str]]:
    """Write the index rows of one piece of hashes (one per record, query and
    table: the key itself, the ball comes when the runs are read) as sorted
    runs of at most ``ROWS_IN_MEMORY`` rows in ``work/index``; returns their
    paths, table by table. A job's piece: runs anywhere that sees ``work``."""
    rows = open_piece(hash_file)
    names = ["hash"] + [name for name in rows.dtype.names if name.startswith("query")]
    folder = os.path.join(work, "index")
    os.makedirs(folder, exist_ok=True)
    dtype = scheme.row()
    paths: list[list[str]] = []
    step = max(1, ROWS_IN_MEMORY // len(names))
    for table in range(len(scheme.tables)):
        paths.append([])
        for at in range(0, len(rows), step):
            part = rows[at:at + step]
            out = np.empty(len(part) * len(names), dtype)
            out["hash"] = np.concatenate([part[name] for name in names])
            out["slot"] = np.concatenate([part["position"] * 2 + min(k, 1)
                                          for k in range(len(names))])
            out["key"] = scheme.key(out["hash"], table)
            path = os.path.join(folder, f"piece{number:06d}-table{table:02d}-{at // step:05d}.npy")
            paths[-1].append(write_run(path, out, ("key",)))
    return paths


def merge_piece(number: int, group: tuple[int, int, list[str]], work: str,
                scheme: Scheme) -> str:
    """Merge ``group`` (a table, a level, up to ``RUNS_PER_TABLE`` of its
    runs) into one run in ``work/index``; returns its path. A job's piece, as
    :func:`index_piece`; the runs merged are left for the caller to remove."""
    table, level, runs = group
    out = os.path.join(work, "index", f"merged{level}-{number:06d}-table{table:02d}.npy")
    save_chunks(out, merged(runs, ("key",), chunk_rows=max(1024, MERGE_ROWS // len(runs))),
                scheme.row())
    return out


def _offsets(run: RunFile, bounds: np.ndarray) -> np.ndarray:
    """The row where each key bound starts in ``run`` (a pass over its keys)."""
    out = np.zeros(len(bounds), np.int64)
    for at in range(0, run.rows, MERGE_ROWS):
        out += np.searchsorted(run.read(at, MERGE_ROWS)["key"], bounds)
    return out


def pairs_part(number: int, part: tuple[int, tuple[int, int], list[str]], work: str,
               scheme: Scheme, threshold: int) -> tuple[list[str], int, int]:
    """Check every group of ball rows in ``part`` (a table, a range of its key
    blocks, the table's runs) and write the pairs found as sorted runs in
    ``work/pairs``. A job's piece, as :func:`index_piece`.

    A block is ``2**bits`` keys (``bits``: the key's width less ``scheme.spread``).
    The ball rows that land in block ``y`` come from the index rows of block
    ``y ^ high`` for each high part ``high`` of the ball's offsets: each run is
    read at those blocks, its keys moved by the offsets, and the block's rows
    sorted by key (one radix pass) into groups.

    Returns:
        the runs' paths, the ball rows made and the pairs of rows checked.
    """
    table, (first, last), runs = part
    if not runs:
        return [], 0, 0
    bits = max(0, scheme.width(table) - scheme.spread)
    files = [RunFile(path, ("key",)) for path in runs]
    try:
        bounds = np.arange((1 << (scheme.width(table) - bits)) + 1, dtype=np.int64) << bits
        offsets = [_offsets(f, bounds) for f in files]
        writer = RunWriter(os.path.join(work, "pairs"), PAIR, ("i", "j", "distance"),
                           rows_in_memory=1 << 20, prefix=f"part{number:06d}")
        made = checked = 0
        for block in range(first, last):
            rows = _ball_rows(files, offsets, block, scheme, table, bits)
            starts, sizes = _groups(rows[0])
            made += len(rows[0])
            checked += int((sizes * (sizes - 1) // 2).sum())
            for found in _check(rows, starts, sizes, threshold, scheme, table):
                writer.add(found)
    finally:
        for f in files:
            f.close()
    return writer.close(), made, checked


def _ball_rows(files: list[RunFile], offsets: list[np.ndarray], block: int, scheme: Scheme,
               table: int, bits: int) -> tuple[np.ndarray, ...]:
    """The ball rows whose keys are in ``block`` (keys, hashes, slots), sorted
    by key: each offset's high part ``high`` takes the index rows of block
    ``block ^ high``."""
    ball = scheme.ball(table)
    highs = ball >> np.uint32(bits)
    keys, hashes, slots = [], [], []
    for high in np.unique(highs).tolist():
        at = block ^ high
        rows = [f.read(int(o[at]), int(o[at + 1] - o[at])) for f, o in zip(files, offsets)]
        rows = np.concatenate(rows) if len(rows) > 1 else rows[0]
        moves = ball[highs == high]
        keys.append((rows["key"][:, None] ^ moves).ravel())
        hashes.append(np.repeat(rows["hash"], len(moves)))
        slots.append(np.repeat(rows["slot"], len(moves)))
    keys = np.concatenate(keys)
    order = stable_order({"key": keys}, ("key",))
    return (keys[order], *(np.concatenate(c)[order] for c in (hashes, slots)))


def _groups(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal keys starts, and its length."""
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    return starts, np.diff(np.append(starts, len(key)))


def _padded(sizes: np.ndarray) -> np.ndarray:
    """Each group size rounded up to one of 8 sizes per octave (exact up to
    16; 32 apart at most): groups of many sizes checked together, for at
    most 1/8 more rows."""
    step = np.minimum(32, 1 << np.maximum(0, np.frexp(sizes)[1] - 4))
    return -(-sizes // step) * step


def _check(rows: tuple, starts, sizes, threshold: int, scheme: Scheme, table: int):
    """The pairs (PAIR arrays) that the groups of ``rows`` (keys, hashes,
    slots; sorted by key, groups at ``starts`` of ``sizes``) hold within
    ``threshold``. Groups of about one size at a time, as a (size, groups)
    block: row ``a`` of every group against row ``a + d`` in one popcount per
    ``d``, contiguous and in cache (about 1 ns a pair). A shorter group is
    padded with values 32 bits apart (:data:`_PADS`): a pad that comes near a
    hash is dropped with the other pairs that are no pairs."""
    keys, hashes, slots = rows
    padded = _padded(sizes)
    values = np.concatenate([hashes, _PADS])  # row len(hashes) + r: the pad of row r
    by_size = np.argsort(padded, kind="stable")
    hits: list[tuple[np.ndarray, np.ndarray]] = []
    held = 0
    for same in np.split(by_size, np.flatnonzero(np.diff(padded[by_size])) + 1):
        size = int(padded[same[0]]) if len(same) else 0
        step = max(1, _BLOCK_CELLS // max(size, 1))
        for g in range(0, len(same) if size >= 2 else 0, step):
            chosen = same[g:g + step]
            row = np.arange(size)[:, None]
            index = np.where(row < sizes[chosen], starts[chosen] + row, len(hashes) + row % 63)
            block = values[index]
            xor, near = np.empty_like(block), np.empty(block.shape, np.uint8)
            for d in range(1, size):
                x, c = xor[:size - d], near[:size - d]
                np.bitwise_xor(block[:-d], block[d:], out=x)
                np.bitwise_count(x, out=c)
                groups = np.flatnonzero(c.min(axis=0) <= threshold)
                if not len(groups):
                    continue
                a, k = np.nonzero(c[:, groups] <= threshold)  # only where a pair is near
                a, b = index[a, groups[k]], index[a + d, groups[k]]
                real = (a < len(hashes)) & (b < len(hashes))
                hits.append((a[real], b[real]))
                held += len(hits[-1][0])
                if held >= _HELD_HITS:  # one hash many times: bound what is held
                    yield _pairs(keys, hashes, slots, hits, scheme, table)
                    hits, held = [], 0
    if hits:
        yield _pairs(keys, hashes, slots, hits, scheme, table)


def _pairs(keys, hashes, slots, hits: list, scheme: Scheme, table: int) -> np.ndarray:
    """PAIR rows of the row pairs ``hits`` (within the threshold): not a record
    with itself nor a query with a query, and only where the pair first meets."""
    a = np.concatenate([a for a, _ in hits])
    b = np.concatenate([b for _, b in hits])
    slot_a, slot_b = slots[a].astype(np.int64), slots[b].astype(np.int64)
    ha, hb = hashes[a], hashes[b]
    keep = ((slot_a >> 1) != (slot_b >> 1)) & ((slot_a & slot_b & 1) == 0)
    keep &= _first(keys[a], ha, hb, scheme, table)
    i, j = slot_a[keep] >> 1, slot_b[keep] >> 1
    out = np.empty(len(i), PAIR)
    out["i"], out["j"] = np.minimum(i, j), np.maximum(i, j)
    out["distance"] = np.bitwise_count(ha[keep] ^ hb[keep])
    return out


def _first(point: np.ndarray, a: np.ndarray, b: np.ndarray, scheme: Scheme,
           table: int) -> np.ndarray:
    """Whether ``point`` (the key of ``table`` where hashes ``a`` and ``b`` met)
    is the first place they meet: no earlier table puts them within
    ``2 * radius``, and (radius 0 or 1) it is the least point of both balls."""
    first = np.ones(len(point), bool)
    for t in range(table):
        first &= np.bitwise_count((a ^ b) & np.uint64(scheme.mask(t))) > 2 * scheme.radius
    if scheme.radius != 1:
        return first  # radius 0: one point; 2: the pair merge drops the repeats
    ka, kb = scheme.key(a, table), scheme.key(b, table)
    x = ka ^ kb
    low = x & (~x + np.uint32(1))
    top = np.where(ka > 0, np.uint32(1) << (np.frexp(ka)[1] - 1).astype(np.uint32), 0)
    least = np.select([x == 0, low == x], [ka ^ top.astype(np.uint32), np.minimum(ka, kb)],
                      np.minimum(ka ^ low, ka ^ (x ^ low)))
    return first & (point == least)

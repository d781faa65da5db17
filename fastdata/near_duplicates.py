"""Near-duplicates: images that look the same though their bytes differ
(resized, re-encoded, lightly cropped; mirrored with ``flip``), found by a
perceptual hash and a hash index (``fastdata dedup --near``; no torch).

The hash: each record decoded small (JPEG's DCT scaling to about 64 pixels,
then 32x32 grey), a 2-D DCT, and of its 8x8 lowest frequencies without the
constant one, a bit per coefficient above their median: 63 bits. Two images
are near-duplicates when their hashes differ in at most ``threshold`` bits.
The mirror image's hash needs no second decode: mirroring flips the sign of
the odd horizontal frequencies.

The pairs: the index of fastdata.near_groups (multi-index hashing done by
sorting, so that memory per process does not grow with the record count),
run by :func:`near_pairs_from_runs` over pieces of hashes in files (hashed by
a job's workers), or by :func:`near_pairs` over hashes held in memory
(through a temporary folder). The groups: :func:`components` of the pairs.

The index's scheme (``m`` blocks, tables of ``j``, balls of ``radius``: see
fastdata.near_groups) for ``n`` records, :func:`choose_scheme`: of the exact
schemes (``2 * radius >= need``; at most 64 tables of at most 26 bits), the
one of least estimated time per record for ``n`` records: its index rows
(:data:`INDEX_COST` each), its ball rows (:data:`BALL_COST` each) and the
pairs of rows that share a key by chance, ``n * ball**2 / 2**(bits + 1)`` per
record and table (:data:`PAIR_COST` each). A scheme's rows per record are
fixed and its chance pairs per record grow with ``n``; the rule moves to
wider keys (more tables, more rows) once those pairs cost more than the rows.
So the work per record grows much slower than ``n`` but is not bounded: 63
bits leave no exact scheme with both wide keys and few rows at threshold 8.
At threshold 8 without queries: 9 bands of 7 bits at radius 0 (a pure sort)
below about 4 * 10^4 records; 3 bands of 21 bits at radius 1 (66 ball rows,
346 chance pairs per record at 10^6, 3,462 at 10^7) up to about 4 * 10^7;
then 10 tables of 2 of 5 blocks (24-26 bits, radius 1, 262 ball rows).
Estimated CPU per record: 4.5 us at 10^6, 9.2 at 10^7, 30 at 10^8, 160 at
10^9 (measured: 4.3 and 9.1 us, bench/near_dups.py ``scale``).

What grows with the dataset: the pairs found, the index's runs on disk, and
in :func:`near_pairs`'s caller 8 bytes per record (16 with ``flip``) for the
hashes.
"""

from __future__ import annotations

import io
import itertools
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import comb

import numpy as np

from fastdata.errors import FastDataError
from fastdata.jobs.sorted_runs import combine_runs, group_chunks, merged, save_chunks
from fastdata.near_groups import (
    FAN_IN,
    HASH_BITS,
    KEY_BITS,
    MERGE_ROWS,
    PAIR,
    RUNS_PER_TABLE,
    Scheme,
    index_piece,
    merge_piece,
    open_piece,
    pairs_part,
    write_hashes,
)

#: Default Hamming threshold, in bits of the 63: re-encoded and resized copies
#: measured here differ by 0-4, copies cropped by 4% per side by 4-16, and
#: unrelated photos by 16 or more (bench/near_dups.py).
DEFAULT_THRESHOLD = 8
_SIDE = 32
_K = np.arange(_SIDE)
_DCT = np.cos(np.pi * (2 * _K[None, :] + 1) * _K[:, None] / (2 * _SIDE)).astype(np.float32)
_DCT[0] *= 1 / np.sqrt(2)
_WEIGHTS = (np.uint64(1) << np.arange(HASH_BITS, dtype=np.uint64))
#: Sign of each kept coefficient in the mirror image: odd horizontal frequencies flip.
_MIRROR = np.where(np.tile(np.arange(8), 8)[1:] % 2 == 1, -1.0, 1.0).astype(np.float32)
#: CPU time in ns, measured on a 2-core AMD EPYC (bench/near_dups.py scale):
#: per index row (written, sorted, read), per ball row (moved, sorted,
#: grouped) and per pair of rows checked in a group.
INDEX_COST = 120.0
BALL_COST = 55.0
PAIR_COST = 1.5
#: Records per piece of hashes that near_pairs writes.
_PIECE = 1 << 20


def _bits(coefficients: np.ndarray) -> int:
    above = coefficients > np.median(coefficients)
    return int((above.astype(np.uint64) * _WEIGHTS).sum())


def image_hash(data: bytes, *, raw_shape: Sequence[int] | None = None) -> tuple[int, int]:
    """The perceptual hash of one stored image, and its mirror image's.

    Raises:
        OSError, ValueError: the bytes are not an image PIL decodes.
    """
    from PIL import Image

    if raw_shape is not None:
        image = Image.fromarray(np.frombuffer(data, np.uint8).reshape(tuple(raw_shape)))
    else:
        image = Image.open(io.BytesIO(data))
        image.draft("L", (2 * _SIDE, 2 * _SIDE))  # JPEG: decode at 1/2 .. 1/8 scale
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        from fastdata.decoding.decoders import pil_to_array

        # 16-bit grey: the high byte, as the decoders take it (convert("L") clips).
        image = Image.fromarray(pil_to_array(image, True, None).reshape(image.size[::-1]))
    grey = image.convert("L").resize((_SIDE, _SIDE), Image.BILINEAR)
    pixels = np.asarray(grey, dtype=np.float32)
    low = (_DCT @ pixels @ _DCT.T)[:8, :8].reshape(-1)[1:]
    return _bits(low), _bits(low * _MIRROR)


def record_hashes(reader, *, flip: bool = False, progress: bool | None = None,
                  threads: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The hash of every record of ``reader`` (uint64), and with ``flip``
    their mirror images' too; records read once in stored order, checked
    against their CRC-32, decoded on ``threads`` threads (PIL releases the GIL).

    Raises:
        CorruptDataError: a damaged record (named).
        FastDataError: a record that does not decode (named).
    """
    from concurrent.futures import ThreadPoolExecutor

    from fastdata.progress import progress_bar

    n = len(reader)
    shape = reader.manifest.raw_shape
    hashes = np.zeros(n, np.uint64)
    mirrored = np.zeros(n, np.uint64) if flip else None

    def one(item):
        index, data = item
        try:
            return index, image_hash(data, raw_shape=shape)
        except (OSError, ValueError) as exc:
            raise FastDataError(f"record {index} does not decode for the near-duplicate "
                                f"hash ({exc})", path=reader.path,
                                key=reader.key_of(index), record=index) from None

    name = os.path.basename(str(reader.url or reader.path).rstrip("/"))
    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool, \
            progress_bar(n, f"hashing {name}", enabled=progress) as bar:
        batch = []
        for index, data, _ in reader.records(check=True):
            batch.append((index, data))
            if len(batch) == 256:
                _store(pool.map(one, batch), hashes, mirrored, bar)
                batch = []
        _store(pool.map(one, batch), hashes, mirrored, bar)
    return hashes, mirrored


def _store(results, hashes, mirrored, bar) -> None:
    for index, (h, m) in results:
        hashes[index] = h
        if mirrored is not None:
            mirrored[index] = m
        bar.update()


def _blocks(m: int, j: int) -> tuple[tuple[int, int], ...]:
    """``m`` blocks over the hash's bits, as even as they come, each narrow
    enough that ``j`` of them fit a key."""
    widths = [min(HASH_BITS // m + (b < HASH_BITS % m), KEY_BITS // j) for b in range(m)]
    starts = np.cumsum([0] + widths[:-1]).tolist()
    return tuple(zip(starts, widths))


def _need(threshold: int, m: int, j: int) -> int:
    """The most differing bits that the ``j`` least-differing of ``m`` blocks
    can hold when ``threshold`` bits differ (spread as evenly as they can be)."""
    q, s = divmod(threshold, m)
    return q * j + max(0, j - (m - s))


def scheme_for(m: int, j: int, threshold: int) -> Scheme:
    """The exact scheme of tables of ``j`` of ``m`` blocks for ``threshold``."""
    radius = -(-_need(threshold, m, j) // 2)
    return Scheme(_blocks(m, j), tuple(itertools.combinations(range(m), j)), radius)


def scheme_cost(scheme: Scheme, n: int, queries: int = 0) -> tuple[float, float, float]:
    """(time per record in ns, ball rows per record, chance pairs per record)
    estimated for ``n`` records with ``queries`` other hashes each."""
    rows = pairs = 0.0
    for t in range(len(scheme.tables)):
        per = (1 + queries) * sum(comb(scheme.width(t), r) for r in range(scheme.radius + 1))
        rows += per
        pairs += n * per * per / 2 ** (scheme.width(t) + 1)
    index = (1 + queries) * len(scheme.tables)
    return index * INDEX_COST + rows * BALL_COST + pairs * PAIR_COST, rows, pairs


def choose_scheme(n: int, threshold: int, queries: int = 0) -> Scheme:
    """The exact scheme of least estimated time per record for ``n`` records
    (the rule in the module's docstring)."""
    best = None
    for m in range(1, min(HASH_BITS, threshold + 2) + 1):
        for j in range(1, m + 1):
            if comb(m, j) > 64:
                break
            scheme = scheme_for(m, j, threshold)
            if scheme.radius > 2 or min(w for _, w in scheme.blocks) < 1:
                continue
            cost = scheme_cost(scheme, n, queries)[0]
            if best is None or cost < best[0]:
                best = (cost, scheme)
    return best[1]


def band_scheme(bands: int, threshold: int) -> Scheme:
    """``bands`` bands of the hash, each a table (``j = 1``).

    Raises:
        ValueError: bands wider than a key (fewer than 3).
    """
    if not 1 <= -(-HASH_BITS // bands) <= KEY_BITS:
        raise ValueError(f"{bands} bands are wider than {KEY_BITS} bits; use 3 or more")
    return scheme_for(bands, 1, threshold)


def _run(executor, fn, pieces, common: tuple):
    if executor is None:
        return ((number, fn(number, arg, *common)) for number, arg in pieces)
    return executor.results(fn, pieces, common, in_order=True)


@dataclass(frozen=True)
class NearPairs:
    """What :func:`near_pairs_from_runs` did: ``path``, the pairs file (rows of
    ``near_groups.PAIR`` sorted by (i, j), i < j, each pair once with its
    smallest distance) holding ``pairs`` rows; the ``records``; the ball
    ``rows`` made; the pairs of rows ``checked`` (a popcount each); the
    ``scheme``."""

    path: str
    records: int
    pairs: int
    rows: int
    checked: int
    scheme: Scheme


def near_pairs_from_runs(hash_files: Sequence[str], work: str, threshold: int, *,
                         bands: int | None = None, scheme: Scheme | None = None,
                         executor=None, parts: int | None = None) -> NearPairs:
    """Every pair of records within ``threshold`` bits, from pieces of hashes
    written by ``near_groups.write_hashes`` (hashed anywhere, any number of files):
    ``near_groups.index_piece`` per file (``merge_piece`` per group of runs
    where a table has many), then ``near_groups.pairs_part`` per range of keys,
    then one merge of the pairs (the index: fastdata.near_groups).

    Args:
        work: a folder for the runs (made if absent; one every worker sees when
            ``executor`` runs pieces elsewhere); only ``pairs.npy`` is left.
        bands: the index's band count (default: ``near_groups.choose_scheme``).
        scheme: the index, given whole (it must be exact for ``threshold``).
        executor: runs the pieces (``results(fn, pieces, common, in_order=)``,
            as fastdata.jobs' executors do); None: this process.
        parts: ranges of keys per table, each a piece (default: 4 pieces in
            all, or one per table where there are more tables).

    Raises:
        FastDataError: a file that is not a piece of hashes, or pieces with
            different numbers of queries.
    """
    pieces = [open_piece(path, mmap=True) for path in hash_files]
    sizes = [(len(p), len(p.dtype.names) - 2) for p in pieces]
    del pieces  # maps of the headers only: nothing was read
    n = sum(rows for rows, _ in sizes)
    if len({q for _, q in sizes}) > 1:
        raise FastDataError(f"pieces of hashes with {sorted({q for _, q in sizes})} queries "
                            "each: write every piece with the same queries", path=work)
    if scheme is None:
        scheme = band_scheme(bands, threshold) if bands else \
            choose_scheme(n, threshold, sizes[0][1] if sizes else 0)
    # 2**spread blocks of keys per table: a block holds at most about MERGE_ROWS
    # ball rows, and spans at most 2**16 keys (its sort: one radix pass).
    rows = max(n * (1 + (sizes[0][1] if sizes else 0)) * len(scheme.ball(t))
               for t in range(len(scheme.tables)))
    spread = max(0, int(np.ceil(np.log2(max(1, rows) / MERGE_ROWS))),
                 max(scheme.width(t) for t in range(len(scheme.tables))) - 16)
    scheme = replace(scheme, slot_bytes=4 if n < 2**31 else 8, spread=spread)
    os.makedirs(work, exist_ok=True)
    index: list[list[str]] = [[] for _ in scheme.tables]
    for _, tables in _run(executor, index_piece, enumerate(hash_files), (work, scheme)):
        for table, paths in enumerate(tables):
            index[table] += paths
    index = _fewer_runs(index, work, scheme, executor)
    split = parts or -(-4 // len(scheme.tables))
    checks = []
    for table, runs in enumerate(index):
        blocks = 1 << (scheme.width(table) - max(0, scheme.width(table) - spread))
        cuts = sorted({blocks * k // split for k in range(split + 1)})
        checks += [(table, (a, b), runs) for a, b in itertools.pairwise(cuts)]
    found, rows, checked = [], 0, 0
    for _, (paths, read, count) in _run(executor, pairs_part, enumerate(checks),
                                        (work, scheme, threshold)):
        found, rows, checked = found + paths, rows + read, checked + count
    if len(found) > FAN_IN:
        found = combine_runs(found, ("i", "j", "distance"), os.path.join(work, "pairs"),
                             fan_in=FAN_IN)
    out = os.path.join(work, "pairs.npy")
    chunk = max(1024, MERGE_ROWS // max(1, len(found)))  # the merge holds about MERGE_ROWS
    pairs = save_chunks(out, _unique(merged(found, ("i", "j", "distance"), chunk_rows=chunk)),
                        PAIR)
    for folder in ("index", "pairs"):
        _remove_runs(os.path.join(work, folder))
    return NearPairs(out, n, pairs, rows, checked, scheme)


def _fewer_runs(index: list[list[str]], work: str, scheme: Scheme, executor
                ) -> list[list[str]]:
    """Each table's runs merged, ``RUNS_PER_TABLE`` at a time (a piece each),
    until no table has more (a part reads every run of its table per block)."""
    level = 0
    while any(len(runs) > RUNS_PER_TABLE for runs in index):
        groups = [(table, level, runs[at:at + RUNS_PER_TABLE])
                  for table, runs in enumerate(index) if len(runs) > RUNS_PER_TABLE
                  for at in range(0, len(runs), RUNS_PER_TABLE)]
        fewer = [runs if len(runs) <= RUNS_PER_TABLE else [] for runs in index]
        for (_, path), (table, _, _) in zip(
                _run(executor, merge_piece, enumerate(groups), (work, scheme)), groups):
            fewer[table].append(path)
        index, level = fewer, level + 1
    return index


def _unique(chunks):
    """The first (least distance) row of each pair."""
    for rows in group_chunks(chunks, ("i", "j")):
        first = np.ones(len(rows), bool)
        first[1:] = (rows["i"][1:] != rows["i"][:-1]) | (rows["j"][1:] != rows["j"][:-1])
        yield rows[first]


def _remove_runs(folder: str) -> None:
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            if name.endswith(".npy"):
                os.remove(os.path.join(folder, name))
        if not os.listdir(folder):
            os.rmdir(folder)


def near_pairs(hashes: np.ndarray, threshold: int = DEFAULT_THRESHOLD,
               queries: Sequence[np.ndarray] = (), bands: int | None = None) -> np.ndarray:
    """Every pair ``(i, j, distance)`` (i < j) of records whose hashes differ
    in at most ``threshold`` bits, found with the index (fastdata.near_groups);
    ``queries``: other hashes of the same records (the mirror images'), each
    compared with ``hashes`` too; ``bands``: the index's band count (default:
    the scheme ``near_groups.choose_scheme`` picks for the record count).

    Returns:
        an int64 array of shape (pairs, 3), sorted, each pair once with its
        smallest distance.
    """
    hashes = np.asarray(hashes, dtype=np.uint64)
    queries = [np.asarray(q, dtype=np.uint64) for q in queries]
    with tempfile.TemporaryDirectory(prefix="fastdata-near-") as work:
        files = [write_hashes(os.path.join(work, f"hashes-{k:06d}.npy"), hashes[at:at + _PIECE],
                              start=at, queries=[q[at:at + _PIECE] for q in queries])
                 for k, at in enumerate(range(0, max(len(hashes), 1), _PIECE))]
        found = near_pairs_from_runs(files, os.path.join(work, "job"), threshold, bands=bands)
        pairs = np.load(found.path, allow_pickle=False)
    return np.stack([pairs["i"], pairs["j"], pairs["distance"]], 1).astype(np.int64)


def group_labels(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(members, labels)``: every record in a pair (sorted) and its group's
    least member, the groups being the connected components of the pairs
    (``(k, 2+)`` array of i, j). Union-find in numpy arrays over the records in
    pairs only (16 bytes each): roots hooked under the least root they meet,
    then every record pointed at its root, until no pair joins two roots."""
    ends = np.asarray(pairs[:, :2], np.int64)
    members = np.unique(ends)
    a, b = np.searchsorted(members, ends[:, 0]), np.searchsorted(members, ends[:, 1])
    parent = np.arange(len(members))
    while True:
        ra, rb = parent[a], parent[b]
        joins = ra != rb
        if not joins.any():
            break
        np.minimum.at(parent, np.maximum(ra, rb)[joins], np.minimum(ra, rb)[joins])
        while True:
            up = parent[parent]
            if np.array_equal(up, parent):
                break
            parent = up
    return members, members[parent]


def components(pairs: np.ndarray, n: int | None = None) -> list[list[int]]:
    """The groups the pairs join, each sorted, ordered by their first member;
    records in no pair are in no group (``n``, the record count, is not needed)."""
    members, labels = group_labels(pairs)
    order = np.lexsort((members, labels))
    members, labels = members[order], labels[order]
    cuts = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    return [g.tolist() for g in np.split(members, cuts)] if len(members) else []

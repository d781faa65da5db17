"""Near-duplicates: images that look the same though their bytes differ
(resized, re-encoded, lightly cropped; mirrored with ``flip``), found by a
perceptual hash and a hash index (``fastdata dedup --near``; no torch).

The hash: each record decoded small (JPEG's DCT scaling to about 64 pixels,
then 32x32 grey), a 2-D DCT, and of its 8x8 lowest frequencies without the
constant one, a bit per coefficient above their median: 63 bits. Two images
are near-duplicates when their hashes differ in at most ``threshold`` bits.
The mirror image's hash needs no second decode: mirroring flips the sign of
the odd horizontal frequencies.

The index is multi-index hashing: the hash is cut into ``m`` bands, and a
pair within ``threshold`` bits differs in at most ``threshold // m`` bits
in one band at least (pigeonhole), so probing each record's bands within
that radius finds every such pair, without comparing all pairs. ``m`` is
chosen for the size: wide bands (3 of 21 bits for 10^6 records at the
default threshold) keep buckets nearly empty, at more probes per band.
What grows with the dataset: 8 bytes per record (16 with ``flip``) for the
hashes, 16 per record for one band's sort at a time, and the pairs found.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

#: Bits of the hash that carry information (8x8 coefficients less the constant one).
HASH_BITS = 63
#: Default Hamming threshold, in bits of the 63: re-encoded and resized copies
#: measured here differ by 0-4, copies cropped by 4% per side by 4-16, and
#: unrelated photos by 16 or more (bench/near_dups.py).
DEFAULT_THRESHOLD = 8
#: The widest band (its bucket tables hold 2**bits int32 and int64).
_MAX_BAND_BITS = 22
_SIDE = 32
_K = np.arange(_SIDE)
_DCT = np.cos(np.pi * (2 * _K[None, :] + 1) * _K[:, None] / (2 * _SIDE)).astype(np.float32)
_DCT[0] *= 1 / np.sqrt(2)
_WEIGHTS = (np.uint64(1) << np.arange(HASH_BITS, dtype=np.uint64))
#: Sign of each kept coefficient in the mirror image: odd horizontal frequencies flip.
_MIRROR = np.where(np.tile(np.arange(8), 8)[1:] % 2 == 1, -1.0, 1.0).astype(np.float32)
#: Pairs checked at a time in the index (memory, not the result, is bounded).
_PAIRS_AT_ONCE = 1 << 22


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
    import os
    from concurrent.futures import ThreadPoolExecutor

    from fastdata.errors import FastDataError
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


def _band_masks(bits: int, radius: int) -> np.ndarray:
    """Every ``bits``-bit value with at most ``radius`` bits set."""
    from itertools import combinations

    values = [sum(1 << b for b in chosen) for r in range(radius + 1)
              for chosen in combinations(range(bits), r)]
    return np.asarray(values, dtype=np.uint64)


def choose_bands(n: int, threshold: int) -> int:
    """The band count whose estimated work is least for ``n`` records: per
    band, its probes times (a pass over the records plus the records the
    probes find by chance, n^2 / 2^bits)."""
    from math import comb

    best, best_cost = 3, None
    for bands in range(3, 9):
        bits = -(-HASH_BITS // bands)
        if bits > _MAX_BAND_BITS:
            continue
        probes = sum(comb(bits, r) for r in range(threshold // bands + 1))
        cost = bands * probes * (n + n * n / 2 ** bits)
        if best_cost is None or cost < best_cost:
            best, best_cost = bands, cost
    return best


def near_pairs(hashes: np.ndarray, threshold: int = DEFAULT_THRESHOLD,
               queries: Sequence[np.ndarray] = (), bands: int | None = None) -> np.ndarray:
    """Every pair ``(i, j, distance)`` (i < j) of records whose hashes differ
    in at most ``threshold`` bits, found with the index (see the module's
    docstring); ``queries``: other hashes of the same records (the mirror
    images'), each compared with ``hashes`` too; ``bands``: the index's
    band count (default: :func:`choose_bands`).

    Returns:
        an int64 array of shape (pairs, 3), sorted, each pair once with its
        smallest distance.
    """
    hashes = np.asarray(hashes, dtype=np.uint64)
    n = len(hashes)
    bands = bands or choose_bands(n, threshold)
    if -(-HASH_BITS // bands) > _MAX_BAND_BITS:
        raise ValueError(f"{bands} bands are wider than {_MAX_BAND_BITS} bits; use 3 or more")
    widths = [HASH_BITS // bands + (b < HASH_BITS % bands) for b in range(bands)]
    found = []
    shift = 0
    for width in widths:
        masks = _band_masks(width, threshold // bands).astype(np.uint32)
        keep = np.uint64((1 << width) - 1)
        keys = ((hashes >> np.uint64(shift)) & keep).astype(np.uint32)
        order = np.argsort(keys, kind="stable")
        # 32-bit tables: a probe is one gather from a table that stays in cache.
        sizes = np.bincount(keys, minlength=1 << width).astype(np.int32)
        starts = (np.cumsum(sizes, dtype=np.int64) - sizes)
        for query in (hashes, *queries):
            qkeys = ((np.asarray(query, np.uint64) >> np.uint64(shift)) & keep
                     ).astype(np.uint32)
            for mask in masks:
                probe = qkeys ^ mask
                counts = sizes[probe]
                hit = np.flatnonzero(counts)
                if len(hit):
                    found += _check(query, hashes, order, hit, starts[probe[hit]],
                                    counts[hit].astype(np.int64), threshold)
        shift += width
    if not found:
        return np.zeros((0, 3), np.int64)
    pairs = np.concatenate(found)
    # One row per pair, its smallest distance.
    pairs = pairs[np.lexsort((pairs[:, 2], pairs[:, 1], pairs[:, 0]))]
    first = np.ones(len(pairs), bool)
    first[1:] = (pairs[1:, 0] != pairs[:-1, 0]) | (pairs[1:, 1] != pairs[:-1, 1])
    return pairs[first]


def _check(query, hashes, order, records, lo, counts, threshold) -> list[np.ndarray]:
    """The pairs (query record, indexed record) of the probed buckets within
    ``threshold``, a part of the records at a time."""
    out = []
    total = np.cumsum(counts)
    start = 0
    while start < len(counts):
        limit = (total[start - 1] if start else 0) + _PAIRS_AT_ONCE
        stop = max(start + 1, int(np.searchsorted(total, limit, side="right")))
        c = counts[start:stop]
        size = int(c.sum())
        i = np.repeat(records[start:stop], c)
        within = np.arange(size) - np.repeat(np.cumsum(c) - c, c)
        j = order[np.repeat(lo[start:stop], c) + within]
        keep = i != j
        i, j = i[keep], j[keep]
        distance = np.bitwise_count(np.asarray(query)[i] ^ hashes[j]).astype(np.int64)
        near = distance <= threshold
        if near.any():
            a, b = i[near], j[near]
            out.append(np.stack([np.minimum(a, b), np.maximum(a, b), distance[near]], 1))
        start = stop
    return out


def components(pairs: np.ndarray, n: int) -> list[list[int]]:
    """The groups the pairs join (union-find), each sorted, ordered by their
    first member; records in no pair are in no group."""
    parent = {}

    def root(x: int) -> int:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    for a, b in pairs[:, :2].tolist():
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for x in {int(v) for v in pairs[:, :2].reshape(-1).tolist()}:
        groups.setdefault(root(x), []).append(x)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])

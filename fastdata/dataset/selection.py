"""Which records of its parent a view selects: sorted runs or a bitmap
(no torch).

A selection maps a view's positions ``0..count`` to its parent's record
indices, ascending, and back. It is stored in the view file as the smaller
of two encodings, each zlib-compressed and base64-encoded with a SHA-256 of
the decoded bytes:

- ``"ranges"``: little-endian int64 pairs ``(start, stop)`` of selected runs;
  few runs (whole classes, a key range) take a few bytes;
- ``"bitmap"``: one bit per parent record (``numpy.packbits``, little bit
  order); a random 10% sample of 10^8 records takes about 6 MB.

What grows with the dataset, per process: 16 bytes per run for ``ranges``;
for ``bitmap`` one bit per parent record plus 8 bytes per 4,096 records (the
counts of set bits before each block), about 0.13 bytes per parent record,
and up to 256 blocks decoded (4 MB at most). A stored selection is refused
before it is inflated past the most its encoding takes for the parent (a
bitmap's bytes; 16 bytes per run, half the parent's records at most), and
a bitmap with a bit set past the parent's last record is refused.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Iterator

import numpy as np

#: Bits per block of a bitmap's prefix counts.
BLOCK_BITS = 4096
_BLOCK_BYTES = BLOCK_BITS // 8
ENCODINGS = ("ranges", "bitmap")
#: Bitmap blocks whose selected offsets are kept decoded (16 KiB each at most).
_KEPT_BLOCKS = 256


class SelectionError(ValueError):
    """A stored selection that cannot be decoded or does not add up."""


class Selection:
    """Selected records of a parent of ``parent_count`` records.

    Build one with :meth:`from_mask_chunks`, :meth:`from_ranges` or
    :meth:`decode`; map positions with :meth:`parents`, parent indices with
    :meth:`rank`.
    """

    def __init__(self, parent_count: int, *, starts: np.ndarray | None = None,
                 stops: np.ndarray | None = None, bits: np.ndarray | None = None) -> None:
        self.parent_count = int(parent_count)
        self.bits = bits
        if bits is not None:
            padded = np.zeros(-(-len(bits) // _BLOCK_BYTES) * _BLOCK_BYTES, np.uint8)
            padded[:len(bits)] = bits
            per_block = np.unpackbits(padded).reshape(-1, BLOCK_BITS).sum(axis=1, dtype=np.int64)
            self._before = np.concatenate([[0], np.cumsum(per_block)]).astype(np.int64)
            self._padded = padded
            self.count = int(self._before[-1])
        else:
            self.starts = np.asarray(starts, dtype=np.int64)
            self.stops = np.asarray(stops, dtype=np.int64)
            lengths = self.stops - self.starts
            self._first = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            self.count = int(self._first[-1])

    @property
    def encoding(self) -> str:
        return "bitmap" if self.bits is not None else "ranges"

    # -- building -----------------------------------------------------------------

    @classmethod
    def from_ranges(cls, parent_count: int, ranges) -> Selection:
        """The records of ``ranges`` (``(start, stop)`` pairs, ascending, apart;
        runs that touch are joined into one)."""
        pairs = np.asarray(list(ranges), dtype=np.int64).reshape(-1, 2)
        starts, stops = pairs[:, 0], pairs[:, 1]
        if len(pairs) > 1:
            joined = starts[1:] == stops[:-1]
            starts = starts[np.concatenate([[True], ~joined])]
            stops = stops[np.concatenate([~joined, [True]])]
        return cls(parent_count, starts=starts, stops=stops)

    @classmethod
    def from_mask_chunks(cls, parent_count: int, chunks) -> Selection:
        """The records whose flag is set in ``chunks``: boolean arrays that,
        one after another, cover the parent's records in order. Held as runs
        while they are few, else as a bitmap."""
        starts, stops, packed, done = [], [], [], 0
        runs = 0
        for mask in chunks:
            mask = np.asarray(mask, dtype=bool)
            edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.view(np.int8), [0]])))
            starts.append(edges[0::2] + done)
            stops.append(edges[1::2] + done)
            runs += len(edges) // 2
            packed.append(mask)
            done += len(mask)
        if done != parent_count:
            raise SelectionError(f"the flags cover {done} records, not the parent's "
                                 f"{parent_count}")
        start = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        stop = np.concatenate(stops) if stops else np.zeros(0, np.int64)
        # Merge runs that meet at a chunk's edge.
        if len(start) > 1:
            joined = np.flatnonzero(start[1:] == stop[:-1])
            keep = np.ones(len(start), bool)
            keep[joined + 1] = False
            stop_keep = np.ones(len(start), bool)
            stop_keep[joined] = False
            start, stop = start[keep], stop[stop_keep]
        if 16 * len(start) <= parent_count // 8 + 1:
            return cls(parent_count, starts=start, stops=stop)
        bits = np.packbits(np.concatenate(packed) if packed else np.zeros(0, bool),
                           bitorder="little")
        return cls(parent_count, bits=bits)

    # -- mapping ------------------------------------------------------------------

    def parents(self, positions) -> np.ndarray:
        """The parent index of each view position (int64, same shape).

        Raises:
            IndexError: a position outside ``0..count``.
        """
        at = np.asarray(positions, dtype=np.int64)
        if at.size and (int(at.min()) < 0 or int(at.max()) >= self.count):
            raise IndexError(f"a position of the view is outside its {self.count} records")
        flat = at.reshape(-1)
        if self.bits is None:
            run = np.searchsorted(self._first, flat, side="right") - 1
            return (self.starts[run] + (flat - self._first[run])).reshape(at.shape)
        block = np.searchsorted(self._before, flat, side="right") - 1
        out = np.empty(len(flat), np.int64)
        if len(flat) == 1:  # one position: no grouping
            b = int(block[0])
            out[0] = b * BLOCK_BITS + self._set_bits(b)[flat[0] - self._before[b]]
            return out.reshape(at.shape)
        for b in np.unique(block).tolist():
            here = block == b
            out[here] = b * BLOCK_BITS + self._set_bits(b)[flat[here] - self._before[b]]
        return out.reshape(at.shape)

    def _set_bits(self, b: int) -> np.ndarray:
        """The selected offsets in block ``b``; the last blocks used are kept
        (a batch's positions fall in few blocks, and the next batch's often
        in the same), at most ``_KEPT_BLOCKS`` of them."""
        cache = self.__dict__.setdefault("_blocks", {})
        found = cache.pop(b, None)
        if found is None:
            raw = self._padded[b * _BLOCK_BYTES:(b + 1) * _BLOCK_BYTES]
            found = np.flatnonzero(np.unpackbits(raw, bitorder="little")).astype(np.int32)
            if len(cache) >= _KEPT_BLOCKS:
                del cache[next(iter(cache))]
        cache[b] = found
        return found

    def rank(self, parents) -> np.ndarray:
        """How many selected records lie before each parent index (0..parent_count):
        the view position of a selected one, the next view position otherwise."""
        at = np.asarray(parents, dtype=np.int64)
        flat = np.clip(at.reshape(-1), 0, self.parent_count)
        if self.bits is None:
            if not len(self.starts):
                return np.zeros(at.shape, np.int64)
            run = np.searchsorted(self.starts, flat, side="right") - 1
            inside = np.clip(flat - self.starts[np.maximum(run, 0)], 0,
                             (self.stops - self.starts)[np.maximum(run, 0)])
            out = np.where(run >= 0, self._first[np.maximum(run, 0)] + inside, 0)
            return out.reshape(at.shape)
        block, within = np.divmod(flat, BLOCK_BITS)
        out = self._before[block].copy()
        for k, (b, w) in enumerate(zip(block.tolist(), within.tolist())):
            if w:
                raw = self._padded[b * _BLOCK_BYTES:(b + 1) * _BLOCK_BYTES]
                out[k] += int(np.unpackbits(raw, bitorder="little", count=w).sum())
        return out.reshape(at.shape)

    def runs(self, lo: int = 0, hi: int | None = None) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` of the selected runs of parent records in ``lo..hi``."""
        hi = self.parent_count if hi is None else hi
        if self.bits is None:
            first = int(np.searchsorted(self.stops, lo, side="right"))
            for s, e in zip(self.starts[first:].tolist(), self.stops[first:].tolist()):
                if s >= hi:
                    return
                yield max(s, lo), min(e, hi)
            return
        step = 1 << 20
        for base in range(lo - lo % 8, hi, step):
            end = min(hi, base + step)
            flags = np.unpackbits(self._padded[base // 8:-(-end // 8)], bitorder="little")
            flags = flags[: end - base].astype(np.int8)
            if base < lo:
                flags[: lo - base] = 0
            edges = np.flatnonzero(np.diff(np.concatenate([[0], flags, [0]])))
            yield from zip((edges[0::2] + base).tolist(), (edges[1::2] + base).tolist())

    # -- storage ------------------------------------------------------------------

    def encode(self) -> dict:
        """The stored form (see the module's docstring)."""
        if self.bits is None:
            raw = np.stack([self.starts, self.stops], axis=1).astype("<i8").tobytes()
        else:  # the bitmap's own bytes, not a copy: it is a bit per record
            raw = memoryview(np.ascontiguousarray(self.bits, np.uint8))
        return {"encoding": self.encoding, "records": self.count,
                "sha256": hashlib.sha256(raw).hexdigest(),
                "data": base64.b64encode(zlib.compress(raw, 6)).decode("ascii")}

    @classmethod
    def decode(cls, stored: dict, parent_count: int) -> Selection:
        """A selection from its stored form, checked (digest, bounds, count).

        Its size is checked before it is inflated: the base64 text against
        what the largest selection of ``parent_count`` records compresses
        to at worst, the inflated bytes against that largest selection
        (:func:`largest_raw`), inflating no further.

        Raises:
            SelectionError: what is wrong with it.
        """
        if not isinstance(stored, dict) or stored.get("encoding") not in ENCODINGS:
            raise SelectionError(f"the selection's encoding is not one of {ENCODINGS}")
        raw = _inflate(stored.get("data", ""), largest_raw(stored["encoding"], parent_count),
                       stored["encoding"], parent_count)
        if hashlib.sha256(raw).hexdigest() != stored.get("sha256"):
            raise SelectionError("the selection fails its SHA-256 check")
        if stored["encoding"] == "bitmap":
            if len(raw) != -(-parent_count // 8):
                raise SelectionError(f"the bitmap has {len(raw) * 8} bits for "
                                     f"{parent_count} records")
            _check_padding(raw, parent_count)
            made = cls(parent_count, bits=np.frombuffer(raw, np.uint8).copy())
        else:
            if len(raw) % 16:
                raise SelectionError("the ranges are not int64 pairs")
            pairs = np.frombuffer(raw, "<i8").reshape(-1, 2).astype(np.int64)
            starts, stops = pairs[:, 0], pairs[:, 1]
            if len(pairs) and (starts[0] < 0 or stops[-1] > parent_count
                               or (stops <= starts).any() or (starts[1:] < stops[:-1]).any()):
                raise SelectionError("the ranges are not ascending, apart and inside the "
                                     "parent's records")
            made = cls(parent_count, starts=starts, stops=stops)
        if made.count != stored.get("records"):
            raise SelectionError(f"the selection holds {made.count} records, not the "
                                 f"{stored.get('records')} it says")
        return made


def largest_raw(encoding: str, parent_count: int) -> int:
    """The most bytes a selection of a parent of ``parent_count`` records
    takes decoded: a bitmap one bit per record; ranges 16 bytes per run, and
    at most ceil(parent_count / 2) runs, since runs are not empty and a
    record left out lies between two of them (runs that touch are one run:
    :meth:`Selection.from_ranges` joins them, :meth:`Selection.from_mask_chunks`
    never makes them)."""
    if encoding == "bitmap":
        return -(-parent_count // 8)
    return 16 * -(-parent_count // 2)


def _compressed_bound(size: int) -> int:
    """The most bytes zlib's compress() gives for ``size`` bytes (zlib's
    compressBound, its stream header and checksum, and some room)."""
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 13 + 6 + 64


def _inflate(text, limit: int, encoding: str, parent_count: int) -> bytes:
    """The bytes the base64 text of a compressed selection holds, refused
    past ``limit`` bytes (the text's length checked first, then at most
    ``limit + 1`` bytes inflated)."""
    if not isinstance(text, str):
        raise SelectionError("the selection's data is not base64 text")
    most = 4 * -(-_compressed_bound(limit) // 3)
    if len(text) > most:
        raise SelectionError(
            f"the selection's data is {len(text):,} characters of base64; a {encoding} of "
            f"{parent_count:,} records takes at most {most:,}: the view file is damaged "
            f"or not fastdata's; make the view again")
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(text, validate=True), limit + 1)
    except (ValueError, zlib.error) as exc:
        raise SelectionError(f"the selection's data cannot be decoded ({exc})") from None
    if len(raw) > limit:
        raise SelectionError(
            f"the selection's data inflates to more than {limit:,} bytes, the most a "
            f"{encoding} of {parent_count:,} records takes: the view file is damaged or "
            f"not fastdata's; make the view again")
    if not inflater.eof or inflater.unused_data:
        raise SelectionError("the selection's data cannot be decoded (the compressed "
                             "stream is cut short or followed by other bytes)")
    return raw


def _check_padding(raw: bytes, parent_count: int) -> None:
    """Refuse a bitmap with a bit set past the parent's last record (the
    padding of its last byte): it would count a record that is not there."""
    used = parent_count % 8
    if used and raw[-1] >> used:
        first = next(b for b in range(used, 8) if raw[-1] >> b & 1)
        raise SelectionError(
            f"the bitmap has a bit set in its padding past the parent's {parent_count} "
            f"records (record {parent_count - used + first}, which is not there): the "
            f"view file is damaged; make the view again")

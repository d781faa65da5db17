"""The order a whole job reads an epoch in: one sequence per (seed, epoch).

Every rank and DataLoader worker evaluates the same order and takes its slice
of it (:mod:`fastdata.order.slices`), so the samples the job consumes, and
their order, do not depend on how many ranks or workers read them; progress
is a position in that order (:mod:`fastdata.order.state`).

The order is computed per position, never as an array of the dataset's
size: :class:`EpochOrder` gives the record at any position from keyed
bijections (:mod:`fastdata.order.bijection`), so its cost is the batch's,
for a thousand records or 10^10.

Shuffling is a block shuffle: the records are cut into blocks of consecutive
records (which sit near each other in a shard), the blocks are permuted, and
the records of every ``window`` consecutive blocks are permuted together. A
batch then mixes records from many blocks (many shards, many classes of a
class-sorted pack) while a reader stays within a bounded set of blocks.
``block=1`` with a window of the whole dataset is a plain permutation of every
record (what random-access reading uses by default). A pack-time
``--shuffle`` uses :func:`permutation` (the pack plan lists its records anyway).

Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fastdata.order.bijection import Bijection, distinct, mix64

#: Records that stay together in a streamed shuffled order, and records mixed at once.
DEFAULT_BLOCK = 16
DEFAULT_WINDOW = 8192


def stable_seed(*parts: int | str) -> int:
    """A 64-bit seed from ints and tags: the same in every process and Python run
    (unlike ``hash()``), and unrelated for neighbouring inputs."""
    # int() first: a numpy integer's repr differs from the equal Python int's.
    text = repr(tuple(p if isinstance(p, str) else int(p) for p in parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Shuffle:
    """How an epoch's order is made: ``block`` consecutive records move together,
    ``window`` records (whole blocks) are permuted among themselves."""

    enabled: bool = False
    seed: int = 0
    block: int | str = DEFAULT_BLOCK  # records, or "shard": each shard is one block
    window: int = DEFAULT_WINDOW

    def describe(self, epoch: int | None = None) -> dict:
        """What fixes the order, for a resume state (the same in every epoch)."""
        block = self.block if self.block == "shard" else int(self.block)
        return {"shuffle": self.enabled, "seed": int(self.seed), "block": block,
                "window": int(self.window)}


def permutation(n: int, seed: int) -> np.ndarray:
    """The documented permutation of ``range(n)`` for ``seed`` (int64), of a
    pack-time ``--shuffle``:
    ``numpy.random.Generator(numpy.random.PCG64(seed)).permutation(n)``, the
    same on every machine and Python version."""
    return np.random.Generator(np.random.PCG64(seed)).permutation(n).astype(np.int64, copy=False)


def epoch_order(n: int, shuffle: Shuffle, epoch: int,
                block_starts: np.ndarray | None = None) -> EpochOrder:
    """The order the job reads epoch ``epoch`` in: an :class:`EpochOrder`,
    whose ``order[positions]`` are record indices, computed for the
    positions asked for.

    ``block_starts`` (the first record of each block, from 0, ascending) gives
    blocks of their own lengths: whole shards, which ``block="shard"`` needs
    (:func:`shard_starts`).

    Raises:
        ValueError: ``block="shard"`` without shard bounds.
    """
    if shuffle.enabled and shuffle.block == "shard" and block_starts is None:
        raise ValueError("Order(block='shard') shuffles whole shards, and no shard bounds "
                         "were given: read a sharded dataset, or give block= a record count")
    return EpochOrder(int(n), shuffle, int(epoch), block_starts)


class EpochOrder:
    """Epoch ``epoch``'s order of ``n`` records: ``order[p]`` for a position,
    a slice or an integer array of positions gives record indices (int64).

    Made per position (:mod:`fastdata.order.bijection`): blocks are permuted
    by one keyed bijection, and the records of each window of consecutive
    permuted blocks by the window's own, so a batch mixes records of many
    blocks while a reader stays within a window's blocks. With ``block=1``
    and a window of the whole dataset it is one bijection of every record.
    Fixed blocks hold nothing per record or block. ``block="shard"`` holds
    the shards' permutation and bounds: O(shards). A dataset's last records
    that do not fill a whole block (fewer than ``block``) are the last
    window's last slot. An epoch of at most :data:`WHOLE_UP_TO` records is
    computed whole on first use (the same values; at most 8 MiB).
    """

    def __init__(self, n: int, shuffle: Shuffle, epoch: int,
                 block_starts: np.ndarray | None = None) -> None:
        self.n = n
        self.shuffle = shuffle
        self.enabled = shuffle.enabled and n > 1
        self._whole: np.ndarray | None = None
        if not self.enabled:
            return
        self._key = stable_seed("order", shuffle.seed, epoch)
        if block_starts is not None and shuffle.block == "shard":
            self._shards = _ShardWindows(n, np.asarray(block_starts, dtype=np.int64),
                                         int(shuffle.window), self._key)
            return
        self._shards = None
        self.block = max(1, int(shuffle.block))
        self.full_blocks = n // self.block
        self.per_window = max(1, int(shuffle.window) // self.block) * self.block
        # One window and single records: a plain bijection of the records.
        self._single = Bijection(n, self._key) if self.per_window >= n and self.block == 1 \
            else None
        self._blocks = Bijection(self.full_blocks, self._key ^ _BLOCKS)

    def __len__(self) -> int:
        return self.n

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, where) -> np.ndarray | int:
        if isinstance(where, slice):
            return self.at(np.arange(*where.indices(self.n), dtype=np.int64))
        if np.ndim(where) == 0:
            return int(self.at(np.asarray([where], dtype=np.int64))[0])
        return self.at(np.asarray(where, dtype=np.int64))

    def at(self, positions: np.ndarray) -> np.ndarray:
        """Record indices at ``positions`` (int64 in ``[0, n)``; negative ones
        count from the end)."""
        pos = np.asarray(positions, dtype=np.int64)
        pos = np.where(pos < 0, pos + self.n, pos)
        if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= self.n):
            raise IndexError(f"a position of {positions!r} is outside an order of {self.n}")
        if not self.enabled:
            return pos.copy()
        if self.n <= WHOLE_UP_TO:
            # A small epoch is computed whole once (8 MiB at most): cheaper per
            # batch than the bijections' per-call cost, and bounded.
            if self._whole is None:
                self._whole = self._records(np.arange(self.n, dtype=np.int64))
            return self._whole[pos]
        return self._records(pos)

    def _records(self, pos: np.ndarray) -> np.ndarray:
        if self._shards is not None:
            return self._shards.at(pos)
        if self._single is not None:
            return self._single.at(pos)
        window, offset = np.divmod(pos, self.per_window)
        size = np.minimum(self.per_window, self.n - window * self.per_window)
        mixed = np.empty_like(pos)
        for s in distinct(size)[0]:  # every window is whole but the last
            here = size == s
            keys = mix64(np.uint64(self._key) ^ window[here].astype(np.uint64))
            mixed[here] = Bijection(int(s), keys).at(offset[here])
        slot = window * (self.per_window // self.block) + mixed // self.block
        within = mixed % self.block
        whole = slot < self.full_blocks
        first = np.full_like(pos, self.full_blocks * self.block)  # the short last block
        first[whole] = self._blocks.at(slot[whole]) * self.block
        return first + within


#: Epochs of up to this many records are computed whole, once (8 MiB of int64).
WHOLE_UP_TO = 1 << 20
#: Tells the block permutation's key from the records' (any odd constant).
_BLOCKS = 0x5851F42D4C957F2D


class _ShardWindows:
    """The order of whole shards as blocks: the shards permuted, and the
    records of every ``window`` records' worth of consecutive permuted shards
    by the window's own bijection. Holds three arrays of the shards' count."""

    def __init__(self, n: int, firsts: np.ndarray, window: int, key: int) -> None:
        lengths = np.diff(np.append(firsts, n))
        perm = Bijection(len(firsts), key ^ _BLOCKS).at(np.arange(len(firsts)))
        self.firsts = firsts[perm]                       # by slot
        self.slot_ends = np.cumsum(lengths[perm])        # positions, by slot
        per_window = max(1, round(window / max(1.0, float(lengths.mean()))))
        ends = self.slot_ends[per_window - 1::per_window]
        self.window_ends = ends if ends.size and ends[-1] == n else np.append(ends, n)
        self.key = key

    def at(self, pos: np.ndarray) -> np.ndarray:
        window = np.searchsorted(self.window_ends, pos, side="right")
        begin = np.where(window > 0, self.window_ends[window - 1], 0)
        size = self.window_ends[window] - begin
        mixed = np.empty_like(pos)
        for s in distinct(size)[0]:
            here = size == s
            keys = mix64(np.uint64(self.key) ^ window[here].astype(np.uint64))
            mixed[here] = begin[here] + Bijection(int(s), keys).at(pos[here] - begin[here])
        slot = np.searchsorted(self.slot_ends, mixed, side="right")
        slot_begin = np.where(slot > 0, self.slot_ends[slot - 1], 0)
        return self.firsts[slot] + (mixed - slot_begin)


def shard_starts(shuffle: Shuffle, reader) -> np.ndarray | None:
    """The first record of each of ``reader``'s shards when ``shuffle`` takes
    whole shards as blocks (``block="shard"``), else None.

    Raises:
        ValueError: ``block="shard"`` and the dataset is not sharded.
    """
    if shuffle.block != "shard":
        return None
    if not getattr(reader, "sharded", False):
        raise ValueError(f"Order(block='shard') shuffles whole shards, and "
                         f"{getattr(reader, 'path', 'this dataset')} is not sharded (LMDB and "
                         f"HDF5 are one file): give block= a record count")
    return np.asarray([first for first, _ in reader.shard_ranges()], dtype=np.int64)

"""The order a whole job reads an epoch in: one sequence per (seed, epoch).

Every rank and DataLoader worker computes the same permutation of the records
and takes its slice of it (:mod:`fastdata.order.slices`), so the samples the job
consumes, and their order, do not depend on how many ranks or workers read
them; progress is a position in that order (:mod:`fastdata.order.state`).

Shuffling is a block shuffle: the records are cut into blocks of consecutive
records (which sit near each other in a shard), the blocks are permuted, and
the records of every ``window`` consecutive blocks are permuted together. A
batch then mixes records from many blocks (many shards, many classes of a
class-sorted pack) while a reader stays within a bounded set of blocks.
``block=1`` with a window of the whole dataset is a plain permutation of every
record (what random-access reading uses by default). :func:`permutation` is the
one permutation function: epochs seed it from (seed, epoch), a pack-time
``--shuffle`` from its seed alone.

Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

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
    """The documented permutation of ``range(n)`` for ``seed`` (int64):
    ``numpy.random.Generator(numpy.random.PCG64(seed)).permutation(n)``, the
    same on every machine and Python version."""
    return np.random.Generator(np.random.PCG64(seed)).permutation(n).astype(np.int64, copy=False)


def epoch_order(n: int, shuffle: Shuffle, epoch: int,
                block_starts: np.ndarray | None = None) -> np.ndarray:
    """Record indices in the order the job reads epoch ``epoch`` (int64, length n).

    ``block_starts`` (the first record of each block, from 0, ascending) gives
    blocks of their own lengths: whole shards, which ``block="shard"`` needs
    (:func:`shard_starts`)."""
    if not shuffle.enabled or n <= 1:
        return np.arange(n, dtype=np.int64)
    if shuffle.block == "shard" and block_starts is None:
        raise ValueError("Order(block='shard') shuffles whole shards, and no shard bounds "
                         "were given: read a sharded dataset, or give block= a record count")
    seed = stable_seed("order", shuffle.seed, epoch)
    if shuffle.block == 1 and int(shuffle.window) >= n:  # every record on its own
        return permutation(n, seed)
    rng = np.random.Generator(np.random.PCG64(seed))
    if block_starts is not None:
        return _order_of_blocks(n, np.asarray(block_starts, dtype=np.int64),
                                int(shuffle.window), rng)
    block = max(1, int(shuffle.block))
    blocks = -(-n // block)
    starts = rng.permutation(blocks).astype(np.int64) * block
    # Records of the permuted blocks, in block order (the last block may be short).
    lengths = np.minimum(block, n - starts)
    order = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(n)
    # Permute inside each window of whole blocks: sort by (window, random key).
    per_window = max(1, int(shuffle.window) // block) * block
    window_of = np.arange(n, dtype=np.int64) // per_window
    return order[np.lexsort((rng.random(n), window_of))]


def shard_starts(shuffle: Shuffle, reader) -> np.ndarray | None:
    """The first record of each of ``reader``'s shards when ``shuffle`` takes
    whole shards as blocks (``block="shard"``), else None.

    Raises:
        ValueError: ``block="shard"`` and the dataset is not sharded.
    """
    if shuffle.block != "shard":
        return None
    ranges = getattr(reader, "shard_ranges", None)
    if ranges is None:
        raise ValueError(f"Order(block='shard') shuffles whole shards, and "
                         f"{getattr(reader, 'path', 'this dataset')} is not sharded (LMDB and "
                         f"HDF5 are one file): give block= a record count")
    return np.asarray([first for first, _ in ranges()], dtype=np.int64)


def _order_of_blocks(n: int, firsts: np.ndarray, window: int, rng) -> np.ndarray:
    """The block shuffle over blocks of any lengths: the blocks permuted, then
    the records of every ``window``-records' worth of consecutive blocks."""
    lengths_all = np.diff(np.append(firsts, n))
    perm = rng.permutation(len(firsts))
    starts, lengths = firsts[perm], lengths_all[perm]
    order = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(n)
    per_window = max(1, round(window / max(1.0, float(lengths_all.mean()))))
    window_of = np.repeat(np.arange(len(perm), dtype=np.int64) // per_window, lengths)
    return order[np.lexsort((rng.random(n), window_of))]

"""The order a dataset is read in: one value for every way of reading.

``fastdata.Order(shuffle=..., seed=..., batch_size=..., drop_last=..., rank=...,
world_size=..., block=..., window=...)`` is given once, to the dataset
(``open_dataset(path, order=...)``, map-style or streaming) or to DALI, and
nothing else takes these options, so no two objects have to agree on them.
The order engine (:mod:`fastdata.order.epochs`, :mod:`fastdata.order.slices`)
turns it into each epoch's sequence and each rank's and worker's slice. No
torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from fastdata.order.epochs import DEFAULT_BLOCK, DEFAULT_WINDOW, Shuffle

#: Batches of a loader when the order names none.
DEFAULT_BATCH = 64


@dataclass(frozen=True)
class Order:
    """Which records each rank reads, in what order, in batches of what size.

    Args:
        shuffle: each epoch in a seeded random order (else the stored order).
        seed: the order's seed (the same on every rank); the epoch is mixed in,
            and random crops draw from it too.
        batch_size: samples per batch. ``fastdata.loader`` and DALI use it
            (None: 64); a stream hands its DataLoader workers whole batches of
            it in turn, so the job's order does not depend on the workers (None:
            single samples in turn).
        drop_last: leave out the last samples of the order (fewer than one per
            rank) and a partial last batch, instead of padding the ranks with
            repeats of the order's first samples.
        rank: this rank; None: torch.distributed's (0 outside a process group).
        world_size: the number of ranks; None: torch.distributed's (1 outside
            a process group).
        block: with ``window``, the shuffle mode (see :mod:`fastdata.order.epochs`):
            records in blocks of ``block`` consecutive records (or "shard",
            a shard per block).
        window: the records of ``window`` records' worth of blocks mixed at
            once. None (both): the reader's own, which is a plain
            permutation of every record (1, the whole dataset) for map-style
            and DALI reading and (16, 8192) for streams, whose reads stay near
            each other. The same values give the same order in every way of
            reading.

    A copy with a value changed, checked again: ``dataclasses.replace(order, seed=1)``.

    Raises:
        ValueError: an option out of range.
    """

    shuffle: bool = False
    seed: int = 0
    batch_size: int | None = None
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    block: int | Literal["shard"] | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        if isinstance(self.seed, bool) or int(self.seed) < 0:
            raise ValueError(f"seed must be a non-negative integer, not {self.seed!r}")
        object.__setattr__(self, "seed", int(self.seed))
        if self.batch_size is not None:
            if isinstance(self.batch_size, bool) or int(self.batch_size) < 1:
                raise ValueError(f"batch_size must be at least 1, not {self.batch_size!r}")
            object.__setattr__(self, "batch_size", int(self.batch_size))
        object.__setattr__(self, "drop_last", bool(self.drop_last))
        if self.block is not None and self.block != "shard":
            if isinstance(self.block, (str, bool)) or int(self.block) < 1:
                raise ValueError(f"block must be a record count of at least 1 or 'shard', "
                                 f"not {self.block!r}")
            object.__setattr__(self, "block", int(self.block))
        if self.window is not None:
            if isinstance(self.window, bool) or int(self.window) < 1:
                raise ValueError(f"window must be at least 1, not {self.window!r}")
            object.__setattr__(self, "window", int(self.window))
        for name in ("rank", "world_size"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, int(value))
        if self.world_size is not None and self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, not {self.world_size}")
        if self.rank is not None and (self.rank < 0 or self.world_size is not None
                                      and self.rank >= self.world_size):
            raise ValueError(f"rank must be in 0..world_size-1, not {self.rank}")

    @property
    def policy(self) -> str:
        """How the ranks' shares are evened out: "drop" or "pad"."""
        return "drop" if self.drop_last else "pad"

    @property
    def loader_batch(self) -> int:
        """The batch size a loader reads in (``batch_size``, else 64)."""
        return DEFAULT_BATCH if self.batch_size is None else self.batch_size

    def shuffle_of(self, records: int, *, stream: bool) -> Shuffle:
        """The engine's shuffle mode for a dataset of ``records`` records, read
        as a stream or by random access (which decides the defaults)."""
        if stream:
            block = DEFAULT_BLOCK if self.block is None else self.block
            window = DEFAULT_WINDOW if self.window is None else self.window
        else:
            block = 1 if self.block is None else self.block
            window = max(1, records) if self.window is None else self.window
        return Shuffle(self.shuffle, self.seed, block, window)


#: Order's option names.
ORDER_NAMES = tuple(f.name for f in fields(Order))

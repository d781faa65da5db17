"""Several datasets mixed into one global order (torch-free).

A mixture of sources (each a dataset of ``size`` records with a ``weight``, a
share of the epoch, or a ``count`` of samples per epoch) has epochs of
``samples_per_epoch`` samples. Epoch ``e`` of the mixture is one sequence of
``(source, record)`` pairs, fixed by (seed, epoch) alone:

- **How many of each source.** Counts are fixed, or the weights (a mapping,
  or a function of the epoch: a curriculum) are apportioned to the epoch's
  samples by largest remainder, so the counts sum to the epoch exactly.
- **Which records.** Each source is read as an endless sequence of *cycles*:
  cycle c is the order engine's order of the whole source for "epoch" c
  (:func:`fastdata.order.epochs.epoch_order`, under the source's own seed).
  Epoch e takes the next ``count`` samples of that sequence, after those the
  epochs before it took. A source smaller than its share is repeated, each
  repeat a fresh permutation; a larger one goes on where the last epoch
  stopped: every record is seen once before any repeats.
- **Where they go.** The sources are spread through the epoch, not
  concatenated: the j-th sample of source s sits at key ``(j + u_s) / count_s``
  (``u_s`` a random phase in [0, 1) per source and epoch), and the epoch is the
  samples sorted by key, computed for the positions asked for
  (:mod:`fastdata.order.interleave`). Any run of consecutive samples then holds a source
  of share f in its share to within 1 + (k - 2) f samples, k the sources in
  the epoch: within one for two sources.

Ranks, workers, batches and resume positions are those of any dataset: the
mixture's epoch is a sequence of ``samples_per_epoch`` positions sliced by
:mod:`fastdata.order.slices`; :class:`MixOrder` stands for it in a resume
state, so a state of another mixture is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fastdata.order.epochs import Shuffle, epoch_order, stable_seed
from fastdata.order.interleave import EpochInterleave


@dataclass(frozen=True)
class MixSource:
    """One source of a mixture: ``size`` records, a ``weight`` or a ``count``."""

    name: str
    size: int
    weight: float | None = None
    count: int | None = None
    block: int = 1
    window: int | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"a mixture source needs a name (a non-empty string), not "
                             f"{self.name!r}")
        if self.size < 1:
            raise ValueError(f"mixture source {self.name!r} holds no records")
        if (self.weight is None) == (self.count is None):
            raise ValueError(f"mixture source {self.name!r}: give a weight or a count, "
                             f"not {'both' if self.weight is not None else 'neither'}")
        if self.weight is not None and not self.weight >= 0:
            raise ValueError(f"mixture source {self.name!r}: weight must be 0 or more, not "
                             f"{self.weight!r}")
        if self.count is not None and (isinstance(self.count, bool) or int(self.count) < 0):
            raise ValueError(f"mixture source {self.name!r}: count must be 0 or more, not "
                             f"{self.count!r}")
        if isinstance(self.block, (str, bool)) or int(self.block) < 1:
            raise ValueError(f"mixture source {self.name!r}: block must be a record count of "
                             f"at least 1, not {self.block!r} (a mixture reads its sources "
                             f"by record, so whole shards are not blocks)")
        if self.window is not None and (isinstance(self.window, bool) or int(self.window) < 1):
            raise ValueError(f"mixture source {self.name!r}: window must be at least 1, not "
                             f"{self.window!r}")

    def describe(self) -> dict:
        """What fixes this source's part of the order (the window as used: None
        is the whole source)."""
        return {"name": self.name, "size": self.size, "count": self.count,
                "weight": self.weight, "block": int(self.block),
                "window": self.size if self.window is None else int(self.window)}


Weights = Callable[[int], Mapping[str, float]]


class Mixture:
    """The global order of a mixture's epochs (see the module docstring).

    Args:
        sources: the sources, in a fixed order (it is part of the mixture).
        samples_per_epoch: the epoch's size; default: the counts' sum when
            every source has a count, else the sources' total size.
        seed, shuffle: the order's seed and whether records are shuffled
            (phases are random either way, so the interleave is fine-grained).
        schedule: a function of the epoch giving every source's weight (by
            name): a curriculum, evaluated deterministically; it replaces the
            sources' weights.
        start, first_epoch: a mixture that continues another from a point
            (:meth:`continued`): its first epoch, and the samples each source
            (by name) had already given there; sources not named start at 0.
    """

    def __init__(self, sources: Sequence[MixSource], *, samples_per_epoch: int | None = None,
                 seed: int = 0, shuffle: bool = True, schedule: Weights | None = None,
                 start: Mapping[str, int] | None = None, first_epoch: int = 0) -> None:
        self.sources = list(sources)
        if not self.sources:
            raise ValueError("a mixture needs at least one source")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"mixture sources need different names: {names}")
        counted = [s.count is not None for s in self.sources]
        if any(counted) and not all(counted):
            raise ValueError("give every mixture source a weight, or every one a count: "
                             + ", ".join(f"{s.name} has a {'count' if c else 'weight'}"
                                         for s, c in zip(self.sources, counted)))
        self.by_count = all(counted)
        if schedule is not None and self.by_count:
            raise ValueError("a weight schedule needs weights, not counts")
        if samples_per_epoch is None:
            samples_per_epoch = (sum(int(s.count) for s in self.sources) if self.by_count
                                 else sum(s.size for s in self.sources))
        self.samples_per_epoch = int(samples_per_epoch)
        if self.samples_per_epoch < 1:
            raise ValueError(f"samples_per_epoch must be at least 1, not {samples_per_epoch}")
        if self.by_count and sum(int(s.count) for s in self.sources) != self.samples_per_epoch:
            raise ValueError(f"the sources' counts sum to "
                             f"{sum(int(s.count) for s in self.sources)}, not "
                             f"samples_per_epoch={self.samples_per_epoch}")
        self.seed, self.shuffle, self.schedule = int(seed), bool(shuffle), schedule
        self.first_epoch = int(first_epoch)
        self.start = {s.name: int((start or {}).get(s.name, 0)) for s in self.sources}
        self._counts: list[np.ndarray] = []   # per epoch from first_epoch, in order
        self._interleave: tuple[int, EpochInterleave] | None = None
        self.counts(self.first_epoch)  # checks the weights now, not at the first batch

    # -- counts ---------------------------------------------------------------

    def _weights(self, epoch: int) -> np.ndarray:
        if self.schedule is None:
            return np.asarray([s.weight for s in self.sources], dtype=np.float64)
        given = dict(self.schedule(epoch))
        missing = [s.name for s in self.sources if s.name not in given]
        extra = sorted(set(given) - {s.name for s in self.sources})
        if missing or extra:
            raise ValueError(f"the weight schedule's epoch {epoch} names "
                             f"{sorted(given)}; the sources are "
                             f"{[s.name for s in self.sources]}")
        weights = np.asarray([float(given[s.name]) for s in self.sources])
        if not np.all(weights >= 0):
            raise ValueError(f"the weight schedule gave negative weights in epoch {epoch}")
        return weights

    def counts(self, epoch: int) -> np.ndarray:
        """Samples of each source in epoch ``epoch`` (int64, summing to the epoch)."""
        if epoch < self.first_epoch:
            raise ValueError(f"this mixture continues another from epoch {self.first_epoch}; "
                             f"it has no epoch {epoch}")
        while len(self._counts) <= epoch - self.first_epoch:
            self._counts.append(self._apportion(self.first_epoch + len(self._counts)))
        return self._counts[epoch - self.first_epoch]

    def _apportion(self, epoch: int) -> np.ndarray:
        if self.by_count:
            return np.asarray([int(s.count) for s in self.sources], dtype=np.int64)
        weights = self._weights(epoch)
        total = weights.sum()
        if not total > 0:
            raise ValueError(f"the mixture's weights sum to 0 in epoch {epoch}")
        exact = weights / total * self.samples_per_epoch
        counts = np.floor(exact).astype(np.int64)
        # Largest remainder; ties to the earlier source.
        short = self.samples_per_epoch - int(counts.sum())
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
        return counts

    def taken_before(self, epoch: int) -> np.ndarray:
        """Samples each source gave the epochs before ``epoch``."""
        base = np.asarray([self.start[s.name] for s in self.sources], dtype=np.int64)
        if epoch <= self.first_epoch:
            return base
        self.counts(epoch - 1)
        return base + np.sum(self._counts[:epoch - self.first_epoch], axis=0, dtype=np.int64)

    def taken_at(self, epoch: int, consumed: int) -> dict[str, int]:
        """Samples each source has given once the first ``consumed`` samples of
        epoch ``epoch`` are read (by name)."""
        consumed = min(max(0, int(consumed)), self.samples_per_epoch)
        here = self.interleave(epoch).before(consumed)
        return {s.name: int(n) for s, n in zip(self.sources, self.taken_before(epoch) + here)}

    def continued(self, sources: Sequence[MixSource], epoch: int, consumed: int,
                  **options) -> Mixture:
        """A new mixture of ``sources`` from the point (epoch ``epoch``, first
        ``consumed`` samples read) of this one: its first epoch is ``epoch``,
        and each source kept (by name, of the same size) goes on after the
        samples it gave here, so nothing is repeated or skipped that need not
        be; the rest of this mixture's epoch ``epoch`` is not read.

        Raises:
            ValueError: a source kept has another size.
        """
        mine = {s.name: s for s in self.sources}
        for s in sources:
            if s.name in mine and mine[s.name].size != s.size:
                raise ValueError(f"source {s.name!r} had {mine[s.name].size} records and has "
                                 f"{s.size} now: it is another dataset; give it another name")
        return Mixture(sources, start=self.taken_at(epoch, consumed), first_epoch=epoch,
                       **options)

    @classmethod
    def described(cls, description: dict) -> Mixture:
        """The mixture a resume state's order describes (see :meth:`describe`).

        Raises:
            ValueError: the description is not a mixture's, or has a schedule
                (a function, which a state cannot hold).
        """
        if not isinstance(description, dict) or "mixture" not in description:
            raise ValueError("this state was not saved from a mixture")
        if description.get("schedule") is not None:
            raise ValueError("this state's mixture had a weight schedule, which a state "
                             "cannot hold: continue it with the same schedule instead")
        sources = [MixSource(s["name"], int(s["size"]), weight=s.get("weight"),
                             count=s.get("count"), block=int(s.get("block", 1)),
                             window=s.get("window")) for s in description["mixture"]]
        return cls(sources, samples_per_epoch=int(description["samples_per_epoch"]),
                   seed=int(description["seed"]), shuffle=bool(description["shuffle"]),
                   start=description.get("start"),
                   first_epoch=int(description.get("first_epoch", 0)))

    # -- the epoch's sequence ---------------------------------------------------

    def epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Epoch ``epoch`` as (source number, record index) arrays, in order
        (arrays of the epoch's size: :meth:`epoch_at` for some positions)."""
        source, record, _ = self.epoch_with_cycles(epoch)
        return source, record

    def epoch_with_cycles(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`epoch`, and the cycle of its source each sample belongs to
        (a record's n-th appearance is in its n-th cycle: random crops draw
        from it, so a repeated record is cropped anew)."""
        return self.epoch_at(epoch, np.arange(self.samples_per_epoch, dtype=np.int64))

    def interleave(self, epoch: int) -> EpochInterleave:
        """Epoch ``epoch``'s positions to (source, sample of the source), per
        position (:mod:`fastdata.order.interleave`); the last epoch's kept."""
        if self._interleave is None or self._interleave[0] != epoch:
            rng = np.random.Generator(np.random.PCG64(stable_seed("mix", self.seed, epoch)))
            phases = rng.random(len(self.sources))
            self._interleave = (epoch, EpochInterleave(self.counts(epoch), phases))
        return self._interleave[1]

    def epoch_at(self, epoch: int, positions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source number, record index, cycle) at ``positions`` of epoch
        ``epoch``: computed for those positions, O(positions) beyond a chunk
        of the interleave."""
        source, j = self.interleave(epoch).at(positions)
        sizes = np.asarray([s.size for s in self.sources], dtype=np.int64)
        taken = self.taken_before(epoch)[source] + j  # in the source's endless sequence
        record = np.empty_like(taken)
        for s in dict.fromkeys(source.reshape(-1).tolist()):
            here = source == s
            record[here] = self._records_at(s, taken[here])
        return source, record, taken // sizes[source]

    def _records_at(self, s: int, taken: np.ndarray) -> np.ndarray:
        """Records at places ``taken`` of source ``s``'s endless sequence of
        cycles (cycle c: the order engine's order of the source for "epoch" c)."""
        source = self.sources[s]
        n = source.size
        mode = Shuffle(self.shuffle, stable_seed("mix-source", self.seed, source.name),
                       source.block, n if source.window is None else source.window)
        cycle, pos = np.divmod(taken, n)
        out = np.empty_like(taken)
        for c in dict.fromkeys(cycle.tolist()):
            here = cycle == c
            out[here] = epoch_order(n, mode, c)[pos[here]]
        return out

    def describe(self, epoch: int | None = None) -> dict:
        """What fixes the mixture's order up to epoch ``epoch`` (default: its
        first), for a resume state: the sources (sizes, shares, block and
        window), the epoch size, seed and shuffle, and a weight schedule's
        counts of every epoch from the first through ``epoch`` (a digest):
        the epochs before a point and the point's own fix which records
        come next, so a state is taken for the same mixture only where they
        agree. A schedule that differs only in later epochs takes effect there.
        """
        epoch = self.first_epoch if epoch is None else int(epoch)
        out = {"mixture": [s.describe() for s in self.sources],
               "samples_per_epoch": self.samples_per_epoch,
               "seed": self.seed, "shuffle": self.shuffle,
               "schedule": None if self.schedule is None else self._schedule_digest(epoch)}
        if self.first_epoch or any(self.start.values()):  # continued from another
            out.update(start=dict(self.start), first_epoch=self.first_epoch)
        return out

    def _schedule_digest(self, epoch: int) -> dict:
        """The weight schedule's counts of epochs first_epoch..epoch, as a digest.
        Costs one row of counts per epoch, kept (as the counts are anyway)."""
        import hashlib

        last = max(self.first_epoch, epoch)
        counts = np.stack([self.counts(e) for e in range(self.first_epoch, last + 1)])
        digest = hashlib.blake2b(counts.astype("<i8").tobytes(), digest_size=16).hexdigest()
        return {"epochs": [self.first_epoch, last], "counts": digest}


@dataclass(frozen=True)
class MixOrder:
    """The position order of a mixture's epoch for the engine's slicing: the
    mixture's sequence read as it stands (it is already interleaved and
    shuffled), described by the mixture (so a state of another is refused)."""

    mixture: Mixture

    enabled = False
    seed = 0
    block = 1

    @property
    def window(self) -> int:
        return self.mixture.samples_per_epoch

    def describe(self, epoch: int | None = None) -> dict:
        return self.mixture.describe(epoch)

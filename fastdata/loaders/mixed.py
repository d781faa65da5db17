"""Several packed datasets read as one: ``fastdata.mix``.

The order is :class:`fastdata.order.mixture.Mixture`'s (shares, repeats,
interleave, per-epoch schedules); this module is the torch layer over it: a
map-style Dataset whose position i of epoch e is record r of source s, read
through that source's own Dataset (batched per source), with its labels kept
or merged as asked. :class:`fastdata.EpochBatches` (and so ``fastdata.loader``)
slices it into equal batches per rank and resumes it exactly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fastdata.dataset.ref import DatasetRef
from fastdata.dataset.resolve import format_of
from fastdata.decoding.options import Decode
from fastdata.errors import FastDataError
from fastdata.keywords import check_read_values, explain_keywords
from fastdata.loaders.buffers import batch_tensor
from fastdata.loaders.collate import Batch
from fastdata.loaders.datasets import dataset_class
from fastdata.loaders.meter_setup import table_of
from fastdata.loaders.samples import OnError
from fastdata.meter.table import clock
from fastdata.mixture_file import ClassMode, combine_classes, read_mixture_file
from fastdata.order.mixture import MixOrder, MixSource, Mixture
from fastdata.order.options import Order


class _Rows:
    """Rows ``places`` of a batch array, as one source's batch to decode into."""

    def __init__(self, rows: np.ndarray, places: np.ndarray) -> None:
        self.rows, self.places = rows, places
        self.shape = (len(places), *rows.shape[1:])

    def __setitem__(self, k: int, image: np.ndarray) -> None:
        self.rows[self.places[k]] = image


@explain_keywords()
def mix(sources: Mapping[str, Any] | str | os.PathLike, *,
        samples_per_epoch: int | None = None, decode: Decode | None = None,
        order: Order | None = None, classes: ClassMode | Sequence[str] | None = None,
        schedule: Callable | None = None,
        with_metadata: bool = False, on_error: OnError = "raise",
        transform: Callable | None = None, target_transform: Callable | None = None,
        ) -> MixedDataset:
    """Mix several packed datasets into one map-style Dataset.

    Args:
        sources: source name -> ``{"path": ..., "weight": w}`` (a share of the
            epoch) or ``{"path": ..., "count": n}`` (samples per epoch); every
            source a weight, or every one a count. A path is anything
            ``open_dataset`` opens (any format, local or a URL); sharded
            formats are read by random access through their index. Or the
            path of a mixture file (:mod:`fastdata.mixture_file`), whose
            ``samples_per_epoch``, ``classes``, ``shuffle`` and ``seed`` are
            the defaults of the arguments here.
        samples_per_epoch: the epoch's size; default: the counts' sum, or the
            sources' total size when they have weights. A source smaller than
            its share is repeated (each repeat a fresh permutation); a larger
            one continues where it stopped in the next epoch.
        decode: one :class:`fastdata.Decode` for every source.
        order: a :class:`fastdata.Order`: ``shuffle`` shuffles each source's
            records (the sources are interleaved either way), ``seed``,
            ``batch_size``, ``drop_last``, ``rank``/``world_size`` as for any
            dataset; ``block``/``window`` apply within each source
            (a record count: ``block="shard"`` is refused, as a mixture
            reads its sources by record).
        classes: "own" (the default): each sample keeps its source's label;
            "merge": one class list, which every source must have identically;
            "union": the sorted union of the sources' class names, each label
            mapped by name; or a list of class names, every source's classes
            mapped by name into it (a class not in it is refused).
        schedule: a function of the epoch giving each source's weight by name
            (a curriculum); it replaces the weights.
        with_metadata: samples are ``(image, label, metadata)``, the metadata
            holding the record's own plus ``"source"`` (the source's name)
            and ``"index"`` (the record within it).
        on_error: as for ``open_dataset``.
        transform: as for ``open_dataset``.
        target_transform: as for ``open_dataset``.

    Raises:
        FastDataError: a source cannot be opened (named), its classes cannot be
            combined as asked, or its images cannot share batches with the
            others' (raw pixels beside encoded images without a fixed size).
    """

    if isinstance(sources, (str, os.PathLike)):

        described = read_mixture_file(sources)
        sources = described.sources
        samples_per_epoch = samples_per_epoch or described.samples_per_epoch
        classes = described.classes if classes is None else classes
        if order is None:
            order = Order(shuffle=described.shuffle, seed=described.seed)
    classes = "own" if classes is None else classes
    order = Order() if order is None else order
    check_read_values(decode, order)
    if order.block == "shard":
        raise ValueError("mix() reads its sources by record, so Order(block='shard') has no "
                         "shards to keep together: give block= a record count (or leave it "
                         "None for a permutation of every source)")
    if not isinstance(sources, Mapping) or not sources:
        raise ValueError("sources must be a non-empty mapping of name -> "
                         "{'path': ..., 'weight': ...} (or 'count': ...)")
    opened, specs = {}, []
    for name, spec in sources.items():
        spec = {"path": spec} if isinstance(spec, (str, os.PathLike, DatasetRef)) \
            else dict(spec)
        path = spec.pop("path", None)
        weight, count = spec.pop("weight", None), spec.pop("count", None)
        per_file = {k: spec.pop(k) for k in ("version", "verify", "allow_outside",
                                             "reader_settings") if k in spec}
        if spec:
            raise ValueError(f"mixture source {name!r}: unknown keys {sorted(spec)}; "
                             f"a source takes path (a path or a fastdata.DatasetRef), "
                             f"version, verify, allow_outside, reader_settings, and weight "
                             f"or count")
        if path is None:
            raise ValueError(f"mixture source {name!r} has no path")
        if per_file or isinstance(path, DatasetRef):
            path = DatasetRef.of(path, **per_file)
        if weight is None and count is None and schedule is not None:
            weight = 1.0  # the schedule gives the weights
        if isinstance(getattr(path, "path", path), (list, tuple)):
            raise ValueError(f"mixture source {name!r}: a source is one dataset (its manifest), "
                             f"not a list of shard files")
        try:
            # Map-style, each in the format's Dataset class, as open_dataset opens it.
            ds = dataset_class(format_of(path))(
                path, decode=decode, order=Order(seed=order.seed), on_error=on_error,
                with_metadata=with_metadata)
        except FastDataError as exc:
            raise FastDataError(f"mixture source {name!r}: {exc}") from exc
        opened[name] = ds
        specs.append(MixSource(str(name), len(ds), weight=weight, count=count,
                               block=1 if order.block is None else order.block,
                               window=order.window))
    mixture = Mixture(specs, samples_per_epoch=samples_per_epoch, seed=order.seed,
                      shuffle=order.shuffle, schedule=schedule)
    return MixedDataset(opened, mixture, order, classes=classes, transform=transform,
                        target_transform=target_transform, with_metadata=with_metadata,
                        decode=decode)


class MixedDataset(Dataset):
    """A map-style Dataset over a mixture (made by :func:`fastdata.mix`).

    Position i of the current epoch is ``locate(i)``; ``len()`` is the epoch's
    size. Read it with ``fastdata.loader(ds)`` or
    ``DataLoader(ds, batch_sampler=fastdata.EpochBatches(ds))``, which set the
    epoch, give every rank equal batches and resume exactly.

    Attributes:
        sources: source name -> its Dataset.
        mixture: the order (:class:`fastdata.order.mixture.Mixture`).
        order: the :class:`fastdata.Order`.
    """

    def __init__(self, sources: Mapping[str, Dataset], mixture: Mixture, order: Order, *,
                 classes: ClassMode | Sequence[str] = "own", transform: Callable | None = None,
                 target_transform: Callable | None = None, with_metadata: bool = False,
                 decode: Decode | None = None) -> None:
        self.sources = dict(sources)
        self.names = list(self.sources)
        self.mixture = mixture
        self.order = order
        self.position_order = MixOrder(mixture)
        self.transform, self.target_transform = transform, target_transform
        self.with_metadata = bool(with_metadata)
        self._check_shapes(decode or Decode())
        self._classes, self._relabel = self._combine_classes(classes)
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._entries: int | None = None  # the epoch the sources were last told

    @property
    def sources_identity(self) -> dict | None:
        """What a resume state records of the sources read: each one's version
        (or view) where it has one; None when none has."""
        found = {name: ds.reader.identity for name, ds in self.sources.items()}
        if not any(found.values()):
            return None
        return {"sources": {name: value or {"version": 1} for name, value in found.items()}}

    # -- classes ------------------------------------------------------------------

    def _combine_classes(self, classes) -> tuple[list[str] | None, list[np.ndarray] | None]:

        return combine_classes({name: list(ds.classes) for name, ds in self.sources.items()},
                               classes)

    @property
    def classes(self) -> list[str]:
        """The merged class list (``classes="merge"``, ``"union"`` or a list)."""
        if self._classes is None:
            raise FastDataError("the mixture's labels are each source's own (classes='own'): "
                                "see ds.sources[name].classes, or mix with classes='merge' "
                                "or 'union'")
        return list(self._classes)

    def _check_shapes(self, decode: Decode) -> None:
        """Refuse sources whose images could not share a batch."""
        if decode.crop is not None or isinstance(decode.size, tuple) or decode.output != "tensor":
            return
        raw = {n: ds.manifest.raw_shape for n, ds in self.sources.items()}
        kinds = {n: tuple(s) if s else "encoded" for n, s in raw.items()}
        if len(set(kinds.values())) > 1:
            listed = ", ".join(f"{n}: {'raw ' + 'x'.join(map(str, k)) if k != 'encoded' else k}"
                               for n, k in kinds.items())
            raise FastDataError(f"the mixture's sources store images differently ({listed}), so "
                                f"their batches would not stack: give "
                                f"decode=fastdata.Decode(size=(h, w)) or a crop")

    def shaping(self) -> dict:
        """What draws from each sample's randomness besides the order (every
        source decodes alike): a random crop's settings, for a resume state."""
        return next(iter(self.sources.values())).shaping()

    # -- the epoch ------------------------------------------------------------------

    def __len__(self) -> int:
        return self.mixture.samples_per_epoch

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` (its shares and records); EpochBatches calls it. A
        random crop draws from the record's cycle (its n-th appearance), not the epoch."""
        self._epoch.fill_(int(epoch))
        for ds in self.sources.values():
            ds.set_epoch(int(epoch))

    def _entries_at(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, record, cycle) at positions ``indices`` of the current epoch,
        computed for those positions (the mixture's order per position)."""
        epoch = self.epoch
        if self._entries != epoch:
            for ds in self.sources.values():  # workers read the epoch from shared memory
                ds.set_epoch(epoch)
            self._entries = epoch
        return self.mixture.epoch_at(epoch, indices)

    def locate(self, index: int) -> tuple[str, int]:
        """(source name, record index) at position ``index`` of the current epoch."""
        source, record, _ = self._entries_at(np.asarray([index], dtype=np.int64))
        return self.names[int(source[0])], int(record[0])

    def counts(self, epoch: int | None = None) -> dict[str, int]:
        """Samples of each source in ``epoch`` (default: the current one)."""
        counts = self.mixture.counts(self.epoch if epoch is None else int(epoch))
        return dict(zip(self.names, (int(c) for c in counts)))

    def continue_from(self, state: dict) -> dict:
        """Go on from where a run of another mixture stopped: other weights, an
        epoch size, sources added or left out. Every source both mixtures
        have (by name, the same dataset) continues after the samples it gave
        there, so nothing is repeated or skipped that need not be; this
        mixture's first epoch is the state's (its part not yet read is not).
        Call it before making this dataset's EpochBatches or loader.

        Args:
            state: the other run's ``EpochBatches.state_dict()``, or its
                StatefulDataLoader's whole state.

        Returns:
            The resume point to load into this dataset's EpochBatches
            (``batches.load_state_dict(point)``).

        Raises:
            ValueError: the state is not a mixture's, has a weight schedule,
                or used another seed or shuffle; a source kept changed size.
        """
        from fastdata.order.state import StreamPoint, order_description, saved_point

        point = saved_point(state)
        old = Mixture.described(point.order)
        mine = self.mixture
        if (old.seed, old.shuffle) != (mine.seed, mine.shuffle):
            raise ValueError(f"the state's mixture was read with seed {old.seed}, shuffle "
                             f"{old.shuffle}; this one has seed {mine.seed}, shuffle "
                             f"{mine.shuffle}: keep them to go on without repeats")
        self.mixture = old.continued(mine.sources, point.epoch, point.consumed,
                                     samples_per_epoch=mine.samples_per_epoch, seed=mine.seed,
                                     shuffle=mine.shuffle, schedule=mine.schedule)
        self.position_order = MixOrder(self.mixture)
        self._entries = None
        self.set_epoch(point.epoch)
        return StreamPoint(point.epoch, 0, len(self),
                           order_description(self.position_order, point.epoch,
                                             shaping=self.shaping())).to_dict()

    # -- samples ----------------------------------------------------------------------

    def __getitem__(self, index: int):
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a mixture of {n} samples")
        return self.__getitems__([index % n])[0]

    def __getitems__(self, indices: Sequence[int]):
        start = clock()
        batch = self._mixed_batch(indices)
        table_of(self).made(start, len(batch))
        return batch

    def _mixed_batch(self, indices: Sequence[int]):
        indices = np.asarray(indices, dtype=np.int64)
        which, records, cycles = self._entries_at(indices)
        stack = len(indices) > 1 and self.transform is None and self.target_transform is None
        # Where every image has one shape, the sources decode straight into
        # the rows of one batch (channels-last memory, as theirs is; in a
        # DataLoader worker, shared memory): no second copy.
        shape = self._shape if stack else None
        pixels = None if shape is None else batch_tensor((len(indices), *shape))
        got: list[Any] = [None] * len(indices)
        parts: dict[tuple[int, int], tuple[np.ndarray, Batch]] = {}
        # A random crop draws from the record's cycle: its n-th appearance gets
        # the n-th crop, so a record repeated in an epoch is cropped anew.
        cycle = cycles if self._random_crops else np.zeros_like(which)
        for s, c in sorted(set(zip(which.tolist(), cycle.tolist()))):
            places = np.flatnonzero((which == s) & (cycle == c))
            ds = self.sources[self.names[s]]
            wanted = records[places].tolist()
            if self._random_crops:
                ds._drawing_epoch = int(c)
            try:
                if pixels is not None and len(places) > 1:
                    part = ds._load(wanted, stack=True, into=_Rows(pixels.numpy(), places))
                else:
                    part = ds._getitems(wanted)
            finally:
                ds._drawing_epoch = None
            if isinstance(part, Batch):
                parts[(s, c)] = (places, part)
                continue
            if len(part) != len(places):  # on_error="skip" left some out: find which
                part = [next(iter(ds.__getitems__([r])), None) for r in records[places]]
            for k, sample in zip(places.tolist(), part):
                got[k] = sample
        if pixels is not None and parts and all(
                p.images is None or tuple(p.images.shape[1:]) == (shape[2], *shape[:2])
                for _, p in parts.values()) and not any(g is not None for g in got) \
                and sum(len(pl) for pl, _ in parts.values()) == len(indices):
            return self._one_batch(pixels, parts, records)
        for (s, _), (places, part) in parts.items():
            if part.images is None:  # decoded into the rows: samples from there
                part = Batch(pixels[torch.from_numpy(places)].permute(0, 3, 1, 2),
                             part.labels, part.metadata)
            for k, sample in zip(places.tolist(), part):
                got[k] = sample
        return [self._finish(int(which[k]), int(records[k]), sample)
                for k, sample in enumerate(got) if sample is not None]

    @property
    def _random_crops(self) -> bool:
        from fastdata.decoding.random_crop import RandomResizedCrop

        return isinstance(next(iter(self.sources.values())).crop, RandomResizedCrop)

    @property
    def _shape(self) -> tuple[int, int, int] | None:
        """The (h, w, c) every sample's image has, when the decode options fix it."""
        from fastdata.loaders.sizes import fixed_shape

        first = next(iter(self.sources.values()))
        if first.output != "tensor":
            return None
        return fixed_shape(first.decode, first.crop)

    def _one_batch(self, pixels: torch.Tensor, parts, records) -> Batch:
        """One batch of the sources' parts, in position order."""
        rows = pixels.numpy()
        size = rows.shape[0]
        labels = torch.empty(size, dtype=torch.int64)
        metas = [None] * size if self.with_metadata else None
        for (s, _), (places, part) in parts.items():
            if part.images is not None:  # a batch of its own (raw records as stored)
                rows[places] = part.images.permute(0, 2, 3, 1).numpy()
            labels[torch.from_numpy(places)] = self._labels(s, part.labels)
            if metas is not None:
                for k, meta in zip(places.tolist(), part.metadata):
                    metas[k] = self._meta(s, int(records[k]), meta)
        return Batch(pixels.permute(0, 3, 1, 2), labels, metas)

    def _labels(self, s: int, labels: torch.Tensor) -> torch.Tensor:
        if self._relabel is None:
            return labels
        return torch.from_numpy(self._relabel[s][labels.numpy()])

    def _meta(self, s: int, record: int, meta: dict | None) -> dict:
        return {**(meta or {}), "source": self.names[s], "index": record}

    def _finish(self, s: int, record: int, sample):
        image, label = sample[0], int(sample[1])
        if self._relabel is not None:
            label = int(self._relabel[s][label])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        if self.with_metadata:
            return image, label, self._meta(s, record, sample[2])
        return image, label

    def close(self) -> None:
        """Close every source (their decode threads and file handles; both come
        back on next use): call it before forking workers for another DataLoader."""
        for ds in self.sources.values():
            ds.close()

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}: {c}" for n, c in self.counts().items())
        return (f"MixedDataset({len(self)} samples per epoch, epoch {self.epoch}: {shares}; "
                f"{self.order})")

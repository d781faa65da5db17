"""Streaming IterableDataset over sharded formats (tar, TFRecord).

See :class:`ShardedIterableDataset` for how an epoch is split across
torch.distributed ranks and DataLoader workers, how it is shuffled, and how
it resumes.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastdata.errors import CorruptDataError, FastDataError
from fastdata.formats import detect_format
from fastdata.image_header import DEFAULT_MAX_PIXELS
from fastdata.loaders.read_ahead import Chunks, ReadAhead
from fastdata.loaders.samples import SamplePipeline
from fastdata.loaders.sizes import stacked_by_caller
from fastdata.machine import rank_and_world
from fastdata.order.epochs import DEFAULT_BLOCK, DEFAULT_WINDOW, Shuffle, epoch_order
from fastdata.order.slices import Slice
from fastdata.order.state import StreamPoint, WorkerPosition, parse_state, worker_positions
from fastdata.redaction import redact

#: Records read per random-access batch (and per retry batch after damage).
_REST_BATCH = 64


class ShardedIterableDataset(SamplePipeline, IterableDataset):
    """Streams ``(image, label)`` from tar or TFRecord shards, with the same work
    on every rank, one order for the whole job, and exact resume.

    **One order per epoch.** For a seed and an epoch, the whole job reads the
    records in one fixed order (see :mod:`fastdata.order`):
    without ``shuffle`` the stored order, with it a block shuffle that mixes
    ``shuffle_window`` records at a time (blocks of ``shuffle_block``
    consecutive records move together, so reads stay near each other). Ranks
    and workers take slices of that order: with ``batch_size`` equal to the
    DataLoader's, the job consumes the same batches in the same order with
    any number of workers, and after t steps of every rank exactly the first
    t x ranks x batch_size samples of the order are done.

    **Equal work per rank.** Every rank yields the same number of samples,
    ``len(ds)``, so every rank takes the same number of steps and
    DistributedDataParallel never waits for a rank that ran out, for any
    number of shards, ranks and workers. ``drop_last=False`` (the default)
    pads: the last ranks repeat the first samples of the order, fewer than
    one sample per rank (``ds.plan().repeats``); ``drop_last=True`` leaves
    the last ``< ranks`` samples of the order out instead. Every record is
    read at least once per epoch when padding, exactly once when the ranks
    divide the count.

    **Resume.** ``state_dict()`` / ``load_state_dict()`` follow the protocol of
    ``torchdata.stateful_dataloader.StatefulDataLoader``: a loader state taken
    after any step and loaded into a new StatefulDataLoader (same ranks and
    workers) continues the epoch exactly, without reading what was skipped.
    ``ds.load_state_dict(loader_state)`` with a loader's whole state (or
    :meth:`resume_point`) resumes with any number of ranks and workers: the
    samples not yet consumed, each once. Without torchdata, save
    ``ds.resume_point(batches=steps_done_this_epoch)`` and load it.

    The rank and world size are read in each worker; a DataLoader with spawned
    workers gets them from the parent (they are resolved when the dataset is
    pickled). ``skipped`` counts in the process that iterates.

    Args:
        path: the dataset's manifest, a shard, a shard pattern, or a list of shard files.
        transform: applied to each image.
        target_transform: applied to each label.
        output: "tensor", "numpy", "pil" or "bytes" (as for map-style datasets).
        shuffle: read each epoch in a seeded random order (see ``set_epoch``).
        seed: the shuffle's seed; the epoch is mixed in.
        batch_size: the DataLoader's batch size: workers then take whole batches
            in turn, so the order does not depend on the number of workers and
            a resume may change the number of ranks or workers. None: workers
            take single samples in turn (equal work and exact resume with the
            same workers still hold).
        drop_last: drop the last samples of the order (fewer than one per rank)
            instead of padding with repeats.
        shuffle_window: records permuted together (whole blocks).
        shuffle_block: consecutive records that stay together in the order, or
            "shard": each shard is a block, so a window spans
            ``shuffle_window`` records of whole shards (for
            ``remote_read="shards"``: a bounded number of shards at a time).
        read_ahead: for a dataset at a URL, chunks of 64 records requested
            ahead of use (in one thread per worker), so that requests overlap
            decoding.
        remote_read: for a dataset at a URL, "ranges" (default) reads each
            chunk's records with ranged requests; "shards" downloads the shards
            the next chunks need, whole, into the shared shard cache
            (``FASTDATA_CACHE_DIR``, ``FASTDATA_CACHE_LIMIT``), ``read_ahead``
            shards in flight, and reads them locally: far fewer requests, but
            a shuffle window touches many shards, which must fit in the cache.
        on_error: "raise" or "skip": a record that cannot be read is left out and
            counted in ``skipped`` (a skipped record shortens its rank's epoch).
        verify: check payload checksums.
        rank, world_size: override torch.distributed's (for tests or custom launchers).
        decoder, size, keep_gray, max_pixels: decoding options, as for map-style datasets.
        crop: a :class:`fastdata.RandomResizedCrop` (instead of ``size``): the
            box of record i is drawn from ``(seed, epoch, i)``, so it does not
            depend on the ranks, workers or a resume.
        with_metadata: samples are ``(image, label, metadata)``, metadata the
            record's dict (``{}`` when it has none); batch them with
            ``fastdata.collate``, which keeps the dicts as a list.
        **reader_options: format options passed to the reader (for TFRecord:
            ``feature_keys``, ``chunk_size``).
    """

    def __init__(
        self,
        path,
        *,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        output: str = "tensor",
        shuffle: bool = False,
        seed: int = 0,
        batch_size: int | None = None,
        drop_last: bool = False,
        shuffle_window: int = DEFAULT_WINDOW,
        shuffle_block: int | str = DEFAULT_BLOCK,
        shuffle_buffer: int | None = None,
        read_ahead: int = 4,
        remote_read: str = "ranges",
        on_error: str = "raise",
        verify: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        decoder: str = "auto",
        size: int | tuple[int, int] | None = None,
        keep_gray: bool = False,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        with_metadata: bool = False,
        crop=None,
        **reader_options: Any,
    ) -> None:
        spec = detect_format(path)
        if not spec.sharded:
            raise FastDataError(f"{spec.name} is not a sharded format; use open_dataset() for "
                                f"a map-style Dataset", path=os.fspath(path) if not
                                isinstance(path, (list, tuple)) else None)
        self._init_samples(spec.load_reader()(path, verify=verify, **reader_options),
                           transform=transform, target_transform=target_transform,
                           output=output, on_error=on_error, decoder=decoder, size=size,
                           keep_gray=keep_gray, max_pixels=max_pixels,
                           with_metadata=with_metadata, crop=crop)
        if shuffle_buffer is not None:  # the name of the window before block shuffling
            shuffle_window = shuffle_buffer
        if batch_size is not None and int(batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        if shuffle_block != "shard" and (isinstance(shuffle_block, str) or shuffle_block < 1):
            raise ValueError(f"shuffle_block must be a record count of at least 1 or "
                             f"'shard', not {shuffle_block!r}")
        if int(shuffle_window) < 1:
            raise ValueError(f"shuffle_window must be at least 1, not {shuffle_window}")
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        if crop is not None and self.seed < 0:
            raise ValueError(f"crop= needs a non-negative seed, not {seed}")
        self.batch_size = None if batch_size is None else int(batch_size)
        self.drop_last = bool(drop_last)
        self.shuffle_window = int(shuffle_window)
        self.shuffle_block = shuffle_block if shuffle_block == "shard" else int(shuffle_block)
        self.read_ahead = max(0, int(read_ahead))
        if remote_read not in ("ranges", "shards"):
            raise ValueError(f"remote_read must be 'ranges' or 'shards', not {remote_read!r}")
        self.remote_read = remote_read
        # The epoch lives in shared memory: DataLoader workers, persistent ones
        # included, read the value set_epoch() last wrote in the main process.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._rank = rank
        self._world = world_size
        self._resume: StreamPoint | WorkerPosition | None = None
        self._position: WorkerPosition | None = None

    # -- the plan ---------------------------------------------------------------

    @property
    def order(self) -> Shuffle:
        return Shuffle(self.shuffle, self.seed, self.shuffle_block, self.shuffle_window)

    def _rank_world(self) -> tuple[int, int]:
        return rank_and_world(self._rank, self._world)

    def plan(self) -> Slice:
        """This rank's share of the current epoch (from a loaded resume point on):
        ``per_rank`` samples, ``batches()``, ``repeats``, ``dropped``."""
        rank, world = self._rank_world()
        start = self._resume.consumed if isinstance(self._resume, StreamPoint) \
            and self._resume.epoch == self.epoch else 0
        return Slice(len(self.reader), start, world, rank, self.batch_size or 1,
                     "drop" if self.drop_last else "pad")

    def __len__(self) -> int:
        """Samples this rank yields this epoch (the same on every rank)."""
        return self.plan().per_rank

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch.fill_(int(value))

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch mixed into the shuffle seed; call before iterating each
        epoch. Workers read it when an epoch's iteration starts (persistent
        workers too: the value is in shared memory). A resume point for
        another epoch is dropped."""
        self.epoch = int(epoch)
        if self._resume is not None and self._resume.epoch != self.epoch:
            self._resume = None
        if self._position is not None and self._position.epoch != self.epoch:
            self._position = None

    def __getstate__(self):
        state = self.__dict__.copy()
        if state.get("_rank") is None or state.get("_world") is None:
            # Pickled for a spawned DataLoader worker, which has no process group.
            rank, world = rank_and_world()
            state["_rank"] = rank if state.get("_rank") is None else state["_rank"]
            state["_world"] = world if state.get("_world") is None else state["_world"]
        return state

    # -- resume -----------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where this process's iteration stands (StatefulDataLoader calls it in
        each worker after each batch, and in the main process without workers)."""
        if self._position is None:
            info = get_worker_info()
            worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
            return self._start_position(worker, workers).to_dict()
        return self._position.to_dict()

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state``: one worker's state (as StatefulDataLoader
        passes it back), a whole StatefulDataLoader ``state_dict()``, or a
        :meth:`resume_point`. The last two resume with any number of ranks
        and workers.

        Raises:
            ValueError: the state belongs to another dataset, order or layout.
        """
        self._resume = parse_state(state, records=len(self.reader), order=self.order)
        if isinstance(self._resume, StreamPoint):
            self.epoch = self._resume.epoch
        # A worker's position carries its epoch: torchdata loads it when it
        # starts iterating, after set_epoch(), and an ended loader state is
        # then dropped for a fresh pass at the epoch set.
        self._position = None

    def resume_point(self, loader_state: dict | None = None, *, batches: int | None = None
                     ) -> dict:
        """The point the job has reached in the current epoch, as a small dict
        for a checkpoint: from a StatefulDataLoader's ``state_dict()`` (of any
        rank: every rank has taken the same steps), or from ``batches``, the
        steps every rank has taken this epoch. Load it with
        :meth:`load_state_dict`, with any number of ranks and workers."""
        if (loader_state is None) == (batches is None):
            raise ValueError("pass a StatefulDataLoader state_dict() or batches=, not both")
        if loader_state is not None:
            return parse_state(loader_state, records=len(self.reader),
                               order=self.order).to_dict()
        plan = self.plan()
        return StreamPoint(self.epoch, plan.consumed_after(int(batches)), len(self.reader),
                           self.order.describe()).to_dict()

    # -- iteration --------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        # Not a generator itself: the position is set when iteration is asked
        # for, so a state_dict() taken before the first sample is this epoch's.
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._position = self._start_position(worker, workers)
        # A loaded state is used once: the next iteration (a persistent worker's
        # next epoch, or the main process's) starts from the epoch's beginning.
        if isinstance(self._resume, WorkerPosition) or info is None:
            self._resume = None
        # A warning about mixed sizes helps only where torch's collate stacks them.
        return self._iterate(self._position, stacked_by_caller(self, sys._getframe(1)))

    def _iterate(self, position: WorkerPosition, stacked: bool) -> Iterator[tuple[Any, int]]:
        plan = position.slice()
        # Crops follow the epoch read, which a loaded worker state carries.
        self._drawing_epoch = position.epoch
        starts = np.asarray([first for first, _ in self.reader.shard_ranges()],
                            dtype=np.int64) if self.shuffle_block == "shard" else None
        order = epoch_order(plan.n, self.order, position.epoch, starts)
        labels = self.reader.labels
        watch_sizes = stacked and self.output in ("tensor", "numpy") and self.transform is None
        for index, data, meta in self._records(plan, order, position):
            if isinstance(meta, CorruptDataError):  # this record's metadata is damaged
                self._corrupt(meta, index)
                continue
            sample = self._sample(index, self._try_convert(data, index), int(labels[index]))
            if sample is not None:
                if watch_sizes:
                    self.mixed_sizes.sample(tuple(sample[0].shape), self.path)
                yield sample if meta is None else (*sample, meta)

    def _start_position(self, worker: int, workers: int) -> WorkerPosition:
        """This worker's starting point: a loaded worker state, a resume point,
        or the start of the epoch."""
        rank, world = self._rank_world()
        resume = self._resume
        if isinstance(resume, WorkerPosition):
            resume.check_layout(rank=rank, world=world, worker=worker, workers=workers,
                                batch_size=self.batch_size or 0, drop_last=self.drop_last)
            return WorkerPosition(**{**vars(resume)})
        plan = self.plan()
        return WorkerPosition(epoch=self.epoch, start=plan.start, records=plan.n,
                              order=self.order.describe(), world=world, rank=rank,
                              workers=workers, worker=worker, batch_size=self.batch_size or 0,
                              drop_last=self.drop_last, taken=0)

    def _records(self, plan: Slice, order, position: WorkerPosition
                 ) -> Iterator[tuple[int, bytes, Any]]:
        """(index, payload, metadata) of this worker's positions from
        ``position.taken`` on, read in chunks; ``position.taken`` counts each
        one as it is handed on. The metadata is None unless ``with_metadata``
        (then the record's dict, or the CorruptDataError reading it raised)."""
        positions = worker_positions(plan, position.worker, position.workers)
        base = position.taken
        chunks = Chunks(plan, order, positions[base:])
        ahead = ReadAhead(self.reader, chunks, self.read_ahead if self.reader.url else 0,
                           whole_shards=self.remote_read == "shards")
        try:
            done = base
            for k, indices in enumerate(chunks):
                # A rank's positions never repeat a record, so an index names its place.
                place = {index: j for j, index in enumerate(indices)}
                payloads = ahead.take(k)
                got = zip(indices, payloads) if payloads is not None \
                    else self._read_rest(indices)  # damage, or no read-ahead: one by one
                metas = self._chunk_metadata(indices)
                for index, data in got:
                    position.taken = done + place[index] + 1  # skipped ones count too
                    yield index, data, metas.get(index)
                done += len(indices)
                position.taken = done
        finally:
            ahead.close()

    def _chunk_metadata(self, indices: list[int]) -> dict[int, Any]:
        """The metadata of a chunk's records by index (one read for the chunk;
        after damage, record by record, a damaged one given as its error)."""
        if not self.with_metadata:
            return {}
        try:
            return dict(zip(indices, self.reader.metadata_many(indices)))
        except CorruptDataError:
            found: dict[int, Any] = {}
            for index in indices:
                try:
                    found[index] = self.reader.metadata(index)
                except CorruptDataError as exc:
                    found[index] = exc
            return found

    def _read_rest(self, indices: list[int]) -> Iterator[tuple[int, bytes]]:
        """Records by random access, in batches; a batch that fails is read again
        one record at a time, and unreadable records are skipped and counted (a
        run of them with one warning: a truncated shard loses many at once)."""
        reader = self.reader
        lost: list[tuple[int, CorruptDataError]] = []
        for start in range(0, len(indices), _REST_BATCH):
            batch = indices[start:start + _REST_BATCH]
            try:
                payloads = reader.read_many(batch)
            except CorruptDataError:
                payloads = None  # find the bad ones: one record at a time
            for k, index in enumerate(batch):
                if payloads is not None:
                    data = payloads[k]
                else:
                    try:
                        data = reader.read(index)
                    except CorruptDataError as exc:
                        if self.on_error == "raise":
                            raise
                        lost.append((index, exc))
                        continue
                self._report_lost(lost)
                lost = []
                yield index, data
        self._report_lost(lost)

    def _report_lost(self, lost: list[tuple[int, CorruptDataError]]) -> None:
        if len(lost) == 1:
            self._corrupt(lost[0][1], lost[0][0])
        elif lost:
            self.skipped += len(lost)
            warnings.warn(f"{redact(self.path)}: skipping {len(lost)} corrupt records "
                          f"{lost[0][0]} to {lost[-1][0]}; {self.skipped} skipped so far; "
                          f"the first: {lost[0][1]}", RuntimeWarning, stacklevel=3)

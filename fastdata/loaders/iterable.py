"""Streaming IterableDataset over sharded formats (tar, TFRecord).

See :class:`ShardedIterableDataset` for how an epoch is split across
torch.distributed ranks and DataLoader workers, how it is shuffled, and how
it resumes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastdata.decoding.options import Decode
from fastdata.errors import CorruptDataError, FastDataError
from fastdata.formats import salvage
from fastdata.keywords import check_read_values, explain_keywords
from fastdata.loaders.decode_pool import DecodePool
from fastdata.loaders.read_ahead import REMOTE_READS, Chunks, ReadAhead, RemoteRead
from fastdata.loaders.samples import OnError, SamplePipeline
from fastdata.loaders.sizes import stacked_by_caller
from fastdata.loaders.stream_batches import (
    StreamBatches,
    TakenPoint,
    stream_batches,
    take_group,
)
from fastdata.machine import rank_and_world
from fastdata.meter.table import clock
from fastdata.order.epochs import Shuffle, epoch_order, shard_starts
from fastdata.order.options import Order
from fastdata.order.slices import Slice
from fastdata.order.state import (
    StreamPoint,
    WorkerPosition,
    order_description,
    parse_state,
    worker_positions,
)
from fastdata.redaction import redact

#: Records a stream decodes at a time on its decode threads.
DECODE_GROUP = 32


class ShardedIterableDataset(SamplePipeline, IterableDataset):
    """Streams ``(image, label)`` from tar or TFRecord shards, with the same work
    on every rank, one order for the whole job, and exact resume.

    **One order per epoch.** For a seed and an epoch, the whole job reads the
    records in one fixed order (see :mod:`fastdata.order`):
    without ``Order(shuffle=True)`` the stored order, with it a block shuffle
    that mixes ``window`` records at a time (blocks of ``block`` consecutive
    records move together, so reads stay near each other). Ranks
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
        path (str | os.PathLike | list | DatasetRef): the dataset's manifest, a
            shard, a shard pattern, a list of shard files, a view or a version
            record; or a :class:`fastdata.DatasetRef` (the version read, whether
            payload checksums are checked, links followed, the format reader's
            settings).
        decode: how records are decoded (:class:`fastdata.Decode`), as for
            map-style datasets.
        order: :class:`fastdata.Order`: ``shuffle``, ``seed`` (the epoch is
            mixed in), ``batch_size`` (the DataLoader's: workers then take
            whole batches in turn, so the order does not depend on the number
            of workers and a resume may change the number of ranks or
            workers; None: single samples in turn, and equal work and exact
            resume with the same workers still hold), ``drop_last`` (drop the
            last samples of the order, fewer than one per rank, and a partial
            last batch, instead of padding with repeats), ``rank``/``world_size`` (default:
            torch.distributed's), and the shuffle mode ``block``/``window``
            (records in blocks of 16 consecutive ones, 8192 records mixed at
            once; ``block="shard"``: each shard is a block, so a window spans
            whole shards, for ``remote_read="shards"``).
        transform: applied to each image.
        target_transform: applied to each label.
        on_error: "raise" or "skip": a record that cannot be read is left out and
            counted in ``skipped`` (a skipped record shortens its rank's epoch).
        with_metadata: samples are ``(image, label, metadata)``, metadata the
            record's dict (``{}`` when it has none); batch them with
            ``fastdata.collate``, which keeps the dicts as a list.
        read_ahead: for a dataset at a URL, chunks of 64 records requested
            ahead of use (in one thread per worker), and whole shards
            downloaded at once, so that requests overlap decoding.
        remote_read: for a dataset at a URL, "auto" (default) plans the reads
            from the epoch's order before the first batch: a shard of which the
            order reads a large share over a stretch short enough to fit in the
            cache is downloaded whole, in order of first use, and dropped after
            its last use; other shards' records are read by ranged requests
            (see :mod:`fastdata.loaders.read_ahead`). The cache is the shared
            shard cache (``FASTDATA_CACHE_DIR``); the bytes held at once are at
            most ``FASTDATA_CACHE_LIMIT`` (else a quarter of its free space, up
            to 8 GiB), shared among a rank's workers. "ranges" reads every
            record by range (the least disk); "shards" downloads every shard
            whole that fits.

    A random crop's box of record i is drawn from ``(seed, epoch, i)``, so it
    does not depend on the ranks, workers or a resume.
    """

    @explain_keywords()
    def __init__(
        self,
        path,
        *,
        decode: Decode | None = None,
        order: Order | None = None,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        on_error: OnError = "raise",
        with_metadata: bool = False,
        read_ahead: int = 4,
        remote_read: RemoteRead = "auto",
    ) -> None:
        check_read_values(decode, order)
        from fastdata.dataset.resolve import format_of, open_reader

        spec = format_of(path)
        if not spec.sharded:
            where = getattr(path, "path", path)
            raise FastDataError(f"{spec.name} is not a sharded format; use open_dataset() for "
                                f"a map-style Dataset", path=os.fspath(where) if not
                                isinstance(where, (list, tuple)) else None)
        self._init_samples(open_reader(path), decode,
                           transform=transform, target_transform=target_transform,
                           on_error=on_error, with_metadata=with_metadata)
        #: The order the stream is read in (:class:`fastdata.Order`).
        self.order = Order() if order is None else order
        self.read_ahead = max(0, int(read_ahead))
        self._decoders = DecodePool()
        if remote_read not in REMOTE_READS:
            raise ValueError(f"remote_read must be one of {', '.join(map(repr, REMOTE_READS))}, "
                             f"not {remote_read!r}")
        self.remote_read = remote_read
        # The epoch lives in shared memory: DataLoader workers, persistent ones
        # included, read the value set_epoch() last wrote in the main process.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._rank = self.order.rank
        self._world = self.order.world_size
        self._resume: StreamPoint | WorkerPosition | None = None
        self._position: WorkerPosition | None = None
        # Read ahead of the loop in this process (fastdata.loader()): the point
        # of the last batch the loop took (see stream_batches.TakenPoint).
        self._taken = None

    # -- the plan ---------------------------------------------------------------

    @property
    def shuffle_mode(self) -> Shuffle:
        """The order engine's shuffle (mode, seed, block, window) of this stream."""
        return self.order.shuffle_of(len(self.reader), stream=True)

    def describe_order(self, epoch: int) -> dict:
        """What fixes the samples of epoch ``epoch``, for a resume state: the
        order, the shards' bounds of ``block="shard"``, a random crop
        (:func:`fastdata.order.state.order_description`)."""
        return order_description(self.shuffle_mode, epoch, shaping=self.shaping(),
                                 starts=shard_starts(self.shuffle_mode, self.reader),
                                 dataset=self.reader.identity)

    # The order's fields, read where the stream's code and its users look for them.
    shuffle = property(lambda self: self.order.shuffle)
    seed = property(lambda self: self.order.seed)
    drop_last = property(lambda self: self.order.drop_last)
    @property
    def batch_size(self) -> int | None:
        return self.order.batch_size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        # fastdata.loader() gives a stream made without one its own batch size.
        self.order = dataclasses.replace(self.order, batch_size=value)

    def _rank_world(self) -> tuple[int, int]:
        return rank_and_world(self._rank, self._world)

    def plan(self) -> Slice:
        """This rank's share of the current epoch (from a loaded resume point on):
        ``per_rank`` samples, ``batches()``, ``repeats``, ``dropped``."""
        rank, world = self._rank_world()
        start = self._resume.consumed if isinstance(self._resume, StreamPoint) \
            and self._resume.epoch == self.epoch else 0
        return Slice(len(self.reader), start, world, rank, self.batch_size or 1,
                     self.order.policy)

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
            self._taken = None

    def close(self) -> None:
        """Stop this process's decode threads and close its file handles; both
        come back on next use. Call it before forking workers for another
        DataLoader so that no thread of ours is running at fork time."""
        self._decoders.close()
        self.reader.close()

    def _after_pass(self) -> None:
        """``fastdata.loader()`` calls this after a whole pass: the next pass
        reads the next epoch (its order and crops), so a loop without
        set_epoch() does not repeat an order."""
        self.set_epoch(self.epoch + 1)

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
        if self._taken is not None:  # batches made ahead of the loop: the loop's point
            return dict(self._taken.point)
        return self._position.to_dict()

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state``: one worker's state (as StatefulDataLoader
        passes it back), a whole StatefulDataLoader ``state_dict()``, or a
        :meth:`resume_point`. The last two resume with any number of ranks
        and workers.

        Raises:
            ValueError: the state belongs to another dataset, order or layout.
        """
        self._resume = parse_state(state, records=len(self.reader),
                                   describe=self.describe_order)
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
                               describe=self.describe_order).to_dict()
        plan = self.plan()
        return StreamPoint(self.epoch, plan.consumed_after(int(batches)), len(self.reader),
                           self.describe_order(self.epoch)).to_dict()

    # -- iteration --------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        # A warning about mixed sizes helps only where torch's collate stacks them.
        return self._start(stacked_by_caller(self, sys._getframe(1)))

    def batches(self, count_taken: bool = False):
        """This stream a batch at a time: an IterableDataset of whole batches
        of the order's ``batch_size``, decoded straight into one tensor, for
        ``DataLoader(ds.batches(), batch_size=None, collate_fn=fastdata.collate)``
        (what ``fastdata.loader()`` does): the same batches in the same order
        as per-sample reading, without per-sample Python. Its state, epoch and
        resume are this stream's."""
        return StreamBatches(self, count_taken)

    def _start(self, stacked: bool, batched: bool = False, count_taken: bool = False):
        # Not a generator itself: the position is set when iteration is asked
        # for, so a state_dict() taken before the first sample is this epoch's.
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._position = self._start_position(worker, workers)
        # A loaded state is used once: the next iteration (a persistent worker's
        # next epoch, or the main process's) starts from the epoch's beginning.
        if isinstance(self._resume, WorkerPosition) or info is None:
            self._resume = None
        self._taken = TakenPoint(self._position) if count_taken and info is None else None
        return self._iterate(self._position, stacked, batched)

    def _iterate(self, position: WorkerPosition, stacked: bool, batched: bool = False
                 ) -> Iterator[tuple[Any, int]]:
        plan = position.slice()
        # Crops follow the epoch read, which a loaded worker state carries.
        self._drawing_epoch = position.epoch
        order = epoch_order(plan.n, self.shuffle_mode, position.epoch,
                            shard_starts(self.shuffle_mode, self.reader))
        if batched:
            yield from stream_batches(self, self._records(plan, order, position), position,
                                      self.batch_size, self.drop_last)
            return
        labels = self.reader.labels
        watch_sizes = stacked and self.output in ("tensor", "numpy") and self.transform is None
        # A per-sample transform runs per sample anyway: its time is taken so too.
        timed = self.transform is not None or self.target_transform is not None
        meter = self._meter
        for index, image, meta in self._decoded(self._records(plan, order, position), position):
            if isinstance(meta, CorruptDataError):  # this record's metadata is damaged
                self._corrupt(meta, index)
                continue
            start = clock() if timed else 0.0
            sample = self._sample(index, image, int(labels[index]))
            if timed:
                meter.add("transform", clock() - start, busy=True)
            if sample is not None:
                if watch_sizes:
                    self.mixed_sizes.sample(tuple(sample[0].shape), self.path)
                yield sample if meta is None else (*sample, meta)

    def _decoded(self, records: Iterator[tuple[int, bytes, Any]], position: WorkerPosition
                 ) -> Iterator[tuple[int, Any, Any]]:
        """(index, image or Failed, metadata) of ``records``, decoded a group at a
        time on this process's decode threads (the decoders release the GIL, so
        a stream decodes on every core it has, as a map-style batch does). The
        position handed on stays that of the last sample given out, not of the
        records decoded ahead."""
        group = DECODE_GROUP if self._decoders.threads_here() > 1 else 1
        while True:
            start = clock()
            items, taken, error = take_group(records, position, group)
            images = self._convert_all([it[0] for it in items], [it[1] for it in items],
                                       self._convert)
            self._meter.made(start, len(items), batch=False, remote=bool(self.reader.url))
            for (index, _data, meta), image, done in zip(items, images, taken):
                position.taken = done
                yield index, image, meta
            if error is not None:
                raise error
            if len(items) < group:
                return

    def _start_position(self, worker: int, workers: int) -> WorkerPosition:
        """This worker's starting point: a loaded worker state, a resume point,
        or the start of the epoch."""
        rank, world = self._rank_world()
        resume = self._resume
        if isinstance(resume, WorkerPosition):
            resume.check_layout(rank=rank, world=world, worker=worker, workers=workers,
                                batch_size=self.batch_size or 0, drop_last=self.drop_last)
            return WorkerPosition(**vars(resume))
        plan = self.plan()
        return WorkerPosition(epoch=self.epoch, start=plan.start, records=plan.n,
                              order=self.describe_order(self.epoch), world=world, rank=rank,
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
                          self.remote_read, workers=position.workers)
        try:
            done = base
            for k, indices in enumerate(chunks):
                # A rank's positions never repeat a record, so an index names its place.
                place = {index: j for j, index in enumerate(indices)}
                payloads = self._timed_read(ahead.take, k)
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
        lost: list[tuple[int, CorruptDataError]] = []
        read_many = functools.partial(self._timed_read, self.reader.read_many)
        for index, data, exc in salvage.read_batches(indices, read_many, self.reader.read):
            if exc is not None:
                if self.on_error == "raise":
                    raise exc
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

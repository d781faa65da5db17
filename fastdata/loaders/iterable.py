"""Streaming IterableDataset over sharded formats (tar, TFRecord).

See :class:`ShardedIterableDataset` for how shards are split across
torch.distributed ranks and DataLoader workers, and how shuffling is seeded.
"""

from __future__ import annotations

import hashlib
import os
import random
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from fastdata.errors import CorruptDataError, FastDataError
from fastdata.formats import detect_format
from fastdata.image_header import DEFAULT_MAX_PIXELS
from fastdata.loaders.samples import SamplePipeline
from fastdata.machine import rank_and_world

#: Records read per random-access batch after a shard's stream broke.
_REST_BATCH = 64


def _seed(*parts: int | str) -> int:
    """A 64-bit seed from ints and tags: the same in every process and Python run
    (unlike ``hash()``), and unrelated for neighbouring inputs."""
    # int() first: a numpy integer's repr differs from the equal Python int's.
    text = repr(tuple(p if isinstance(p, str) else int(p) for p in parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class ShardedIterableDataset(SamplePipeline, IterableDataset):
    """Streams ``(image, label)`` from tar or TFRecord shards.

    **Splitting.** With R ranks (torch.distributed, or ``rank``/``world_size``)
    of K DataLoader workers each there are W = R x K global workers; worker
    ``id`` of rank ``r`` is number g = r x K + id. The S shards (in the shuffled
    order when ``shuffle``, which depends on (seed, epoch) only, so every
    worker agrees on it) are split like this:

    - S >= W: worker g reads whole shards g, g+W, g+2W, ... of that order.
      Every record is read exactly once per epoch across all ranks and
      workers. When W divides S and shards hold equal counts, every worker
      (and rank) gets the same number of samples; otherwise the split stays
      exactly-once but uneven: the first S mod W workers get one shard more.
      DistributedDataParallel needs the same number of steps on every rank, so
      choose S a multiple of W (or stop each rank after the same step count).
    - S < W: every worker reads every shard and keeps the records whose index
      i satisfies i mod W == g: still exactly once, counts within one of each
      other, but each worker reads all the bytes, so prefer S >= W.

    Within a worker, records come in shard order; a DataLoader then
    interleaves its workers' batches.

    **Shuffling** (``shuffle=True``): the shard order is shuffled with a seed
    made from (seed, epoch), then each worker passes its records through a
    buffer of ``shuffle_buffer`` samples seeded by (seed, epoch, g); records are
    decoded after leaving the buffer, so it holds encoded bytes, not pixels.
    The order is reproducible for the same seed, epoch, world size and number
    of workers per rank, and changes with :meth:`set_epoch`.

    The rank and world size are read in each worker; a DataLoader with spawned
    workers gets them from the parent (they are resolved when the dataset is
    pickled), since a spawned worker has no process group. ``skipped`` counts
    in the process that iterates (a worker's count stays in the worker).

    Args:
        path: the dataset's ``.fastdata.json`` manifest, a shard, a shard pattern,
            or a list of shard files.
        transform: applied to each image.
        target_transform: applied to each label.
        output: "tensor", "numpy", "pil" or "bytes" (as for map-style datasets).
        shuffle: shuffle shard order and samples (seeded).
        shuffle_buffer: samples held per worker for shuffling.
        seed: base seed; the epoch is mixed in (see ``set_epoch``).
        on_error: "raise" or "skip": a record that cannot be read is left out and
            counted in ``skipped`` (each one: when a shard's stream breaks, the
            records after the damage are read through the dataset index).
        verify: check payload checksums.
        rank, world_size: override torch.distributed's (for tests or custom launchers).
        decoder, size, keep_gray, max_pixels: decoding options, as for map-style datasets.
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
        shuffle_buffer: int = 1000,
        seed: int = 0,
        on_error: str = "raise",
        verify: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        decoder: str = "auto",
        size: int | tuple[int, int] | None = None,
        keep_gray: bool = False,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
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
                           keep_gray=keep_gray, max_pixels=max_pixels)
        self.shuffle = shuffle
        self.shuffle_buffer = max(1, int(shuffle_buffer))
        self.seed = seed
        self.epoch = 0
        self._rank = rank
        self._world = world_size

    def __len__(self) -> int:
        """Records in the whole dataset (all ranks and workers together)."""
        return len(self.reader)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch mixed into the shuffle seed; call before iterating each
        epoch (with ``persistent_workers=False``, workers pick it up at start)."""
        self.epoch = int(epoch)

    def __getstate__(self):
        state = self.__dict__.copy()
        if state.get("_rank") is None or state.get("_world") is None:
            # Pickled for a spawned DataLoader worker, which has no process group.
            rank, world = rank_and_world()
            state["_rank"] = rank if state.get("_rank") is None else state["_rank"]
            state["_world"] = world if state.get("_world") is None else state["_world"]
        return state

    def _assignment(self) -> tuple[list[int], int | None, int]:
        """(shards to read, record stride or None, global worker number g)."""
        rank, world = rank_and_world()
        if self._rank is not None:
            rank = self._rank
        if self._world is not None:
            world = self._world
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside a world of size {world}")
        g, total = rank * workers + worker, world * workers
        shards = list(range(len(self.reader.shard_paths)))
        if self.shuffle:
            random.Random(_seed("shards", self.seed, self.epoch)).shuffle(shards)
        if len(shards) >= total:
            return shards[g::total], None, g
        return shards, total, g

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        shards, stride, g = self._assignment()
        records = self._records(shards, stride, g)
        if self.shuffle:
            rng = random.Random(_seed("samples", self.seed, self.epoch, g))
            records = _buffer_shuffle(records, self.shuffle_buffer, rng)
        labels = self.reader.labels
        watch_sizes = self.output in ("tensor", "numpy") and self.transform is None
        for index, data in records:
            sample = self._sample(index, self._try_convert(data), int(labels[index]))
            if sample is not None:
                if watch_sizes:
                    self.mixed_sizes.sample(tuple(sample[0].shape), self.path)
                yield sample

    def _records(self, shards: list[int], stride: int | None, g: int
                 ) -> Iterator[tuple[int, bytes]]:
        """(index, payload) of this worker's records, checksums verified."""
        for shard in shards:
            yield from self._shard_records(shard, stride, g)

    def _shard_records(self, shard: int, stride: int | None, g: int
                       ) -> Iterator[tuple[int, bytes]]:
        """One shard's records, streamed. A damaged record is skipped alone under
        ``on_error="skip"``: when the stream itself breaks (a bad frame, a data
        CRC failure inside it, a cut-short file), the records it had not reached
        are read by random access through the dataset index, which knows where
        each one starts, and only those that cannot be read are skipped, each
        one counted."""
        reader = self.reader
        first, count = reader.shard_ranges()[shard]
        reached = first  # records before this one came through the stream
        stream = reader.iter_shard(shard)
        while True:
            try:
                index, data = next(stream)
            except StopIteration:
                return
            except CorruptDataError:
                if self.on_error == "raise":
                    raise
                break  # the records not reached are read by random access below
            reached = index + 1
            if stride is not None and index % stride != g:
                continue
            if reader.verify:
                try:
                    reader.check(index, data)
                except CorruptDataError as exc:
                    self._corrupt(exc, index)
                    continue
            yield index, data
        rest = [i for i in range(reached, first + count) if stride is None or i % stride == g]
        yield from self._read_rest(rest)

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
            warnings.warn(f"{self.path}: skipping {len(lost)} corrupt records {lost[0][0]} to "
                          f"{lost[-1][0]}; {self.skipped} skipped so far; the first: "
                          f"{lost[0][1]}", RuntimeWarning, stacklevel=3)


def _buffer_shuffle(items: Iterator, size: int, rng: random.Random) -> Iterator:
    """Yield ``items`` in a random order, holding at most ``size`` of them."""
    buffer: list = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        buffer[j], item = item, buffer[j]
        yield item
    rng.shuffle(buffer)
    yield from buffer

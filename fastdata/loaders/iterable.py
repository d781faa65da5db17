"""Streaming IterableDataset over sharded formats (tar, TFRecord).

Shards are split across torch.distributed ranks and DataLoader workers: the
global worker g of W (W = world size x workers per rank) reads shards g, g+W,
g+2W, ... of the (optionally shuffled) shard list, so every record is read
exactly once per epoch. When there are fewer shards than global workers,
records are split instead (record i goes to worker i mod W), which keeps the
once-per-epoch guarantee at the cost of every worker touching every shard.

Shuffling is seeded: the shard order by (seed, epoch), then a buffer of
``shuffle_buffer`` samples per worker by (seed, epoch, g). The order is
reproducible for a given seed, epoch, world size and worker count.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from fastdata.errors import CorruptDataError, FastDataError
from fastdata.formats import detect_format
from fastdata.loaders.datasets import check_options, convert_payload


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardedIterableDataset(IterableDataset):
    """Streams ``(image, label)`` from tar or TFRecord shards.

    Args:
        path: the dataset's ``.fastdata.json`` manifest, a shard, a shard pattern,
            or a list of shard files.
        transform: applied to each image.
        target_transform: applied to each label.
        output: "tensor", "numpy", "pil" or "bytes" (as for map-style datasets).
        shuffle: shuffle shard order and samples (seeded).
        shuffle_buffer: samples held per worker for shuffling.
        seed: base seed; the epoch is mixed in (see ``set_epoch``).
        on_error: "raise" or "skip" (count in ``skipped`` and go on).
        verify: check payload checksums.
        rank, world_size: override torch.distributed's (for tests or custom launchers).
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
    ) -> None:
        check_options(output, on_error)
        spec = detect_format(path)
        reader_cls = spec.load_reader()
        from fastdata.loaders.sharded import ShardedReader

        if not issubclass(reader_cls, ShardedReader):
            raise FastDataError(f"{spec.name} is not a sharded format; use open_dataset() for "
                                f"a map-style Dataset", path=os.fspath(path) if not
                                isinstance(path, (list, tuple)) else None)
        self.reader = reader_cls(path, verify=verify)
        self.transform = transform
        self.target_transform = target_transform
        self.output = output
        self.shuffle = shuffle
        self.shuffle_buffer = max(1, int(shuffle_buffer))
        self.seed = seed
        self.on_error = on_error
        self.epoch = 0
        self.skipped = 0
        self._rank = rank
        self._world = world_size

    @property
    def classes(self) -> list[str]:
        return list(self.reader.manifest.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return self.reader.manifest.class_to_idx

    def __len__(self) -> int:
        """Records in the whole dataset (all ranks and workers together)."""
        return len(self.reader)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch mixed into the shuffle seed; call before iterating each
        epoch (with ``persistent_workers=False``, workers pick it up at start)."""
        self.epoch = int(epoch)

    def _assignment(self) -> tuple[list[int], int | None, int]:
        """(shards to read, record stride or None, record phase) for this worker."""
        rank, world = _rank_and_world()
        if self._rank is not None:
            rank = self._rank
        if self._world is not None:
            world = self._world
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        g, total = rank * workers + worker, world * workers
        shards = list(range(len(self.reader.shard_paths)))
        if self.shuffle:
            random.Random(f"{self.seed}-{self.epoch}").shuffle(shards)
        if len(shards) >= total:
            return shards[g::total], None, 0
        return shards, total, g

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        shards, stride, phase = self._assignment()
        rng = random.Random(f"{self.seed}-{self.epoch}-{phase}-{shards[:1]}")
        samples = self._samples(shards, stride, phase)
        if not self.shuffle:
            yield from samples
            return
        buffer: list = []
        for sample in samples:
            if len(buffer) < self.shuffle_buffer:
                buffer.append(sample)
                continue
            j = rng.randrange(len(buffer))
            buffer[j], sample = sample, buffer[j]
            yield sample
        rng.shuffle(buffer)
        yield from buffer

    def _samples(self, shards: list[int], stride: int | None, phase: int):
        labels = self.reader.labels
        for shard in shards:
            stream = self.reader.iter_shard(shard)
            while True:
                try:
                    index, data = next(stream)
                except StopIteration:
                    break
                except CorruptDataError:
                    if self.on_error == "raise":
                        raise
                    self.skipped += 1
                    break  # a damaged shard cannot be resynchronised: move to the next
                if stride is not None and index % stride != phase:
                    continue
                try:
                    image = convert_payload(data, self.output)
                except Exception as exc:  # decoders raise many types
                    if self.on_error == "raise":
                        from fastdata.errors import DecodeError

                        raise DecodeError(f"record {index} cannot be decoded ({exc})",
                                          path=self.reader.path, offset=index) from exc
                    self.skipped += 1
                    continue
                label = int(labels[index])
                if self.transform is not None:
                    image = self.transform(image)
                if self.target_transform is not None:
                    label = self.target_transform(label)
                yield image, label

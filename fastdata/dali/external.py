"""The external source: whole batches read with fastdata's reader and handed to DALI.

Used for LMDB and HDF5 (DALI has no reader for them), for pre-decoded (raw)
datasets and encodings DALI cannot decode (GIF), and for every format with
``reader="external"``. Its order is the order engine's (:mod:`fastdata.order`):
each epoch a permutation of the whole dataset (shuffled, computed per batch) or
the stored order,
each pipeline shard an equal part of it (padded, as every fastdata reader is),
so with the same seed it reads a map-style Dataset's and a stream's batches.
It checks fastdata's CRC32s, which DALI's own readers do not.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from fastdata.dataset.ref import DatasetRef
from fastdata.encodings import sniff_encoding
from fastdata.order.epochs import Shuffle, epoch_order
from fastdata.order.options import Order
from fastdata.order.slices import Slice

#: Encodings DALI's image decoder reads (``fn.decoders.image``); GIF is not one.
DALI_ENCODINGS = frozenset({"jpeg", "png", "bmp", "webp", "tiff", "ppm", "pgm", "pbm",
                            "jpeg2000"})


def shard_bounds(count: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """[start, stop) of shard ``shard_id`` of ``count`` records, as DALI's own
    readers split a dataset (the external source takes the engine's slices)."""
    return count * shard_id // num_shards, count * (shard_id + 1) // num_shards


def external_slice(count: int, shard_id: int, num_shards: int, batch_size: int) -> Slice:
    """The external source's share of an epoch: the order engine's slice of
    pipeline shard ``shard_id`` (equal on every shard, padded)."""
    return Slice(count, 0, num_shards, shard_id, batch_size, "pad")


class ExternalBatches:
    """A DALI external-source callable: one batch of (images, labels) per call.

    Stateless given its argument (DALI's ``BatchInfo``: epoch and iteration),
    so DALI can run it in parallel worker processes; picklable (the reader is
    opened lazily in the process that calls it).

    Args:
        path: the packed dataset.
        order: the :class:`fastdata.Order` read: ``batch_size`` records per
            batch (the last one of an epoch may be smaller unless
            ``drop_last``), this pipeline's part ``rank`` of ``world_size``
            (None: 0 of 1), and the order engine's shuffle (``shuffle``,
            ``seed``, ``block``/``window``; by default a permutation of every
            record each epoch, as map-style reading has it: every part sees
            the same one).
        mode: "encoded" (payload bytes as 1-D uint8 arrays) or "raw" (HWC
            uint8 pixels).
        transcode: with "encoded", turn payloads that DALI cannot decode (GIF)
            into PPM (decoded by fastdata's decoders; PPM costs no compression
            and DALI reads it), so the batch stays one of encoded images.
        reader: an already open reader of ``path`` to use in this process.
    """

    def __init__(self, path: str | list[str] | DatasetRef, *, order: Order | None = None,
                 mode: Literal["encoded", "raw"] = "encoded", transcode: bool = False,
                 reader: Any = None) -> None:
        from fastdata.keywords import check_read_values

        check_read_values(None, order)
        order = Order() if order is None else order
        if order.block == "shard":
            raise ValueError("the external source reads records, not whole shards: give "
                             "Order(block=) a record count")
        self.path = path
        self.order = order
        self.batch_size = order.loader_batch
        self.shard_id = 0 if order.rank is None else int(order.rank)
        self.num_shards = 1 if order.world_size is None else int(order.world_size)
        self.drop_last = order.drop_last
        self.mode = mode
        self.transcode = bool(transcode)
        # An open reader may be handed over: LMDB refuses a second open of one path.
        self._reader = reader
        self.count = len(self.reader)
        self._decode = None
        self._order: tuple[int, Any] | None = None

    @property
    def reader(self) -> Any:
        """The dataset's reader, opened in this process on first use."""
        if self._reader is None:
            from fastdata.dataset.resolve import open_reader

            self._reader = open_reader(self.path)
        return self._reader

    def _slice(self) -> Slice:
        return external_slice(self.count, self.shard_id, self.num_shards, self.batch_size)

    def shard_size(self) -> int:
        """Records of this shard per epoch."""
        return self._slice().per_rank

    def __len__(self) -> int:
        """Batches per epoch."""
        n = self.shard_size()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def batch_indices(self, epoch: int, iteration: int) -> list[int]:
        """The record indices of this shard's batch ``iteration`` of epoch
        ``epoch``: computed for that batch alone (the order engine's
        per-position order), whatever the dataset's size."""
        if self._order is None or self._order[0] != epoch:
            o = self.order
            window = self.count if o.window is None else int(o.window)
            block = 1 if o.block is None else int(o.block)
            self._order = (epoch, epoch_order(
                self.count, Shuffle(o.shuffle, o.seed, block, max(1, window)), epoch))
        return self._slice().batch_records(self._order[1], iteration).tolist()

    def __call__(self, info: Any) -> tuple[list[np.ndarray], np.ndarray]:
        """The batch of ``info`` (DALI's ``BatchInfo``, or an iteration number).

        Raises:
            StopIteration: the epoch has no more batches.
        """
        iteration = getattr(info, "iteration", info)
        epoch = getattr(info, "epoch_idx", 0)
        if iteration >= len(self):
            raise StopIteration
        batch = self.batch_indices(epoch, iteration)
        reader = self.reader
        payloads = reader.read_many(batch)
        labels = reader.labels[batch].astype(np.int64)
        if self.mode == "raw":
            decode = self._decoder()
            images = [decode(p) for p in payloads]
        elif self.transcode:
            images = [self._dali_readable(p) for p in payloads]
        else:
            images = [np.frombuffer(p, dtype=np.uint8) for p in payloads]
        return images, labels

    def _dali_readable(self, payload: bytes) -> np.ndarray:
        if sniff_encoding(payload) in DALI_ENCODINGS:
            return np.frombuffer(payload, dtype=np.uint8)
        rgb = self._decoder()(payload)
        header = b"P6\n%d %d\n255\n" % (rgb.shape[1], rgb.shape[0])
        return np.frombuffer(header + np.ascontiguousarray(rgb).tobytes(), dtype=np.uint8)

    def _decoder(self) -> Any:
        if self._decode is None:
            # fastdata.decoding.decode, not the Datasets: they would import torch
            # into DALI's worker processes.
            from fastdata.decoding.decode import DecoderChain

            self._decode = DecoderChain(raw_shape=self.reader.manifest.raw_shape)
        return self._decode

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_reader=None, _decode=None, _order=None)
        return state


def external_node(fn: Any, types: Any, source: ExternalBatches, *, py_workers: int,
                  run_ahead: int) -> tuple[Any, Any]:
    """``fn.external_source`` fed by ``source``, inside a pipeline: (images, labels)
    nodes, images 1-D uint8 (encoded) or HWC uint8 (raw)."""
    parallel = py_workers > 0
    extra = {"prefetch_queue_depth": max(2, int(run_ahead))} if parallel else {}
    raw = source.mode == "raw"
    return fn.external_source(
        source=source, num_outputs=2, batch=True, batch_info=True, parallel=parallel,
        dtype=[types.UINT8, types.INT64], ndim=[3 if raw else 1, 0],
        layout=["HWC" if raw else "", ""], **extra)

"""Planning a pipeline: which part of the data, on which device, through which reader.

Sharding follows DALI's readers everywhere: with ``num_shards`` S, shard i of
an epoch's order holds records ``[i*N//S, (i+1)*N//S)``. DALI's readers move
each pipeline to the next shard after every epoch (their
``stick_to_shard=False``); together the shards still cover every record once
per epoch.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastdata.dali.device import resolve_device
from fastdata.dali.external import DALI_ENCODINGS, external_slice, shard_bounds
from fastdata.dali.options import DALIOptions
from fastdata.dali.readers import NativeReader, NativeRequest, NativeUnavailable
from fastdata.errors import FastDataError
from fastdata.machine import rank_and_world


@dataclass(frozen=True)
class PipelinePlan:
    """How a pipeline reads and processes a dataset (resolved options).

    Attributes:
        path: the dataset.
        format: its format name.
        reader: "tfrecord", "webdataset" (DALI readers) or "external".
        mode: what the records hold for the pipeline: "encoded" (DALI decodes)
            or "raw" (HWC uint8 pixels, no decoding).
        transcode: the external source turns encodings DALI cannot decode
            (GIF) into PPM before DALI decodes the batch.
        device: "gpu" or "cpu".
        device_id: the CUDA device, None for a CPU-only pipeline.
        shard_id, num_shards: this pipeline's part of the data.
        count: records in the dataset.
        shard_size: records of this shard in the first epoch.
        batches: batches per epoch for this shard.
    """

    path: str | list[str]
    format: str
    reader: str
    mode: str
    transcode: bool
    device: str
    device_id: int | None
    shard_id: int
    num_shards: int
    count: int
    shard_size: int
    batches: int


@dataclass(frozen=True)
class Placement:
    """Where a pipeline runs: its shard and its device (resolved, not "auto")."""

    shard_id: int
    num_shards: int
    device: str
    device_id: int | None


def place(options: DALIOptions) -> Placement:
    """The shard (by default torch.distributed's rank and world size) and device.

    Raises:
        ValueError: the shard is out of range, or a bad ``device_id``.
        FastDataError: "gpu" asked for and DALI sees no CUDA device.
    """
    rank, world = rank_and_world()
    order = options.order
    shard_id = rank if order.rank is None else int(order.rank)
    num_shards = world if order.world_size is None else int(order.world_size)
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        raise ValueError(f"Order(rank=) must be in [0, world_size), got {shard_id} of "
                         f"{num_shards}")
    device, device_id = resolve_device(options.device, options.device_id)
    return Placement(shard_id, num_shards, device, device_id)


def absolute(path: str | os.PathLike | Sequence[str | os.PathLike]) -> str | list[str]:
    """``path`` (or each shard of a list) made absolute: DALI's worker processes
    may not share this one's working directory. URLs (s3://, gs://, az://,
    http(s)://) stay URLs; ``file://`` URLs become plain paths."""
    from fastdata.formats.remote_files import absolute as absolute_one

    if isinstance(path, (list, tuple)):  # shard files written by another tool
        return [absolute_one(p) for p in path]
    return absolute_one(path)


def make_plan(path: str | list[str], reader: Any, options: DALIOptions, where: Placement
              ) -> tuple[PipelinePlan, NativeReader | None]:
    """The plan of a pipeline over the dataset that ``reader`` reads, and DALI's
    own reader for it (None: the external source).

    Raises:
        FastDataError: the dataset is too small for the shards or for one full
            batch, or ``reader="dali"`` and DALI's readers cannot read it.
    """
    count = len(reader)
    if count < where.num_shards:
        raise FastDataError(f"a dataset of {count} records cannot be split into "
                            f"{where.num_shards} shards", path=path)
    enc = reader.manifest.encoding or {}
    mode = "raw" if enc.get("storage") == "raw" else "encoded"
    transcode = mode == "encoded" and bool(set(enc.get("formats") or {}) - DALI_ENCODINGS)
    request = NativeRequest(path=path, mode=mode, transcode=transcode,
                            shard_id=where.shard_id, num_shards=where.num_shards,
                            options=options)
    native = choose_native(reader, request)
    if native is not None:  # DALI's own readers split the records into contiguous parts
        start, stop = shard_bounds(count, where.shard_id, where.num_shards)
        shard_size = stop - start
    else:
        shard_size = external_slice(count, where.shard_id, where.num_shards,
                                    options.batch_size).per_rank
    batches = _batches(shard_size, options, where, path)
    # A version or a view: its record, so every DALI worker reads that version.
    plan = PipelinePlan(path=reader.path if getattr(reader, "record", None) else path,
                        format=reader.format_name,
                        reader=native.name if native is not None else "external",
                        mode=mode, transcode=transcode, device=where.device,
                        device_id=where.device_id, shard_id=where.shard_id,
                        num_shards=where.num_shards, count=count, shard_size=shard_size,
                        batches=batches)
    return plan, native


def choose_native(reader: Any, request: NativeRequest) -> NativeReader | None:
    """DALI's own reader for the dataset, through its format's adapter
    (``fastdata.dali.readers.dali_reader``); None where the external source reads it.

    Raises:
        FastDataError: ``reader="dali"`` and DALI's readers cannot read it.
    """
    from fastdata.dali.readers import dali_reader
    from fastdata.formats import get_format

    choice = request.options.reader
    if choice == "external":
        return None
    spec = get_format(reader.format_name)
    if getattr(reader, "record", None) is not None:
        # DALI's readers read one dataset's files whole: not a view's records,
        # nor a version's parts one after another.
        if choice == "dali":
            raise FastDataError("DALI's own readers read one dataset's files whole, not a "
                                "view or a version of several parts; use reader='auto' or "
                                "'external'", path=request.path)
        return None
    native = dali_reader(spec)
    if native is None:
        if choice == "dali":
            raise FastDataError(f"DALI has no reader for fastdata's {spec.name} layout; use "
                                f"reader='auto' or 'external'", path=request.path)
        return None
    try:
        return native(reader, request)
    except NativeUnavailable as exc:
        if choice == "dali":
            raise
        if exc.warn_on_fallback:
            warnings.warn(f"{exc}; reading it through fastdata's reader in an external "
                          f"source instead", stacklevel=5)
        return None


def _batches(shard_size: int, options: DALIOptions, where: Placement,
             path: str | list[str]) -> int:
    size = options.batch_size
    batches = shard_size // size if options.order.drop_last else math.ceil(shard_size / size)
    if batches == 0:
        raise FastDataError(f"shard {where.shard_id} of {where.num_shards} holds {shard_size} "
                            f"records: no full batch of {size} (drop_last=True)", path=path)
    return batches

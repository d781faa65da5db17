"""Building the DALI pipeline: reader node, decode, resize, crop and normalise.

Decoding is ``fn.decoders.image`` with ``device="mixed"`` (nvJPEG) on the GPU,
``"cpu"`` otherwise; then ``fn.resize`` (linear with antialiasing), an optional
centre crop, and ``fn.crop_mirror_normalize`` (layout, and normalisation to
float when ``mean``/``std`` are given). With ``crop=RandomResizedCrop(...)``,
training crops instead: ``fn.decoders.image_random_crop`` (which decodes only
the crop's region) and a resize to the crop's size, or
``fn.random_resized_crop`` for pre-decoded records, then a flip drawn by
``fn.random.coin_flip``. Without a GPU the same pipeline runs on the CPU
(``device_id=None``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from fastdata.dali.device import import_dali
from fastdata.dali.external import ExternalBatches, external_node
from fastdata.dali.options import (
    DALIOptions,
    DALIReader,
    Device,
    Layout,
    StartMethod,
    options_from,
)
from fastdata.dali.plan import PipelinePlan, absolute, make_plan, place
from fastdata.dataset.ref import DatasetRef
from fastdata.decoding.options import Decode
from fastdata.decoding.random_crop import TRIES
from fastdata.keywords import explain_keywords
from fastdata.order.options import Order


@explain_keywords()
def build_pipeline(path: str | os.PathLike | Sequence[str | os.PathLike] | DatasetRef, *,
                   decode: Decode | None = None, order: Order | None = None,
                   run_ahead: int = 2, device: Device = "auto", device_id: int | None = None,
                   num_threads: int = 2, mean: Sequence[float] | None = None,
                   std: Sequence[float] | None = None, layout: Layout = "CHW",
                   reader: DALIReader = "auto", py_workers: int = 0,
                   py_start_method: StartMethod | None = None,
                   index_dir: str | os.PathLike | None = None) -> Any:
    """Build a DALI pipeline that yields ``(images, labels)`` batches of a packed dataset.

    Args:
        path: a packed dataset (any format), as ``fastdata.open_reader`` takes
            it: also a view, a version record, a shard pattern or a list of
            shards from another tool, or a URL (s3://, gs://, az://,
            http(s)://); or a :class:`fastdata.DatasetRef` (the version read,
            whether fastdata's reader checks each record, links followed, the
            format reader's settings). DALI's own readers read
            a remote dataset from local copies: all its shards are downloaded
            into the shared cache first (see fastdata.dali.downloads).
        decode: a :class:`fastdata.Decode`, the same value the torch Datasets
            take: ``size`` (an int for the shorter side, aspect kept, or
            (height, width)) and ``crop``: a :class:`fastdata.CenterCrop`
            after the resize, or a :class:`fastdata.RandomResizedCrop`
            (instead of ``size``): a random crop of its area and ratio ranges
            (DALI's sampler: up to 10 tries, as torchvision's), resized to its
            size and flipped with probability ``hflip``. The boxes are DALI's
            own draws, seeded by the order's seed: statistically those of
            fastdata's Datasets, not the same boxes, and not resumable
            mid-epoch. DALI decodes with its own decoder to RGB tensors
            (``decoder``, ``keep_gray``, ``max_pixels`` and ``output`` are the
            torch Datasets').
        order: a :class:`fastdata.Order`, as the Datasets take it:
            ``batch_size`` (None: 64), ``shuffle``, ``seed`` (the same on every
            rank, so their parts stay disjoint), ``drop_last``,
            ``rank``/``world_size`` (this pipeline's part of the data; default
            torch.distributed's, else 0/1), and ``block``/``window``. The
            external source reads the order engine's order (a permutation of
            the whole dataset by default: the order a map-style Dataset reads
            with the same seed); DALI's tfrecord/webdataset readers shuffle
            within a buffer of ``window`` records (default 1024). With
            ``drop_last`` the external source drops a short last batch;
            DALI's readers always fill the last batch by repeating the
            shard's last record (``pad_last_batch``), which DALILoader (or
            ``DALIGenericIterator(reader_name=READER_NAME)``) trims or drops.
        run_ahead: batches DALI prepares ahead (its prefetch queue depth).
        device: "gpu" (decode with nvJPEG, process on the GPU; needs CUDA),
            "cpu" (a CPU-only pipeline, ``device_id=None``) or "auto" (GPU
            when DALI sees one).
        device_id: the CUDA device for "gpu"; None takes torch's current one.
        num_threads: DALI's CPU threads.
        mean: per-channel values (0-1 or 0-255 scale); with ``std`` the
            images are normalised on the pipeline's device to float32,
            otherwise they stay uint8.
        std: per-channel values, on the scale of ``mean``.
        layout: "CHW" (default) or "HWC".
        reader: "auto", "dali" (DALI's own reader; tfrecord and tar only)
            or "external" (fastdata's reader in an external source, any format).
        py_workers: worker processes running the external source in
            parallel (DALI's parallel external source); 0 reads in the
            pipeline's thread.
        py_start_method: "fork" or "spawn" for those workers; None takes
            "fork" on the CPU and "spawn" on the GPU (a process that has
            initialised CUDA must not fork). Under "spawn" the script that
            builds the pipeline needs an ``if __name__ == "__main__":`` guard.
        index_dir: where generated DALI index files go (tar shards, and
            TFRecord shards without ``.idx``); default
            ``$FASTDATA_CACHE_DIR`` or ``~/.cache/fastdata``, under
            ``dali-index/``.

    Returns:
        The ``nvidia.dali.Pipeline``, outputs ``(images, labels)``: images
        uint8 (or float32 when normalised) in ``layout``, labels int64 scalars.
        Its DALI reader, when it has one, is named ``READER_NAME``.

    Raises:
        FastDataError: DALI is not installed, no GPU for device="gpu", or the
            dataset cannot be read this way (with ``reader="dali"``: also a
            remote dataset larger than ``FASTDATA_CACHE_LIMIT``).
        ValueError: an option is out of range.
    """
    import_dali()  # before the options: without DALI, say how to install it first
    opts = options_from(locals())
    return plan_and_build(path, opts)[0]


def plan_and_build(path: str | os.PathLike | Sequence[str | os.PathLike],
                   options: DALIOptions) -> tuple[Any, PipelinePlan]:
    """The DALI pipeline over ``path`` and its plan (see :func:`build_pipeline`).

    Raises:
        FastDataError: DALI is not installed, no GPU for device="gpu", or the
            dataset cannot be read this way (with ``reader="dali"``: also a
            remote dataset larger than ``FASTDATA_CACHE_LIMIT``).
        ValueError: the shard or the device is out of range.
    """
    _, fn, types = import_dali()
    from nvidia.dali.pipeline import Pipeline

    from fastdata.dataset.resolve import open_reader

    where = place(options)
    ref = DatasetRef.of(path)
    ref = dataclasses.replace(ref, path=absolute(ref.path))
    path = ref.path
    reader = open_reader(ref)
    try:
        plan, native = make_plan(path, reader, options, where)
        start_method = options.py_start_method
        if start_method is None:
            # Forking a process that has initialised CUDA is unsafe (and DALI refuses it).
            start_method = "spawn" if plan.device == "gpu" else "fork"
        pipe = Pipeline(batch_size=options.batch_size, num_threads=int(options.num_threads),
                        device_id=plan.device_id, seed=int(options.order.seed),
                        prefetch_queue_depth=int(options.run_ahead),
                        py_num_workers=max(1, int(options.py_workers)),
                        py_start_method=start_method)
        with pipe:
            if native is not None:
                encoded, labels = native.build(fn, types)
            else:
                encoded, labels = _external(fn, types, plan, options, reader, ref)
            images = _process(fn, types, _decode(fn, types, encoded, plan, options), options)
            if plan.device == "gpu":
                labels = labels.gpu()
            pipe.set_outputs(images, labels)
        return pipe, plan
    finally:
        # Handles reopen lazily where the reader is used again (the external source).
        reader.close()


def _external(fn: Any, types: Any, plan: PipelinePlan, options: DALIOptions,
              reader: Any, ref: DatasetRef) -> tuple[Any, Any]:
    order = dataclasses.replace(options.order, rank=plan.shard_id, world_size=plan.num_shards)
    # The plan's path: a version's or a view's record, so every worker reads it.
    source = ExternalBatches(dataclasses.replace(ref, path=plan.path, version=None),
                             order=order, mode=plan.mode, transcode=plan.transcode,
                             reader=reader)
    return external_node(fn, types, source, py_workers=options.py_workers,
                         run_ahead=options.run_ahead)


def _decode(fn: Any, types: Any, encoded: Any, plan: PipelinePlan,
            options: DALIOptions) -> Any:
    """HWC uint8 images on the pipeline's device (a random crop's already
    cropped and resized to its size)."""
    crop = options.decode.random_crop
    if plan.mode == "encoded":
        decoder_device = "mixed" if plan.device == "gpu" else "cpu"
        if crop is None:
            return fn.decoders.image(encoded, device=decoder_device, output_type=types.RGB)
        images = fn.decoders.image_random_crop(
            encoded, device=decoder_device, output_type=types.RGB, num_attempts=TRIES,
            random_area=list(crop.scale), random_aspect_ratio=list(crop.ratio))
        height, width = crop.size
        return fn.resize(images, resize_x=width, resize_y=height)
    images = encoded.gpu() if plan.device == "gpu" else encoded  # raw: pixels already
    if crop is None:
        return images
    return fn.random_resized_crop(images, size=list(crop.size), num_attempts=TRIES,
                                  random_area=list(crop.scale),
                                  random_aspect_ratio=list(crop.ratio))


def _process(fn: Any, types: Any, images: Any, options: DALIOptions) -> Any:
    """Resize, then centre crop (or a random crop's flip), layout and
    normalisation, as the options ask."""
    if options.decode.size is not None:
        if options.size_hw is None:
            images = fn.resize(images, resize_shorter=options.decode.size)
        else:
            height, width = options.size_hw
            images = fn.resize(images, resize_x=width, resize_y=height)
    mean, std = options.mean255, options.std255
    crop, random = options.decode.center_crop, options.decode.random_crop
    flip = random is not None and random.hflip > 0.0
    if crop is None and not flip and mean is None and options.layout == "HWC":
        return images  # nothing left to do: skip the operator
    cmn: dict[str, Any] = {"dtype": types.FLOAT if mean is not None else types.UINT8,
                           "output_layout": options.layout}
    if crop is not None:
        cmn["crop"] = crop
    if flip:
        cmn["mirror"] = fn.random.coin_flip(probability=random.hflip)
    if mean is not None:
        cmn.update(mean=mean, std=std)
    return fn.crop_mirror_normalize(images, **cmn)

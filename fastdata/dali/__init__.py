"""NVIDIA DALI pipelines over packed datasets: decoding and resizing on the GPU.

``import fastdata.dali`` works without DALI (and imports no torch); building a
pipeline imports DALI and, when it is missing, raises a FastDataError that says
how to install it (``pip install nvidia-dali-cuda130``).

    loader = fastdata.dali.DALILoader(
        "train.tfrecord", decode=fastdata.Decode(size=256, crop=fastdata.CenterCrop(224)),
        order=fastdata.Order(batch_size=256), mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225))
    for images, labels in loader:      # float32 [B, 3, 224, 224] and int64 [B], on the GPU
        ...

How each format is read (``reader="auto"``): a format with a DALI adapter
(``fastdata.dali.readers.DALI_READERS``) goes through DALI's own reader,
every other one through an external source fed by fastdata's reader.

=========  ========================================================================
format     reader
=========  ========================================================================
tfrecord   DALI's ``fn.readers.tfrecord`` over the shards, with the per-shard
           ``<shard>.idx`` files fastdata writes (tfrecord2idx format); shards from
           other tools without one get an index generated from fastdata's scan.
tar        DALI's ``fn.readers.webdataset`` with an index in DALI's own format
           (wds2idx, ``v1.2``) generated from the shards' tar headers on first use
           and cached (see ``index_dir``). The index names the image member
           fastdata's reader picks as component ``img`` and the label member as
           ``cls``; the ASCII-decimal ``.cls`` bytes are turned into an int64
           label inside the pipeline with DALI arithmetic.
lmdb/hdf5  ``fn.external_source`` fed by a batch callable that reads records with
           fastdata's reader (``read_many``: one transaction / one contiguous
           read per batch), checking each record's CRC32. With ``py_workers > 0``
           DALI runs the callable in that many worker processes, reading several
           batches ahead in parallel.
=========  ========================================================================

``reader="external"`` uses the external source for tfrecord and tar too (it
shuffles the whole dataset each epoch, where DALI's readers shuffle within a
buffer of ``Order(window=)`` records, and it checks fastdata's CRC32s, which
DALI's readers do not). Pre-decoded (``raw``) datasets and datasets holding an
encoding DALI cannot decode (GIF) always use the external source: raw pixels
go in as HWC uint8 arrays with no decoding; GIFs are decoded by fastdata on the
CPU and handed to DALI as PPM, so the other records of the batch still decode
on the GPU.

A dataset at a URL (s3://, gs://, az://, http(s)://): DALI's readers open local
files only, so the whole dataset (every shard, and each TFRecord shard's
``.idx``) is downloaded into fastdata's shared cache first; when it is larger
than ``FASTDATA_CACHE_LIMIT`` the external source reads it instead (a warning;
an error with ``reader="dali"``). The external source reads URLs through
fastdata's readers.

Modules: ``options`` (:class:`DALIOptions`), ``device`` (importing DALI, CUDA
devices), ``plan`` (shard, device and reader: :class:`PipelinePlan`),
``readers`` (the adapters to DALI's readers), ``indexes`` (their index files),
``downloads`` (local copies of a remote dataset's shards for them),
``external`` (:class:`ExternalBatches`), ``pipeline`` (:func:`build_pipeline`, and
:func:`plan_and_build` for a :class:`DALIOptions`),
``loader`` (:class:`DALILoader`).
"""

from __future__ import annotations

from fastdata.dali.device import INSTALL_HINT, cuda_devices
from fastdata.dali.external import DALI_ENCODINGS, ExternalBatches
from fastdata.dali.loader import DALILoader
from fastdata.dali.options import DEVICES, LAYOUTS, READERS, DALIOptions
from fastdata.dali.pipeline import build_pipeline, plan_and_build
from fastdata.dali.plan import PipelinePlan
from fastdata.dali.readers import READER_NAME

__all__ = [
    "DALI_ENCODINGS", "DEVICES", "INSTALL_HINT", "LAYOUTS", "READERS", "READER_NAME",
    "DALILoader", "DALIOptions", "ExternalBatches", "PipelinePlan", "build_pipeline",
    "cuda_devices", "plan_and_build",
]

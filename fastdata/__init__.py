"""fastdata: pack image folders into fast containers and feed them to PyTorch.

``import fastdata`` is light: torch, lmdb and the other heavy libraries load
only when the names that need them are first used.

    fastdata.pack("images/", "train.lmdb")
    ds = fastdata.open_dataset("train.lmdb")       # a torch Dataset of (uint8 CHW tensor, label)
    ds = fastdata.open_dataset("train.lmdb", decode=fastdata.Decode(size=224),
                               order=fastdata.Order(shuffle=True, batch_size=256))
    for images, labels in fastdata.loader(ds): ...

The top level holds what a training script needs; everything else lives in its
sub-package, each an attribute of ``fastdata`` imported on first use:
``fastdata.formats`` (the registry, the format readers), ``fastdata.dataset``
(version records, views, the resolver, the commit), ``fastdata.ops`` (append,
join, subset, gc, verify),
``fastdata.records`` (``Manifest``), ``fastdata.packers``, ``fastdata.loaders``,
``fastdata.order`` (``Order``), ``fastdata.decoding`` (``Decode``,
``CenterCrop``, ``RandomResizedCrop``), ``fastdata.storage`` (paths and URLs),
``fastdata.bench``, ``fastdata.demo`` (``synthesize``) and ``fastdata.dali``
(``DALILoader``).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

from fastdata.errors import (  # noqa: E402  (light: no third-party imports)
    BadImageError,
    CorruptDataError,
    DecodeError,
    FastDataError,
    ManifestError,
    MixedSizeWarning,
    OutputExistsError,
    SourceError,
    StorageError,
    UnknownFormatError,
    UnsafeNameError,
)

# Public name -> "module:attribute", imported on first access.
_LAZY = {
    "pack": "fastdata.packers.pack:pack",
    "convert": "fastdata.packers.convert:convert",
    "dedup": "fastdata.duplicates:dedup",
    "subset": "fastdata.ops.subset:subset",
    "append": "fastdata.ops.append:append",
    "join": "fastdata.ops.join:join",
    "gc": "fastdata.ops.gc:gc",
    "open_reader": "fastdata.dataset.resolve:open_reader",
    "read_manifest": "fastdata.dataset.resolve:read_manifest",
    "DatasetRef": "fastdata.dataset.ref:DatasetRef",
    "PackOptions": "fastdata.packers.options:PackOptions",
    "Source": "fastdata.packers.source:Source",
    "ImageFolderSource": "fastdata.packers.source:ImageFolderSource",
    "CSVSource": "fastdata.packers.sources.csv_list:CSVSource",
    "JSONLinesSource": "fastdata.packers.sources.json_lines:JSONLinesSource",
    "ParquetSource": "fastdata.packers.sources.parquet:ParquetSource",
    "DatasetSource": "fastdata.packers.sources.dataset:DatasetSource",
    "open_source": "fastdata.packers.sources.dispatch:open_source",
    "open_dataset": "fastdata.loaders.opening:open_dataset",
    "PackedDataset": "fastdata.loaders.datasets:PackedDataset",
    "LMDBDataset": "fastdata.loaders.datasets:LMDBDataset",
    "HDF5Dataset": "fastdata.loaders.datasets:HDF5Dataset",
    "TFRecordDataset": "fastdata.loaders.datasets:TFRecordDataset",
    "TarDataset": "fastdata.loaders.datasets:TarDataset",
    "ShardedIterableDataset": "fastdata.loaders.iterable:ShardedIterableDataset",
    "EpochBatches": "fastdata.loaders.sampler:EpochBatches",
    "CUDAPrefetcher": "fastdata.loaders.prefetch:CUDAPrefetcher",
    "BackgroundBatches": "fastdata.loaders.background:BackgroundBatches",
    "loader": "fastdata.loaders.make_loader:loader",
    "collate": "fastdata.loaders.collate:collate",
    "stats": "fastdata.loaders.stats:stats",
    "log_stats": "fastdata.meter.export:log_stats",
    "RandomResizedCrop": "fastdata.decoding.random_crop:RandomResizedCrop",
    "CenterCrop": "fastdata.decoding.options:CenterCrop",
    "Decode": "fastdata.decoding.options:Decode",
    "Order": "fastdata.order.options:Order",
    "mix": "fastdata.loaders.mixed:mix",
    "MixedDataset": "fastdata.loaders.mixed:MixedDataset",
}

__all__ = sorted([
    "__version__", "FastDataError", "BadImageError", "CorruptDataError", "DecodeError",
    "ManifestError", "MixedSizeWarning", "OutputExistsError", "SourceError", "StorageError",
    "UnknownFormatError", "UnsafeNameError", *_LAZY,
])


#: Sub-packages reachable as attributes (``fastdata.formats.read_manifest``).
_SUBMODULES = ("formats", "records", "errors", "packers", "loaders", "order", "decoding",
               "storage", "dataset", "ops", "bench", "demo", "dali", "machine", "encodings", "meter",
               "cli")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"fastdata.{name}")
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'fastdata' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return __all__

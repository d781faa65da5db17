"""Converting a packed dataset into another format (``fastdata convert``): a
pack whose source is the dataset itself."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from fastdata.packers.options import PackOptions
from fastdata.packers.pack import pack
from fastdata.packers.sources.dataset import DatasetSource
from fastdata.packers.summary import PackSummary


def convert(
    source: str | os.PathLike | list | DatasetSource,
    output: str | os.PathLike,
    *,
    options: PackOptions | None = None,
    progress: bool | None = None,
    on_event: Callable[[str], None] | None = None,
    reader_settings: Mapping[str, Any] | None = None,
    scheduler: Any = None,
    ray: Any = None,
) -> PackSummary:
    """Write the dataset ``source`` again as ``output``, in the format its name
    (or ``options.format``) gives.

    Without preprocessing options every record is carried over bit for bit:
    its payload bytes (raw pixels stay raw), label, key and metadata, with the
    classes and the record order; ``options`` resize or re-encode as for
    :func:`fastdata.pack`, and ``shard_size``, ``shuffle``, ``resume`` and
    ``overwrite`` work alike. The manifest's ``source.converted_from`` names
    the dataset read (path, format, count, and its fingerprint and time of
    packing when it has a fastdata manifest).

    Args:
        source: the dataset to read: anything :class:`DatasetSource` opens (a
            fastdata dataset of any format, a webdataset tar, a TFRecord of
            another tool), or a DatasetSource.
        output: the dataset to write (see :func:`fastdata.pack`).
        options: pack options (default: records as they are).
        progress: show a progress bar (None: only on a terminal).
        on_event: called with each warning as it happens.
        reader_settings: the source reader's own settings (``feature_keys`` for a
            TFRecord of another tool).
        scheduler: convert on a Dask cluster, as :func:`fastdata.pack` does
            (this machine reads the records; the workers preprocess them and
            write the shards).
        ray: convert on a Ray cluster instead (see :func:`fastdata.pack`).

    Raises:
        SourceError: ``output`` is ``source`` (or would write over its files).
        UnknownFormatError, ManifestError, CorruptDataError: ``source`` cannot
            be read.
        FastDataError: as :func:`fastdata.pack`.
    """
    if not isinstance(source, DatasetSource):
        source = DatasetSource(source, reader_settings=reader_settings)
    return pack(source, output, options=options, progress=progress, on_event=on_event,
                scheduler=scheduler, ray=ray)


__all__ = ["convert"]

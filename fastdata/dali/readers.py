"""Adapters from fastdata's formats to DALI's own readers.

Each format's adapter is registered here (:data:`DALI_READERS`,
:func:`register_dali_reader`; the formats name no layer above them); formats
without one are read through the external source. An adapter is called while the pipeline is
planned, with the open fastdata reader and a :class:`NativeRequest`; it
prepares what DALI's reader needs (index files) and returns a
:class:`NativeReader`, whose ``build`` makes the reader node inside the
pipeline. When DALI's reader cannot read the dataset, it raises
:class:`NativeUnavailable` and the planner falls back to the external source
(unless ``reader="dali"`` was asked for).

DALI's readers open local files only: the shards of a dataset at a URL are
downloaded whole into the shared cache first (see fastdata.dali.downloads),
unless the cache limit is smaller than the dataset (:class:`CacheTooSmall`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastdata.dali.downloads import ShardFiles, cache_shortfall, shard_files
from fastdata.dali.indexes import (
    IMAGE_COMPONENT,
    LABEL_COMPONENT,
    tfrecord_index_paths,
    webdataset_index_paths,
)
from fastdata.dali.options import DALIOptions
from fastdata.errors import FastDataError

#: Name of the DALI reader operator, for ``DALIGenericIterator(reader_name=...)``.
READER_NAME = "fastdata_reader"


class NativeUnavailable(FastDataError):
    """DALI's own reader cannot read this dataset (the external source can)."""

    #: The planner warns when it falls back to the external source for this reason.
    warn_on_fallback = False


class CacheTooSmall(NativeUnavailable):
    """A remote dataset is larger than the download cache may hold
    (``FASTDATA_CACHE_LIMIT``), and DALI's readers need all of it on disk."""

    warn_on_fallback = True


@dataclass(frozen=True)
class NativeRequest:
    """What an adapter is asked for.

    Attributes:
        path: the dataset (for error messages).
        mode: "encoded" or "raw" (see ``PipelinePlan.mode``).
        transcode: some records hold encodings DALI cannot decode.
        shard_id, num_shards: the pipeline's part of the data.
        options: the pipeline's options (its order's shuffle, seed and window;
            index_dir).
    """

    path: str | list[str]
    mode: str
    transcode: bool
    shard_id: int
    num_shards: int
    options: DALIOptions


@dataclass(frozen=True)
class NativeReader:
    """A prepared DALI reader.

    Attributes:
        name: DALI's name for it ("tfrecord", "webdataset"): ``PipelinePlan.reader``.
        build: ``build(fn, types) -> (encoded, labels)``, called inside the
            pipeline: the reader node, named :data:`READER_NAME`, and its
            outputs as 1-D uint8 encoded images and int64 scalar labels.
    """

    name: str
    build: Callable[[Any, Any], tuple[Any, Any]]


def _require_decodable(name: str, request: NativeRequest) -> None:
    # DALI's readers hand every record to DALI's decoder, so raw pixels and
    # GIFs need the external source.
    if request.mode != "encoded" or request.transcode:
        what = ("pre-decoded (raw)" if request.mode == "raw"
                else "GIF (or other non-DALI) encoded")
        raise NativeUnavailable(f"DALI's {name} reader needs images DALI decodes, but this "
                                f"dataset holds {what} records; use reader='auto'",
                                path=request.path)


def _local_files(name: str, reader: Any, request: NativeRequest,
                 side_suffix: str | None = None) -> ShardFiles:
    """The local files of the dataset's shards: for a dataset at a URL, the
    whole dataset downloaded into the cache (see fastdata.dali.downloads).

    Raises:
        CacheTooSmall: the dataset is larger than the cache limit.
    """
    shortfall = cache_shortfall(reader)
    if shortfall is not None:
        raise CacheTooSmall(f"DALI's {name} reader reads local files only, and {shortfall}",
                            path=request.path)
    return shard_files(reader, side_suffix)


def _common(request: NativeRequest) -> dict[str, Any]:
    """Keywords every DALI reader takes, from the request."""
    opts = request.options
    # pad_last_batch: the last batch repeats the shard's last record; the
    # iterator trims (or drops) it, so an epoch holds each record once.
    return {"name": READER_NAME, "shard_id": request.shard_id,
            "num_shards": request.num_shards, "random_shuffle": bool(opts.order.shuffle),
            "initial_fill": opts.reader_window, "pad_last_batch": True,
            "seed": int(opts.order.seed)}


# -- TFRecord -------------------------------------------------------------------------


def tfrecord_reader(reader: Any, request: NativeRequest) -> NativeReader:
    """DALI's ``fn.readers.tfrecord`` over a TFRecord dataset's shards, with their
    tfrecord2idx files (generated where a shard has none). A remote dataset's
    shards and ``.idx`` files are downloaded into the cache first (all of them).

    Raises:
        NativeUnavailable: the records are not images DALI decodes, or the
            dataset is remote and larger than the cache limit.
    """
    from fastdata.formats.tfrecord.schema import (
        DEFAULT_FEATURE_KEYS,
        SHARD_INDEX_SUFFIX,
    )

    _require_decodable("tfrecord", request)
    keys = dict(getattr(reader, "feature_keys", DEFAULT_FEATURE_KEYS))
    files = _local_files("tfrecord", reader, request, SHARD_INDEX_SUFFIX)
    build = functools.partial(
        _tfrecord_node, paths=files.paths,
        index_paths=tfrecord_index_paths(reader, files, request.options.index_dir),
        image_key=keys["image"], label_key=keys["label"], common=_common(request))
    return NativeReader("tfrecord", build)


def _tfrecord_node(fn: Any, types: Any, *, paths: list[str], index_paths: list[str],
                   image_key: str, label_key: str, common: dict[str, Any]
                   ) -> tuple[Any, Any]:
    import nvidia.dali.tfrecord as tfrec

    features = {image_key: tfrec.FixedLenFeature((), tfrec.string, ""),
                label_key: tfrec.FixedLenFeature([1], tfrec.int64, -1)}
    out = fn.readers.tfrecord(path=paths, index_path=index_paths, features=features, **common)
    return out[image_key], fn.reshape(out[label_key], shape=[])


# -- tar (webdataset) ----------------------------------------------------------------------


def webdataset_reader(reader: Any, request: NativeRequest) -> NativeReader:
    """DALI's ``fn.readers.webdataset`` over a tar dataset's shards, with a DALI
    index of each shard (generated from its tar headers on first use, cached).

    The index names the image member fastdata's reader picks as component
    ``img`` and the label member as ``cls``; the ASCII-decimal label bytes
    become an int64 inside the pipeline (:func:`ascii_label`). A remote
    dataset's shards are downloaded into the cache first (all of them).

    Raises:
        NativeUnavailable: the records are not images DALI decodes, a sample
            has no ``.cls`` label member, or the dataset is remote and larger
            than the cache limit.
    """
    _require_decodable("webdataset", request)
    files = _local_files("webdataset", reader, request)
    found = webdataset_index_paths(reader, files, request.options.index_dir)
    if found is None:
        raise NativeUnavailable("some tar samples have no .cls label member; DALI's "
                                "webdataset reader path needs one; use reader='auto'",
                                path=request.path)
    index_paths, width = found
    build = functools.partial(_webdataset_node, paths=files.paths,
                              index_paths=index_paths, width=width, common=_common(request))
    return NativeReader("webdataset", build)


def _webdataset_node(fn: Any, types: Any, *, paths: list[str], index_paths: list[str],
                     width: int, common: dict[str, Any]) -> tuple[Any, Any]:
    encoded, cls = fn.readers.webdataset(
        paths=paths, index_paths=index_paths, ext=[IMAGE_COMPONENT, LABEL_COMPONENT],
        missing_component_behavior="error", **common)
    return encoded, ascii_label(fn, types, cls, width)


def ascii_label(fn: Any, types: Any, data: Any, width: int) -> Any:
    """int64 label from ASCII-decimal bytes, in DALI operations (Horner's rule over
    the first ``width`` bytes; bytes that are not digits, such as a newline, are
    skipped)."""
    padded = fn.cast(fn.pad(data, axes=[0], shape=[width], fill_value=0), dtype=types.INT64)
    value = types.Constant(0, dtype=types.INT64)
    for i in range(width):
        digit = padded[i] - 48
        is_digit = fn.cast((digit >= 0) & (digit <= 9), dtype=types.INT64)
        value = value * (1 + 9 * is_digit) + digit * is_digit
    return value


#: Format name -> the function building DALI's native reader for it; formats
#: without one feed DALI from fastdata's reader (an external source). DALI's
#: layer keeps this: a format names no layer above it.
DALI_READERS = {"tfrecord": tfrecord_reader, "tar": webdataset_reader}


def register_dali_reader(format_name: str, build) -> None:
    """Read format ``format_name`` with ``build(reader, request) -> NativeReader``."""
    DALI_READERS[format_name] = build


def dali_reader(spec):
    """The native-reader builder of format ``spec``: its registered one; None: none."""
    return DALI_READERS.get(spec.name)

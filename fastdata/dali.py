"""NVIDIA DALI pipelines over packed datasets: decoding and resizing on the GPU.

``import fastdata.dali`` works without DALI; building a pipeline imports it
and, when it is missing, raises a FastDataError that says how to install it
(``pip install nvidia-dali-cuda130``, or ``pip install fastdata[dali]``).

    loader = fastdata.dali.DALILoader("train.tfrecord", batch_size=256, size=224,
                                      mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    for images, labels in loader:      # float32 [B, 3, 224, 224] and int64 [B], on the GPU
        ...

How each format is read (``reader="auto"``):

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
buffer of ``shuffle_buffer`` records, and it checks fastdata's CRC32s, which
DALI's readers do not). Pre-decoded (``raw``) datasets and datasets holding an
encoding DALI cannot decode (GIF) always use the external source: raw pixels
go in as HWC uint8 arrays with no decoding; GIFs are decoded by fastdata on the
CPU and handed to DALI as PPM, so the other records of the batch still decode
on the GPU.

Decoding is ``fn.decoders.image`` with ``device="mixed"`` (nvJPEG) on the GPU,
``"cpu"`` otherwise; then ``fn.resize`` (linear with antialiasing), an optional
centre crop, and ``fn.crop_mirror_normalize`` (layout, and normalisation to
float when ``mean``/``std`` are given). Without a GPU the same pipeline runs on
the CPU (``device_id=None``).

Sharding follows DALI's readers everywhere: with ``num_shards`` S, shard i of
an epoch's order holds records ``[i*N//S, (i+1)*N//S)``. Note that DALI's
readers move each pipeline to the next shard after every epoch (their
``stick_to_shard=False``); together the shards still cover every record once
per epoch.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.encodings import sniff_encoding
from fastdata.errors import FastDataError

#: The message raised when DALI is missing.
INSTALL_HINT = "NVIDIA DALI is not installed: pip install nvidia-dali-cuda130 (or fastdata[dali])"

#: Name of the DALI reader operator, for ``DALIGenericIterator(reader_name=...)``.
READER_NAME = "fastdata_reader"

#: Encodings DALI's image decoder reads (``fn.decoders.image``); GIF is not one.
DALI_ENCODINGS = frozenset({"jpeg", "png", "bmp", "webp", "tiff", "ppm", "pgm", "pbm",
                            "jpeg2000"})

#: Version tag of the webdataset index files written here (DALI's wds2idx format).
_WDS_INDEX_VERSION = "v1.2"
#: Component names in those index files (they need not match the member names).
_IMAGE_COMPONENT = "img"
_LABEL_COMPONENT = "cls"

DEVICES = ("auto", "gpu", "cpu")
READERS = ("auto", "dali", "external")
LAYOUTS = ("CHW", "HWC")


def _import_dali():
    """Import DALI, or raise the install hint."""
    try:
        import nvidia.dali  # noqa: F401  (raises ImportError when missing)
        from nvidia.dali import fn, types
    except ImportError as exc:
        raise FastDataError(INSTALL_HINT) from exc
    return nvidia.dali, fn, types


# -- options ------------------------------------------------------------------------


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


def _rank_and_world() -> tuple[int, int]:
    # Without torch imported, torch.distributed cannot be initialised: no import needed.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _cuda_devices() -> int:
    """CUDA devices DALI can use (0 without a GPU or driver)."""
    try:
        from nvidia.dali import backend

        return int(backend.GetCUDADeviceCount())
    except Exception:  # no driver, or an older DALI: ask torch instead
        try:
            import torch

            return torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:
            return 0


def _resolve_device(device: str, device_id: int | None) -> tuple[str, int | None]:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    if device == "cpu":
        return "cpu", None
    gpus = _cuda_devices()
    if device == "auto" and gpus == 0:
        return "cpu", None
    if gpus == 0:
        raise FastDataError("device='gpu' needs a CUDA GPU and none is available to DALI; "
                            "use device='cpu' (or 'auto') to run the pipeline on the CPU")
    if device_id is None:
        device_id = _current_cuda_device()
    if not 0 <= int(device_id) < gpus:
        raise ValueError(f"device_id {device_id} out of range: {gpus} CUDA device(s)")
    return "gpu", int(device_id)


def _current_cuda_device() -> int:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return int(os.environ.get("LOCAL_RANK", 0))


def _shard_bounds(count: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """[start, stop) of shard ``shard_id``: DALI's readers split the same way."""
    return count * shard_id // num_shards, count * (shard_id + 1) // num_shards


def _scale255(values: Sequence[float] | None, name: str) -> list[float] | None:
    """Per-channel values on the 0-255 scale (0-1 values are scaled, as
    fastdata's CUDAPrefetcher and torchvision's Normalize take them)."""
    if values is None:
        return None
    out = np.asarray(values, dtype=np.float64).reshape(-1).tolist()  # lists, tuples, arrays
    if not out:
        raise ValueError(f"{name} must hold one value per channel")
    if max(out) <= 1.0:
        out = [v * 255.0 for v in out]
    return out


def _hw(value, name: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        pair = (value, value)
    elif isinstance(value, Sequence) and len(value) == 2:
        pair = (int(value[0]), int(value[1]))
    else:
        raise ValueError(f"{name} must be an int or (height, width), not {value!r}")
    if pair[0] <= 0 or pair[1] <= 0:
        raise ValueError(f"{name} must be positive, not {value!r}")
    return pair


# -- index files for DALI's readers ---------------------------------------------------


def _cache_dir(index_dir: str | os.PathLike | None) -> str:
    if index_dir is not None:
        return os.fspath(index_dir)
    base = os.environ.get("FASTDATA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "fastdata")
    return os.path.join(base, "dali-index")


def _cached_index_path(shard: str, kind: str, index_dir: str | os.PathLike | None) -> str:
    """Where the generated index of ``shard`` lives: named after the shard's path,
    size and mtime, so a rewritten shard never meets a stale index."""
    st = os.stat(shard)
    tag = f"{os.path.realpath(shard)}\0{st.st_size}\0{st.st_mtime_ns}\0{kind}"
    digest = hashlib.sha256(tag.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    return os.path.join(_cache_dir(index_dir), f"{os.path.basename(shard)}.{digest}.{kind}.idx")


def _write_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _tfrecord_index_paths(reader, index_dir) -> list[str]:
    """The tfrecord2idx index of every shard: fastdata's ``<shard>.idx`` where it
    exists, else one generated from the reader's index (framed offset, size)."""
    from fastdata.formats.tfrecord.schema import SHARD_INDEX_SUFFIX

    index = reader._ensure_index()
    out = []
    for (first, count), path in zip(reader.shard_ranges(), reader.shard_paths):
        beside = path + SHARD_INDEX_SUFFIX
        if os.path.isfile(beside):
            out.append(beside)
            continue
        target = _cached_index_path(path, "tfrecord", index_dir)
        if not os.path.isfile(target):
            rows = index[first:first + count]
            _write_atomic(target, "".join(f"{o} {s}\n" for o, s in zip(
                rows["offset"].tolist(), rows["size"].tolist())))
        out.append(target)
    return out


def _webdataset_index_paths(reader, index_dir) -> tuple[list[str], int] | None:
    """DALI webdataset index files for every tar shard, and the longest ``.cls``
    member in bytes; None when a record has no ``.cls`` member (its label comes
    from ``.json``, which the DALI reader path does not parse)."""
    paths, digits = [], 1
    for shard, path in enumerate(reader.shard_paths):
        target = _cached_index_path(path, "wds", index_dir)
        if os.path.isfile(target):
            paths.append(target)
            digits = max(digits, _read_wds_digits(target))
            continue
        built = _build_wds_index(reader, shard, path)
        if built is None:
            return None
        text, width = built
        # The widest label goes beside the index (DALI's format has no room for
        # it), so a cached index needs no rescan; written first, the index last.
        _write_atomic(target + ".width", str(width))
        _write_atomic(target, text)
        paths.append(target)
        digits = max(digits, width)
    return paths, digits


def _read_wds_digits(index_path: str) -> int:
    try:
        with open(index_path + ".width", encoding="ascii") as f:
            return max(1, int(f.read().strip()))
    except (OSError, ValueError):
        return 20  # every int64 fits; only costs a few more pipeline operations


def _build_wds_index(reader, shard: int, path: str) -> tuple[str, int] | None:
    """(index text, widest .cls member) of one tar shard, or None without .cls members."""
    from fastdata.formats.tar.members import iter_members, split_key

    first, count = reader.shard_ranges()[shard]
    rows = reader._ensure_index()[first:first + count]
    wanted = {off: i for i, off in enumerate(rows["offset"].tolist())}
    image: list[Any] = [None] * count
    label: list[Any] = [None] * count
    group_key, group_record, group_cls = None, None, None

    def close_group() -> None:
        if group_record is not None:
            label[group_record] = group_cls

    for member in iter_members(path):
        parts = split_key(member.name)
        if parts is None:
            continue
        key, ext = parts
        if key != group_key:
            close_group()
            group_key, group_record, group_cls = key, None, None
        record = wanted.get(member.offset)
        if record is not None:
            image[record] = member
            group_record = record
        elif ext.lower() == _LABEL_COMPONENT:
            group_cls = member
    close_group()
    missing = [i for i in range(count) if image[i] is None]
    if missing:
        raise FastDataError(f"the dataset index points at no tar member for record "
                            f"{first + missing[0]}; re-pack the dataset", path=path)
    if any(c is None for c in label):
        return None
    names_ok = all(not any(ch.isspace() for ch in m.name) for m in (*image, *label))
    version = _WDS_INDEX_VERSION if names_ok else "v1.1"  # v1.2 lines carry names

    def component(ext: str, m) -> str:
        return f"{ext} {m.offset} {m.size} {m.name}" if names_ok else f"{ext} {m.offset} {m.size}"

    lines = [f"{version} {count}\n"]
    lines.extend(f"{component(_IMAGE_COMPONENT, i)} {component(_LABEL_COMPONENT, c)}\n"
                 for i, c in zip(image, label))
    return "".join(lines), max(c.size for c in label)


# -- the external source ---------------------------------------------------------------


class ExternalBatches:
    """A DALI external-source callable: one batch of (images, labels) per call.

    Stateless given its argument (DALI's ``BatchInfo``: epoch and iteration),
    so DALI can run it in parallel worker processes; picklable (the reader is
    opened lazily in the process that calls it).

    Args:
        path: the packed dataset.
        batch_size: records per batch (the last one of an epoch may be smaller).
        shard_id, num_shards: this pipeline's part of each epoch's order.
        shuffle: permute the whole dataset each epoch (seeded by ``seed`` and
            the epoch, so every shard sees the same permutation).
        seed: the shuffle seed.
        drop_last: leave out the last batch of a shard when it is partial.
        mode: "encoded" (payload bytes as 1-D uint8 arrays) or "raw" (HWC
            uint8 pixels).
        transcode: with "encoded", turn payloads that DALI cannot decode (GIF)
            into PPM (decoded by fastdata's decoders; PPM costs no compression
            and DALI reads it), so the batch stays one of encoded images.
        reader_options: passed to ``fastdata.open_reader``.
        reader: an already open reader of ``path`` to use in this process.
    """

    def __init__(self, path: str, *, batch_size: int, shard_id: int = 0, num_shards: int = 1,
                 shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                 mode: str = "encoded", transcode: bool = False,
                 reader_options: dict | None = None, reader=None) -> None:
        from fastdata.formats import open_reader

        self.path = path
        self.batch_size = int(batch_size)
        self.shard_id = int(shard_id)
        self.num_shards = int(num_shards)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.mode = mode
        self.transcode = bool(transcode)
        self.reader_options = dict(reader_options or {})
        # An open reader may be handed over: LMDB refuses a second open of one path.
        self._reader = reader if reader is not None else open_reader(path,
                                                                     **self.reader_options)
        self.count = len(self._reader)
        self._decode = None
        self._order: tuple[int, np.ndarray] | None = None

    @property
    def reader(self):
        if self._reader is None:
            from fastdata.formats import open_reader

            self._reader = open_reader(self.path, **self.reader_options)
        return self._reader

    def shard_size(self) -> int:
        start, stop = _shard_bounds(self.count, self.shard_id, self.num_shards)
        return stop - start

    def __len__(self) -> int:
        """Batches per epoch."""
        n = self.shard_size()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def indices(self, epoch: int) -> np.ndarray:
        """The record indices of this shard in epoch ``epoch``, in order."""
        if self._order is None or self._order[0] != epoch:
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.count)
            else:
                order = np.arange(self.count)
            start, stop = _shard_bounds(self.count, self.shard_id, self.num_shards)
            self._order = (epoch, order[start:stop])
        return self._order[1]

    def __call__(self, info) -> tuple[list[np.ndarray], np.ndarray]:
        iteration = getattr(info, "iteration", info)
        epoch = getattr(info, "epoch_idx", 0)
        if iteration >= len(self):
            raise StopIteration
        mine = self.indices(epoch)
        batch = mine[iteration * self.batch_size:(iteration + 1) * self.batch_size].tolist()
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

    def _dali_readable(self, payload) -> np.ndarray:
        if sniff_encoding(payload) in DALI_ENCODINGS:
            return np.frombuffer(payload, dtype=np.uint8)
        rgb = self._decoder()(payload)
        header = b"P6\n%d %d\n255\n" % (rgb.shape[1], rgb.shape[0])
        return np.frombuffer(header + np.ascontiguousarray(rgb).tobytes(), dtype=np.uint8)

    def _decoder(self):
        if self._decode is None:
            from fastdata.loaders.decode import DecoderChain

            # (datasets.raw_shape_of would import torch into DALI's worker processes)
            enc = self.reader.manifest.encoding or {}
            shape = enc.get("shape") if enc.get("storage") == "raw" else None
            self._decode = DecoderChain(raw_shape=shape)
        return self._decode

    def __getstate__(self):
        state = self.__dict__.copy()
        state.update(_reader=None, _decode=None, _order=None)
        return state


# -- the pipeline ------------------------------------------------------------------------


def _ascii_label(fn, types, data, width: int):
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


def _plan_and_build(
    path: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    batch_size: int,
    size: int | tuple[int, int] | None = None,
    device: str = "auto",
    device_id: int | None = None,
    num_threads: int = 2,
    shard_id: int | None = None,
    num_shards: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    layout: str = "CHW",
    crop: int | tuple[int, int] | None = None,
    drop_last: bool = False,
    reader: str = "auto",
    py_workers: int = 0,
    py_start_method: str | None = None,
    prefetch: int = 2,
    shuffle_buffer: int = 1024,
    index_dir: str | os.PathLike | None = None,
    reader_options: dict | None = None,
):
    _, fn, types = _import_dali()
    from nvidia.dali.pipeline import Pipeline

    from fastdata.formats import open_reader

    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if reader not in READERS:
        raise ValueError(f"reader must be one of {', '.join(READERS)}, not {reader!r}")
    if (mean is None) != (std is None):
        raise ValueError("give both mean and std, or neither")
    if py_workers < 0:
        raise ValueError(f"py_workers must be 0 or more, not {py_workers}")
    size_hw = None
    if size is not None and not isinstance(size, int):
        size_hw = _hw(size, "size")
    elif isinstance(size, int) and size <= 0:
        raise ValueError(f"size must be positive, not {size}")
    crop_hw = _hw(crop, "crop")
    mean255, std255 = _scale255(mean, "mean"), _scale255(std, "std")

    rank, world = _rank_and_world()
    shard_id = rank if shard_id is None else int(shard_id)
    num_shards = world if num_shards is None else int(num_shards)
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be in [0, num_shards), got {shard_id} of {num_shards}")
    dev, dev_id = _resolve_device(device, device_id)

    # Absolute: DALI's worker processes may not share this one's working directory.
    if isinstance(path, (list, tuple)):  # shard files written by another tool
        path = [os.path.abspath(os.fspath(p)) for p in path]
    else:
        path = os.path.abspath(os.fspath(path))
    src = open_reader(path, **(reader_options or {}))
    try:
        fmt = src.format_name
        count = len(src)
        if count < num_shards:
            raise FastDataError(f"a dataset of {count} records cannot be split into {num_shards} "
                                f"shards", path=path)
        enc = src.manifest.encoding or {}
        mode = "raw" if enc.get("storage") == "raw" else "encoded"
        transcode = mode == "encoded" and bool(set(enc.get("formats") or {}) - DALI_ENCODINGS)

        native = {"tfrecord": "tfrecord", "tar": "webdataset"}.get(fmt)
        wds = None
        if reader == "dali":
            if native is None:
                raise FastDataError(f"DALI has no reader for fastdata's {fmt} layout; use "
                                    f"reader='auto' or 'external'", path=path)
            if mode != "encoded" or transcode:
                what = "pre-decoded (raw)" if mode == "raw" else "GIF (or other non-DALI) encoded"
                raise FastDataError(f"DALI's {native} reader needs images DALI decodes, but this "
                                    f"dataset holds {what} records; use reader='auto'", path=path)
        use_native = (native is not None and mode == "encoded" and not transcode
                      and reader != "external")
        if use_native and native == "webdataset":
            wds = _webdataset_index_paths(src, index_dir)
            if wds is None:
                if reader == "dali":
                    raise FastDataError("some tar samples have no .cls label member; DALI's "
                                        "webdataset reader path needs one; use reader='auto'",
                                        path=path)
                use_native = False
        shard_len = _shard_bounds(count, shard_id, num_shards)
        shard_len = shard_len[1] - shard_len[0]
        batches = shard_len // batch_size if drop_last else math.ceil(shard_len / batch_size)
        if batches == 0:
            raise FastDataError(f"shard {shard_id} of {num_shards} holds {shard_len} records: no "
                                f"full batch of {batch_size} (drop_last=True)", path=path)

        if py_start_method is None:
            # Forking a process that has initialised CUDA is unsafe (and DALI refuses it).
            py_start_method = "spawn" if dev == "gpu" else "fork"
        pipe = Pipeline(batch_size=int(batch_size), num_threads=int(num_threads),
                        device_id=dev_id, seed=int(seed), prefetch_queue_depth=int(prefetch),
                        py_num_workers=max(1, int(py_workers)), py_start_method=py_start_method)
        decoder_device = "mixed" if dev == "gpu" else "cpu"
        with pipe:
            if use_native and native == "tfrecord":
                import nvidia.dali.tfrecord as tfrec

                keys = getattr(src, "feature_keys", {"image": "image/encoded",
                                                     "label": "image/class/label"})
                features = {keys["image"]: tfrec.FixedLenFeature((), tfrec.string, ""),
                            keys["label"]: tfrec.FixedLenFeature([1], tfrec.int64, -1)}
                out = fn.readers.tfrecord(
                    path=list(src.shard_paths), index_path=_tfrecord_index_paths(src, index_dir),
                    features=features, name=READER_NAME, shard_id=shard_id,
                    num_shards=num_shards, random_shuffle=bool(shuffle),
                    initial_fill=int(shuffle_buffer), pad_last_batch=True, seed=int(seed))
                encoded, labels = out[keys["image"]], fn.reshape(out[keys["label"]], shape=[])
            elif use_native:
                index_paths, width = wds
                encoded, cls = fn.readers.webdataset(
                    paths=list(src.shard_paths), index_paths=index_paths,
                    ext=[_IMAGE_COMPONENT, _LABEL_COMPONENT], missing_component_behavior="error",
                    name=READER_NAME, shard_id=shard_id, num_shards=num_shards,
                    random_shuffle=bool(shuffle), initial_fill=int(shuffle_buffer),
                    pad_last_batch=True, seed=int(seed))
                labels = _ascii_label(fn, types, cls, width)
            else:
                source = ExternalBatches(path, batch_size=batch_size, shard_id=shard_id,
                                         num_shards=num_shards, shuffle=shuffle, seed=seed,
                                         drop_last=drop_last, mode=mode, transcode=transcode,
                                         reader_options=reader_options, reader=src)
                parallel = py_workers > 0
                extra = {"prefetch_queue_depth": max(2, int(prefetch))} if parallel else {}
                encoded, labels = fn.external_source(
                    source=source, num_outputs=2, batch=True, batch_info=True,
                    parallel=parallel, dtype=[types.UINT8, types.INT64],
                    ndim=[1 if mode == "encoded" else 3, 0],
                    layout=["" if mode == "encoded" else "HWC", ""], **extra)
            if mode == "encoded":
                images = fn.decoders.image(encoded, device=decoder_device, output_type=types.RGB)
            else:
                images = encoded.gpu() if dev == "gpu" else encoded
            if size is not None:
                if size_hw is None:
                    images = fn.resize(images, resize_shorter=int(size))
                else:
                    images = fn.resize(images, resize_x=size_hw[1], resize_y=size_hw[0])
            if crop_hw is not None or mean255 is not None or layout != "HWC":
                cmn = {"dtype": types.FLOAT if mean255 is not None else types.UINT8,
                       "output_layout": layout}
                if crop_hw is not None:
                    cmn["crop"] = crop_hw
                if mean255 is not None:
                    cmn.update(mean=mean255, std=std255)
                images = fn.crop_mirror_normalize(images, **cmn)
            if dev == "gpu":
                labels = labels.gpu()
            pipe.set_outputs(images, labels)

        plan = PipelinePlan(path=path, format=fmt,
                            reader=native if use_native else "external", mode=mode,
                            transcode=transcode, device=dev, device_id=dev_id,
                            shard_id=shard_id, num_shards=num_shards, count=count,
                            shard_size=shard_len, batches=batches)
        return pipe, plan
    finally:
        # Handles reopen lazily where the reader is used again (the external source).
        src.close()


def build_pipeline(path: str | os.PathLike | Sequence[str | os.PathLike], *,
                   batch_size: int, **options: Any):
    """Build a DALI pipeline that yields ``(images, labels)`` batches of a packed dataset.

    Args:
        path: a packed dataset (any format), as ``fastdata.open_reader`` takes
            it: also a shard pattern or a list of shards from another tool.
        batch_size: samples per batch.
        size: resize to this: an int for the shorter side (aspect kept), or
            (height, width). None keeps each image's size.
        device: "gpu" (decode with nvJPEG, process on the GPU; needs CUDA),
            "cpu" (a CPU-only pipeline, ``device_id=None``) or "auto" (GPU when
            DALI sees one).
        device_id: the CUDA device for "gpu"; None takes torch's current one.
        num_threads: DALI's CPU threads.
        shard_id, num_shards: this pipeline's part of the data; by default the
            torch.distributed rank and world size when it is initialised, else 0/1.
        shuffle: shuffle each epoch (the external source: a permutation of the
            whole dataset; DALI's tfrecord/webdataset readers: within a buffer
            of ``shuffle_buffer`` records).
        seed: the random seed (the same on every rank, so shards stay disjoint).
        mean, std: per-channel values (0-1 or 0-255 scale); with them the
            images are normalised on the pipeline's device to float32,
            otherwise they stay uint8.
        layout: "CHW" (default) or "HWC".
        crop: centre crop (int or (h, w)) after the resize.
        drop_last: leave out each epoch's last partial batch. The external
            source ends its epochs itself (the last batch is smaller, or
            dropped); DALI's readers always fill the last batch by repeating
            the shard's last record (``pad_last_batch``), which DALILoader (or
            ``DALIGenericIterator(reader_name=READER_NAME)``) trims or drops.
        reader: "auto", "dali" (DALI's own reader; tfrecord and tar only) or
            "external" (fastdata's reader in an external source, any format).
        py_workers: worker processes running the external source in parallel
            (DALI's parallel external source); 0 reads in the pipeline's thread.
        py_start_method: "fork" or "spawn" for those workers; None takes
            "fork" on the CPU and "spawn" on the GPU (a process that has
            initialised CUDA must not fork). Under "spawn" the script that
            builds the pipeline needs an ``if __name__ == "__main__":`` guard.
        prefetch: batches DALI prepares ahead.
        shuffle_buffer: the shuffle buffer of DALI's readers.
        index_dir: where generated DALI index files go (tar shards, and
            TFRecord shards without ``.idx``); default ``$FASTDATA_CACHE_DIR``
            or ``~/.cache/fastdata``, under ``dali-index/``.
        reader_options: passed to ``fastdata.open_reader`` (for example
            ``{"verify": False}``).

    Returns:
        The ``nvidia.dali.Pipeline``, outputs ``(images, labels)``: images
        uint8 (or float32 when normalised) in ``layout``, labels int64 scalars.
        Its DALI reader, when it has one, is named :data:`READER_NAME`.

    Raises:
        FastDataError: DALI is not installed, no GPU for device="gpu", or the
            dataset cannot be read this way.
    """
    return _plan_and_build(path, batch_size=batch_size, **options)[0]


class DALILoader:
    """Iterates ``(images, labels)`` torch tensors from a DALI pipeline over a dataset.

    Takes :func:`build_pipeline`'s arguments. Images are ``[B, C, H, W]``
    (``layout="CHW"``) uint8, or float32 with ``mean``/``std``; labels int64
    ``[B]``; both on the GPU for device "gpu", else on the CPU. Each epoch
    holds exactly this shard's records: the last batch is partial unless
    ``drop_last=True``.

    The images of a batch must share one size: give ``size`` as (h, w), or a
    ``crop``, unless the dataset is pre-decoded at a fixed shape.

    Attributes:
        pipeline: the DALI pipeline.
        plan: how it reads the dataset (:class:`PipelinePlan`).
    """

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike], *,
                 batch_size: int, drop_last: bool = False, **options: Any) -> None:
        self.pipeline, self.plan = _plan_and_build(path, batch_size=batch_size,
                                                   drop_last=drop_last, **options)
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        if self.plan.reader == "external":
            # The source itself ends each epoch (and drops a partial batch if asked).
            options = {"last_batch_policy": LastBatchPolicy.PARTIAL}
        else:
            options = {"reader_name": READER_NAME, "last_batch_policy":
                       LastBatchPolicy.DROP if drop_last else LastBatchPolicy.PARTIAL}
        self._manifest = None
        # The iterator runs the first batches as it is made.
        with self._explained():
            self._iter = DALIGenericIterator(self.pipeline, ["images", "labels"],
                                             auto_reset=True, **options)

    def __len__(self) -> int:
        """Batches per epoch for this shard."""
        if self.plan.reader == "external":
            return self.plan.batches
        return len(self._iter)

    def __iter__(self):
        """One epoch of ``(images, labels)``. Left early, the next loop carries on
        with the rest of that epoch (DALI's iterators cannot restart one midway)."""
        with self._explained():
            for out in self._iter:
                batch = out[0]
                yield batch["images"], batch["labels"].view(-1)

    @contextlib.contextmanager
    def _explained(self):
        try:
            yield
        except RuntimeError as exc:
            if "IsDenseTensor" not in str(exc):
                raise
            raise FastDataError(
                "the images of a batch differ in size, so they cannot be stacked into one "
                "tensor: give size=(height, width), or a crop (an int size keeps each "
                "image's aspect ratio); build_pipeline gives ragged batches",
                path=self.plan.path if isinstance(self.plan.path, str) else None) from exc

    @property
    def manifest(self):
        if self._manifest is None:
            from fastdata.formats import read_manifest

            self._manifest = read_manifest(self.plan.path)
        return self._manifest

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return self.manifest.class_to_idx

    def __repr__(self) -> str:
        p = self.plan
        return (f"DALILoader({p.path!r}, format={p.format}, reader={p.reader}, mode={p.mode}, "
                f"device={p.device}, shard {p.shard_id}/{p.num_shards}, batches={len(self)})")

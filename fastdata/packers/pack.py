"""Packing an image folder into a container: the one entry point every format uses."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from fastdata import __version__
from fastdata.errors import BadImageError, FastDataError, SourceError, UnknownFormatError
from fastdata.formats import check_local, format_for_output, sharded_formats
from fastdata.machine import usable_cores
from fastdata.packers.checks import check_image
from fastdata.packers.preprocess import Preprocess
from fastdata.packers.source import ImageFolderSource, Source, SourceEntry
from fastdata.progress import progress_bar
from fastdata.records import Manifest, Record


@dataclass(frozen=True)
class SkippedFile:
    """A source image left out of the pack, and why."""

    key: str
    reason: str


@dataclass(frozen=True)
class PackSummary:
    """What a pack did. ``to_dict()`` is what ``fastdata pack --json`` prints."""

    output: str
    format: str
    records: int
    classes: int
    bytes_in: int
    bytes_out: int
    seconds: float
    skipped: list[SkippedFile] = field(default_factory=list)
    ignored: int = 0
    warnings: list[str] = field(default_factory=list)
    report: str | None = None
    encodings: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["images_per_second"] = round(self.rate, 1)
        return data


@dataclass(frozen=True)
class PackOptions:
    """Options of a pack, recorded in the manifest.

    Attributes:
        format: container format name, or None to choose from the output extension.
        overwrite: replace an existing output.
        strict: stop at the first bad image instead of skipping it.
        verify_decode: decode every image fully at pack time.
        shard_size: for sharded formats (tar, tfrecord): records per shard ("10000")
            or bytes per shard ("256MB"); None writes one file.
        preprocess: pack-time resize/crop/re-encode (default: store original bytes).
        workers: processes reading, checking and preprocessing images; None uses
            the usable cores. The output is byte-identical for any value.
        writer_options: further format options passed to the writer.
    """

    format: str | None = None
    overwrite: bool = False
    strict: bool = False
    verify_decode: bool = False
    shard_size: str | int | None = None
    preprocess: Preprocess = field(default_factory=Preprocess)
    workers: int | None = None
    writer_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Prepared:
    """One source image after reading, checking and preprocessing (picklable)."""

    key: str
    label: int
    source_bytes: int
    payload: bytes
    encoding: str
    width: int
    height: int


def _prepare(job: tuple[SourceEntry, bool, Preprocess]) -> _Prepared | SkippedFile:
    """Read, check and preprocess one image; runs in pack worker processes."""
    entry, verify_decode, pre = job
    try:
        data = _read(entry)
        info = check_image(data, key=entry.key, verify_decode=verify_decode)
        if pre.identity:
            return _Prepared(entry.key, entry.label, len(data), data, info.encoding,
                             info.width, info.height)
        try:
            payload, encoding, width, height = pre.apply(data, info.encoding)
        except Exception as exc:  # any decoder/encoder failure makes this image bad
            raise BadImageError(f"cannot be decoded for preprocessing: {exc}",
                                key=entry.key) from None
        return _Prepared(entry.key, entry.label, len(data), payload, encoding, width, height)
    except BadImageError as exc:
        return SkippedFile(entry.key, exc.message)


def pack(
    source: str | os.PathLike | Source,
    output: str | os.PathLike,
    *,
    options: PackOptions | None = None,
    progress: bool | None = None,
    on_event: Callable[[str], None] | None = None,
) -> PackSummary:
    """Pack ``source`` into ``output``.

    Args:
        source: a folder with one sub-folder per class (read as an
            :class:`ImageFolderSource`), or any :class:`Source`.
        output: the dataset to write; its extension selects the format unless
            ``options.format`` is set.
        options: pack options (defaults: keep bytes, skip bad images).
        progress: show a progress bar (None: only on a terminal).
        on_event: called with each warning as it happens (the CLI prints them).

    Returns:
        The summary. Skipped files and warnings are also written to
        ``OUTPUT.report.json`` when there are any.

    Raises:
        SourceError: the source is missing, has no classes or no usable images.
        BadImageError: a bad image under ``strict``.
        OutputExistsError: the output exists and ``overwrite`` is False.
        UnknownFormatError: the format cannot be chosen.
        FastDataError: impossible options (for example raw storage of images of
            different sizes).
    """
    options = options or PackOptions()
    pre = options.preprocess
    started = time.perf_counter()
    check_local(output)
    if not isinstance(source, Source):
        check_local(source)
    output = os.path.abspath(os.fspath(output))
    spec = format_for_output(output, options.format)
    writer_cls = spec.load_writer()
    if isinstance(source, Source):
        src: Source | None = source
        source_root = src.describe().get("root")
    else:
        src = None  # scanned once the writer has accepted the output
        source_root = os.path.abspath(os.fspath(source))
    if source_root and os.path.commonpath([output, source_root]) == source_root:
        raise SourceError("the output must not be inside the source folder", path=output)
    workers = options.workers if options.workers is not None else usable_cores()
    if workers < 1:
        raise FastDataError(f"workers={workers} is not allowed: give at least 1")

    warnings_: list[str] = []

    def warn(msg: str) -> None:
        warnings_.append(msg)
        if on_event:
            on_event(msg)

    skipped: list[SkippedFile] = []
    encodings: Counter[str] = Counter()
    fingerprint = hashlib.sha256()
    bytes_in = 0
    raw_shape: tuple[int, int, int] | None = None

    writer_options = dict(options.writer_options)
    if options.shard_size not in (None, ""):
        if not spec.sharded:
            raise UnknownFormatError(
                f"shard_size= applies to sharded formats ({', '.join(sharded_formats())}), "
                f"not {spec.name}", path=output)
        writer_options["shard_size"] = options.shard_size

    # The writer first: it refuses an existing output before any scanning.
    with _sigterm_as_interrupt(), writer_cls(output, overwrite=options.overwrite,
                                              **writer_options) as writer:
        if src is None:
            src = ImageFolderSource(source_root)
        for msg in src.warnings():
            warn(msg)
        described = src.describe()
        empty = {i for i in range(len(src.classes))} - {e.label for e in src}
        class_counts = [0] * len(src.classes)
        workers = min(workers, max(1, len(src) // 16))
        jobs = ((entry, options.verify_decode, pre) for entry in src)
        # The pool starts before the progress bar's thread, so nothing of ours
        # is mid-call in another thread when it forks.
        pool = _start_pool(workers)
        results = pool.imap(_prepare, jobs, chunksize=8) if pool else map(_prepare, jobs)
        bar = progress_bar(len(src), f"pack {os.path.basename(output)}", enabled=progress)
        try:
            for item in results:
                bar.update(1)
                if isinstance(item, SkippedFile):
                    if options.strict:
                        raise BadImageError(
                            item.reason + " (strict=True stops at the first bad image)",
                            path=_entry_path(source_root, item.key), key=item.key)
                    skipped.append(item)
                    continue
                if item.encoding == "raw":
                    shape = (item.height, item.width, 3)
                    if raw_shape is None:
                        raw_shape = shape
                    elif shape != raw_shape:
                        raise FastDataError(
                            f"raw storage needs one image size, but this image is "
                            f"{item.width}x{item.height} and earlier ones "
                            f"{raw_shape[1]}x{raw_shape[0]}; pass resize=(h, w), or resize=N "
                            f"with center_crop=True", key=item.key)
                fingerprint.update(f"{item.key}\t{item.label}\t{item.source_bytes}\n".encode())
                writer.write(Record(writer.count, item.key, item.label, item.payload,
                                    item.encoding, item.width, item.height))
                class_counts[item.label] += 1
                encodings[item.encoding] += 1
                bytes_in += item.source_bytes
        finally:
            bar.close()
            if pool is not None:
                pool.terminate()
                pool.join()
        if writer.count == 0:
            raise SourceError(
                f"none of the {len(src)} image files could be read ({len(skipped)} skipped, "
                f"first: {skipped[0].key}: {skipped[0].reason})" if skipped
                else "no images to pack", path=source_root)
        for label, name in enumerate(src.classes):
            if class_counts[label] == 0 and label not in empty:
                warn(f"every image of class {name!r} was skipped; its label {label} is kept")
        storage = "keep" if pre.identity else pre.encoding
        manifest = Manifest(
            format=spec.name,
            count=writer.count,
            classes=list(src.classes),
            class_counts=class_counts,
            encoding={"storage": storage, "formats": dict(sorted(encodings.items())),
                      "shape": list(raw_shape) if raw_shape else None,
                      "dtype": "uint8" if raw_shape else None,
                      "layout": "HWC" if raw_shape else None},
            bytes={"source": bytes_in, "payload": writer.payload_bytes},
            checksums={},
            shards=[],
            source={"root": described.get("root"), "fingerprint": fingerprint.hexdigest(),
                    "files": described.get("files", len(src)), "skipped": len(skipped),
                    "ignored": described.get("ignored", 0),
                    **{k: v for k, v in described.items()
                       if k not in ("root", "files", "ignored")}},
            pack_options={"format": spec.name, "strict": options.strict,
                          "verify_decode": options.verify_decode,
                          "preprocess": pre.to_dict(),
                          **{k: v for k, v in writer_options.items()}},
            created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            fastdata_version=__version__,
        )
        manifest = writer.finish(manifest)

    output = getattr(writer, "output_path", output)
    report = None
    if skipped or warnings_:
        report = _write_report(output, skipped, warnings_)
    else:
        _remove_stale_report(output)
    return PackSummary(
        output=output,
        format=spec.name,
        records=manifest.count,
        classes=len(manifest.classes),
        bytes_in=bytes_in,
        bytes_out=int(manifest.bytes.get("on_disk", 0)),
        seconds=time.perf_counter() - started,
        skipped=skipped,
        ignored=int(described.get("ignored", 0)),
        warnings=warnings_,
        report=report,
        encodings=dict(manifest.encoding["formats"]),
    )


def _start_pool(workers: int):
    """A process pool for ``workers`` > 1, else None (work runs inline)."""
    if workers <= 1:
        return None
    import multiprocessing as mp

    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    return mp.get_context(method).Pool(workers, initializer=_worker_init)


def _worker_init() -> None:
    # Ctrl-C goes to the whole process group: let the parent alone handle it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import cv2

        cv2.setNumThreads(1)  # one process per core already
    except ImportError:
        pass


def _entry_path(root: str | None, key: str) -> str:
    return os.path.join(root, key) if root else key


def _read(entry: SourceEntry) -> bytes:
    if entry.data is not None:
        return entry.data
    try:
        with open(entry.path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise BadImageError(f"cannot read file: {exc.strerror or exc}", key=entry.key) from None


def _report_path(output: str) -> str:
    base = output[: -len(".fastdata.json")] if output.endswith(".fastdata.json") else output
    return f"{base}.report.json"


def _remove_stale_report(output: str) -> None:
    """A report from an earlier pack of the same output would describe other data."""
    try:
        os.remove(_report_path(output))
    except FileNotFoundError:
        pass


def _write_report(output: str, skipped: list[SkippedFile], warnings_: list[str]) -> str:
    path = _report_path(output)
    data = {"output": output, "skipped": [asdict(s) for s in skipped], "warnings": warnings_}
    tmp = f"{path}.partial"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)
    return path


class _sigterm_as_interrupt:
    """Turn SIGTERM into KeyboardInterrupt while packing, so ``kill`` cleans up
    the partial output just like Ctrl-C does (main thread only)."""

    def __enter__(self):
        self._old = None
        try:
            self._old = signal.signal(signal.SIGTERM, self._handler)
        except ValueError:  # not the main thread: leave signals alone
            self._old = None
        return self

    @staticmethod
    def _handler(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False

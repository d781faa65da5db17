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
from fastdata.errors import BadImageError, OutputExistsError, SourceError
from fastdata.formats import format_for_output
from fastdata.packers.checks import check_image
from fastdata.packers.source import ImageFolderSource, SourceEntry
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
        writer_options: format options passed to the writer (for example shard size).
    """

    format: str | None = None
    overwrite: bool = False
    strict: bool = False
    verify_decode: bool = False
    writer_options: dict[str, Any] = field(default_factory=dict)


def pack(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    options: PackOptions | None = None,
    progress: bool | None = None,
    on_event: Callable[[str], None] | None = None,
) -> PackSummary:
    """Pack the ImageFolder tree at ``source`` into ``output``.

    Args:
        source: a folder with one sub-folder per class.
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
    """
    options = options or PackOptions()
    started = time.perf_counter()
    output = os.path.abspath(os.fspath(output))
    spec = format_for_output(output, options.format)
    writer_cls = spec.load_writer()
    if os.path.lexists(output) and not options.overwrite:
        raise OutputExistsError("output already exists; pass --overwrite to replace it",
                                path=output)
    src = ImageFolderSource(source)
    if os.path.commonpath([output, src.root]) == src.root:
        raise SourceError("the output must not be inside the source folder", path=output)

    warnings_: list[str] = []

    def warn(msg: str) -> None:
        warnings_.append(msg)
        if on_event:
            on_event(msg)

    for name in src.empty_classes:
        warn(f"class folder {name!r} has no images; its label {src.class_to_idx[name]} is kept")

    skipped: list[SkippedFile] = []
    class_counts = [0] * len(src.classes)
    encodings: Counter[str] = Counter()
    fingerprint = hashlib.sha256()
    bytes_in = 0

    with _sigterm_as_interrupt(), writer_cls(output, overwrite=options.overwrite,
                                              **options.writer_options) as writer:
        bar = progress_bar(len(src), f"pack {os.path.basename(output)}", enabled=progress)
        try:
            for entry in src:
                bar.update(1)
                try:
                    data = _read(entry)
                    info = check_image(data, key=entry.key, verify_decode=options.verify_decode)
                except BadImageError as exc:
                    if options.strict:
                        raise BadImageError(exc.message + " (--strict stops at the first bad image)",
                                            path=entry.path, key=entry.key) from None
                    skipped.append(SkippedFile(entry.key, exc.message))
                    continue
                fingerprint.update(f"{entry.key}\t{entry.label}\t{len(data)}\n".encode())
                writer.write(Record(writer.count, entry.key, entry.label, data, info.encoding))
                class_counts[entry.label] += 1
                encodings[info.encoding] += 1
                bytes_in += len(data)
        finally:
            bar.close()
        if writer.count == 0:
            raise SourceError(
                f"none of the {len(src)} image files could be read ({len(skipped)} skipped, "
                f"first: {skipped[0].key}: {skipped[0].reason})" if skipped
                else "no images to pack", path=src.root)
        for label, name in enumerate(src.classes):
            if class_counts[label] == 0 and name not in src.empty_classes:
                warn(f"every image of class {name!r} was skipped; its label {label} is kept")
        manifest = Manifest(
            format=spec.name,
            count=writer.count,
            classes=list(src.classes),
            class_counts=class_counts,
            encoding={"storage": "keep", "formats": dict(sorted(encodings.items())), "shape": None},
            bytes={"source": bytes_in, "payload": writer.payload_bytes},
            checksums={},
            shards=[],
            source={"root": src.root, "fingerprint": fingerprint.hexdigest(),
                    "files": len(src), "skipped": len(skipped), "ignored": len(src.ignored)},
            pack_options={"format": spec.name, "strict": options.strict,
                          "verify_decode": options.verify_decode,
                          **{k: v for k, v in options.writer_options.items()}},
            created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            fastdata_version=__version__,
        )
        manifest = writer.finish(manifest)

    report = None
    if skipped or warnings_:
        report = _write_report(output, skipped, warnings_)
    return PackSummary(
        output=output,
        format=spec.name,
        records=manifest.count,
        classes=len(manifest.classes),
        bytes_in=bytes_in,
        bytes_out=_disk_usage(output),
        seconds=time.perf_counter() - started,
        skipped=skipped,
        ignored=len(src.ignored),
        warnings=warnings_,
        report=report,
        encodings=dict(manifest.encoding["formats"]),
    )


def _read(entry: SourceEntry) -> bytes:
    try:
        with open(entry.path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise BadImageError(f"cannot read file: {exc.strerror or exc}", key=entry.key) from None


def _write_report(output: str, skipped: list[SkippedFile], warnings_: list[str]) -> str:
    path = f"{output}.report.json"
    data = {"output": output, "skipped": [asdict(s) for s in skipped], "warnings": warnings_}
    tmp = f"{path}.partial"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)
    return path


def _disk_usage(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


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

"""What a pack reports: the summary it returns and the report file of skipped
images, warnings and records stored under another name than their key."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from fastdata.formats import MANIFEST_SUFFIX
from fastdata.packers.prepare import SkippedFile
from fastdata.records import RenamedKey
from fastdata.storage.partial import replace_file


@dataclass(frozen=True)
class ResumeCounts:
    """What a resumed pack (``--resume``) took from the interrupted one and what
    it packed now. A piece of the interrupted pack that is not whole in its
    partial output counts as packed now."""

    kept_pieces: int
    kept_records: int
    packed_pieces: int
    packed_records: int


@dataclass(frozen=True)
class UploadFigures:
    """What a pack to a URL's upload did: ``bytes`` sent in ``seconds`` of
    uploading (``mb_s``), ``parts`` requests, the most parts at once it
    reached (``parts_at_once``, found by measuring), and one connection's
    rate when a single-part upload timed it (``connection_mb_s``)."""

    bytes: int
    seconds: float
    parts: int
    parts_at_once: int
    mb_s: float | None
    connection_mb_s: float | None


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
    #: Files ignored for their extension, per extension (no dot): {"gif": 1}.
    ignored_extensions: dict[str, int] = field(default_factory=dict)
    #: Records the format stores under another name (tar member keys).
    renamed: list[RenamedKey] = field(default_factory=list)
    #: What the pack put in place: the output file or folder, or for sharded
    #: formats every shard (with its side files), the index, keys and manifest.
    files: list[str] = field(default_factory=list)
    #: For a resumed pack: what it took from the interrupted one and what it
    #: packed now; None for a pack that resumed nothing.
    resumed: ResumeCounts | None = None
    #: For a pack to a URL: what the upload did (see :class:`UploadFigures`).
    upload: UploadFigures | None = None

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["images_per_second"] = round(self.rate, 1)
        return data


def report_path(output: str) -> str:
    """``OUTPUT.report.json``; for a sharded dataset, named by its manifest
    ``NAME.fastdata.json``, ``NAME.report.json`` (``out.tar.report.json``)."""
    base = output[: -len(MANIFEST_SUFFIX)] if output.endswith(MANIFEST_SUFFIX) else output
    return f"{base}.report.json"


def remove_stale_report(output: str) -> None:
    """A report from an earlier pack of the same output would describe other data."""
    try:
        os.remove(report_path(output))
    except FileNotFoundError:
        pass


def write_report(output: str, skipped: list[SkippedFile], warnings_: list[str],
                 renamed: list[RenamedKey]) -> str:
    """``OUTPUT.report.json``: every skipped file with its reason, the warnings, and
    every record stored under another name (``key``, ``stored_as``, ``file``, ``reason``).
    The report travels with the dataset: it names the output by its name, not by
    the packing machine's folders."""
    path = report_path(output)
    data = {"output": os.path.basename(output), "skipped": [asdict(s) for s in skipped],
            "warnings": warnings_,
            "renamed": [asdict(r) for r in renamed]}
    replace_file(path, json.dumps(data, indent=2, ensure_ascii=False))
    return path

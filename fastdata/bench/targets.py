"""What to measure: the rows of a benchmark (the folder baseline and packed datasets)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fastdata.formats.remote_files import absolute, is_remote
from fastdata.bench.measure import error_text
from fastdata.bench.options import BASELINE_NAME, EVAL, RAW_LABEL, Variant
from fastdata.errors import SourceError, UnknownFormatError

if TYPE_CHECKING:
    from fastdata.packers.source import ImageFolderSource, Source


@dataclass(frozen=True)
class Target:
    """One row of the benchmark: a folder or a packed dataset.

    Attributes:
        name: row name ("folder (PIL)", "lmdb", "lmdb resize256", ...).
        kind: "folder" (the baseline) or "packed".
        format: "folder" or a registered format name.
        variant: "keep", "resizeN", "raw", or "existing" for a dataset given as is.
        path: the folder or dataset.
        count: samples per epoch.
        payload_bytes: stored bytes read per epoch.
        size_bytes: size on disk of the whole dataset (None for a folder).
        pack_seconds: how long packing took (None when not packed here).
        samples: (path, label) pairs of a folder target.
        indices: the records used, when ``limit`` selects part of a dataset.
        error: why this row cannot be measured (packing or opening failed).
        pipeline: "eval" (decode, resize to S x S) or a training pipeline
            ("train unfused", "train fused": see ``fastdata.bench.train``).
        base: the name of the dataset's evaluation row ("" for an eval row).
    """

    name: str
    kind: str
    format: str
    variant: str
    path: str | None
    count: int = 0
    payload_bytes: int = 0
    size_bytes: int | None = None
    pack_seconds: float | None = None
    samples: tuple[tuple[str, int], ...] = ()
    indices: tuple[int, ...] | None = None
    error: str | None = None
    pipeline: str = EVAL
    base: str = ""

    @property
    def label(self) -> str:
        """What is stored, in words."""
        if self.kind == "folder":
            return "image files, PIL decode + resize per sample"
        if self.variant == "raw" or self.name.endswith(RAW_LABEL):
            return RAW_LABEL
        if self.variant.startswith("resize"):
            return f"re-encoded at pack time, shorter side {self.variant[6:]}"
        return "original bytes"


def _refused(path: str | os.PathLike, why: str) -> SourceError:
    """The error for a bench target that is not something bench can measure."""
    from fastdata.formats.registry import known_extensions

    return SourceError(
        f"{why}; fastdata bench measures image folders (one sub-folder of images per class) "
        f"and packed datasets ({', '.join(known_extensions())} or PREFIX.fastdata.json)",
        path=path)


def select_indices(n: int, limit: int | None, seed: int) -> list[int] | None:
    """A seeded random selection of ``limit`` of ``n`` indices, sorted; None for all."""
    if limit is None or limit >= n:
        return None
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(n, size=limit, replace=False))


def _folder_rows(root: str | os.PathLike, *, limit: int | None, seed: int,
                 name: str) -> tuple[Target, ImageFolderSource]:
    """The baseline target over an image folder, and the source it reads (for packing)."""
    from fastdata.packers.source import ImageFolderSource

    src = ImageFolderSource(root)
    chosen = select_indices(len(src), limit, seed)
    if chosen is not None:
        src = src.subset(chosen)
    entries = list(src.entries)
    size = sum(os.path.getsize(e.path) for e in entries)
    target = Target(name=name, kind="folder", format="folder", variant="keep", path=src.root,
                    count=len(entries), payload_bytes=size,
                    samples=tuple((e.path, e.label) for e in entries),
                    indices=tuple(chosen) if chosen is not None else None)
    return target, src


def folder_target(root: str | os.PathLike, *, limit: int | None = None, seed: int = 0,
                  name: str = BASELINE_NAME) -> Target:
    """The baseline row over an image folder (a seeded selection under ``limit``).

    Raises:
        SourceError: ``root`` is not an image folder.
    """
    return _folder_rows(root, limit=limit, seed=seed, name=name)[0]


def pack_targets(
    source: str | os.PathLike,
    work_dir: str | os.PathLike,
    *,
    formats: Sequence[str],
    variants: Sequence[Variant],
    limit: int | None = None,
    seed: int = 0,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Target]:
    """Pack ``source`` into every format and variant; the baseline row first.

    Under ``limit`` every format packs exactly the samples the baseline reads.
    A format whose pack fails gives a row that carries the error instead of
    stopping the benchmark.

    Raises:
        SourceError: ``source`` is not an image folder; the message says what
            bench measures.
    """
    from fastdata.formats import get_format

    try:
        baseline, pack_source = _folder_rows(source, limit=limit, seed=seed,
                                             name=BASELINE_NAME)
    except SourceError as exc:
        raise _refused(source, f"not an image folder ({exc.message})") from None
    work_dir = os.path.abspath(os.fspath(work_dir))
    os.makedirs(work_dir, exist_ok=True)
    targets = [baseline]
    for variant in variants:
        for fmt in formats:
            spec = get_format(fmt)
            out = os.path.join(work_dir, f"{spec.name}-{variant.name}{spec.extensions[0]}")
            targets.append(_pack_one(pack_source, out, spec.name, variant,
                                     progress=progress, log=log))
    return targets


def _pack_one(source: Source, out: str, fmt: str, variant: Variant, *, progress: bool | None,
              log: Callable[[str], None] | None) -> Target:
    """Pack ``source`` into ``out`` as one row; a failure is the row's error."""
    from fastdata.dataset.resolve import read_manifest
    from fastdata.packers.pack import PackOptions, pack

    name = fmt + variant.suffix
    try:
        summary = pack(source, out, progress=progress,
                       options=PackOptions(format=fmt, overwrite=True,
                                           preprocess=variant.preprocess))
        manifest = read_manifest(summary.output)
    except Exception as exc:  # a broken format must not stop the others
        reason = f"pack failed: {error_text(exc)}"
        if log:
            log(f"{name}: {reason}")
        return Target(name=name, kind="packed", format=fmt, variant=variant.name, path=out,
                      error=reason)
    if log:
        log(f"packed {name}: {manifest.count} records in {summary.seconds:.1f} s, "
            f"{summary.bytes_out / 1e6:.1f} MB on disk")
    return Target(name=name, kind="packed", format=fmt, variant=variant.name,
                  path=summary.output, count=manifest.count,
                  payload_bytes=int(manifest.bytes.get("payload", 0)),
                  size_bytes=int(manifest.bytes.get("on_disk", summary.bytes_out)),
                  pack_seconds=summary.seconds)


def existing_target(path: str | os.PathLike, *, limit: int | None = None,
                    seed: int = 0) -> Target:
    """A row for an existing packed dataset, or (as the baseline) an image folder.

    A dataset that cannot be opened (damaged, half-written) gives a row that
    carries the error, so that the other rows are still measured.

    Raises:
        SourceError: ``path`` does not exist, or is neither a packed dataset
            nor an image folder; the message says what bench measures.
    """
    from fastdata.formats import detect_format
    from fastdata.dataset.resolve import read_manifest
    from fastdata.mixture_file import is_mixture_file

    path = os.fspath(path)
    if is_mixture_file(path):
        return mixture_target(path, limit=limit, seed=seed)
    base = os.path.basename(path.rstrip("/\\")) or path
    base = base.removesuffix(".fastdata.json")  # a sharded dataset named by its manifest
    if is_remote(path):  # beside the same dataset on local disk, say which is which
        base = f"{path.split('://', 1)[0]}:{base}"
    try:
        spec = detect_format(path)
    except UnknownFormatError:
        if not os.path.lexists(path):
            raise _refused(path, "no such file or folder") from None
        if not os.path.isdir(path):
            raise _refused(path, "neither a packed dataset nor an image folder") from None
        try:
            return folder_target(path, limit=limit, seed=seed, name=f"{BASELINE_NAME} {base}")
        except SourceError as exc:
            raise _refused(path, f"neither a packed dataset nor an image folder "
                                 f"({exc.message})") from None
    try:
        manifest = read_manifest(path)
    except Exception as exc:  # a damaged or half-written dataset is a failed row
        # Named by its extension only and nothing is there (a shard pattern is
        # not a file itself: its failure is a row like any damaged dataset's).
        if not is_remote(path) and not os.path.lexists(path) and \
                not any(c in base for c in "%{"):
            raise _refused(path, "no such file or folder") from None
        return Target(name=f"{spec.name} {base}", kind="packed", format=spec.name,
                      variant="existing", path=path, error=error_text(exc))
    raw = (manifest.encoding or {}).get("storage") == "raw"
    name = f"{spec.name} {base}" + (" " + RAW_LABEL if raw else "")
    chosen = select_indices(manifest.count, limit, seed)
    count = manifest.count if chosen is None else len(chosen)
    payload = int(manifest.bytes.get("payload", 0))
    if chosen is not None and manifest.count:
        payload = round(payload * count / manifest.count)  # proportional estimate
    return Target(name=name, kind="packed", format=spec.name,
                  variant="raw" if raw else "existing", path=absolute(path),
                  count=count, payload_bytes=payload,
                  size_bytes=int(manifest.bytes.get("on_disk", 0)) or None,
                  indices=tuple(chosen) if chosen is not None else None)


def mixture_target(path: str, *, limit: int | None = None, seed: int = 0) -> Target:
    """A row for a mixture file: one epoch of the mixture, its stored bytes
    estimated from each source's mean record size and its share."""
    from fastdata.dataset.mixture_summary import mixture_summary
    from fastdata.dataset.resolve import read_manifest

    base = os.path.basename(path)
    try:
        summary = mixture_summary(path)
        payload = 0
        for s in summary["sources"]:
            m = read_manifest(s["path"])
            payload += int(m.bytes.get("payload", 0)) * s["per_epoch"] / max(1, m.count)
    except Exception as exc:  # a broken mixture is a failed row, as a damaged dataset is
        return Target(name=f"mixture {base}", kind="packed", format="mixture",
                      variant="existing", path=path, error=error_text(exc))
    count = summary["samples_per_epoch"]
    chosen = select_indices(count, limit, seed)
    if chosen is not None:
        payload, count = payload * len(chosen) / count, len(chosen)
    shares = "+".join(s["name"] for s in summary["sources"])
    return Target(name=f"mixture {shares}", kind="packed", format="mixture",
                  variant="existing", path=os.path.abspath(path), count=count,
                  payload_bytes=round(payload),
                  indices=tuple(chosen) if chosen is not None else None)

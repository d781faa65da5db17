"""Packing a source into a container: the one entry point every format uses.

The steps: resolve the format and the source, start the writer (which refuses
an existing output before anything is scanned), put the source in a seeded
random order if asked (``shuffle=``), prepare every image (in worker
processes, order kept; or on a Dask cluster, see ``cluster.py``), write the
records, then the manifest; the writer publishes the output atomically.
"""

from __future__ import annotations

import datetime as _dt
import os
import signal
import time
from typing import Any, Callable

from fastdata import __version__
from fastdata.errors import FastDataError, SourceError
from fastdata.formats import FormatSpec, check_local, format_for_output
from fastdata.formats.remote_files import as_local, is_remote
from fastdata.image_header import check_max_pixels
from fastdata.jobs.choose import cluster_asked
from fastdata.machine import usable_cores
from fastdata.packers.journal import (
    PackJournal,
    discard_earlier_partial,
    kept_for_resume,
    partial_to_resume,
    remove_stale_partials,
    say_how_to_resume,
    state_dir,
)
from fastdata.packers.options import PackOptions, writer_options_for
from fastdata.packers.pieces import (
    entries_to_prepare,
    pieces_to_keep,
    write_items,
    write_pieces,
)
from fastdata.packers.plan import PackPlan, ResumeRefused, plan_entries
from fastdata.packers.pool import PreparedStream
from fastdata.packers.prepare import SkippedFile
from fastdata.packers.shuffle import check_seed, shuffled
from fastdata.packers.source import ImageFolderSource, Source, parse_extensions
from fastdata.packers.sources.dataset import DatasetSource, writes_over
from fastdata.packers.sources.dispatch import open_source, source_kind
from fastdata.packers.summary import PackSummary, remove_stale_report, write_report
from fastdata.packers.tally import Tally
from fastdata.progress import progress_bar
from fastdata.records import Manifest
from fastdata.redaction import redact_url

__all__ = ["PackOptions", "PackSummary", "SkippedFile", "pack"]


def pack(
    source: str | os.PathLike | Source,
    output: str | os.PathLike,
    *,
    options: PackOptions | None = None,
    progress: bool | None = None,
    on_event: Callable[[str], None] | None = None,
    scheduler: Any = None,
    ray: Any = None,
) -> PackSummary:
    """Pack ``source`` into ``output``.

    Args:
        source: a folder with one sub-folder per class (read as an
            :class:`ImageFolderSource`), a list file (``.csv``, ``.tsv``,
            ``.jsonl``) or Parquet (a ``.parquet`` file, a folder of them), or
            a packed dataset (``.lmdb``, ``.h5``, ``.tar``, ``.tfrecord``, a
            manifest or shard pattern: its records as they are stored, see
            ``fastdata.convert``), read with ``fastdata.open_source`` before
            anything is written, or any :class:`Source`.
        output: the dataset to write (a path, or an s3://, gs://, az:// URL: packed
            in a local staging folder, then uploaded with the manifest last; see
            fastdata.packers.upload); its extension selects the format. Without
            a known extension ``options.format`` chooses it (an extension that
            contradicts ``options.format`` is refused): LMDB and HDF5 write
            ``output`` itself, tar and TFRecord add their extension
            (``output.tar``, sidecars ``output.tar.fastdata.json``, ...).
        options: pack options (defaults: keep bytes, skip bad images).
        progress: show a progress bar (None: only on a terminal).
        on_event: called with each warning as it happens (the CLI prints them).
        scheduler: pack on a Dask cluster: its scheduler's address
            (``"tcp://HOST:8786"``) or a ``distributed.Client``. The workers
            must see the source and the output's folder at the same paths; the
            output is the one a local pack gives (see fastdata.packers.cluster).
        ray: pack on a Ray cluster instead: its address (``"HOST:6379"``,
            ``"ray://HOST:10001"``, ``"auto"``), or True for the one in
            ``$FASTDATA_RAY`` (also used when neither is given). The same
            rules as ``scheduler``.

    Returns:
        The summary (``files`` lists what was written). Skipped files,
        warnings and records stored under another name than their key (tar)
        are also written to ``OUTPUT.report.json`` (sharded formats:
        ``NAME.report.json`` beside ``NAME.fastdata.json``) when there are any.

    Raises:
        SourceError: the source is missing, has no classes or no usable images.
        BadImageError: a bad image under ``strict``.
        OutputExistsError: the output exists and ``overwrite`` is False.
        UnknownFormatError: the format cannot be chosen, or the output's
            extension contradicts ``options.format``.
        FastDataError: impossible options (for example raw storage of images of
            different sizes); a cluster that cannot be reached.
        SchedulerLost: the cluster went away during the pack (the finished
            pieces are kept for ``resume``).
    """
    options = options or PackOptions()
    cluster = cluster_asked(scheduler=scheduler, ray=ray)
    started = time.perf_counter()
    output = as_local(os.fspath(output))
    if is_remote(output):
        from fastdata.packers.upload import pack_to_url

        if cluster is not None and not os.environ.get("FASTDATA_STAGING_DIR"):
            raise FastDataError("a pack to a URL on a cluster stages the shards in a "
                                "folder the workers share: set FASTDATA_STAGING_DIR to one",
                                path=output)

        if options.resume:
            raise FastDataError("--resume of a pack to a URL is not supported: pack to a "
                                "local folder with --resume, then upload it", path=output)

        return pack_to_url(pack, source, output, options, progress=progress, on_event=on_event,
                           **(cluster or {}))
    check_local(output)
    if not isinstance(source, Source):
        check_local(source)
        if source_kind(source) != "folder":  # a list or Parquet: read and checked now
            source = open_source(source, extensions=options.extensions)
    output = os.path.abspath(os.fspath(output))
    spec = format_for_output(output, options.format)
    writer_cls = spec.load_writer()
    src = source if isinstance(source, Source) else None  # a folder is scanned later
    source_root = src.describe().get("root") if src else os.path.abspath(os.fspath(source))
    if isinstance(src, DatasetSource) and writes_over(src, spec, output):
        raise SourceError("the output would write over the dataset being read"
                          + (f" ({source_root})" if source_root != output else "")
                          + ": give the converted dataset another name", path=output)
    if source_root and not is_remote(source_root) and \
            os.path.commonpath([output, source_root]) == source_root:
        raise SourceError("the output must not be inside the source folder", path=output)
    try:
        check_max_pixels(options.max_pixels)
    except ValueError as exc:
        raise FastDataError(str(exc)) from None
    workers = options.workers if options.workers is not None else usable_cores()
    if workers < 1:
        raise FastDataError(f"workers={workers} is not allowed: give at least 1")
    writer_options = writer_options_for(spec, writer_cls, options, output)
    extensions = _folder_extensions(src, options)
    seed = check_seed(options.shuffle)

    resume = bool(options.resume)
    if resume and not writer_cls.resumable:
        raise FastDataError(f"{spec.name} packs cannot be resumed; pack again without --resume",
                            path=output)
    journal = PackJournal(state_dir(writer_cls.output_stem(output, **writer_options)))
    resume_path = partial_to_resume(journal, output) if resume else None
    # The writer first: it refuses an existing output (and a pack already
    # running to it) before any scanning.
    with _sigterm_as_interrupt():
        writer = writer_cls(output, overwrite=options.overwrite,
                            **({"resume_path": resume_path} if resume_path else {}),
                            **writer_options)
        try:
            manifest, tally, src = _pack_into(writer, spec, journal, source, src, source_root,
                                              extensions, seed, options, writer_options,
                                              workers, progress, on_event, output,
                                              cluster)
        except ResumeRefused:
            writer.suspend()  # the interrupted pack stays as it was
            raise
        except BaseException as exc:
            if (writer.resumable and kept_for_resume(exc) and journal.exists()
                    and not journal.finishing):
                writer.suspend()
                journal.close()
                say_how_to_resume(exc, journal)
            else:
                writer.abort()
                journal.remove()
            raise
        journal.remove()
        renamed = writer.renamed_keys()

    output = getattr(writer, "output_path", output)
    for replaced in getattr(writer, "replaced_legacy", ()):
        remove_stale_report(replaced)  # the report of a dataset of the earlier naming
    report = None
    if tally.skipped or tally.warnings or renamed:
        report = write_report(output, tally.skipped, tally.warnings, renamed)
    else:
        remove_stale_report(output)
    return PackSummary(
        output=output, format=spec.name, records=manifest.count,
        classes=len(manifest.classes), bytes_in=tally.bytes_in,
        bytes_out=int(manifest.bytes.get("on_disk", 0)),
        seconds=time.perf_counter() - started, skipped=tally.skipped,
        ignored=int(manifest.source.get("ignored", 0)), warnings=tally.warnings,
        report=report, encodings=dict(manifest.encoding["formats"]), files=writer.files,
        ignored_extensions=dict(manifest.source.get("ignored_extensions") or {}),
        renamed=renamed, resumed=journal.resume_counts(manifest.count),
    )


def _pack_into(writer, spec, journal, source, src, source_root, extensions, seed,
               options: PackOptions, writer_options, workers, progress, on_event, output,
               cluster: dict | None = None):
    """Scan, plan, prepare and write everything into ``writer``; returns the
    published manifest, the tally and the source."""
    if src is None:
        src = ImageFolderSource(source_root, extensions=extensions)
    if seed is not None:
        src = shuffled(src, seed)
    tally = Tally(len(src.classes), on_event)
    for msg in src.warnings():
        tally.warn(msg)
    kept: dict = {}
    plan = None
    total = len(src)
    if writer.resumable:
        writer.piece_mode = True
        plan = PackPlan.build(src, src.classes,
                              _resume_options(spec, options, writer_options),
                              entries_path=plan_entries(writer), sharded=spec.sharded,
                              max_records=getattr(writer, "max_records", None),
                              max_bytes=getattr(writer, "max_bytes", None),
                              stored_size=getattr(writer, "stored_size_of", None))
        if options.resume and not journal.exists():
            tally.note("no interrupted pack of this output to resume (it stopped before "
                       "its plan was saved); packing from the start")
        if options.resume and journal.exists():
            saved = journal.saved_plan()
            saved.check_same(plan, output)
            os.remove(plan.entries_path)  # the same entries as the saved plan's
            plan = saved
            kept = pieces_to_keep(writer, plan, journal, prefix_only=not spec.sharded,
                                  warn=tally.note)
        else:
            discard_earlier_partial(journal, tally.note)
            remove_stale_partials(writer)
            journal.start(plan, writer.temp_path)
        todo = entries_to_prepare(src, plan, kept)
        todo_count = total - sum(plan.pieces[k][1] - plan.pieces[k][0] for k in kept)
    else:
        todo, todo_count = iter(src), total
    if cluster is not None:
        from fastdata.packers.cluster import write_on_cluster

        if options.workers is not None:
            tally.note("workers= applies to a local pack: on a cluster each worker "
                       "thread prepares one piece at a time")
        write_on_cluster(cluster, writer, spec, src, plan, kept, journal, tally, options,
                         writer_options, source_root, output,
                         lambda: progress_bar(total, f"pack {os.path.basename(output)}",
                                              enabled=progress))
    else:
        _write_local(writer, spec, plan, kept, todo, todo_count, journal, tally, options,
                     workers, source_root, progress, output)
    _check_written(src, plan, tally, writer.count, source_root)
    # From here an interruption drops the partial output, as before pieces existed:
    # the publish moves its files, so what is left would not resume.
    journal.finishing = True
    manifest = writer.finish(_manifest(spec, src, tally, writer, options, writer_options))
    return manifest, tally, src


def _write_local(writer, spec, plan, kept, todo, todo_count, journal, tally, options,
                 workers, source_root, progress, output) -> None:
    """Prepare ``todo`` in local worker processes and write it (with the kept pieces)."""
    items = PreparedStream(todo, options, min(workers, max(1, todo_count // 16)))
    # The bar's thread starts after the pool: nothing of ours is mid-call at fork.
    bar = progress_bar(plan.count if plan else todo_count,
                       f"pack {os.path.basename(output)}", enabled=progress)
    try:
        if plan is not None:
            write_pieces(writer, plan, kept, items, journal, tally, strict=options.strict,
                         source_root=source_root, adopted_already=not spec.sharded,
                         on_entries=bar.update)
        else:
            write_items(writer, items, tally, strict=options.strict, source_root=source_root,
                        on_entries=bar.update)
    except BaseException:
        items.close(terminate=True)
        raise
    finally:
        bar.close()
        items.close()


def _resume_options(spec: FormatSpec, options: PackOptions, writer_options) -> dict:
    """What a resume must find unchanged: the recorded options and the limit."""
    return {**_recorded_options(spec, options, writer_options),
            "max_pixels": options.max_pixels}


def _folder_extensions(src: Source | None, options: PackOptions) -> tuple[str, ...] | None:
    """``options.extensions``, checked before anything is written; refused with a
    Source, which chose its files already."""
    if options.extensions is None:
        return None
    if src is not None:
        raise FastDataError("extensions= applies to a folder source; give the Source "
                            "itself the extensions (ImageFolderSource(root, extensions=...))")
    return parse_extensions(options.extensions)


def _check_written(src: Source, plan: PackPlan | None, tally: Tally, written: int,
                   root: str | None) -> None:
    """Refuse an empty result; warn about classes that lost every image."""
    if written == 0:
        skipped = tally.skipped
        raise SourceError(
            f"none of the {len(src)} image files could be read ({len(skipped)} skipped, "
            f"first: {skipped[0].key}: {skipped[0].reason})" if skipped
            else "no images to pack", path=root)
    unwritten = [label for label in range(len(src.classes)) if tally.class_counts[label] == 0]
    if not unwritten:
        return
    # The plan knows every entry's label; without one the source is read again.
    present = plan.labels if plan is not None else {e.label for e in src}
    for label in unwritten:
        if label in present:
            tally.warn(f"every image of class {src.classes[label]!r} was skipped; its label "
                       f"{label} is kept")


def _recorded_options(spec: FormatSpec, options: PackOptions, writer_options) -> dict:
    """The options recorded in the manifest's ``pack_options``."""
    return {"format": spec.name, "strict": options.strict,
            "verify_decode": options.verify_decode,
            "preprocess": options.preprocess.to_dict(),
            "extensions": None if options.extensions is None
            else [e[1:] for e in parse_extensions(options.extensions)],
            "shuffle": check_seed(options.shuffle),
            **writer_options}


def _manifest(spec: FormatSpec, src: Source, tally: Tally, writer, options: PackOptions,
              writer_options: dict[str, Any]) -> Manifest:
    pre = options.preprocess
    described = src.describe()
    raw = tally.raw_shape
    return Manifest(
        format=spec.name,
        count=writer.count,
        classes=list(src.classes),
        class_counts=tally.class_counts,
        # Raw records stay raw under "keep" (a raw dataset converted as it is).
        encoding={"storage": "raw" if raw else "keep" if pre.identity else pre.encoding,
                  "formats": dict(sorted(tally.encodings.items())),
                  "shape": list(raw) if raw else None,
                  "dtype": "uint8" if raw else None,
                  "layout": "HWC" if raw else None},
        bytes={"source": tally.bytes_in, "payload": writer.payload_bytes},
        checksums={},
        shards=[],
        source=recorded_source({
            "root": described.get("root"), "fingerprint": tally.fingerprint.hexdigest(),
            "files": described.get("files", len(src)), "skipped": len(tally.skipped),
            "ignored": described.get("ignored", 0),
            **{k: v for k, v in described.items() if k not in ("root", "files", "ignored")}},
            options.keep_source_path),
        pack_options=_recorded_options(spec, options, writer_options),
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        fastdata_version=__version__,
    )


def recorded_source(source: dict, keep_path: bool) -> dict:
    """The manifest's ``source`` with its paths (the root; a converted
    dataset's ``converted_from.path``) as recorded: their names (``images``,
    ``train.csv``), or with ``keep_path`` the absolute paths or URLs; never a
    credential (see fastdata.redaction)."""
    from fastdata.storage.urls import basename

    def recorded(path):
        if not isinstance(path, str) or not path:
            return path
        return redact_url(path if keep_path else basename(path.rstrip("/" + os.sep)) or path)

    out = dict(source, root=recorded(source.get("root")))
    if isinstance(out.get("converted_from"), dict):
        origin = out["converted_from"]
        out["converted_from"] = dict(origin, path=recorded(origin.get("path")))
    return out


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

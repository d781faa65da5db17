"""Packing a source into a container: the one entry point every format uses.

The steps: resolve the format and the source, start the writer (which refuses
an existing output before anything is scanned), put the source in a seeded
random order if asked (``shuffle=``), prepare every image (in worker
processes, order kept), write the records, then the manifest; the writer
publishes the output atomically.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable

from fastdata import __version__
from fastdata.errors import BadImageError, FastDataError, SourceError, UnknownFormatError
from fastdata.formats import FormatSpec, check_local, format_for_output, sharded_formats
from fastdata.formats.remote_files import as_local, is_remote
from fastdata.image_header import check_max_pixels
from fastdata.machine import usable_cores
from fastdata.formats.writer import remove_path
from fastdata.packers.journal import PackJournal, remove_stale_partials, state_dir
from fastdata.packers.pieces import entries_to_prepare, pieces_to_keep, write_pieces
from fastdata.packers.plan import PackPlan, ResumeRefused
from fastdata.packers.prepare import Prepared, SkippedFile, prepare, start_pool
from fastdata.packers.options import PackOptions
from fastdata.packers.shuffle import check_seed, shuffled
from fastdata.packers.source import ImageFolderSource, Source, parse_extensions
from fastdata.packers.summary import PackSummary, remove_stale_report, write_report
from fastdata.progress import progress_bar
from fastdata.records import Manifest, Record

__all__ = ["PackOptions", "PackSummary", "SkippedFile", "pack"]


@dataclass
class _Tally:
    """What the pack has seen so far: counts, the source fingerprint, skips and warnings."""

    classes: int
    on_event: Callable[[str], None] | None = None
    skipped: list[SkippedFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    encodings: Counter = field(default_factory=Counter)
    bytes_in: int = 0
    raw_shape: tuple[int, int, int] | None = None
    fingerprint: Any = field(default_factory=hashlib.sha256)
    class_counts: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.class_counts = [0] * self.classes

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)
        if self.on_event:
            self.on_event(msg)

    def note(self, msg: str) -> None:
        """Tell the user about the run itself (not the data): not in the report."""
        if self.on_event:
            self.on_event(msg)

    def add(self, item: Prepared) -> None:
        """Count a prepared image that is about to be written."""
        if item.encoding == "raw":
            shape = (item.height, item.width, 3)
            if self.raw_shape is None:
                self.raw_shape = shape
            elif shape != self.raw_shape:
                raise FastDataError(
                    f"raw storage needs one image size, but this image is "
                    f"{item.width}x{item.height} and earlier ones "
                    f"{self.raw_shape[1]}x{self.raw_shape[0]}; pass resize=(h, w), or resize=N "
                    f"with center_crop=True", key=item.key)
        self.fingerprint.update(f"{item.key}\t{item.label}\t{item.source_bytes}\n".encode())
        self.class_counts[item.label] += 1
        self.encodings[item.encoding] += 1
        self.bytes_in += item.source_bytes


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
            different sizes).
    """
    options = options or PackOptions()
    started = time.perf_counter()
    output = as_local(os.fspath(output))
    if is_remote(output):
        from fastdata.packers.upload import pack_to_url

        if options.resume:
            raise FastDataError("--resume of a pack to a URL is not supported: pack to a "
                                "local folder with --resume, then upload it", path=output)

        return pack_to_url(pack, source, output, options, progress=progress, on_event=on_event)
    check_local(output)
    if not isinstance(source, Source):
        check_local(source)
    output = os.path.abspath(os.fspath(output))
    spec = format_for_output(output, options.format)
    writer_cls = spec.load_writer()
    src = source if isinstance(source, Source) else None  # a folder is scanned later
    source_root = src.describe().get("root") if src else os.path.abspath(os.fspath(source))
    if source_root and os.path.commonpath([output, source_root]) == source_root:
        raise SourceError("the output must not be inside the source folder", path=output)
    try:
        check_max_pixels(options.max_pixels)
    except ValueError as exc:
        raise FastDataError(str(exc)) from None
    workers = options.workers if options.workers is not None else usable_cores()
    if workers < 1:
        raise FastDataError(f"workers={workers} is not allowed: give at least 1")
    writer_options = _writer_options(spec, options, output)
    extensions = _folder_extensions(src, options)
    seed = check_seed(options.shuffle)

    resume = bool(options.resume)
    if resume and not writer_cls.resumable:
        raise FastDataError(f"{spec.name} packs cannot be resumed; pack again without --resume",
                            path=output)
    journal = PackJournal(state_dir(writer_cls.output_stem(output, **writer_options)))
    resume_path = _partial_to_resume(journal, output) if resume else None
    # The writer first: it refuses an existing output (and a pack already
    # running to it) before any scanning.
    with _sigterm_as_interrupt():
        writer = writer_cls(output, overwrite=options.overwrite,
                            **({"resume_path": resume_path} if resume_path else {}),
                            **writer_options)
        try:
            manifest, tally, src = _pack_into(writer, spec, journal, source, src, source_root,
                                              extensions, seed, options, writer_options,
                                              workers, progress, on_event, output)
        except ResumeRefused:
            writer.suspend()  # the interrupted pack stays as it was
            raise
        except BaseException as exc:
            if (writer.resumable and _resumable_failure(exc) and journal.exists()
                    and not journal.finishing):
                writer.suspend()
                journal.close()
                _say_how_to_resume(exc, journal)
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
        renamed=renamed,
    )


def _pack_into(writer, spec, journal, source, src, source_root, extensions, seed,
               options: PackOptions, writer_options, workers, progress, on_event, output):
    """Scan, plan, prepare and write everything into ``writer``; returns the
    published manifest, the tally and the source."""
    if src is None:
        src = ImageFolderSource(source_root, extensions=extensions)
    if seed is not None:
        src = shuffled(src, seed)
    tally = _Tally(len(src.classes), on_event)
    for msg in src.warnings():
        tally.warn(msg)
    kept: dict = {}
    plan = None
    total = len(src)
    if writer.resumable:
        writer.piece_mode = True
        plan = PackPlan.build(src, src.classes,
                              _resume_options(spec, options, writer_options),
                              sharded=spec.sharded,
                              max_records=getattr(writer, "max_records", None),
                              max_bytes=getattr(writer, "max_bytes", None),
                              stored_size=getattr(writer, "stored_size_of", None))
        if options.resume and not journal.exists():
            tally.note("no interrupted pack of this output to resume (it stopped before "
                       "its plan was saved); packing from the start")
        if options.resume and journal.exists():
            saved = PackPlan.from_json(journal.plan_json(), journal.folder)
            saved.check_same(plan, output)
            kept = pieces_to_keep(writer, plan, journal, prefix_only=not spec.sharded,
                                  warn=tally.note)
        else:
            _discard_earlier_partial(journal, tally)
            remove_stale_partials(writer)
            journal.start(plan.to_json(), writer.temp_path)
        todo = entries_to_prepare(src, plan, kept)
        todo_count = total - sum(plan.pieces[k][1] - plan.pieces[k][0] for k in kept)
    else:
        todo, todo_count = iter(src), total
    items = _Prepared(todo, options, min(workers, max(1, todo_count // 16)))
    # The bar's thread starts after the pool: nothing of ours is mid-call at fork.
    bar = progress_bar(total, f"pack {os.path.basename(output)}", enabled=progress)
    try:
        if plan is not None:
            write_pieces(writer, plan, kept, items, journal, tally, strict=options.strict,
                         source_root=source_root, adopted_already=not spec.sharded,
                         on_entries=bar.update)
        else:
            _write_all(writer, items, tally, options, source_root, bar)
    except BaseException:
        items.close(terminate=True)
        raise
    finally:
        bar.close()
        items.close()
    _check_written(src, tally, writer.count, source_root)
    # From here an interruption drops the partial output, as before pieces existed:
    # the publish moves its files, so what is left would not resume.
    journal.finishing = True
    manifest = writer.finish(_manifest(spec, src, tally, writer, options, writer_options))
    return manifest, tally, src


def _write_all(writer, items, tally: "_Tally", options: PackOptions, source_root, bar) -> None:
    """Write every prepared item (formats that cannot resume)."""
    for item in items:
        bar.update(1)
        if isinstance(item, SkippedFile):
            if options.strict:
                raise BadImageError(
                    item.reason + " (strict=True stops at the first bad image)",
                    path=os.path.join(source_root, item.key) if source_root
                    else item.key, key=item.key)
            tally.skipped.append(item)
            continue
        tally.add(item)
        writer.write(Record(writer.count, item.key, item.label, item.payload,
                            item.encoding, item.width, item.height, item.metadata))


def _resume_options(spec: FormatSpec, options: PackOptions, writer_options) -> dict:
    """What a resume must find unchanged: the recorded options and the limit."""
    return {**_recorded_options(spec, options, writer_options),
            "max_pixels": options.max_pixels}


def _partial_to_resume(journal: PackJournal, output: str) -> str | None:
    if not journal.exists():
        return None  # killed before its plan was saved: the pack starts from the beginning
    partial = journal.partial()
    if partial is None:
        raise FastDataError("the partial output of the interrupted pack is gone; pack "
                            "again without --resume", path=output)
    return partial


def _discard_earlier_partial(journal: PackJournal, tally: "_Tally") -> None:
    """A pack without --resume starts over: the partial output of an earlier,
    interrupted pack to the same output goes (the lock says it is not running)."""
    if not journal.exists():
        return
    partial = journal.partial()
    if partial:
        remove_path(partial)
    journal.remove()
    tally.note("the partial output of an interrupted pack to this output was removed; "
               "--resume would have continued it")


def _resumable_failure(exc: BaseException) -> bool:
    """An interruption (Ctrl-C, SIGTERM): the pieces written so far are kept
    for --resume. After an error (a full disk, a bad option) the partial output
    goes, as it always did: it would hold the space the error asks for."""
    return isinstance(exc, KeyboardInterrupt)


def _say_how_to_resume(exc: BaseException, journal: PackJournal) -> None:
    import sys

    done = len(journal.pieces())
    print(f"fastdata: {done} finished piece{'s' if done != 1 else ''} kept in "
          f"{journal.folder}; the same command with --resume continues the pack",
          file=sys.stderr)


def _folder_extensions(src: Source | None, options: PackOptions) -> tuple[str, ...] | None:
    """``options.extensions``, checked before anything is written; refused with a
    Source, which chose its files already."""
    if options.extensions is None:
        return None
    if src is not None:
        raise FastDataError("extensions= applies to a folder source; give the Source "
                            "itself the extensions (ImageFolderSource(root, extensions=...))")
    return parse_extensions(options.extensions)


def _writer_options(spec: FormatSpec, options: PackOptions, output: str) -> dict[str, Any]:
    writer_options = dict(options.writer_options)
    if options.shard_size not in (None, ""):
        if not spec.sharded:
            raise UnknownFormatError(
                f"shard_size= applies to sharded formats ({', '.join(sharded_formats())}), "
                f"not {spec.name}", path=output)
        size = options.shard_size
        # "10000" from the command line and 10000 from Python are one option.
        writer_options["shard_size"] = int(size) if isinstance(size, str) and \
            size.strip().isdigit() else size
    return writer_options


class _Prepared:
    """Every entry prepared, in order, by worker processes when
    ``workers`` > 1. The pool starts here, at once (before any thread of ours
    exists); ``close()`` stops it."""

    def __init__(self, entries, options: PackOptions, workers: int) -> None:
        self._stop = threading.Event()
        jobs = ((entry, options.verify_decode, options.preprocess, options.max_pixels)
                for entry in _until(entries, self._stop))
        self._pool = start_pool(workers)
        self._chunks = None
        if self._pool is None:
            self._results = map(prepare, jobs)
        else:  # chunks of 8 jobs, as imap(chunksize=8) makes, but an iterator we can drain
            self._chunks = self._pool.imap(_prepare_chunk, _chunked(jobs, 8))
            self._results = (item for chunk in self._chunks for item in chunk)

    def __iter__(self) -> Iterator[Prepared | SkippedFile]:
        return iter(self._results)

    def close(self, *, terminate: bool = False) -> None:
        """Stop the pool: let the workers finish (all work is done) or, after an
        error, stop feeding them, take what they still send, then let them go;
        ``terminate`` them only if that does not end in time."""
        self._stop.set()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        drained = False
        try:
            drained = not terminate or self._drain(_DRAIN_SECONDS)
        finally:  # a second Ctrl-C while draining still ends the workers
            if drained:
                pool.close()
            else:
                pool.terminate()
            pool.join()

    def _drain(self, seconds: float) -> bool:
        """Take the results still coming (the stopped feed bounds them). A worker
        blocked sending a result that nobody reads makes ``Pool.terminate()`` wait
        for ever. False when they do not all arrive within ``seconds``."""
        import multiprocessing

        end = time.monotonic() + seconds
        failed = 0  # chunks whose job raised: not the error being reported
        while True:
            try:
                self._chunks.next(timeout=max(0.0, end - time.monotonic()))
            except StopIteration:
                return True
            except multiprocessing.TimeoutError:
                return False
            except Exception:  # noqa: BLE001 - any error a job raised in its worker
                failed += 1


def _prepare_chunk(jobs: tuple) -> list[Prepared | SkippedFile]:
    """``prepare`` over a chunk of jobs, in a worker process."""
    return [prepare(job) for job in jobs]


def _chunked(items, size: int) -> Iterator[tuple]:
    it = iter(items)
    while chunk := tuple(itertools.islice(it, size)):
        yield chunk


#: How long a stopped pack waits for the work already handed to its workers.
_DRAIN_SECONDS = 20.0


def _until(entries, stop: threading.Event):
    """``entries`` until ``stop`` is set: the pool's task thread, which feeds jobs
    ahead of the workers, stops feeding once the pack stops."""
    for entry in entries:
        if stop.is_set():
            return
        yield entry


def _check_written(src: Source, tally: _Tally, written: int, root: str | None) -> None:
    """Refuse an empty result; warn about classes that lost every image."""
    if written == 0:
        skipped = tally.skipped
        raise SourceError(
            f"none of the {len(src)} image files could be read ({len(skipped)} skipped, "
            f"first: {skipped[0].key}: {skipped[0].reason})" if skipped
            else "no images to pack", path=root)
    empty = set(range(len(src.classes))) - {e.label for e in src}
    for label, name in enumerate(src.classes):
        if tally.class_counts[label] == 0 and label not in empty:
            tally.warn(f"every image of class {name!r} was skipped; its label {label} is kept")


def _recorded_options(spec: FormatSpec, options: PackOptions, writer_options) -> dict:
    """The options recorded in the manifest's ``pack_options``."""
    return {"format": spec.name, "strict": options.strict,
            "verify_decode": options.verify_decode,
            "preprocess": options.preprocess.to_dict(),
            "extensions": None if options.extensions is None
            else [e[1:] for e in parse_extensions(options.extensions)],
            "shuffle": check_seed(options.shuffle),
            **writer_options}


def _manifest(spec: FormatSpec, src: Source, tally: _Tally, writer, options: PackOptions,
              writer_options: dict[str, Any]) -> Manifest:
    pre = options.preprocess
    described = src.describe()
    raw = tally.raw_shape
    return Manifest(
        format=spec.name,
        count=writer.count,
        classes=list(src.classes),
        class_counts=tally.class_counts,
        encoding={"storage": "keep" if pre.identity else pre.encoding,
                  "formats": dict(sorted(tally.encodings.items())),
                  "shape": list(raw) if raw else None,
                  "dtype": "uint8" if raw else None,
                  "layout": "HWC" if raw else None},
        bytes={"source": tally.bytes_in, "payload": writer.payload_bytes},
        checksums={},
        shards=[],
        source={"root": described.get("root"), "fingerprint": tally.fingerprint.hexdigest(),
                "files": described.get("files", len(src)), "skipped": len(tally.skipped),
                "ignored": described.get("ignored", 0),
                **{k: v for k, v in described.items()
                   if k not in ("root", "files", "ignored")}},
        pack_options=_recorded_options(spec, options, writer_options),
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        fastdata_version=__version__,
    )


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

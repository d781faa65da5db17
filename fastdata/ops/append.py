"""``fastdata.append``: add a source's images to a packed dataset as a new
version, without rewriting what exists (no torch).

The new records are packed, as a complete dataset of the same format, into
``NAME.versions/parts/ID/`` (ID: fresh, so writers at once never share a
name); then :func:`fastdata.dataset.commit.commit` records a version that
reads the earlier parts and this one: the same records, labels, keys and
checksums as one pack of both sources, classes new to the dataset
appended to its list. A key the dataset already holds is refused (or, with
``skip_existing``, passed over and counted); an append that lands after
another one rebases onto it without packing again, unless their keys
collide.

The keys are checked as a job (fastdata.ops.append_pieces): pieces hash the
dataset's keys into sorted runs, on this machine's processes or a cluster,
and the runs are merged with the source's (see :func:`append` for what
grows with the records). A rebase onto another append compares the two
parts' keys the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from fastdata.dataset.commit import Conflict, commit
from fastdata.dataset.record import DatasetRecord, Part, new_id
from fastdata.errors import FastDataError
from fastdata.ops.append_pieces import AppendSource, listed
from fastdata.ops.piece_readers import read_version
from fastdata.packers.options import PackOptions


@dataclass(frozen=True)
class AppendResult:
    """What :func:`append` did.

    Attributes:
        dataset: the dataset appended to.
        version: the new version's number.
        added: records added.
        records: the new version's records.
        new_classes: classes the dataset did not have, appended to its list.
        skipped_existing: how many of the source's keys the dataset held
            (passed over with ``skip_existing``); ``skipped_keys`` the first ones.
        part: the part written (its manifest or file).
        summary: the pack's summary of the part.
        rebased: versions other writers committed meanwhile, which this
            append was recorded after.
    """

    dataset: str
    version: int
    added: int
    records: int
    new_classes: list[str]
    skipped_existing: int
    skipped_keys: list[str] = field(default_factory=list)
    part: str = ""
    summary: Any = None
    rebased: int = 0

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "summary"}
        out["pack"] = self.summary.to_dict() if self.summary is not None else None
        return out


@dataclass
class AddPart:
    """The change an append commits: one more part.

    ``reader_of(part)`` opens a part of the dataset (the new one too): when
    another append landed meanwhile, the two parts' keys are compared.
    ``keys`` is not read (None; kept so that the fields stay in place)."""

    part: Part
    part_path: str
    classes: list[str]
    class_counts: list[int]
    keys: Any
    reader_of: Any
    kind: str = "append"
    rebased: int = 0
    new_classes: list = field(default_factory=list)

    def apply(self, head: DatasetRecord, read: DatasetRecord) -> DatasetRecord:
        ids = [p.id for p in read.parts]
        if [p.id for p in head.parts[:len(ids)]] != ids or \
                [p.selection for p in head.parts[:len(ids)]] != [p.selection for p in read.parts]:
            raise Conflict(f"version {head.number} ({head.change}) changed the parts this "
                           f"append was made on; append again")
        landed = head.parts[len(ids):]
        if landed:
            self.rebased = head.number - read.number
            for part in landed:
                count, first = self._shared(part)
                if count:
                    raise Conflict(f"{count:,} of the new key(s) ({listed(first, count)}) "
                                   f"were appended meanwhile by another writer (now version "
                                   f"{head.number}); append again, with --skip-existing "
                                   f"(skip_existing=True) to pass over them")
        new = [c for c in self.classes if c not in head.classes]
        self.new_classes = new  # the last apply is the one recorded
        classes = list(head.classes) + new
        counts = list(head.class_counts) + [0] * len(new)
        for name, count in zip(self.classes, self.class_counts):
            counts[classes.index(name)] += count
        what = f"appended {self.part.records:,} records" + (
            f" ({len(new)} new class(es): {', '.join(new[:5])})" if new else "")
        return dataclasses.replace(
            head, records=head.records + self.part.records, classes=classes,
            class_counts=counts, parts=list(head.parts) + [self.part], summary=what)

    def _shared(self, part: Part) -> tuple[int, list[str]]:
        """The keys of the new part that ``part`` holds too: how many, the
        first ones (sorted); compared through sorted runs of their hashes."""
        import tempfile

        from fastdata.ops.append_pieces import shared_keys

        with self.reader_of(self.part) as mine, self.reader_of(part) as other, \
                tempfile.TemporaryDirectory(prefix="fastdata-append-") as folder:
            return shared_keys(mine, other, folder)

    def check_files(self) -> None:
        from fastdata.formats.remote_files import is_remote
        from fastdata.storage import list_tree
        from fastdata.storage.urls import dirname

        there = list_tree(dirname(self.part_path)) if is_remote(self.part_path) else \
            os.path.exists(self.part_path)
        if not there:
            raise FastDataError("the appended part was removed before it was recorded (by "
                                "fastdata gc with a grace period shorter than this append "
                                "took); append again", path=self.part_path)


def append(source, dataset: str | os.PathLike, *, options: PackOptions | None = None,
           skip_existing: bool = False, progress: bool | None = None, on_event=None,
           allow_outside: bool = False, scheduler: Any = None, ray: Any = None,
           workers: int | None = None, resume: bool = False) -> AppendResult:
    """Add the images of ``source`` (any source ``fastdata.pack`` takes) to the
    packed dataset ``dataset`` (local or at a URL) as a new version.

    Args:
        options: the pack options of the new records (``fastdata.PackOptions``).
            Their preprocessing (resize, crop, encoding, quality) is the
            dataset's own unless given; other preprocessing is refused.
            ``options.resume`` continues an interrupted append's pack.
        skip_existing: pass over the source's images whose key the dataset
            holds, instead of refusing them all.
        scheduler: check the keys on a Dask cluster (its scheduler's address
            or a ``distributed.Client``), and pack the new part there (as
            ``fastdata.pack`` does); ``ray``: on a Ray cluster (its address,
            or True for ``$FASTDATA_RAY``). The workers must see the
            dataset, the source and ``$FASTDATA_STAGING_DIR`` at the same paths.
        workers: processes on this machine for the key check (None: one per
            usable core; the pack's are ``options.workers``).
        resume: continue an interrupted key check (its finished pieces are
            kept in its work folder, see fastdata.jobs.journal).

    What grows: memory per process does not grow with the dataset's
    records; a worker holds one piece's key hashes (at most 2^18 rows of
    17 bytes), this process a chunk of the sorted runs (1.1 MB while the
    source's keys are sorted), the first keys listed, and the pack's own
    (see fastdata.pack); the source holds what it lists (a folder's file
    names). On disk while it runs, in the work folder
    (``$FASTDATA_STAGING_DIR``, else the temporary folder): 17 bytes per key
    of the dataset and of the source, and 16 per key both hold, until the
    new part is packed.

    Returns:
        an :class:`AppendResult`.

    Raises:
        FastDataError: keys already in the dataset (without ``skip_existing``),
            nothing new to add, preprocessing unlike the dataset's, a part
            stored unlike the dataset, or (``Conflict``) another writer's
            change that this one cannot be recorded after.
    """
    from fastdata.dataset.history import history_dir
    from fastdata.dataset.resolve import open_reader
    from fastdata.formats.registry import get_format
    from fastdata.ops.piece_readers import describe_dataset
    from fastdata.packers.pack import pack
    from fastdata.packers.source import Source
    from fastdata.packers.sources.dispatch import open_source
    from fastdata.storage.urls import join

    dataset = os.fspath(dataset)
    options = options or PackOptions()
    with open_reader(dataset, allow_outside=allow_outside) as reader:
        if getattr(reader, "is_view", False):
            raise FastDataError("a view cannot be appended to; append to its dataset, then "
                                "make the view again", path=dataset)
        name, read = read_version(reader)
        classes = list(reader.classes)
        records = len(reader)
        first = reader.parts[0].manifest if hasattr(reader, "parts") else reader.manifest
        spec = get_format(reader.format_name)
        described = describe_dataset(reader, allow_outside)
    options = _same_preprocess(options, first, dataset)
    if not isinstance(source, Source):
        source = open_source(source, extensions=options.extensions,
                             allow_outside=allow_outside)
    new_classes = [c for c in source.classes if c not in classes]
    cluster = {"scheduler": scheduler, "ray": ray}
    run, clashes = _key_check(source, described, records, cluster={**cluster, "workers": workers},
                              resume=resume, progress=progress, on_event=on_event)
    try:
        wrapped = AppendSource(source, classes + new_classes, clashes, skip_existing)
        if len(wrapped) == 0:
            raise FastDataError(f"nothing to append: every one of the source's "
                                f"{len(source):,} images is in the dataset already",
                                path=dataset)
        folder = join(history_dir(name), "parts", _resumed_id(name, options) or new_id())
        target = join(folder, "part" + spec.extensions[0])
        summary = pack(wrapped, target, options=dataclasses.replace(options, format=spec.name),
                       progress=progress, on_event=on_event, **cluster)
    finally:
        run.finish()  # the positions passed over were read by the pack
    part_path = target + (".fastdata.json" if spec.sharded else "")
    part, change = _new_part(name, folder, part_path, first, allow_outside)
    try:
        version = commit(name, change, read)
    except Conflict:
        _remove(folder)
        raise
    return AppendResult(dataset, version.number, part.records, version.records,
                        list(change.new_classes), clashes.distinct,
                        list(clashes.first_distinct), part_path, summary, change.rebased)


def _key_check(source, described: dict, records: int, *, cluster: dict, resume: bool,
               progress: bool | None, on_event):
    """The job that finds the source's keys the dataset ``described`` holds
    (see fastdata.ops.append_pieces): its run (``finish()`` when done with
    the positions) and the :class:`~fastdata.ops.append_pieces.Clashes`."""
    from fastdata.formats.reader import key_at
    from fastdata.jobs.runner import Job
    from fastdata.ops.append_pieces import (
        candidates,
        confirm,
        key_piece,
        source_runs,
    )
    from fastdata.ops.dedup_pieces import piece_records, plan_pieces
    from fastdata.ops.piece_readers import open_described, run_then_merge

    pieces = [(start, end) for _, start, end in plan_pieces([records])]
    # The source is in it so that appends of two sources at once are two jobs.
    fingerprint = {"dataset": dict(described, records=records),
                   "source": json.loads(json.dumps(source.describe(), default=str)),
                   "entries": len(source), "piece_records": piece_records(records)}
    job = Job("append-keys", fingerprint, key_piece, pieces, common=(described,),
              sizes=[end - start for start, end in pieces])
    with run_then_merge(job, cluster, resume=resume, progress=progress,
                        on_event=on_event) as run, open_described(described) as reader:
        mine, _ = source_runs((entry.key for entry in source), run.work)
        paths = [os.path.join(run.work, r["run"]) for r in run.results] + mine

        def key_of(index: int) -> str:
            return key_at(reader, index)

        pairs = candidates(paths, key_of, run.work)
        clashes = confirm((entry.key for entry in source), pairs, key_of, run.work)
    return run, clashes


def _new_part(name: str, folder: str, part_path: str, first, allow_outside: bool):
    """The part packed at ``part_path`` (checked alike the dataset's first,
    else removed) and the change that records it."""
    from fastdata.dataset.commit import step
    from fastdata.dataset.history import dataset_folder, relative_name
    from fastdata.dataset.record import manifest_digest
    from fastdata.formats import open_reader as open_files

    step("after-part")
    with open_files(part_path, allow_outside=allow_outside) as packed:
        try:
            _check_alike(first, packed.manifest, part_path)
        except FastDataError:
            packed.close()
            _remove(folder)  # no version names it: it goes now
            raise
        part = Part(folder.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1],
                    relative_name(dataset_folder(name), part_path), len(packed),
                    manifest_digest(packed.manifest))
        change = AddPart(part, part_path, list(packed.classes),
                         list(packed.manifest.class_counts), None,
                         _part_opener(name, allow_outside))
    return part, change


def _part_opener(name: str, allow_outside: bool):
    def open_part(part: Part):
        from fastdata.dataset.history import dataset_folder
        from fastdata.formats import open_reader as open_files
        from fastdata.storage.urls import join

        return open_files(join(dataset_folder(name), part.path), allow_outside=allow_outside)

    return open_part


def _same_preprocess(options: PackOptions, manifest, where: str) -> PackOptions:
    """``options`` with the dataset's preprocessing where none was given;
    refused when another was."""
    from fastdata.packers.preprocess import Preprocess

    stored = (manifest.pack_options or {}).get("preprocess")
    if not isinstance(stored, dict):
        return options
    given = options.preprocess.to_dict()
    if options.preprocess == Preprocess() and given != stored:
        try:
            return dataclasses.replace(options, preprocess=Preprocess(**{
                k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()}))
        except (TypeError, FastDataError):
            return options
    differ = {k: (stored.get(k), v) for k, v in given.items() if stored.get(k, v) != v and
              not (isinstance(v, tuple) and list(v) == stored.get(k))}
    if differ:
        shown = ", ".join(f"{k} {a!r} (given {b!r})" for k, (a, b) in differ.items())
        raise FastDataError(f"the dataset was packed with {shown}; append with its own "
                            f"preprocessing (give none, and it is used)", path=where)
    return options


def _resumed_id(name: str, options: PackOptions) -> str | None:
    """With ``resume``: the id of the part an interrupted append left (the
    newest part no version names yet), so its pack continues."""
    if not options.resume:
        return None
    from fastdata.ops.gc import unrecorded_parts

    found = unrecorded_parts(name)
    return found[-1] if found else None


def _check_alike(base, part, where: str) -> None:
    """Refuse a part stored unlike the dataset (raw against encoded, another shape)."""
    mine, theirs = base.encoding or {}, part.encoding or {}
    if (mine.get("storage") == "raw") != (theirs.get("storage") == "raw") or \
            (mine.get("storage") == "raw" and mine.get("shape") != theirs.get("shape")):
        raise FastDataError(
            f"the new records are stored as {theirs.get('storage')} {theirs.get('shape') or ''}"
            f", the dataset's as {mine.get('storage')} {mine.get('shape') or ''}; append "
            f"with the options of the first pack", path=where)


def _remove(folder: str) -> None:
    from fastdata.ops.gc import remove_tree

    remove_tree(folder)

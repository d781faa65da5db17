"""``fastdata.subset``: write a view that selects records of a dataset by
class, key, metadata, a random fraction or content (no torch).

The selection is a job (fastdata.ops.subset_pieces): pieces flag their
range of the parent's records, on this machine's processes or a cluster;
the flags are combined on this machine in piece order, a piece at a time,
with the records dropped for their content and the draw of ``fraction``
(fastdata.ops.subset_merge), into the selection the view stores as runs or
a bitmap (:mod:`fastdata.dataset.selection`). A subset of a view selects from the
view's parent, so views never chain.

What grows with the parent's records, in memory and on disk: see
:func:`subset`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdata.errors import FastDataError


@dataclass(frozen=True)
class SubsetResult:
    """What :func:`subset` wrote.

    Attributes:
        path: the view file.
        parent: the dataset it selects from.
        records: records selected.
        parent_records: the parent's records.
        missing_keys: keys of ``keys``/``exclude_keys`` the parent does not
            hold (the first 20), and ``missing_count`` how many in all.
        excluded_by_content: records dropped because an ``exclude`` dataset
            holds the same bytes.
        registered: the view is noted in its dataset's history, so ``fastdata
            gc`` keeps what it reads (not at a read-only URL).
    """

    path: str
    parent: str
    records: int
    parent_records: int
    missing_keys: list[str] = field(default_factory=list)
    missing_count: int = 0
    excluded_by_content: int = 0
    registered: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def read_key_list(path: str | os.PathLike) -> list[str]:
    """Keys from a file, one per line (blank lines and ``#`` comments skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f
                    if line.strip() and not line.lstrip().startswith("#")]
    except OSError as exc:
        raise FastDataError(f"cannot read the key list ({exc.strerror})",
                            path=os.fspath(path)) from None


def subset(dataset: str | os.PathLike, out: str | os.PathLike, *,
           classes: Sequence[str] | None = None,
           keys: Iterable[str] | None = None,
           exclude_keys: Iterable[str] | None = None,
           where: str | None = None,
           fraction: float | None = None,
           seed: int = 0,
           stratify: bool = False,
           exclude: Sequence[str | os.PathLike] = (),
           exclude_indices: Sequence[int] | None = None,
           overwrite: bool = False,
           progress: bool | None = None,
           allow_outside: bool = False,
           scheduler: Any = None, ray: Any = None, workers: int | None = None,
           resume: bool = False,
           on_event: Callable[[str], None] | None = None) -> SubsetResult:
    """Write a view of ``dataset`` at ``out`` (``NAME.fastdata.json``, in the
    dataset's folder or above it) selecting the records that pass every
    selector given; the payloads are not copied.

    Args:
        classes: keep records of these class names.
        keys: keep only the records with these keys.
        exclude_keys: drop the records with these keys.
        where: keep records whose metadata passes the expression
            (:mod:`fastdata.ops.where`).
        fraction: then keep this fraction (0 < F <= 1) of what is left,
            exactly ``round(F * n)`` records, drawn with ``seed``; with
            ``stratify`` that fraction of each class.
        exclude: drop records whose bytes one of these datasets holds (a
            validation set, by content digest; each read as it is now: its
            current version, or a view).
        exclude_indices: drop the records at these indices of ``dataset``
            (what ``fastdata dedup --write-view`` drops).
        overwrite: replace an existing view file.
        scheduler: flag the records on a Dask cluster (its scheduler's
            address or a ``distributed.Client``); ``ray``: on a Ray cluster
            (its address, or True for ``$FASTDATA_RAY``). The workers must
            see the datasets and ``$FASTDATA_STAGING_DIR`` at the same paths.
        workers: processes on this machine (None: one per usable core).
        resume: continue an interrupted run of the same selection (its
            finished pieces are kept in its work folder).
        on_event: called with each note (a run kept or started over).

    What grows: memory per process does not grow with the parent's records
    but for one bit per record, the selection this process builds (each
    part's bitmap, and up to as much again in runs while those are
    smaller); each process holds the keys given (``keys``,
    ``exclude_keys``) and this one ``exclude_indices`` (8 bytes each). A
    worker holds one piece's flags and labels. On disk while it runs, in
    the work folder (``$FASTDATA_STAGING_DIR``, else the temporary folder):
    one bit per record and 4 bytes per flagged one, and with ``exclude`` 28
    bytes per flagged record and per record of each excluded dataset. The
    view written holds the selection (runs or a bitmap, compressed).

    Returns:
        a :class:`SubsetResult`; the view is the same, byte for byte,
        wherever the pieces ran.

    Raises:
        FastDataError: an unknown class, an expression outside the language,
            a fraction outside (0, 1], a view outside the parent's folder, or
            nothing selected.
    """
    from fastdata.dataset.views import register_view, write_view
    from fastdata.ops.piece_readers import (
        base_of,
        close_root,
        open_described,
        run_then_merge,
    )
    from fastdata.ops.subset_merge import combine, missing_keys

    if fraction is not None and not 0 < float(fraction) <= 1:
        raise FastDataError(f"fraction must be in (0, 1], not {fraction}")
    if stratify and fraction is None:
        raise FastDataError("stratify applies to a fraction: give fraction= too")
    if where:
        from fastdata.ops.where import compile_where

        compile_where(where)  # refused here, before any piece runs
    out = os.fspath(out)
    if not out.lower().endswith(".fastdata.json"):
        raise FastDataError("a view file's name ends in .fastdata.json; name it "
                            "NAME.fastdata.json", path=out)
    out = out if "://" in out else os.path.abspath(out)
    keep = sorted(set(keys)) if keys is not None else None
    drop_keys = sorted(set(exclude_keys)) if exclude_keys is not None else None
    parent, n, rules, drop = _parent(dataset, classes, keep, drop_keys, where, exclude,
                                     exclude_indices, allow_outside)
    job = _job(parent, n, drop, rules, exclude, allow_outside)
    cluster = {"scheduler": scheduler, "ray": ray, "workers": workers}
    with run_then_merge(job, cluster, resume=resume, progress=progress,
                        on_event=on_event) as run:
        given = root = open_described(parent)
        try:
            root, record, name = base_of(given)
            made = combine(run, root, record, fraction, seed, stratify)
            if made.selected == 0:
                raise FastDataError("the selectors select no record; nothing written: "
                                    "give selectors that some record passes", path=out)
            asked = _asked(classes=list(classes) if classes else None,
                           keys=len(keep) if keep is not None else None,
                           exclude_keys=len(drop_keys) if drop_keys is not None else None,
                           where=where, fraction=fraction,
                           seed=seed if fraction is not None else None,
                           stratify=stratify or None,
                           exclude=[os.fspath(p) for p in exclude] or None,
                           exclude_indices=len(drop) if drop is not None else None)
            view = _view_record(record, given, out, name, made.stored, made.counts, asked,
                                made.payload)
            view = write_view(view, overwrite=overwrite)
            registered = register_view(name, view) if name else False
            missing_count, missing = missing_keys(run, rules.get("listed"))
        finally:
            close_root(given, root)
    run.finish()
    return SubsetResult(out, (view.of or {}).get("path") or name or os.fspath(dataset),
                        made.selected, n, missing, missing_count, made.excluded, registered)


def _asked(**selectors) -> dict:
    """The selectors a view records (those given)."""
    return {k: v for k, v in selectors.items() if v is not None}


def _parent(dataset, classes, keep, drop_keys, where, exclude, exclude_indices,
            allow_outside: bool) -> tuple[dict, int, dict, np.ndarray | None]:
    """How pieces open the parent (its base records), their count, the
    rules every piece tests, and ``exclude_indices`` as base indices; the
    parent is closed again before the pieces run."""
    from fastdata.dataset.resolve import open_reader
    from fastdata.ops.piece_readers import base_of, close_root, describe_dataset

    given = root = open_reader(dataset, allow_outside=allow_outside)
    try:
        root, _, _ = base_of(given)
        rules = _rules(root, classes, keep, drop_keys, where, bool(exclude), dataset)
        drop = _dropped(given, root, exclude_indices, dataset)
        return describe_dataset(given, allow_outside), len(root), rules, drop
    finally:
        close_root(given, root)


def _rules(root, classes, keep, drop_keys, where, digests: bool, dataset) -> dict:
    """What every piece tests (see fastdata.ops.subset_pieces.select_piece)."""
    import hashlib
    import json

    from fastdata.ops.where import reads_field

    names = list(root.classes)
    wanted = None
    if classes:
        unknown = [c for c in classes if c not in names]
        if unknown:
            raise FastDataError(f"no class {', '.join(map(repr, unknown))} in the dataset; "
                                f"its classes: {', '.join(names[:20])}"
                                f"{' ...' if len(names) > 20 else ''}",
                                path=os.fspath(dataset))
        wanted = [names.index(c) for c in classes]
    rules = {"classes": wanted, "where": where or None, "digests": digests,
             "keep": keep, "drop": drop_keys,
             "where_key": bool(where) and reads_field(where, "key")}
    if keep is not None or drop_keys is not None:
        rules["listed"] = sorted(set(keep or ()) | set(drop_keys or ()))
        rules["keys_digest"] = hashlib.sha256(json.dumps(
            [keep, drop_keys], ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()
    return rules


def _dropped(given, root, exclude_indices, dataset) -> np.ndarray | None:
    """``exclude_indices`` as base indices, sorted, each once (None: none)."""
    if exclude_indices is None:
        return None
    drop = np.unique(np.asarray(list(exclude_indices), np.int64))
    if len(drop) and (drop[0] < 0 or drop[-1] >= len(given)):
        bad = int(drop[0] if drop[0] < 0 else drop[-1])
        raise FastDataError(f"exclude_indices holds {bad}, outside the {len(given):,} "
                            f"records; give indices from 0 to {len(given) - 1:,}",
                            path=os.fspath(dataset))
    return np.sort(given.base_of(drop)) if root is not given else drop


def _job(parent: dict, n: int, drop, rules: dict, exclude, allow_outside: bool):
    """The job's pieces (fastdata.ops.subset_pieces): the parent's ranges,
    and the records of each ``exclude`` dataset, read as they are now."""
    import hashlib

    from fastdata.jobs.runner import Job
    from fastdata.ops.dedup_pieces import plan_pieces
    from fastdata.ops.piece_readers import describe
    from fastdata.ops.subset_pieces import plan, subset_piece

    # Absolute: a worker of a cluster need not run in this folder.
    paths = [os.fspath(p) for p in exclude]
    others, counts = describe([p if "://" in p else os.path.abspath(p) for p in paths],
                              bool(allow_outside))
    drop = drop if drop is not None else np.zeros(0, np.int64)
    pieces: list[tuple] = [("select", start, end, drop[np.searchsorted(drop, start):
                                                      np.searchsorted(drop, end)].tolist())
                           for start, end in plan(n)]
    pieces += [("exclude", d + 1, start, end) for d, start, end in plan_pieces(counts)]
    shared = {k: v for k, v in rules.items() if k not in ("keep", "drop", "listed")}
    fingerprint = {"parent": dict(parent, records=n), "rules": shared,
                   "exclude": [dict(d, records=c) for d, c in zip(others, counts)],
                   "dropped": hashlib.sha256(drop.tobytes()).hexdigest(),
                   "pieces": len(pieces)}
    return Job("subset", fingerprint, subset_piece, pieces, common=([parent, *others], rules),
               sizes=[p[3] - p[2] if p[0] == "exclude" else p[2] - p[1] for p in pieces])


def _view_record(record, given, out: str, name, stored: list, counts, asked, payload):
    """The view to write at ``out``: ``record``'s parts with the new
    selections (``stored``: each part's stored form), every name re-rooted
    at the view's folder."""
    import dataclasses

    from fastdata.dataset.views import name_in
    from fastdata.storage.urls import join

    root = given.root if getattr(given, "record", None) is not None else _pack_folder(given)

    def moved(rel: str) -> str:
        whole = join(root, rel)
        return name_in(out, whole if "://" in whole else os.path.normpath(whole))

    parts = [dataclasses.replace(p, path=moved(p.path), selection=s)
             for p, s in zip(record.parts, stored)]
    columns = [{**c, "path": moved(c["path"])} for c in record.columns]
    labels = record.labels and {**record.labels, "path": moved(record.labels["path"])}
    of = {"path": name_in(out, name) if name else None,
          "version": record.number if record.kind == "version" else (record.of or {}).get(
              "version"),
          "sha256": record.sha256 if record.kind == "version" else (record.of or {}).get(
              "sha256")}
    return dataclasses.replace(
        record, kind="view", records=sum(p.selected for p in parts), class_counts=counts.tolist(),
        parts=parts, columns=columns, labels=labels, number=None, parent=None,
        parent_sha256=None, change="", summary="", of=of, selected_by=asked,
        payload_bytes=payload, created_at="", path=out, sha256="")


def _pack_folder(reader) -> str:
    from fastdata.dataset.history import dataset_folder

    return dataset_folder(reader.dataset_path)

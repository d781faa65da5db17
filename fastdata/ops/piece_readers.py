"""Datasets as a job's pieces open them.

The machine that plans a job describes each dataset once, as it is read
now, so that every piece reads the same records: :func:`describe` by path
and version, :func:`describe_dataset` from a reader the resolver gave. A
worker process opens each description once and keeps the few it used last
open for its next pieces: :func:`piece_reader`, :func:`described_reader`,
and :func:`open_root` for the base records (every part's, unselected) of a
version or a view. :func:`run_then_merge` runs a job and closes those its
pieces opened in the process that planned it before the merge opens the
dataset there again."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

#: Readers this process opened for pieces, by (process, what they read): a
#: worker running many pieces opens each dataset once; the least recently
#: used of more than the limit (``OPEN_READERS``, ``OPEN_DESCRIBED``,
#: ``OPEN_ROOTS``) is closed.
_READERS: dict = {}
_DESCRIBED: dict = {}
_ROOTS: dict = {}
OPEN_READERS, OPEN_DESCRIBED, OPEN_ROOTS = 4, 2, 2


def _cached(cache: dict, token: Any, limit: int, opener: Callable[[], Any],
            closer: Callable[[Any], None]):
    """What ``opener`` opens for ``token``, opened once per process and kept
    in ``cache``; the least recently used of more than ``limit`` is closed."""
    key = (os.getpid(), token)
    found = cache.pop(key, None)
    if found is None:
        for old in [k for k in cache if k[0] != os.getpid()]:
            del cache[old]  # a forked parent's: never used across fork
        while len(cache) >= limit:  # a long-lived worker of many jobs
            closer(cache.pop(next(iter(cache))))
        found = opener()
    cache[key] = found  # the most recent last
    return found


def _release(cache: dict, closer: Callable[[Any], None]) -> None:
    """Close what this process holds in ``cache``."""
    for key in [k for k in cache if k[0] == os.getpid()]:
        closer(cache.pop(key))


@contextlib.contextmanager
def run_then_merge(job, cluster: dict, *, resume: bool, progress: bool | None,
                   on_event) -> Iterator:
    """Run ``job`` (fastdata.jobs.runner.Job) on the executor ``cluster``
    names (``scheduler``, ``ray``, ``workers``), then the block that merges
    its results: the readers its pieces opened in this process (with
    :func:`described_reader`, :func:`open_root`) are closed first, since the
    merge opens the dataset again and LMDB opens a file once per process. A
    failure in the block removes the work folder, an interruption keeps it
    for ``resume`` (``JobRun.merging``). Yields the run; the caller calls
    its ``finish()`` once done with its files."""
    from fastdata.jobs.choose import open_executor
    from fastdata.jobs.runner import run_job

    with contextlib.closing(open_executor(**cluster, on_event=on_event)) as executor:
        try:
            run = run_job(job, executor, resume=resume, progress=progress,
                          on_event=on_event)
        finally:
            release_described()
            release_roots()
        with run.merging(executor):
            yield run


# -- by path and version ---------------------------------------------------------------


def describe(paths: list[str], allow_outside: bool) -> tuple[list[dict], list[int]]:
    """How a piece opens each dataset of ``paths`` (path, the version read
    now, ``allow_outside``; the manifest's ``created_at`` too, so that a job
    resumed over a re-packed dataset is another job), and their record
    counts. The readers are closed again before pieces run: none is open
    across a fork."""
    from fastdata.dataset.resolve import open_reader

    datasets, counts = [], []
    for where in paths:
        reader = open_reader(where, allow_outside=allow_outside)
        try:
            # A view's or a version's own file is one version: it is opened as it is.
            pinned = _names_one_version(where)
            datasets.append({"path": where,
                             "version": None if pinned else getattr(reader, "version", None),
                             "allow_outside": allow_outside,
                             "created_at": reader.manifest.created_at})
            counts.append(len(reader))
        finally:
            reader.close()
    return datasets, counts


def _names_one_version(where) -> bool:
    from fastdata.dataset.resolve import classify

    return isinstance(where, (str, os.PathLike)) and \
        classify(where) in ("view", "version")


def piece_reader(spec: dict):
    """The reader of the dataset ``spec`` (from :func:`describe`; a
    ``verify`` entry opens it with that setting) in this process."""
    from fastdata.dataset.resolve import open_reader

    # created_at: a dataset packed again at the same path is another dataset.
    token = (spec["path"], spec.get("version"), spec.get("allow_outside"),
             spec.get("verify"), spec.get("created_at"))
    return _cached(_READERS, token, OPEN_READERS, lambda: open_reader(
        spec["path"], version=spec.get("version"), allow_outside=spec.get("allow_outside"),
        verify=spec.get("verify")), lambda reader: reader.close())


# -- from a reader the resolver gave ---------------------------------------------------


def describe_dataset(given, allow_outside: bool) -> dict:
    """How a piece opens the dataset ``given`` (a reader the resolver gave)
    as it is read now, without reading its version record again (``fastdata
    gc`` may remove that record meanwhile; the parts stay while a kept
    version names them): a version by its record itself (JSON), a view by
    its file, a pack never changed by its files."""
    def absolute(path) -> str:
        path = os.fspath(path)
        return path if "://" in path else os.path.abspath(path)

    record = getattr(given, "record", None)
    spec = {"verify": bool(given.verify), "allow_outside": bool(allow_outside),
            "created_at": given.manifest.created_at}
    if record is None:
        return {"pack": absolute(given.dataset_path), **spec}
    if record.kind == "view":
        return {"view": absolute(record.path), "sha256": record.sha256, **spec}
    return {"version": absolute(record.path), "record": record.encode().decode("utf-8"),
            **spec}


def open_described(spec: dict):
    """A reader of the dataset :func:`describe_dataset` described (the
    caller closes it)."""
    from fastdata.dataset.reader import DatasetReader
    from fastdata.dataset.record import parse_record
    from fastdata.dataset.resolve import open_reader
    from fastdata.formats import open_reader as open_files

    options = {"verify": spec["verify"], "allow_outside": spec["allow_outside"]}
    if "pack" in spec:
        return open_files(spec["pack"], **options)
    if "view" in spec:
        return open_reader(spec["view"], **options)
    where = spec["version"]
    return DatasetReader(where, record=parse_record(spec["record"].encode("utf-8"), where),
                         **options)


def described_reader(spec: dict):
    """:func:`open_described`'s reader of ``spec``, opened once per process."""
    return _cached(_DESCRIBED, json.dumps(spec, sort_keys=True), OPEN_DESCRIBED,
                   lambda: open_described(spec), lambda reader: reader.close())


def release_described() -> None:
    """Close the readers this process opened for pieces with
    :func:`described_reader` (a job's pieces run in the process that plans
    it when it has one worker)."""
    _release(_DESCRIBED, lambda reader: reader.close())


def read_version(reader) -> tuple[str, Any]:
    """The dataset's name and the version ``reader`` reads, as a record
    (a pack never changed: its version 1)."""
    from fastdata.dataset.commit import pack_record

    record = getattr(reader, "record", None)
    if record is not None:
        return reader.dataset_path, record
    return reader.dataset_path, pack_record(reader, reader.dataset_path)


# -- the base records of a version or a view -------------------------------------------


def open_root(spec: dict):
    """``(given, root)`` for the dataset ``spec`` (:func:`describe_dataset`)
    in this process, opened once per process (see :func:`base_of`)."""

    def opener():
        given = open_described(spec)
        try:
            return given, base_of(given)[0]
        except BaseException:
            given.close()
            raise

    return _cached(_ROOTS, json.dumps(spec, sort_keys=True), OPEN_ROOTS, opener,
                   lambda pair: close_root(*pair))


def release_roots() -> None:
    """Close the roots this process opened with :func:`open_root`."""
    _release(_ROOTS, lambda pair: close_root(*pair))


def close_root(given, root) -> None:
    """Close what :func:`open_root` or :func:`base_of` opened."""
    if root is not given:
        root.parts = []  # the parts are given's, closed with it
    given.close()


def base_of(given):
    """``(root, record, dataset)``: a reader of the base records (every
    part's records, unselected) of ``given``, its record, and the dataset's
    name. ``root`` is ``given`` when no part has a selection."""
    import dataclasses

    from fastdata.contained import Folder
    from fastdata.dataset.reader import DatasetReader
    from fastdata.formats.remote_files import absolute

    name, record = read_version(given)
    if getattr(given, "record", None) is None:  # a pack never changed
        return given, record, name
    if record.kind == "view":
        name = dataset_of(given)
    if all(p.selection is None for p in record.parts):
        return given, record, name
    whole = dataclasses.replace(
        record, records=record.base_records, class_counts=[0] * len(record.classes),
        parts=[dataclasses.replace(p, selection=None) for p in record.parts], sha256="")
    # The names DatasetReader resolves its parts' at, so that it takes these.
    inside = Folder(given.root, where=given.path, links_out=given.allow_outside)
    opened = {absolute(inside.path(p.path, "parts")): r
              for p, r in zip(record.parts, given.parts)}
    for reader in given.parts:
        if reader.sharded:
            reader.coalesce = None
    root = DatasetReader(given.path, record=whole, opened=opened, **given.child_options())
    return root, record, name


def dataset_of(given) -> str | None:
    """The dataset a version or a view reads (None: unknown)."""
    record = given.record
    if record.kind == "version":
        return given.dataset_path
    of = (record.of or {}).get("path")
    if not isinstance(of, str):
        return None
    from fastdata.storage.urls import dirname, join

    where = join(dirname(given.path), of)
    return where if "://" in where else os.path.normpath(where)

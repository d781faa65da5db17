"""The resolver: a path (or a :class:`DatasetRef`) opened as a dataset, once
(no torch).

A path is one of: a mixture file (read by ``fastdata.mix``), a view file,
a version record, or a packed dataset's files. A pack is opened with its
format's reader; when the dataset has changed since (``NAME.versions/``
holds versions), its current version's record is read and every part is
opened once, the pack's reader reused as the part it is. Formats know
nothing of this: they read the files of one pack.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastdata.dataset.ref import DatasetRef
from fastdata.errors import FastDataError

if TYPE_CHECKING:
    from fastdata.formats.reader import Reader


def classify(path) -> str:
    """``"mixture"``, ``"view"``, ``"version"`` or ``"pack"``: what ``path``
    holds (a list of shard files is a pack)."""
    from fastdata.dataset.history import is_version_file, is_view_file
    from fastdata.mixture_file import is_mixture_file

    if isinstance(path, DatasetRef):
        path = path.path
    if isinstance(path, Mapping) or is_mixture_file(path):
        return "mixture"
    if is_view_file(path):
        return "view"
    if is_version_file(path):
        return "version"
    return "pack"


def format_of(path):
    """The format spec of the dataset at ``path`` (a pack, a view or a version
    record: the format its record names)."""
    from fastdata.formats.registry import detect_format, get_format

    if isinstance(path, DatasetRef):
        path = path.path
    kind = classify(path)
    if kind in ("view", "version"):
        from fastdata.dataset.history import read_record

        return get_format(read_record(os.fspath(path)).format)
    return detect_format(path)


def open_reader(where, *, version: int | None = None, verify: bool | None = None,
                allow_outside: bool | None = None,
                settings: Mapping[str, Any] | None = None) -> Reader:
    """Open the dataset at ``where`` (a path, URL, list of shard files or a
    :class:`DatasetRef`): its current version, or version ``version``
    (``fastdata info --history`` lists them). A view file opens as the view.

    Returns:
        The format's own reader for a dataset never changed, a
        :class:`fastdata.dataset.reader.DatasetReader` for a version or a view.

    Raises:
        FastDataError: no such version; ManifestError: a damaged record or
            a part that changed.
    """
    ref = DatasetRef.of(where, version=version, verify=verify, allow_outside=allow_outside,
                        reader_settings=settings)
    from fastdata.dataset.history import (
        head_number,
        read_record,
        read_version,
        record_path,
    )
    from fastdata.dataset.reader import DatasetReader

    options = {"verify": ref.verify, "allow_outside": ref.allow_outside,
               "settings": ref.reader_settings}
    path = ref.path
    kind = "pack" if isinstance(path, (list, tuple)) else classify(path)
    if kind == "mixture":
        raise FastDataError("a mixture file holds several datasets: read it with "
                            "fastdata.open_dataset or fastdata.mix", path=os.fspath(path))
    if kind in ("view", "version"):
        if ref.version is not None:
            raise FastDataError(f"a {kind} file is one version already; give the dataset's "
                                f"own path with version=", path=os.fspath(path))
        record = read_record(os.fspath(path))
        return DatasetReader(record.path, record=record, **options)
    probe = None if isinstance(path, (list, tuple)) else _early_pointer(path)
    pack = _open_pack(path, options)
    if isinstance(path, (list, tuple)):
        if ref.version is not None:
            raise FastDataError("a list of shard files has no versions; open the dataset's "
                                "manifest with version=")
        return pack
    try:
        name = pack.dataset_path
        head = probe[1].result() if probe and probe[0] == name else head_number(name)
        if head is None:
            if ref.version not in (None, 1):
                raise FastDataError(f"the dataset has no version {ref.version} (it has only "
                                    f"version 1, the pack)", path=name)
            return pack
        number = head if ref.version is None else ref.version
        if number > head:
            raise FastDataError(f"the dataset has no version {number} (it has 1 to {head}; "
                                f"fastdata info --history lists them)", path=name)
        record = read_version(name, number)
    except BaseException:
        pack.close()
        raise
    return DatasetReader(record_path(name, number), record=record,
                         opened={pack_key(pack): pack}, **options)


def _early_pointer(path):
    """For a manifest at a URL: ``(dataset name, future of its version
    pointer)``, asked for now, so that its round trip overlaps the pack's
    own (manifest, index) instead of following them; None locally."""
    from fastdata.formats.remote_files import is_remote

    text = os.fspath(path)
    if not is_remote(text) or not text.endswith(".fastdata.json"):
        return None
    from fastdata.dataset.history import head_number
    from fastdata.storage.forked import process_threads

    # A sharded pack's name is its manifest (checked against the pack once open).
    return text, process_threads("fastdata-open", 4).submit(head_number, text)


def pack_key(reader) -> str:
    """The absolute path a part opened as ``reader`` has in a record."""
    from fastdata.formats.remote_files import absolute

    return absolute(reader.dataset_path)


def _open_pack(path, options: dict):
    from fastdata.formats.registry import detect_format

    return detect_format(path).load_reader().open(path, **options)


def dataset_path(where, *, allow_outside: bool = False) -> str:
    """The name a dataset's versions are kept under, whatever names it: a
    shard pattern, the manifest, a version record (a view: its own file)."""
    from fastdata.dataset.history import dataset_of_record

    path = where.path if isinstance(where, DatasetRef) else where
    kind = classify(path)
    if kind == "version":
        return dataset_of_record(os.fspath(path))
    if kind == "view":
        return os.fspath(path)
    with _open_pack(path, {"verify": True, "allow_outside": allow_outside,
                           "settings": None}) as reader:
        return reader.dataset_path


def read_manifest(where, *, version: int | None = None, allow_outside: bool | None = None):
    """The manifest of the dataset at ``where`` (a path, URL or
    :class:`DatasetRef`): its current version's, or version ``version``'s."""
    with open_reader(where, version=version, allow_outside=allow_outside) as reader:
        return reader.manifest

"""Choosing the source for a path: an image folder, a list file, Parquet or a
packed dataset."""

from __future__ import annotations

import os
from collections.abc import Iterable

from fastdata.errors import FastDataError
from fastdata.packers.source import ImageFolderSource, Source

#: List and table files, by extension (any letter case).
FILE_KINDS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl",
              ".parquet": "parquet"}


def source_kind(path: str | os.PathLike) -> str:
    """What ``path`` is read as: "csv", "tsv", "jsonl" or "parquet" for a file
    with one of those extensions (``.ndjson`` is JSON Lines too) and for a
    folder holding ``.parquet`` files and no sub-folder (hidden ones aside);
    "dataset" for a packed dataset (a format's extension, such as ``.lmdb``,
    ``.h5`` or ``.tar``, shard patterns included; a ``.fastdata.json``
    manifest; a folder or file that a format's probe recognises); "folder"
    for anything else (an ImageFolder tree, or a path that
    :class:`ImageFolderSource` will say is missing or not a folder)."""
    text = os.fspath(path)
    if os.path.isdir(text) and _is_parquet_folder(text):
        return "parquet"
    kind = FILE_KINDS.get(os.path.splitext(text)[1].lower())
    if kind is not None and not os.path.isdir(text):
        return kind
    return "dataset" if _is_dataset(text) else "folder"


def open_source(path: str | os.PathLike, *, path_column: str | None = None,
                label_column: str | None = None,
                extensions: Iterable[str] | str | None = None,
                allow_outside: bool = False) -> Source:
    """The :class:`~fastdata.Source` for ``path``, chosen by :func:`source_kind`.

    Args:
        path: an image folder, a ``.csv``/``.tsv``/``.jsonl`` list, a
            ``.parquet`` file or a folder of them, or a packed dataset (read
            as a :class:`~fastdata.packers.sources.dataset.DatasetSource`).
        path_column: the column holding each image: its path in a list
            (default ``path``), the image struct, bytes or path in Parquet
            (default ``image``).
        label_column: the column holding the labels (default: ``label`` when
            there is one; without, the records are unlabelled: label -1, no classes).
        extensions: an image folder's extensions (see :class:`ImageFolderSource`).
        allow_outside: let a list's or table's paths, or a dataset's links,
            lead out of its folder (see fastdata.contained); an image folder
            follows its links as torchvision does, whatever this says.

    Raises:
        SourceError: what the chosen source refuses (missing, malformed ...).
        FastDataError: an option that does not apply to this kind of source,
            or a URL (sources are read from local paths).
    """
    from fastdata.formats.registry import check_local
    from fastdata.formats.remote_files import is_remote

    check_local(path)
    if is_remote(os.fspath(path)):
        raise FastDataError("sources are read from local paths: download the list or "
                            "folder, then pack the local copy", path=os.fspath(path))
    kind = source_kind(path)
    if kind == "dataset":
        if path_column is not None or label_column is not None or extensions is not None:
            raise FastDataError("path_column=, label_column= and extensions= do not apply to "
                                "a packed dataset: its records, keys and labels are taken "
                                "as stored", path=os.fspath(path))
        from fastdata.packers.sources.dataset import DatasetSource

        return DatasetSource(path, allow_outside=allow_outside)
    if kind == "folder":
        if path_column is not None or label_column is not None:
            raise FastDataError("path_column= and label_column= apply to list files (.csv, "
                                ".tsv, .jsonl) and Parquet, not to an image folder",
                                path=os.fspath(path))
        return ImageFolderSource(path, extensions=extensions)
    if extensions is not None:
        raise FastDataError("extensions= applies to an image folder, not to a list file or "
                            "Parquet (they name their images)", path=os.fspath(path))
    if kind == "parquet":
        from fastdata.packers.sources.parquet import IMAGE_COLUMN, ParquetSource

        return ParquetSource(path, image_column=path_column or IMAGE_COLUMN,
                             label_column=label_column, allow_outside=allow_outside,
                             _column_option="path_column")
    from fastdata.packers.sources.listed import PATH_COLUMN

    if kind == "jsonl":
        from fastdata.packers.sources.json_lines import JSONLinesSource

        return JSONLinesSource(path, path_column=path_column or PATH_COLUMN,
                               label_column=label_column, allow_outside=allow_outside)
    from fastdata.packers.sources.csv_list import CSVSource

    return CSVSource(path, path_column=path_column or PATH_COLUMN, label_column=label_column,
                     allow_outside=allow_outside)


def _is_dataset(path: str) -> bool:
    """A packed dataset: recognised by a format's probe (cheap: they look for
    a format's files, never read a dataset), or named so, unless it is a
    folder with sub-folders (an image folder of that name: a dataset folder,
    LMDB's, has none)."""
    from fastdata.formats.registry import FORMATS, MANIFEST_SUFFIX, known_extensions

    if os.path.exists(path) and any(spec.probe is not None and spec.probe(path)
                                    for spec in FORMATS.values()):
        return True
    if not path.rstrip("/\\").lower().endswith((MANIFEST_SUFFIX, *known_extensions())):
        return False
    return not (os.path.isdir(path) and _has_subfolders(path))


def _has_subfolders(folder: str) -> bool:
    try:
        with os.scandir(folder) as it:
            return any(e.is_dir() for e in it)
    except OSError:
        return False


def _is_parquet_folder(folder: str) -> bool:
    try:
        with os.scandir(folder) as it:
            visible = [e for e in it if not e.name.startswith(".")]
    except OSError:
        return False
    if any(e.is_dir() for e in visible):
        return False
    return any(e.name.lower().endswith(".parquet") for e in visible)


__all__ = ["FILE_KINDS", "open_source", "source_kind"]

"""Joined columns: per-record values from a table, stored beside the
dataset as plain arrays (no pickle, no torch).

A join writes one folder of files named by each column's position in the
join (``cNNNN``), never by the column's name:

    present.npy            bool per record: the table had its row
    cNNNN.missing.npy      bool per record, where a row's value was missing or null
    cNNNN.npy              a value per record (int64, float64, float32 or bool),
                           or a fixed-length vector ``(records, D)`` of those
    cNNNN.utf8             text of every record, one after another (UTF-8),
    cNNNN.offsets.npy      and where each record's starts (int64, records + 1)
    labels.npy             with a label column: every record's label (int64)

The description a join returns, kept in the version record, maps each
column's name to its kind and its files (``{"caption": {"kind": "string",
"files": {"text": "c0000.utf8", "offsets": "c0000.offsets.npy"}}}``) and
lists each file's SHA-256 (``sha256``), checked when the file is first
read; a reader opens only files named there. Entries of the first layout
(no ``files``: files named after the column) are read through the same
checks. Text columns hold strings, or JSON for other values (``kind:
"json"``). What grows with the dataset: the columns themselves (a
512-float32 embedding is 2 KB per record), read memory-mapped, not loaded.
"""

from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np

from fastdata.errors import ManifestError

KINDS = ("number", "vector", "string", "json", "bool")
#: The files a column of each kind has (besides ``missing``), and their suffixes.
ROLES = {"number": ("values",), "bool": ("values",), "vector": ("values",),
         "string": ("text", "offsets"), "json": ("text", "offsets")}
SUFFIXES = {"values": ".npy", "text": ".utf8", "offsets": ".offsets.npy",
            "missing": ".missing.npy"}


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- reading ----------------------------------------------------------------------

class JoinedColumns:
    """The columns one join wrote, read per record (memory-mapped, each file
    checked against its SHA-256 when first used). Only files the entry's
    ``sha256`` map lists are opened, each a plain name inside ``folder``.

    Args:
        folder: the column folder (local, or a URL: files fetched whole into
            the shared cache).
        entry: the version record's entry for it.

    Raises:
        ManifestError: the entry names a file that is not a plain name, or
            that its ``sha256`` map does not list.
    """

    def __init__(self, folder: str, entry: dict) -> None:
        self.folder, self.entry = folder, entry
        self._where = str(entry.get("path") or folder)
        try:
            self.records = int(entry["records"])
            digests, columns = entry["sha256"], entry["columns"]
        except (KeyError, TypeError, ValueError):
            raise self._refused("lacks its records, columns or sha256 field") from None
        if not isinstance(digests, dict) or not isinstance(columns, dict):
            raise self._refused("has a columns or sha256 field that is not a map")
        for file in digests:
            if not _plain_name(file):
                raise self._refused(f"lists the file {file!r}, not a plain file name")
        #: name -> (kind, role -> file, written by the first layout?)
        self._layout = {name: self._files(name, spec) for name, spec in columns.items()}
        self._owner = {f: n for n, (_, files, _) in self._layout.items() for f in files.values()}
        self.names = list(self._layout)
        self._arrays: dict[str, np.ndarray] = {}
        self._texts: dict[str, np.ndarray] = {}

    def _refused(self, what: str) -> ManifestError:
        return ManifestError(f"the joined-columns entry {self._where} {what}; restore the "
                             f"version record from a copy, or join the table again",
                             path=self.folder)

    def _files(self, name: str, spec) -> tuple[str, dict, bool]:
        """A column's kind and files: from its ``files`` map, or (first
        layout) named after it."""
        kind = spec.get("kind") if isinstance(spec, dict) else None
        if kind not in KINDS:
            raise self._refused(f"gives column {name!r} a kind this fastdata does not read")
        listed = self.entry["sha256"]
        legacy = "files" not in spec
        if legacy:
            files = {role: f"{name}{SUFFIXES[role]}" for role in (*ROLES[kind], "missing")}
            if files["missing"] not in listed:
                del files["missing"]
        else:
            files = spec["files"]
            if not isinstance(files, dict):
                raise self._refused(f"gives column {name!r} a files field that is not a map")
        for role in ROLES[kind]:
            if role not in files:
                raise self._refused(f"gives column {name!r} no {role} file")
        for role, file in files.items():
            if not _plain_name(file):
                raise self._refused(f"names the {role} file of column {name!r} {file!r}, "
                                    f"not a plain file name")
            if file not in listed:
                raise self._refused(f"names the {role} file of column {name!r} {file!r}, "
                                    f"which its sha256 map does not list")
        return kind, dict(files), legacy

    def __getstate__(self):
        return {**self.__dict__, "_arrays": {}, "_texts": {}}

    def _file(self, file: str) -> str:
        from fastdata.formats.remote_files import local_copy
        from fastdata.storage.urls import join

        return local_copy(join(self.folder, file))

    def _checked(self, file: str) -> str:
        from fastdata.errors import CorruptDataError

        if file not in self.entry["sha256"]:  # names listed there are plain (checked)
            raise self._refused(f"has no file {file!r} in its sha256 map")
        path = self._file(file)
        if _sha256(path) != self.entry["sha256"][file]:
            owner = self._owner.get(file)
            of = f" (column {owner!r})" if owner is not None else ""
            raise CorruptDataError(f"joined column file {file}{of} fails its SHA-256 check; "
                                   f"join the table again", path=path)
        return path

    def array(self, file: str) -> np.ndarray:
        """A ``.npy`` file the entry lists, memory-mapped (checked once)."""
        found = self._arrays.get(file)
        if found is None:
            found = self._arrays[file] = np.load(self._checked(file), mmap_mode="r",
                                                 allow_pickle=False)
        return found

    def text(self, file: str) -> np.ndarray:
        """A ``.utf8`` file the entry lists, as bytes (checked once)."""
        found = self._texts.get(file)
        if found is None:
            path = self._checked(file)  # checked whatever its size
            found = self._texts[file] = np.memmap(path, dtype=np.uint8, mode="r") \
                if os.path.getsize(path) else np.zeros(0, np.uint8)
        return found

    def values(self, indices) -> list[dict]:
        """Each record's joined values (``{}`` for a record without a row, or
        past the records the join covered)."""
        out = []
        present = self.array("present.npy")
        for i in (int(j) for j in indices):
            if i >= self.records or not present[i]:
                out.append({})
                continue
            out.append({name: self._value(kind, files, legacy, i)
                        for name, (kind, files, legacy) in self._layout.items()})
        return out

    def _value(self, kind: str, files: dict, legacy: bool, i: int):
        if "missing" in files and self.array(files["missing"])[i]:
            return None
        if kind in ("number", "bool"):
            value = self.array(files["values"])[i].item()
            # The first layout read a NaN as missing; this one keeps NaN a value.
            return None if legacy and isinstance(value, float) and math.isnan(value) \
                else value
        if kind == "vector":
            return np.array(self.array(files["values"])[i])
        offsets = self.array(files["offsets"])
        raw = bytes(self.text(files["text"])[offsets[i]:offsets[i + 1]]).decode("utf-8")
        return raw if kind == "string" else (json.loads(raw) if raw else None)


    def check_files(self) -> list[dict]:
        """Every file of the entry against its SHA-256, for ``fastdata verify``:
        problems as ``{"index": None, "key": None, "path", "reason"}``."""
        from fastdata.errors import FastDataError

        problems = []
        for file in self.entry["sha256"]:
            try:
                self._checked(file)
            except FastDataError as exc:
                problems.append({"index": None, "key": None, "path": exc.path or self.folder,
                                 "reason": exc.message})
            except OSError as exc:
                problems.append({"index": None, "key": None, "path": f"{self.folder}/{file}",
                                 "reason": f"joined column file {file} cannot be read "
                                           f"({exc.strerror or exc}); join the table again"})
        return problems


def _plain_name(name) -> bool:
    """A file name with no folder in it: no "/", "\\", not "." or "..", not
    absolute, not empty."""
    return isinstance(name, str) and name not in ("", ".", "..") and \
        not any(c in name for c in "/\\\0") and not os.path.isabs(name)

"""Sources: what ``pack()`` reads. The ``Source`` protocol and its first implementation,
the image-folder source, which walks a class-per-folder tree like torchvision's ImageFolder.

A Source yields entries (key, label, and a file path or the bytes themselves)
in a fixed order, knows its classes, and describes itself for the manifest.

Labels are the indices of the sorted class-folder names, so they equal
``torchvision.datasets.ImageFolder(root).class_to_idx`` for the same tree.
Within a class, files are found recursively (following symlinks, as torchvision
does) and ordered the way torchvision orders them: by directory path, then by
file name. The order never depends on what the file system returns. The files
taken are those with torchvision's extensions (``IMG_EXTENSIONS``, any letter
case) unless ``extensions=`` says otherwise, so by default the samples and
their indices are torchvision's too.

Differences from torchvision, on purpose: hidden entries (names starting with
".") are ignored and counted instead of becoming classes or samples, and an
empty class folder keeps its label but is reported instead of raising.
"""

from __future__ import annotations

import os
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fastdata.encodings import TORCHVISION_EXTENSIONS, has_image_extension
from fastdata.errors import FastDataError, SourceError


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """One image of a source: where to get its bytes, and what it is.

    Attributes:
        key: a unique name within the source ("/"-separated; for files the path
            relative to the source root).
        label: class index into the source's ``classes``; -1 for an unlabelled
            record (a source without classes gives -1 for all).
        path: the file holding the image, or None when ``data`` holds it.
        data: the encoded image itself, or None when ``path`` names a file.
        metadata: per-sample facts beyond the label (JSON values: boxes,
            captions, weights ...), stored with the record; None: none.
        raw_shape: set when the bytes are decoded pixels, not an encoded image:
            uint8 RGB in HWC order of this ``(height, width, 3)`` shape (the
            records of a raw dataset being converted). Pixels have no header
            to identify them, so the entry says so; they are stored raw,
            bit for bit, unless preprocessing changes them. None: an encoded
            image, identified by its header.
    """

    key: str
    label: int
    path: str | None = None
    data: bytes | None = None
    metadata: dict | None = None
    raw_shape: tuple[int, int, int] | None = None


@runtime_checkable
class Source(Protocol):
    """What ``fastdata.pack`` reads: entries in a fixed order, and their classes.

    An implementation scans its input once; iterating twice gives the same
    entries in the same order (the output depends only on the source and the
    options). Entries are pickled to pack worker processes, so they stay small:
    a path, or the bytes of one image.
    """

    #: Class names; an entry's label indexes this list.
    classes: list[str]

    def __len__(self) -> int:
        """Number of entries."""

    def __iter__(self) -> Iterator[SourceEntry]:
        """The entries, always in the same order."""

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts for the manifest's ``source`` field: at least ``root``
        (a path or None) and ``files``; ``ignored`` counts what the scan left out."""

    def warnings(self) -> list[str]:
        """Things about the input a user should hear (for example empty classes)."""


#: The reason recorded for a file whose extension is not among those packed.
IGNORED_EXTENSION = "extension not packed (extensions= adds it)"


@dataclass(frozen=True)
class IgnoredFile:
    """A file or folder the scan passed over, and why."""

    key: str
    reason: str


@dataclass
class ImageFolderSource:
    """An ImageFolder tree, scanned once and held as a sorted list of entries
    (the first :class:`Source`).

    Args:
        root: the folder holding one sub-folder per class.
        extensions: the file extensions to pack, any letter case (see
            :func:`parse_extensions`). Default: torchvision's ``IMG_EXTENSIONS``
            (``fastdata.encodings.TORCHVISION_EXTENSIONS``), so the samples are
            ``torchvision.datasets.ImageFolder(root)``'s; ``"+gif"`` adds GIFs.
            Files with other extensions are ignored and counted.

    Raises:
        SourceError: ``root`` is missing, not a folder, has no class folders, or
            has no image files at all.
        FastDataError: ``extensions`` names no usable extension.
    """

    root: str
    extensions: Iterable[str] | str | None = None
    classes: list[str] = field(init=False)
    entries: FolderEntries = field(init=False)
    ignored: list[IgnoredFile] = field(init=False)
    #: For a subset: the class folders that are empty in the whole tree (a class
    #: merely not selected is not empty, and is not warned about).
    _empty_in_tree: list[str] | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.root = os.path.abspath(os.fspath(self.root))
        self.extensions = parse_extensions(self.extensions)
        if not os.path.exists(self.root):
            raise SourceError("source folder does not exist", path=self.root)
        if not os.path.isdir(self.root):
            raise SourceError("source is not a folder (expected one sub-folder per class), "
                              "nor a list (.csv, .tsv, .jsonl) or Parquet (.parquet) file, nor a "
                              "packed dataset (.lmdb, .h5, .tar, .tfrecord)",
                              path=self.root)
        self.ignored = []
        self.classes = self._find_classes()
        if not self.classes:
            raise SourceError(
                "no class folders found: the source must hold one sub-folder per class, "
                "each with the images of that class", path=self.root)
        found = _EntriesBuilder()
        for label, name in enumerate(self.classes):
            self._scan_class(label, name, found)
        self.entries = found.done(self.root)
        if not self.entries:
            raise SourceError(
                f"no image files found in {len(self.classes)} class folder(s); accepted "
                f"extensions: {' '.join(e[1:] for e in self.extensions)} (extensions= "
                f"takes others)", path=self.root)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as torchvision's ImageFolder has it."""
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def empty_classes(self) -> list[str]:
        """Class folders that hold no image file (they keep their label)."""
        if self._empty_in_tree is not None:
            return list(self._empty_in_tree)
        seen = set(self.entries.labels)
        return [name for i, name in enumerate(self.classes) if i not in seen]

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[SourceEntry]:
        return iter(self.entries)

    def describe(self) -> dict[str, Any]:
        return {"root": self.root, "files": len(self.entries), "ignored": len(self.ignored),
                "extensions": [e[1:] for e in self.extensions],
                "ignored_extensions": self.ignored_extensions()}

    def ignored_extensions(self) -> dict[str, int]:
        """Files ignored for their extension, counted per lower-cased extension
        (no dot; "" for a name without one), sorted by extension."""
        counts = Counter(os.path.splitext(i.key)[1].lower().lstrip(".")
                         for i in self.ignored if i.reason == IGNORED_EXTENSION)
        return dict(sorted(counts.items()))

    def warnings(self) -> list[str]:
        return [f"class folder {name!r} has no images; its label {self.class_to_idx[name]} "
                f"is kept" for name in self.empty_classes]

    def subset(self, indices) -> "ImageFolderSource":
        """The same source restricted to the entries at ``indices`` (in that order);
        classes are kept whole so labels do not change."""
        sub = object.__new__(ImageFolderSource)
        sub.root = self.root
        sub.extensions = self.extensions
        sub.classes = list(self.classes)
        sub.entries = self.entries.take(indices)
        sub.ignored = list(self.ignored)
        sub._empty_in_tree = self.empty_classes
        return sub

    def _find_classes(self) -> list[str]:
        classes = []
        with os.scandir(self.root) as it:
            for entry in it:
                if entry.name.startswith("."):
                    self.ignored.append(IgnoredFile(entry.name, "hidden"))
                elif entry.is_dir():
                    classes.append(entry.name)
                else:
                    self.ignored.append(IgnoredFile(entry.name, "file outside any class folder"))
        return sorted(classes)

    def _scan_class(self, label: int, name: str, found_entries: _EntriesBuilder) -> None:
        top = os.path.join(self.root, name)
        found: list[tuple[str, list[str]]] = []
        visited: set[str] = set()
        for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in visited:  # a symlink loop: do not walk it twice
                dirnames[:] = []
                continue
            visited.add(real)
            rel_dir = os.path.relpath(dirpath, self.root)
            for d in [d for d in dirnames if d.startswith(".")]:
                self.ignored.append(IgnoredFile(_key(rel_dir, d), "hidden"))
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            found.append((dirpath, filenames))
        # torchvision sorts os.walk's tuples (by directory path), then file names.
        for dirpath, filenames in sorted(found, key=lambda t: t[0]):
            rel_dir = os.path.relpath(dirpath, self.root)
            for fname in sorted(filenames):
                key = _key(rel_dir, fname)
                if fname.startswith("."):
                    self.ignored.append(IgnoredFile(key, "hidden"))
                elif not has_image_extension(fname, self.extensions):
                    self.ignored.append(IgnoredFile(key, IGNORED_EXTENSION))
                else:
                    found_entries.add(key, label)


class FolderEntries(Sequence):
    """An image folder's entries, held compactly: the keys as one UTF-8 blob
    (NUL-separated: no file name holds NUL), the labels as int32. A
    :class:`SourceEntry` is made when asked for.

    What grows with the folder: its keys' bytes plus 12 bytes per file (about
    45 bytes a file, where a list of SourceEntry objects took about 260).
    """

    def __init__(self, root: str, blob: bytearray, starts: array, labels: array) -> None:
        self.root, self._blob, self._starts, self.labels = root, blob, starts, labels

    def __len__(self) -> int:
        return len(self.labels)

    def key(self, i: int) -> str:
        # surrogateescape: a file name's undecodable bytes come back as they were
        return self._blob[self._starts[i]:self._starts[i + 1] - 1].decode(
            "utf-8", "surrogateescape")

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"entry {i} of {len(self)}")
        key = self.key(i)
        return SourceEntry(key, self.labels[i], os.path.join(self.root, key))

    def __iter__(self) -> Iterator[SourceEntry]:
        for i in range(len(self)):
            yield self[i]

    def take(self, indices) -> FolderEntries:
        """The entries at ``indices``, in that order."""
        found = _EntriesBuilder()
        for i in indices:
            found.add(self.key(int(i)), self.labels[int(i)])
        return found.done(self.root)


class _EntriesBuilder:
    def __init__(self) -> None:
        self._blob = bytearray()
        self._starts = array("q", [0])
        self._labels = array("i")

    def add(self, key: str, label: int) -> None:
        self._blob += key.encode("utf-8", "surrogateescape") + b"\0"
        self._starts.append(len(self._blob))
        self._labels.append(label)

    def done(self, root: str) -> FolderEntries:
        return FolderEntries(root, self._blob, self._starts, self._labels)


def parse_extensions(extensions: Iterable[str] | str | None) -> tuple[str, ...]:
    """The extensions an image-folder source packs (lower case, with dot, in order).

    Args:
        extensions: None: torchvision's ``IMG_EXTENSIONS``. A sequence
            (``["gif", ".JPG"]``) or a comma-separated string (``"gif,jpg"``):
            exactly those, with or without the dot, any letter case. A string
            that starts with "+" (``"+gif"``, ``"+gif,jfif"``) adds to
            torchvision's instead of replacing them.

    Raises:
        FastDataError: an empty entry, a "/" in one, or nothing at all.
    """
    if extensions is None:
        return TORCHVISION_EXTENSIONS
    base: tuple[str, ...] = ()
    if isinstance(extensions, str):
        text = extensions.strip()
        if text.startswith("+"):
            base, text = TORCHVISION_EXTENSIONS, text[1:]
        items: list = text.split(",")
    else:
        items = list(extensions)
    out = list(base)
    for item in items:
        if not isinstance(item, str):
            raise FastDataError(f"extensions= takes names like 'gif' or '.gif', not {item!r}")
        ext = "." + item.strip().lower().lstrip(".")
        if ext == "." or "/" in ext or os.sep in ext or any(c.isspace() for c in ext):
            raise FastDataError(f"extensions= has an unusable entry {item!r}: give names "
                                f"like gif,jpg (a leading + adds them to torchvision's)")
        if ext not in out:
            out.append(ext)
    if not out:
        raise FastDataError("extensions= names no extension: give names like gif,jpg")
    return tuple(out)


def _key(rel_dir: str, name: str) -> str:
    rel = name if rel_dir in ("", ".") else os.path.join(rel_dir, name)
    return rel.replace(os.sep, "/")

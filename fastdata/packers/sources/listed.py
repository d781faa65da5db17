"""What list sources share: one row per image with its file path, its label and
anything else, read from a list file (CSV/TSV, JSON Lines).

Paths are relative to the list file's folder and stay inside it (absolute
paths, ``..`` out of the folder and links leading out are refused unless
``allow_outside=True``: see fastdata.contained); an entry's key is the path as
the list gives it ("/"-separated). A path listed twice (the same
file, however written) is kept once, from its first line, and reported. Files
are not opened here: a missing or unreadable one is yielded like any other,
and the pack skips it and names it in its report.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastdata.contained import list_folder
from fastdata.errors import SourceError
from fastdata.packers.source import SourceEntry
from fastdata.packers.sources.labels import LabelScan

#: The column (CSV) or field (JSON Lines) that holds an image's path, by default.
PATH_COLUMN = "path"
#: The label column used when present, by default.
LABEL_COLUMN = "label"


@dataclass(frozen=True, slots=True)
class ListRow:
    """One row of a list file, as read."""

    line: int
    path: str
    label: Any  # a class name, an integer, or None (no label)
    metadata: dict | None


class ListedSource:
    """A :class:`~fastdata.Source` read from a list file: subclasses read the rows
    (``_read_rows``), this class turns them into entries, classes and labels.

    Attributes:
        path: the list file (absolute).
        classes: the class names (labels index them; [] when unlabelled).
        entries: the entries, in list order, duplicates left out.
        label_column: the label column used, or None (unlabelled: labels -1).
        duplicates: rows left out because an earlier row lists the same file.
    """

    kind = "list"

    def __init__(self, path: str | os.PathLike, *, path_column: str = PATH_COLUMN,
                 label_column: str | None = None, allow_outside: bool = False) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.path_column = path_column
        self.label_column = label_column
        self.allow_outside = allow_outside
        if label_column is not None and label_column == path_column:
            raise SourceError(f"the path column and the label column are both "
                              f"{path_column!r}; name two different columns", path=self.path)
        check_list_file(self.path)
        self._build(self._read_rows())

    def _read_rows(self) -> list[ListRow]:
        """The list's rows; sets ``label_column`` to the column used (None: none)."""
        raise NotImplementedError

    def _build(self, rows: list[ListRow]) -> None:
        base = os.path.dirname(self.path)
        names = list_folder(base, self.path)
        scan = LabelScan(self.label_column or LABEL_COLUMN, self.path)
        first_line: dict[str, ListRow] = {}
        kept: list[tuple[ListRow, str]] = []
        self.duplicates = 0
        self._first_duplicate: tuple[str, int, int] | None = None
        self._relabelled = 0
        for row in rows:
            # allow_outside: the list is the user's own; an absolute path stays as it is.
            file = os.path.join(base, row.path) if self.allow_outside else \
                names.path(row.path, f"line {row.line} ({self.path_column})")
            same = os.path.normpath(file)
            first = first_line.get(same)
            if first is not None:
                self.duplicates += 1
                self._first_duplicate = self._first_duplicate or (row.path, first.line, row.line)
                self._relabelled += row.label != first.label
                continue
            first_line[same] = row
            kept.append((row, file))
            if self.label_column is not None:
                scan.add(row.label, lambda line=row.line: f"line {line}")
        if not kept:
            raise SourceError("the list has no rows: give one row per image after the "
                              "header", path=self.path)
        plan = scan.finish()
        self.classes = plan.classes
        self.label_kind = plan.kind
        self.entries = [SourceEntry(list_key(row.path), plan.index(row.label), path=file,
                                    metadata=row.metadata) for row, file in kept]

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[SourceEntry]:
        return iter(self.entries)

    def __getitem__(self, index: int) -> SourceEntry:
        return self.entries[index]

    def describe(self) -> dict[str, Any]:
        return {"root": self.path, "kind": self.kind, "files": len(self.entries), "ignored": 0,
                "duplicates": self.duplicates, "path_column": self.path_column,
                "label_column": self.label_column, "labels": self.label_kind}

    def warnings(self) -> list[str]:
        if not self.duplicates:
            return []
        path, first, again = self._first_duplicate
        text = (f"{self.duplicates} row(s) of {os.path.basename(self.path)} list a file an "
                f"earlier row lists; each file is packed once, with its first row (first: "
                f"{path!r} on lines {first} and {again})")
        if self._relabelled:
            text += f"; {self._relabelled} of these rows give another label, not used"
        return [text]


def check_list_file(path: str) -> None:
    """Refuse a list path that is missing or not a file."""
    if not os.path.exists(path):
        raise SourceError("list file does not exist", path=path)
    if not os.path.isfile(path):
        raise SourceError("is not a file: give a list file (.csv, .tsv, .jsonl)", path=path)


def list_key(path: str) -> str:
    """An entry's key: the path as the list gives it, "/"-separated."""
    for sep in (os.sep, os.altsep):
        if sep and sep != "/":
            path = path.replace(sep, "/")
    return path

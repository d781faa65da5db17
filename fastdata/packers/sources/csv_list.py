"""CSV and TSV lists: a header row naming the columns, then one row per image.

    path,label,caption
    cat/1.jpg,cat,a cat on a mat
    /data/dog 2.png,dog,"a dog, asleep"

The ``path`` column holds the file (relative to the list's folder, or
absolute); the ``label`` column, when there is one, a class name or an integer
(integers are class indices kept as given: "007" is 7); every other column is
kept, as text, in the entry's metadata. The file is UTF-8 (a byte-order mark is
allowed); fields follow Python's ``csv`` module (quote a field that holds the
delimiter, a quote or a line break).
"""

from __future__ import annotations

import csv
import os
import re

from fastdata.errors import SourceError
from fastdata.packers.sources.listed import LABEL_COLUMN, PATH_COLUMN, ListedSource, ListRow

_INTEGER = re.compile(r"[+-]?[0-9]+")


class CSVSource(ListedSource):
    """A CSV (``.csv``) or TSV (``.tsv``) list of images (see the module doc).

    Args:
        path: the list file.
        path_column: the column holding each image's path.
        label_column: the column holding the labels; None: ``label`` when the
            header has it, else the list is unlabelled (labels -1, no classes).
        delimiter: the field separator; None: a tab for ``.tsv``, else ",".
        allow_outside: take paths that lead out of the list's folder (absolute,
            ``..``, links out): for a list of your own; refused by default.

    Raises:
        SourceError: a missing file, no path column (or no such label column),
            a line with another number of fields than the header, an empty path,
            a label column mixing class names and integers, no rows.
        UnsafeNameError: a path leads out of the list's folder (absolute, ``..``,
            a link out) and ``allow_outside`` is off.
    """

    def __init__(self, path: str | os.PathLike, *, path_column: str = PATH_COLUMN,
                 label_column: str | None = None, delimiter: str | None = None,
                 allow_outside: bool = False) -> None:
        tsv = os.fspath(path).lower().endswith(".tsv")
        self.delimiter = delimiter or ("\t" if tsv else ",")
        self.kind = "tsv" if self.delimiter == "\t" else "csv"
        self.metadata_columns: list[str] = []
        super().__init__(path, path_column=path_column, label_column=label_column,
                         allow_outside=allow_outside)

    def describe(self):
        return {**super().describe(), "metadata_columns": self.metadata_columns}

    def _read_rows(self) -> list[ListRow]:
        try:
            with open(self.path, "rb") as f:
                # strict: a stray quote is an error naming its line, not a field
                # silently joined with the next ones
                return self._rows(csv.reader(_text_lines(f), delimiter=self.delimiter,
                                             strict=True))
        except OSError as exc:
            raise SourceError(f"cannot read the list: {exc.strerror or exc}",
                              path=self.path) from None

    def _rows(self, reader) -> list[ListRow]:
        header: list[str] | None = None
        rows: list[ListRow] = []
        while True:
            line = reader.line_num + 1  # where this row starts
            try:
                cells = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                raise SourceError(f"line {line} is not valid {self.kind.upper()}: {exc}",
                                  path=self.path) from None
            except UnicodeDecodeError:
                raise SourceError(f"line {line} is not UTF-8 text; save the list as UTF-8",
                                  path=self.path) from None
            if not any(cell.strip() for cell in cells):
                continue  # a blank line
            if header is None:
                header = self._read_header(cells, line)
                continue
            rows.append(self._row(header, cells, line))
        if header is None:
            raise SourceError(f"the list is empty: its first line must name the columns "
                              f"({self.path_column!r} and, optionally, "
                              f"{self.label_column or LABEL_COLUMN!r})", path=self.path)
        return rows

    def _read_header(self, cells: list[str], line: int) -> list[str]:
        seen = set()
        for number, name in enumerate(cells, 1):
            if not name.strip():
                raise SourceError(f"line {line}: column {number} of the header has no name",
                                  path=self.path)
            if name in seen:
                raise SourceError(f"line {line}: the header names the column {name!r} twice",
                                  path=self.path)
            seen.add(name)
        if self.path_column not in seen:
            raise SourceError(
                f"no {self.path_column!r} column: the first line must name the columns, and "
                f"it has {', '.join(map(repr, cells))}; name the path column with "
                f"path_column=NAME", path=self.path)
        if self.label_column is not None and self.label_column not in seen:
            raise SourceError(f"no {self.label_column!r} column (label_column=NAME); the header "
                              f"has {', '.join(map(repr, cells))}", path=self.path)
        if self.label_column is None and LABEL_COLUMN in seen \
                and self.path_column != LABEL_COLUMN:
            self.label_column = LABEL_COLUMN
        taken = (self.path_column, self.label_column)
        self.metadata_columns = [name for name in cells if name not in taken]
        return cells

    def _row(self, header: list[str], cells: list[str], line: int) -> ListRow:
        if len(cells) != len(header):
            sep = "tab" if self.delimiter == "\t" else repr(self.delimiter)
            raise SourceError(
                f"line {line} has {len(cells)} field(s), the header {len(header)} (fields are "
                f"{sep}-separated; quote a field that holds one)", path=self.path)
        values = dict(zip(header, cells))
        path = values.pop(self.path_column)
        if not path:
            raise SourceError(f"line {line}: the path ({self.path_column!r}) is empty",
                              path=self.path)
        label = None
        if self.label_column is not None:
            text = values.pop(self.label_column)
            label = int(text) if _INTEGER.fullmatch(text) else text
        return ListRow(line, path, label, values or None)


def _text_lines(f):
    """The lines of a binary file as text, decoded one by one (a byte that is not
    UTF-8 stops the reader at its own line; a byte-order mark is dropped)."""
    for number, raw in enumerate(f):
        yield raw.decode("utf-8-sig" if number == 0 else "utf-8")

"""JSON Lines lists (``.jsonl``): one JSON object per line, one line per image.

    {"path": "cat/1.jpg", "label": "cat", "boxes": [[4, 8, 20, 30]]}
    {"path": "dog/2.png", "label": "dog", "meta": {"source": "web"}}

``path`` holds the file (relative to the list's folder, or absolute); ``label``,
when the lines have it, a class name (a JSON string) or an integer class index
(a JSON number); every other field is kept in the entry's metadata as it is
(lists, objects, numbers). Blank lines are skipped; the file is UTF-8.
"""

from __future__ import annotations

import json
import os

from fastdata.errors import SourceError
from fastdata.packers.sources.listed import LABEL_COLUMN, PATH_COLUMN, ListedSource, ListRow


class JSONLinesSource(ListedSource):
    """A JSON Lines list of images (see the module doc).

    Args:
        path: the list file.
        path_column: the field holding each image's path.
        label_column: the field holding the labels; None: ``label`` when any
            line has it, else the list is unlabelled (labels -1, no classes).
            When lines have it, every line must.
        allow_outside: take paths that lead out of the list's folder (absolute,
            ``..``, links out): for a list of your own; refused by default.

    Raises:
        SourceError: a missing file, a line that is not a JSON object (its
            number named), a line without a path, a label field mixing class
            names and integers or missing from some lines, no rows.
        UnsafeNameError: a path leads out of the list's folder (absolute, ``..``,
            a link out) and ``allow_outside`` is off.
    """

    kind = "jsonl"

    def __init__(self, path: str | os.PathLike, *, path_column: str = PATH_COLUMN,
                 label_column: str | None = None, allow_outside: bool = False) -> None:
        super().__init__(path, path_column=path_column, label_column=label_column,
                         allow_outside=allow_outside)

    def _read_rows(self) -> list[ListRow]:
        label = self.label_column or LABEL_COLUMN
        rows: list[ListRow] = []
        labelled = False
        try:
            with open(self.path, "rb") as f:
                for number, raw in enumerate(f, 1):
                    if not raw.strip():
                        continue
                    obj = self._parse(raw, number)
                    path = obj.pop(self.path_column, None)
                    if not isinstance(path, str) or not path:
                        what = "has no" if path is None else "has an empty or non-text"
                        raise SourceError(f"line {number} {what} {self.path_column!r} field "
                                          f"(the image's path)", path=self.path)
                    labelled = labelled or label in obj
                    value = obj.pop(label, None) if label != self.path_column else None
                    rows.append(ListRow(number, path, value, obj or None))
        except OSError as exc:
            raise SourceError(f"cannot read the list: {exc.strerror or exc}",
                              path=self.path) from None
        if self.label_column is not None and not labelled:
            raise SourceError(f"no line has a {label!r} field (label_column=NAME)", path=self.path)
        self.label_column = label if labelled else None
        return rows

    def _parse(self, raw: bytes, number: int) -> dict:
        try:
            obj = json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
        except UnicodeDecodeError:
            raise SourceError(f"line {number} is not UTF-8 text; save the list as UTF-8",
                              path=self.path) from None
        except json.JSONDecodeError as exc:
            raise SourceError(f"line {number} is not valid JSON: {exc.msg} (column "
                              f"{exc.colno})", path=self.path) from None
        except RecursionError:
            raise SourceError(f"line {number} nests too deeply to read", path=self.path) \
                from None
        if not isinstance(obj, dict):
            raise SourceError(f"line {number} holds a JSON {type(obj).__name__}, not an object "
                              f"({{\"{self.path_column}\": ..., ...}})", path=self.path)
        return obj

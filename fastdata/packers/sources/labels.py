"""Labels from a column of a list or a table: class names, integers, or none.

A label column holds class names (labels are then the indices of the sorted
names, as ImageFolder sorts its class folders) or integers (kept as given; the
classes are then "0" .. the largest, as strings). Both kinds in one column are
refused. A source without a label column is unlabelled: every label is -1 and
there are no classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fastdata.errors import SourceError

#: The label of a record without one (a source with no label column).
UNLABELLED = -1
#: Integer labels make classes "0" .. the largest: more than this many is surely
#: not a class index (a date or an id in the label column).
MAX_INTEGER_CLASSES = 1_000_000


@dataclass(frozen=True)
class LabelPlan:
    """What a scanned label column became.

    Attributes:
        classes: the class names; a label indexes them ([] when unlabelled).
        kind: "names", "integers", "classlabel" (names given by the source,
            e.g. a Hugging Face ClassLabel) or "none".
    """

    classes: list[str]
    kind: str
    _lookup: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lookup", {name: i for i, name in enumerate(self.classes)})

    def index(self, value) -> int:
        """The label of a scanned value (None: unlabelled)."""
        if value is None:
            return UNLABELLED
        if isinstance(value, str):
            return self._lookup[value]
        return int(value)


class LabelScan:
    """Collects the values of one label column, then decides its kind.

    Args:
        column: the column's name (for messages).
        path: the list or table file (for messages).
        names: class names the source declares (a Hugging Face ClassLabel):
            integers must index them, names must be among them.
    """

    def __init__(self, column: str, path: str, names: list[str] | None = None) -> None:
        self.column = column
        self.path = path
        self.names = names
        self._names: set[str] = set()
        self._first_name: str | None = None
        self._first_int: str | None = None
        self._first_none: str | None = None
        self._first_label: str | None = None
        self._top = -1

    def add(self, value, where: Callable[[], str]) -> None:
        """One value: a class name (str), an integer, or None (no label).
        ``where()`` says where it is ("line 7"), asked only when needed."""
        if value is None:
            if self._first_none is None:
                self._first_none = where()
            return
        if self._first_label is None:
            self._first_label = where()
        if isinstance(value, str):
            if value == "":
                raise SourceError(f"{where()}: the label ({self.column!r}) is empty; give "
                                  f"every row a label, or no label column at all",
                                  path=self.path)
            if self._first_name is None:
                self._first_name = f"{where()}: {value!r}"
            if self.names is not None and value not in self.names:
                raise SourceError(f"{where()}: label {value!r} is not one of the "
                                  f"{len(self.names)} class names the source declares",
                                  path=self.path)
            self._names.add(value)
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise SourceError(f"{where()}: label {value!r} is neither a class name nor an "
                              f"integer", path=self.path)
        if self._first_int is None:
            self._first_int = f"{where()}: {value}"
        if value < 0:
            raise SourceError(f"{where()}: label {value} is negative; integer labels are "
                              f"class indices from 0", path=self.path)
        limit = len(self.names) if self.names is not None else MAX_INTEGER_CLASSES
        if value >= limit:
            what = (f"the {limit} class names the source declares" if self.names is not None
                    else f"at most {MAX_INTEGER_CLASSES:,} classes")
            raise SourceError(f"{where()}: label {value} is not a class index ({what})",
                              path=self.path)
        self._top = max(self._top, value)

    def finish(self) -> LabelPlan:
        """The classes and kind of the column.

        Raises:
            SourceError: names and integers mixed, or some values missing.
        """
        if self._first_name and self._first_int and self.names is None:
            raise SourceError(
                f"the label column {self.column!r} mixes class names and integers "
                f"({self._first_name}; {self._first_int}); use one kind throughout",
                path=self.path)
        if self._first_label is None:
            return LabelPlan([], "none")
        if self._first_none is not None:
            raise SourceError(
                f"{self._first_none}: no label, though other rows have one "
                f"({self._first_label}); give every row a label, or none at all",
                path=self.path)
        if self.names is not None:
            return LabelPlan(list(self.names), "classlabel")
        if self._first_name:
            return LabelPlan(sorted(self._names), "names")
        return LabelPlan([str(i) for i in range(self._top + 1)], "integers")

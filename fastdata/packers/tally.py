"""What a pack has seen so far: counts per class and encoding, the source's
fingerprint, skipped images and warnings (kept pieces of a resumed pack are
counted as if packed again)."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from fastdata.errors import FastDataError
from fastdata.packers.prepare import Prepared, SkippedFile


@dataclass
class Tally:
    """What the pack has seen so far: counts, the source fingerprint, skips and warnings."""

    classes: int
    on_event: Callable[[str], None] | None = None
    skipped: list[SkippedFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    encodings: Counter = field(default_factory=Counter)
    bytes_in: int = 0
    raw_shape: tuple[int, int, int] | None = None
    fingerprint: Any = field(default_factory=hashlib.sha256)
    class_counts: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.class_counts = [0] * self.classes

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)
        if self.on_event:
            self.on_event(msg)

    def note(self, msg: str) -> None:
        """Tell the user about the run itself (not the data): not in the report."""
        if self.on_event:
            self.on_event(msg)

    def add(self, item: Prepared) -> None:
        """Count a prepared image that is about to be written."""
        if item.encoding == "raw":
            shape = (item.height, item.width, 3)
            if self.raw_shape is None:
                self.raw_shape = shape
            elif shape != self.raw_shape:
                raise FastDataError(
                    f"raw storage needs one image size, but this image is "
                    f"{item.width}x{item.height} and earlier ones "
                    f"{self.raw_shape[1]}x{self.raw_shape[0]}; pass resize=(h, w), or resize=N "
                    f"with center_crop=True", key=item.key)
        _check_label(item.label, self.classes, item.key)
        self.fingerprint.update(f"{item.key}\t{item.label}\t{item.source_bytes}\n".encode())
        if item.label >= 0:  # -1: an unlabelled record, of no class
            self.class_counts[item.label] += 1
        self.encodings[item.encoding] += 1
        self.bytes_in += item.source_bytes


def _check_label(label: int, classes: int, key: str) -> None:
    """A record's label indexes the classes; a source without classes is
    unlabelled, and every label is -1."""
    if classes and not 0 <= label < classes:
        raise FastDataError(f"the source gives label {label}, not a class index (0..{classes - 1} "
                            f"for {classes} classes)", key=key)
    if not classes and label != -1:
        raise FastDataError(f"the source gives label {label} but has no classes: a source "
                            f"without classes is unlabelled, and every label is -1", key=key)

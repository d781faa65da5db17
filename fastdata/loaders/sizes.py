"""Images of different sizes meeting a collate that stacks them.

torch's ``default_collate`` fails on such a batch with errors that do not say
why ("Trying to resize storage that is not resizable" inside a worker, "stack
expects each tensor to be equal size"). fastdata raises its own error where it
collates (``fastdata.collate``, ``fastdata.loader``) and, where a DataLoader
collates with torch's default, warns once per process before the batch reaches
it, with what to do; nowhere else (a loop over a stream, a collate that keeps
a list).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from fastdata.errors import MixedSizeWarning
from fastdata.redaction import redact

ADVICE = ("decode to one size with size=(h, w) (or size=S plus a crop in transform=), "
          "resize in a transform, or pass a collate_fn that keeps a list, "
          "e.g. collate_fn=lambda batch: tuple(zip(*batch))")


def describe_shapes(shapes: Iterable[tuple]) -> str:
    """'3x480x640, 3x300x400 and 2 more' for the distinct shapes seen."""
    distinct = list(dict.fromkeys(tuple(int(d) for d in s) for s in shapes))
    named = ", ".join("x".join(map(str, s)) for s in distinct[:2])
    more = len(distinct) - 2
    return named + (f" and {more} more" if more > 0 else "")


def mixed_size_message(shapes: Iterable[tuple], where: str) -> str:
    return (f"images of {where} differ in size ({describe_shapes(shapes)}), so they cannot "
            f"be stacked: {ADVICE}")


def stacked_by_caller(dataset, frame) -> bool:
    """Whether the code asking ``dataset`` for samples (the frame that called
    ``__iter__`` or ``__getitems__``) is a DataLoader fetcher that batches them
    with torch's default collate, which stacks them: the one place a warning
    about mixed sizes helps. A plain loop, a collate that keeps a list or
    ``fastdata.collate`` (which raises its own error) stacks nothing here."""
    fetcher = frame.f_locals.get("self") if frame is not None else None
    if getattr(fetcher, "dataset", None) is not dataset \
            or not getattr(fetcher, "auto_collation", False):
        return False
    from torch.utils.data import default_collate

    return getattr(fetcher, "collate_fn", None) is default_collate


class MixedSizeNotice:
    """Warns once per process when a Dataset hands differently sized images to
    a DataLoader that may stack them (tensor output, no transform)."""

    __slots__ = ("warned_pid", "first")

    def __init__(self) -> None:
        self.warned_pid = None
        self.first = None

    def batch(self, shapes: list[tuple], path: str) -> None:
        """Shapes of one batch's images."""
        if len(set(shapes)) > 1:
            self._warn(shapes, path, "one batch")

    def sample(self, shape: tuple, path: str) -> None:
        """One streamed sample's shape: warns when it differs from the first."""
        if self.first is None:
            self.first = shape
        elif shape != self.first:
            self._warn([self.first, shape], path, "this stream")

    def _warn(self, shapes: list[tuple], path: str, where: str) -> None:
        import os

        pid = os.getpid()
        if self.warned_pid == pid:
            return
        self.warned_pid = pid
        warnings.warn(f"{redact(str(path))}: {mixed_size_message(shapes, where)} "
                      f"(torch's default collate fails on them; ignore this warning if "
                      f"nothing stacks them: a collate_fn that keeps a list, batch_size=None)",
                      MixedSizeWarning, stacklevel=4)


def fixed_shape(decode, crop) -> tuple[int, int, int] | None:
    """The (h, w, 3) every decoded image has when the options fix it
    (``crop=``, or ``size=(h, w)``, without ``keep_gray``); None otherwise."""
    if decode.keep_gray:
        return None
    if crop is not None:
        return (*crop.size, 3)
    size = decode.size
    if isinstance(size, tuple) and len(size) == 2:
        return (int(size[0]), int(size[1]), 3)
    return None

"""Exceptions raised by fastdata.

Every error carries the path, key and offset it concerns (when known) so that a
message can say exactly which file or record is at fault and what to do.
"""

from __future__ import annotations

import os


class FastDataError(Exception):
    """Base class for every error fastdata raises on purpose.

    Args:
        message: what went wrong and, where possible, what to do about it.
        path: the file or directory concerned.
        key: the record key (a source-relative path) concerned.
        offset: a byte offset or record index inside ``path``.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike | None = None,
        key: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.message = message
        self.path = os.fspath(path) if path is not None else None
        self.key = key
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path)
        if self.key is not None:
            where.append(f"key {self.key!r}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        return f"{': '.join(where)}: {self.message}" if where else self.message

    def __reduce__(self):
        # Keep the fields when an error crosses a DataLoader worker boundary.
        return (_rebuild, (type(self), self.message, self.path, self.key, self.offset))


def _rebuild(cls, message, path, key, offset):
    return cls(message, path=path, key=key, offset=offset)


class SourceError(FastDataError):
    """The input image folder is missing, empty or unusable."""


class BadImageError(FastDataError):
    """A source image is corrupt, truncated, empty or unreadable."""


class UnknownFormatError(FastDataError):
    """The container format cannot be chosen or is not supported."""


class OutputExistsError(FastDataError):
    """The output exists and ``overwrite`` was not given."""


class ManifestError(FastDataError):
    """A dataset has no manifest, an unreadable one, or one from a newer fastdata."""


class CorruptDataError(FastDataError):
    """A packed container is truncated or its bytes fail a checksum."""


class DecodeError(FastDataError):
    """A stored record could not be decoded into pixels."""


class DamagedImageError(DecodeError):
    """An image decodes only because the decoder papers over damage in its
    compressed data (libjpeg's "Corrupt JPEG data: ..." warnings); raised by
    the strict checks of ``pack --verify-decode`` and ``verify --decode``."""


class MixedSizeWarning(UserWarning):
    """Images of one batch (or one stream) differ in size, so a collate that
    stacks them will fail. Silence it where a collate keeps a list on purpose:
    ``warnings.filterwarnings("ignore", category=fastdata.MixedSizeWarning)``."""

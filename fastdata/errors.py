"""Exceptions raised by fastdata.

Every error carries the path, key and offset it concerns (when known) so that a
message can say exactly which file or record is at fault and what to do.
"""

from __future__ import annotations

import os
import re

from fastdata.redaction import redact, redact_url


class FastDataError(Exception):
    """Base class for every error fastdata raises on purpose.

    Args:
        message: what went wrong and, where possible, what to do about it.
        path: the file or directory concerned.
        key: the record key (a source-relative path) concerned.
        offset: a byte offset inside ``path``.
        record: a record index (0-based) of the dataset at ``path``.

    The message and path keep no credential: the user-info and query values of
    any URL in them are masked (``http://***@host/x?sig=***``).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike | None = None,
        key: str | None = None,
        offset: int | None = None,
        record: int | None = None,
    ) -> None:
        # Credentials in a URL never reach a message (see fastdata.redaction).
        self.message = redact(message)
        self.path = redact_url(os.fspath(path)) if path is not None else None
        self.key = key
        self.offset = offset
        self.record = record
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path)
        if self.key is not None:
            where.append(f"key {self.key!r}")
        # A record index reads "record N", a byte offset "byte offset N"; either is
        # left out here when the message already says it (no "record 3: record 3").
        if self.record is not None and not _says(self.message, f"record {self.record}"):
            where.append(f"record {self.record}")
        if self.offset is not None and not _says(self.message, f"byte offset {self.offset}"):
            where.append(f"byte offset {self.offset}")
        return f"{': '.join(where)}: {self.message}" if where else self.message

    def __reduce__(self):
        # Keep the fields when an error crosses a DataLoader worker boundary.
        return (_rebuild, (type(self), self.message, self.path, self.key, self.offset,
                           self.record))


def _says(message: str, phrase: str) -> bool:
    return re.search(rf"\b{re.escape(phrase)}\b", message) is not None


def _rebuild(cls, message, path, key, offset, record):
    return cls(message, path=path, key=key, offset=offset, record=record)


# An object's default repr ("<_io.BytesIO object at 0x7f...>"): Pillow puts the
# file object it was given into its messages, which means nothing to a user.
_OBJECT_REPR = re.compile(r"<[^<>]*\bat 0x[0-9a-fA-F]+>")


def exception_text(exc: BaseException) -> str:
    """Another library's exception (Pillow, a decoder) as text for a message:
    no object reprs; Pillow's "cannot identify image file <...>" in words."""
    if type(exc).__name__ == "UnidentifiedImageError":  # Pillow's; PIL is not imported here
        return "not an image Pillow can identify"
    text = _OBJECT_REPR.sub("the image data", str(exc)).strip()
    return text or type(exc).__name__


def shown_bytes(data: bytes, limit: int = 16) -> str:
    """The first bytes of ``data`` for a message: quoted text when they are
    printable ASCII (an HTML page saved as .jpg), otherwise hex."""
    head = bytes(data[:limit])
    more = "..." if len(data) > limit else ""
    if not head:
        return "nothing"
    if all(32 <= b < 127 or b in b"\t\r\n" for b in head):
        text = head.decode("ascii").encode("unicode_escape").decode("ascii")  # \n as \\n
        return f'"{text}{more}"'
    return f"bytes {head.hex(' ')}{more}"


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


class StorageError(FastDataError):
    """An object store or HTTP server could not be read or written: a missing
    object, denied credentials, an endpoint that cannot be reached. The message
    names the URL and never a credential."""


class MissingObjectError(StorageError):
    """The object (or local file) is not there: a 404, or no such file."""


class AccessDeniedError(StorageError):
    """The store refused the request (401/403). S3 answers 403 for a missing
    object when the credentials may not list the bucket."""


class MixedSizeWarning(UserWarning):
    """Images of one batch (or one stream) differ in size, so a collate that
    stacks them will fail. Silence it where a collate keeps a list on purpose:
    ``warnings.filterwarnings("ignore", category=fastdata.MixedSizeWarning)``."""


class UnsafeNameError(FastDataError):
    """A name a dataset or a list holds (a shard, a sidecar, an image path)
    would lead outside it: an absolute path, a ``..`` segment, a URL, a control
    character, or a symbolic link out of its folder. Nothing was opened."""

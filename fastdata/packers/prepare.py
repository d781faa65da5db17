"""The per-image work of a pack: read, check and preprocess one source entry.

Runs in pack worker processes (or inline for one worker); what comes back is
picklable and holds the bytes to store.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastdata.errors import BadImageError, exception_text
from fastdata.packers.checks import check_image, check_raw
from fastdata.packers.preprocess import Preprocess
from fastdata.packers.source import SourceEntry
from fastdata.records import metadata_json


@dataclass(frozen=True)
class SkippedFile:
    """A source image left out of the pack, and why."""

    key: str
    reason: str


@dataclass(frozen=True)
class Prepared:
    """One source image after reading, checking and preprocessing (picklable)."""

    key: str
    label: int
    source_bytes: int
    payload: bytes
    encoding: str
    width: int
    height: int
    #: The entry's metadata as canonical JSON (``fastdata.records.metadata_json``).
    metadata: bytes | None = None


def prepare(job: tuple[SourceEntry, bool, Preprocess, int | None]) -> Prepared | SkippedFile:
    """Read, check and preprocess one image; runs in pack worker processes."""
    entry, verify_decode, pre, max_pixels = job
    if not _is_utf8(entry.key):
        # Keys are stored as UTF-8 in every format: such a name cannot be stored.
        return SkippedFile(printable_key(entry.key), BAD_NAME)
    try:
        meta = _metadata(entry)
        data = _read(entry)
        raw_shape = getattr(entry, "raw_shape", None)
        if raw_shape is not None:  # decoded pixels: no header to check or decode
            info = check_raw(data, raw_shape, key=entry.key)
        else:
            info = check_image(data, key=entry.key, verify_decode=verify_decode,
                               max_pixels=max_pixels)
        if pre.identity:
            return Prepared(entry.key, entry.label, len(data), data, info.encoding,
                            info.width, info.height, meta)
        try:
            if pre.lossless_restarts:
                return Prepared(entry.key, entry.label, len(data),
                                pre.rewrite(data, info.encoding), info.encoding,
                                info.width, info.height, meta)
            payload, encoding, width, height = pre.apply(data, info.encoding, raw_shape)
        except Exception as exc:  # any decoder/encoder failure makes this image bad
            raise BadImageError(f"cannot be decoded for preprocessing: {exception_text(exc)}",
                                key=entry.key) from None
        return Prepared(entry.key, entry.label, len(data), payload, encoding, width, height,
                        meta)
    except BadImageError as exc:
        return SkippedFile(entry.key, exc.message)


#: The reason given for a file whose name cannot be stored.
BAD_NAME = "file name is not valid UTF-8; rename the file to store it"


def _is_utf8(key: str) -> bool:
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes of a file name (surrogate escapes)
        return False
    return True


def printable_key(key: str) -> str:
    """``key`` with the bytes that are not UTF-8 written as ``\\xNN`` escapes."""
    try:
        raw = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
        return key.encode("utf-8", "backslashreplace").decode("ascii", "replace")
    return raw.decode("utf-8", "backslashreplace")


def start_pool(workers: int):
    """A process pool for ``workers`` > 1, else None (work runs inline)."""
    if workers <= 1:
        return None
    import multiprocessing as mp

    from fastdata.jobs.processes import signals_blocked, start_method, worker_init

    with signals_blocked():
        return mp.get_context(start_method()).Pool(workers, initializer=worker_init)


def _metadata(entry: SourceEntry) -> bytes | None:
    """The entry's metadata as stored; metadata that JSON cannot hold makes the
    entry bad (skipped, or the pack stopped under strict)."""
    metadata = getattr(entry, "metadata", None)
    if metadata is None:
        return None
    try:
        return metadata_json(metadata)
    except (TypeError, ValueError) as exc:
        raise BadImageError(str(exc), key=entry.key) from None


def _read(entry: SourceEntry) -> bytes:
    if entry.data is not None:
        return entry.data
    try:
        with open(entry.path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise BadImageError(f"cannot read file: {exc.strerror or exc}", key=entry.key) from None

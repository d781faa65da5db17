"""The base of every format reader (no torch here).

A reader gives ``len``, labels, keys, the manifest, random access
(``read(i)`` / ``read_many(indices)``) and sequential iteration. File handles
are opened lazily in the process that reads and are never pickled, so a reader
(and a Dataset holding one) crosses into DataLoader workers cheaply under fork,
spawn and forkserver. The base owns that lifecycle: a format opens its handle
in ``_open_handle`` and gets it back from ``_process_handle()``; a handle
inherited across fork is handed to ``_abandon_handle`` (never used, never
closed) and a fresh one opened.
"""

from __future__ import annotations

import inspect
import os
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fastdata.errors import CorruptDataError, ManifestError
from fastdata.formats.integrity import check_labels
from fastdata.formats.record_metadata import RecordMetadata
from fastdata.formats.remote_files import absolute, is_remote, local_copy
from fastdata.records import Manifest

_OPEN_LOCK = threading.Lock()


def _reset_lock_in_child() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()  # another parent thread may have held it at fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_in_child)


def key_at(reader, index: int) -> str:
    """Record ``index``'s key (``reader.keys[index]``), read alone where the
    format can; an error reading it is raised, not passed over."""
    key = reader.key_of(index)
    return key if key is not None else reader.keys[index]


def open_lock() -> threading.Lock:
    """The lock readers hold while opening a handle (threads of one process share
    readers; a fresh lock in every forked child, so none is inherited held)."""
    return _OPEN_LOCK


class Reader(RecordMetadata):
    """Base class of format readers.

    Args:
        path: the packed dataset.
        verify: check each record's CRC32 against the one stored at pack time
            (cheap next to decoding; turn off only for pre-decoded data that is
            read faster than it can be checksummed).
        allow_outside: follow symbolic links inside the dataset's folder that
            lead out of it (shards spread over disks by links you made). Off by
            default: a dataset from elsewhere must not make fastdata read other
            files (see fastdata.contained). Names that are absolute, hold
            ``..`` or are URLs are refused either way.
    """

    format_name = ""
    #: The dataset is shard files (the shard methods of
    #: ``fastdata.formats.sharded.reader.ShardedReader`` apply).
    sharded = False
    #: What a resume state records of the dataset beyond its order (a
    #: version's number and digest); None for a pack.
    identity: dict | None = None
    #: Whole-file walks (``fastdata verify``, the RAM cache fill) run in a child
    #: process, for formats whose C library aborts or faults on some damaged
    #: files instead of returning an error (see fastdata.formats.isolate).
    walk_in_child = False
    #: The format's C library opens a local file itself (LMDB, HDF5): a dataset
    #: at a URL is downloaded into the shared cache on open (see ``_data_url``).
    needs_local_file = False

    @classmethod
    def settings(cls) -> tuple[str, ...]:
        """The names of this format's own reader settings (its keyword-only
        parameters besides ``verify`` and ``allow_outside``)."""
        params = inspect.signature(cls.__init__).parameters.values()
        return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY
                     and p.name not in ("verify", "allow_outside"))

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = True,
             allow_outside: bool = False, settings: Mapping[str, Any] | None = None):
        """Open the files of the packed dataset at ``path`` with this reader;
        ``settings``: its own settings by name (:meth:`settings`). A dataset
        that changed since its pack opens as packed here: its versions and
        views are read through ``fastdata.open_reader``.

        Raises:
            TypeError: a setting this format's reader does not have, naming
                those it has.
        """
        settings = dict(settings or {})
        unknown = sorted(set(settings) - set(cls.settings()))
        if unknown:
            have = ", ".join(cls.settings()) or "none"
            raise TypeError(f"the {cls.format_name or cls.__name__} reader has no setting "
                            f"{', '.join(map(repr, unknown))} (its settings: {have})")
        return cls(path, verify=verify, allow_outside=allow_outside, **settings)

    def __init__(self, path: str | os.PathLike, *, verify: bool = True,
                 allow_outside: bool = False) -> None:
        self.allow_outside = bool(allow_outside)
        self.path = absolute(path)
        #: The URL the dataset was opened by, when it is remote.
        self.url = self.path if is_remote(self.path) else None
        if self.url is not None and self.needs_local_file:
            self.path = local_copy(self._data_url(self.url))
        self.verify = verify
        self._manifest: Manifest | None = None
        self._labels: np.ndarray | None = None
        self._crcs: np.ndarray | None = None
        self._keys: list[str] | None = None
        self._metadata_crcs: np.ndarray | None = None
        self._pid: int | None = None
        self._handle: Any = None
        try:
            self._load()
        except BaseException:
            self._close_handles()  # a refused dataset keeps nothing open
            raise

    # -- subclass hooks -------------------------------------------------------

    def _data_url(self, url: str) -> str:
        """The one object to download for a ``needs_local_file`` format."""
        return url

    def _load_metadata(self) -> None:
        """Set ``_manifest``, ``_labels`` and ``_crcs``; raise ManifestError if
        ``path`` is not a complete dataset of this format, CorruptDataError if
        an array fails its checksum (see fastdata.formats.integrity)."""
        raise NotImplementedError

    def _load_keys(self) -> list[str] | None:
        """The stored source keys, or None when the dataset has none."""
        raise NotImplementedError

    def _read_many(self, indices: Sequence[int]) -> list[bytes]:
        raise NotImplementedError

    def _iter_payloads(self) -> Iterator[tuple[int, bytes]]:
        """Sequential (index, payload) over the whole dataset."""
        for i in range(len(self)):
            yield i, self._read_many([i])[0]

    def _open_handle(self) -> Any:
        """Open this process's handle (file, environment...); formats with one override it."""
        raise NotImplementedError

    def _release_handle(self, handle: Any) -> None:
        """Close a handle this process opened."""

    def _abandon_handle(self, handle: Any) -> None:
        """A handle inherited from the parent process: never used here, and never
        closed (closing may release state the parent still relies on)."""

    def _load(self) -> None:
        """Load the metadata and refuse labels that are not class indices."""
        self._load_metadata()
        if isinstance(self._labels, np.ndarray):  # an index's column checks its own pieces
            check_labels(self._labels, self._manifest, path=self.path)

    def check_layout(self) -> list[dict]:
        """Problems with the tables that locate records, for ``fastdata verify``:
        dicts ``{"index": record or None, "path", "reason"}``; none by default."""
        return []

    def check_files(self, on_bytes: Callable[[int], None] | None = None,
                    shards: range | None = None) -> list[dict]:
        """Problems with whole files against the manifest (checksums, side files),
        as :meth:`check_layout` gives them; ``on_bytes(n)`` reports bytes read;
        ``shards``: only those shards' files (a piece of a job; None: all)."""
        return []

    def child_options(self) -> dict:
        """Keyword arguments that open this dataset alike in a child process
        (JSON-ready; see ``walk_in_child``)."""
        return {"verify": self.verify, "allow_outside": self.allow_outside}

    def crash_path(self) -> str:
        """The file to name when reading the dataset killed a child process."""
        return self.path

    # -- the handle lifecycle ----------------------------------------------------

    def _process_handle(self) -> Any:
        """The handle of this process, opened on first use (thread-safe)."""
        self._check_process()
        handle = self._handle
        if handle is None:
            with open_lock():
                if self._handle is None:
                    self._handle = self._open_handle()
                handle = self._handle
        return handle

    def _check_process(self) -> None:
        # Handles opened in a parent process are never used after fork.
        pid = os.getpid()
        if self._pid != pid:
            if self._pid is not None:
                self._forget_handles()
            self._pid = pid

    def _forget_handles(self) -> None:
        """Drop (without using) handles inherited from another process."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._abandon_handle(handle)

    def _close_handles(self) -> None:
        """Close this process's handles."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._release_handle(handle)

    def _accept_manifest(self, text: str | bytes, where: str) -> Manifest:
        """Parse a stored manifest and check that it describes this format.

        Raises:
            ManifestError: not a fastdata manifest, or one of another format.
        """
        manifest = Manifest.from_json(text, path=where)
        if manifest.format != self.format_name:
            raise ManifestError(f"manifest says format {manifest.format!r}, not "
                                f"{self.format_name!r}", path=where)
        return manifest

    # -- public API -----------------------------------------------------------

    @property
    def dataset_path(self) -> str:
        """The dataset's own name (its URL, for one opened at a URL): where
        its versions are kept (``NAME.versions/``)."""
        return self.url or self.path

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            self._load()
        return self._manifest

    @property
    def labels(self) -> np.ndarray:
        """int64 array of the labels, one per record."""
        if self._labels is None:
            self._load()
        return self._labels

    @property
    def keys(self) -> list[str]:
        """Source keys (relative paths), loaded on first use; ``"#<index>"`` for
        datasets that store none."""
        if self._keys is None:
            keys = self._load_keys()
            self._keys = keys if keys is not None else [f"#{i}" for i in range(len(self))]
        return self._keys

    @property
    def classes(self) -> list[str]:
        return self.manifest.classes

    def __len__(self) -> int:
        return self.manifest.count

    def read(self, index: int) -> bytes:
        """The payload of record ``index`` (negative indices count from the end)."""
        return self.read_many([index])[0]

    def read_many(self, indices: Sequence[int], *, check: bool | None = None) -> list[bytes]:
        """Payloads of several records, fetched together where the format can;
        their CRC32s checked when ``check`` (None: ``verify``), else left to
        the caller (:meth:`check`). The container's own framing is always checked."""
        norm = self._normalise(indices)
        self._check_process()
        payloads = self._read_many(norm)
        if self.verify if check is None else check:
            expected = self.crcs_of(norm)
            for k, (j, data) in enumerate(zip(norm, payloads)):
                self.check(j, data, None if expected is None else expected[k])
        return payloads

    def __iter__(self) -> Iterator[tuple[int, bytes, int]]:
        """Sequential ``(index, payload, label)`` over every record."""
        return self.records(check=self.verify)

    def records(self, *, check: bool) -> Iterator[tuple[int, bytes, int]]:
        """Sequential ``(index, payload, label)``; ``check=False`` leaves the CRC32
        check to the caller (who may want to go on past a damaged record). The
        container's own framing is always checked."""
        self._check_process()
        labels = self.labels
        for i, data in self._iter_payloads():
            if check:
                self.check(i, data)
            yield i, data, int(labels[i])

    def _stored_crcs(self):
        """The records' stored CRC32s, or None for a dataset without them
        (written elsewhere)."""
        if self._labels is None:  # metadata dropped when pickled: reload it once
            self._load()
        return self._crcs

    def crcs_of(self, indices: Sequence[int]) -> list[int] | None:
        """The stored CRC32s of records ``indices`` (in range), in one lookup;
        None when the dataset stores none."""
        crcs = self._stored_crcs()
        if crcs is None:
            return None
        return np.asarray(crcs[np.asarray(indices, dtype=np.int64)]).tolist()

    def check(self, index: int, data: bytes | memoryview, expected: int | None = None) -> None:
        """Raise CorruptDataError when ``data`` does not match record ``index``'s
        CRC32 (``expected``, when the caller looked it up with :meth:`crcs_of`)."""
        if expected is None:
            crcs = self._stored_crcs()
            if crcs is None:
                return
            expected = int(crcs[index])
        actual = zlib.crc32(data)
        if actual != expected:
            raise CorruptDataError(
                f"record {index} fails its CRC32 check (stored {expected:08x}, read "
                f"{actual:08x}): the file is damaged; re-pack it or read with "
                f"on_error='skip'", path=self.path, key=self.key_of(index), record=index)

    def _normalise(self, indices: Sequence[int]) -> list[int]:
        """``indices`` as positions in range (negative ones count from the end)."""
        n = len(self)
        norm = []
        for i in indices:
            j = int(i)
            if j < 0:
                j += n
            if not 0 <= j < n:
                raise IndexError(f"index {i} out of range for a dataset of {n} records")
            norm.append(j)
        return norm

    def key_of(self, index: int) -> str | None:
        """Record ``index``'s source key for a message, or None when the keys
        cannot be read (never raises: it must not mask the error being reported)."""
        try:
            return self.keys[index]
        except Exception:  # keys are only for the message; never mask the real error
            return None

    def close(self) -> None:
        """Close file handles; the reader reopens them if used again."""
        if self._pid == os.getpid():
            self._close_handles()
        self._pid = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self) -> None:
        # A dropped reader gives back its descriptors (a loop opening datasets
        # must not run out of them). Never raises: this may run at interpreter
        # exit, after the modules it needs are gone, or on a half-built reader.
        try:
            self.close()
        except Exception:  # nothing can be done about a failed close here
            pass

    def __getstate__(self):
        state = self.__dict__.copy()
        # Per-record arrays are reloaded in the receiving process: a Dataset
        # pickles in bytes, not megabytes, when DataLoader workers spawn.
        state.update(_pid=None, _handle=None, _labels=None, _crcs=None, _keys=None,
                     _metadata_crcs=None)
        return state


"""``fastdata.DatasetRef``: where a dataset is and how its files are opened,
as one value (no torch).

The settings that belong to a stored dataset travel together: its path or
URL, the version read, whether records are checked, whether links out of
its folder are followed, and its format reader's own settings. Every entry
point takes one (``open_dataset``, the Dataset classes, each source of
``mix``, DALI), as ``Decode`` and ``Order`` carry decoding and order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class DatasetRef:
    """A stored dataset and how to open it.

    Args:
        path: the dataset: an ``.lmdb`` folder, an ``.h5`` file, a sharded
            set's manifest (or shard pattern, or a list of shard files), a
            view file or a version record; a local path or a URL.
        version: the version to read (``fastdata info --history`` lists
            them); None: the current one.
        verify: check each record's CRC32 as it is read.
        allow_outside: follow links and names leading out of the dataset's
            folder (see :mod:`fastdata.contained`).
        reader_settings: the format reader's own settings, by name (LMDB
            ``readahead``; HDF5 ``rdcc_nbytes``, ``merge_gap``,
            ``block_bytes``; TFRecord ``feature_keys``, ``chunk_size``).

    Example:
        ``fastdata.open_dataset(fastdata.DatasetRef("s3://b/train.tar.fastdata.json",
        version=3))``
    """

    path: str | os.PathLike | Sequence[str | os.PathLike]
    version: int | None = None
    verify: bool = True
    allow_outside: bool = False
    reader_settings: Mapping[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        version = self.version
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                    or version < 1):
            raise TypeError(f"version must be a version number (1, 2, ...), not {version!r}")
        if not isinstance(self.verify, bool) or not isinstance(self.allow_outside, bool):
            raise TypeError("verify and allow_outside are True or False")
        if self.reader_settings is not None and not isinstance(self.reader_settings, Mapping):
            raise TypeError(f"reader_settings is a mapping of setting names to values, not "
                             f"{type(self.reader_settings).__name__}")
        path = self.path
        if isinstance(path, os.PathLike):
            object.__setattr__(self, "path", os.fspath(path))
        elif isinstance(path, (list, tuple)):
            object.__setattr__(self, "path", [os.fspath(p) for p in path])
        elif not isinstance(path, str):
            raise TypeError(f"path is a path, a URL or a list of shard files, not "
                             f"{type(path).__name__}")

    @classmethod
    def of(cls, where, *, version: int | None = None, verify: bool | None = None,
           allow_outside: bool | None = None,
           reader_settings: Mapping[str, Any] | None = None) -> DatasetRef:
        """``where`` as a DatasetRef: a path with the settings given, or a
        DatasetRef with those given (other than their defaults) replacing its
        own.

        Raises:
            ValueError: a setting given both in the DatasetRef and here, with
                two values other than its default.
        """
        defaults = {"version": None, "verify": True, "allow_outside": False,
                    "reader_settings": None}
        given = {k: v for k, v in dict(version=version, verify=verify,
                                        allow_outside=allow_outside,
                                        reader_settings=reader_settings).items()
                 if v is not None and v != defaults[k]}
        if not isinstance(where, DatasetRef):
            return cls(where, **given)
        clash = [k for k, v in given.items() if getattr(where, k) != defaults[k] and
                 getattr(where, k) != v]
        if clash:
            raise ValueError(f"{', '.join(clash)} given twice (in the DatasetRef and as a "
                             f"keyword) with different values; give it once")
        return replace(where, **given) if given else where

    def describe(self) -> dict:
        """What a resume state or a message shows of it."""
        return {"path": self.path if isinstance(self.path, str) else list(self.path),
                "version": self.version}

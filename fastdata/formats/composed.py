"""The base of readers made of other readers: a view (its parent's records
through a selection) and a dataset version (its parts one after another).
No torch; the readers inside open their own files."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from fastdata.formats.reader import Reader


class ComposedReader(Reader):
    """A reader over ``inner()`` readers, opened with their format's reader
    ``settings``; a subclass maps record indices onto them."""

    def __init__(self, path, *, verify: bool = True, allow_outside: bool = False,
                 settings: Mapping[str, Any] | None = None) -> None:
        self._settings = dict(settings or {})
        super().__init__(path, verify=verify, allow_outside=allow_outside)

    def inner(self) -> list[Reader]:
        """The readers this one reads through."""
        raise NotImplementedError

    def _make_keys(self):
        """The keys as a sequence over the inner readers' keys."""
        raise NotImplementedError

    @property
    def keys(self):
        if self._keys is None:
            self._keys = self._make_keys()
        return self._keys

    def check(self, index: int, data, expected: int | None = None) -> None:
        # The CRC looked up with the batch's: no inner reader is asked per
        # record unless it fails (then the inner reader names the record).
        if expected is not None and zlib.crc32(data) == expected:
            return
        self._check_inner(index, data, expected)

    def _check_inner(self, index: int, data, expected: int | None) -> None:
        raise NotImplementedError

    def _iter_payloads(self):
        for i, data, _ in self.records(check=False):
            yield i, data

    def child_options(self) -> dict:
        return {"verify": self.verify, "allow_outside": self.allow_outside,
                "settings": self._settings}

    def close(self) -> None:
        for reader in self.inner():
            reader.close()

    def __getstate__(self):
        # The inner readers pickle their own way; what maps indices goes along.
        state = self.__dict__.copy()
        state.update(_pid=None, _handle=None, _keys=None)
        return state

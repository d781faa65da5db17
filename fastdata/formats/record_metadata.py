"""Per-sample metadata, the part of every reader that reads it (no torch).

A record's metadata is canonical JSON stored beside its payload, each with
its own CRC-32 (see ``fastdata.records.metadata_json``). :class:`Reader`
takes this surface from :class:`RecordMetadata`; a format supplies the two
hooks, ``_read_metadata_many`` and ``_load_metadata_crcs``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence

import numpy as np

from fastdata.errors import CorruptDataError


class RecordMetadata:
    """The metadata methods of a reader (``fastdata.formats.reader.Reader``),
    which provides ``manifest``, ``path``, ``verify``, ``key_of``,
    ``_normalise``, ``_check_process`` and ``_metadata_crcs``."""

    # -- the format's hooks --------------------------------------------------------

    def _read_metadata_many(self, indices: Sequence[int]) -> list[bytes | None]:
        """The stored metadata JSON of each record (None: the record has none);
        called only when ``has_metadata``. Indices are in range."""
        return [None] * len(indices)

    def _load_metadata_crcs(self) -> np.ndarray | None:
        """The CRC32 of each record's metadata JSON (0: none), checked against
        the manifest's SHA-256; None when the dataset stores none (another
        tool's)."""
        return None

    # -- public API ----------------------------------------------------------------

    @property
    def has_metadata(self) -> bool:
        """Whether records carry metadata (the manifest's ``extra["metadata"]``)."""
        extra = self.manifest.extra if isinstance(self.manifest.extra, dict) else {}
        return isinstance(extra.get("metadata"), dict)

    def metadata(self, index: int) -> dict:
        """Record ``index``'s metadata: the dict the source gave (as JSON gives it
        back), or an empty dict when it has none.

        Raises:
            CorruptDataError: the stored JSON fails its CRC32 (with ``verify``)
                or cannot be parsed.
        """
        return self.metadata_many([index])[0]

    def metadata_many(self, indices: Sequence[int]) -> list[dict]:
        """The metadata of several records (see :meth:`metadata`)."""
        norm = self._normalise(indices)
        if not self.has_metadata:
            return [{} for _ in norm]
        return [self.parse_metadata(j, data)
                for j, data in zip(norm, self.metadata_bytes_many(norm, check=self.verify))]

    def metadata_bytes_many(self, indices: Sequence[int], *, check: bool = True
                            ) -> list[bytes | None]:
        """The stored metadata JSON of records ``indices`` (in range), None for
        a record without; ``check``: against their CRC32s."""
        if not self.has_metadata:
            return [None] * len(indices)
        self._check_process()
        found = self._read_metadata_many(list(indices))
        if check:
            for j, data in zip(indices, found):
                self.check_metadata(j, data)
        return found

    def metadata_crcs(self) -> np.ndarray | None:
        """The CRC32 of each record's metadata JSON (0: none), loaded and checked
        against the manifest on first use; None when there are none to check."""
        if self._metadata_crcs is None and self.has_metadata:
            self._check_process()
            self._metadata_crcs = self._load_metadata_crcs()
        return self._metadata_crcs

    def check_metadata(self, index: int, data: bytes | None) -> None:
        """Raise CorruptDataError when ``data`` (None: no metadata stored) is
        not record ``index``'s metadata as packed (its CRC32)."""
        crcs = self.metadata_crcs()
        if crcs is None:  # another tool's dataset: nothing to check against
            return
        expected = int(crcs[index])
        actual = 0 if data is None else zlib.crc32(data)
        if actual != expected:
            what = "is missing" if data is None else (
                f"fails its CRC32 check (stored {expected:08x}, read {actual:08x})")
            raise CorruptDataError(
                f"the metadata of record {index} {what}: the file is damaged; re-pack it or "
                f"read with on_error='skip'", path=self.path, key=self.key_of(index),
                record=index)

    def parse_metadata(self, index: int, data: bytes | None):
        """Record ``index``'s stored metadata JSON as its value ({} for None)."""
        if data is None:
            return {}
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise CorruptDataError(
                f"the metadata of record {index} is not valid JSON ({type(exc).__name__}: "
                f"{str(exc)[:80]}); re-pack it", path=self.path, key=self.key_of(index),
                record=index) from None

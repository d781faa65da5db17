"""The sample record and the manifest: one JSON schema for every format.

A packed dataset is a sequence of records ``(key, label, payload)``. The
manifest describes the whole dataset and is written last, so a dataset without
one is incomplete by definition.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from fastdata.errors import ManifestError
from fastdata.manifest_schema import validate_manifest

#: Version of the manifest schema and of the on-disk layouts it describes.
#: Readers refuse manifests with a higher version.
MANIFEST_VERSION = 1

#: Value of the "kind" field, so a stray JSON file is never taken for a manifest.
MANIFEST_KIND = "fastdata-manifest"


@dataclass(frozen=True, slots=True)
class Record:
    """One sample on its way into a container.

    Attributes:
        index: position in the dataset (0-based, dense).
        key: the path of the source file relative to the source root, with "/"
            separators; unique within a dataset.
        label: the class index.
        payload: the bytes to store (the original file bytes unless a pack-time
            encoding changed them).
        encoding: what ``payload`` holds ("jpeg", "png", ..., or "raw").
        width: image width in pixels (0 when unknown).
        height: image height in pixels (0 when unknown).
        metadata: the sample's metadata as canonical UTF-8 JSON (see
            :func:`metadata_json`), or None when it has none.
    """

    index: int
    key: str
    label: int
    payload: bytes
    encoding: str
    width: int = 0
    height: int = 0
    metadata: bytes | None = None


@dataclass(frozen=True, slots=True)
class PieceRecord:
    """What a resumed pack knows of a record it keeps: its key, label, CRC-32 and
    payload size (the bytes themselves stay in the partial output), and its
    metadata (canonical JSON, as the journal carries it; None: none)."""

    key: str
    label: int
    crc: int
    size: int
    metadata: bytes | None = None


def metadata_json(metadata: Any) -> bytes:
    """The stored form of a sample's metadata: canonical UTF-8 JSON, compact,
    keys in the order given (``json.dumps(meta, ensure_ascii=False,
    separators=(",", ":"))``).

    Raises:
        TypeError: ``metadata`` is not a dict.
        ValueError: it holds a value JSON cannot represent (bytes, a set, NaN
            or infinity, an object), or text that is not valid Unicode; the
            message says which.
    """
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict (a JSON object), not "
                         f"{type(metadata).__name__}")
    try:
        text = json.dumps(metadata, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        detail = ("a float NaN or infinity: JSON has neither" if "Out of range float" in
                  str(exc) else f"{type(exc).__name__}: {exc}")
        raise ValueError(f"metadata cannot be stored as JSON ({detail}); give JSON values: "
                         f"dict, list, str, int, finite float, bool, None") from None


@dataclass(frozen=True, slots=True)
class RenamedKey:
    """A record whose key a format stores under another name (tar member names).
    The dataset's keys (``ds.keys``) stay the original ones.

    Attributes:
        key: the record's key, as the source gave it.
        stored_as: the name the format stores it under (for tar: the webdataset
            sample key, the members' name without extension).
        file: the data file it is in, relative to the output's folder.
        reason: why the name differs.
    """

    key: str
    stored_as: str
    file: str
    reason: str


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to know about a packed dataset.

    Attributes:
        format: the container format name ("lmdb", "hdf5", "tfrecord", "tar").
        count: number of records.
        classes: class names; a record's label indexes this list.
        class_counts: records per class, same order as ``classes``.
        encoding: ``{"storage": "keep"|"jpeg"|"png"|"raw", "formats": {encoding: count},
            "shape": [h, w, c] or None}``.
        bytes: ``{"source": ..., "payload": ..., "on_disk": ...}`` byte totals.
        checksums: ``{"record": "crc32", "payload_sha256": hex, "metadata_sha256":
            {array name: hex}}``: each record's CRC32 is stored beside it; the
            payload SHA-256 covers all payloads in order; ``metadata_sha256``
            the per-record arrays as stored (see fastdata.formats.integrity).
        shards: one entry per file: ``{"path", "count", "bytes", ...}``; paths are
            relative to the dataset location.
        source: where the data came from: root, fingerprint, file counts.
        pack_options: the options the pack ran with.
        created_at: ISO 8601 UTC time the pack finished.
        fastdata_version: version of the fastdata that wrote it.
        version: manifest schema version.
        extra: format-specific settings (key schema, index files, ...).
    """

    format: str
    count: int
    classes: list[str]
    class_counts: list[int]
    encoding: dict[str, Any]
    bytes: dict[str, int]
    checksums: dict[str, Any]
    shards: list[dict[str, Any]]
    source: dict[str, Any]
    pack_options: dict[str, Any]
    created_at: str
    fastdata_version: str
    version: int = MANIFEST_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as torchvision's ImageFolder has it."""
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def raw_shape(self) -> tuple[int, ...] | None:
        """The HWC shape of pre-decoded (raw) records, or None for encoded ones."""
        enc = self.encoding or {}
        if enc.get("storage") == "raw" and enc.get("shape"):
            return tuple(int(x) for x in enc["shape"])
        return None

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain JSON-ready data, with the schema marker."""
        data = {"kind": MANIFEST_KIND}
        data.update(dataclasses.asdict(self))
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """The manifest as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str | bytes, *, path: str | None = None) -> "Manifest":
        """Parse and validate a manifest.

        Args:
            text: the JSON text.
            path: where it came from, for error messages.

        Raises:
            ManifestError: the text is not a fastdata manifest, lacks a field,
                has a field of the wrong type or range (see
                ``fastdata.manifest_schema``), or was written by a newer fastdata.
        """
        try:
            data = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"manifest is not valid JSON ({exc})", path=path) from None
        if not isinstance(data, dict) or data.get("kind") != MANIFEST_KIND:
            raise ManifestError("not a fastdata manifest", path=path)
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ManifestError("manifest has no integer 'version' field (>= 1)", path=path)
        if version > MANIFEST_VERSION:
            raise ManifestError(
                f"manifest version {version} is newer than this fastdata reads "
                f"(up to {MANIFEST_VERSION}); upgrade fastdata (in its checkout: git pull, then "
                f"pip install -e .)",
                path=path,
            )
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(n for n in names if n not in data and n not in ("version", "extra"))
        if missing:
            raise ManifestError(f"manifest lacks field(s) {', '.join(missing)}", path=path)
        validate_manifest(data, path)
        return cls(**{k: v for k, v in data.items() if k in names})

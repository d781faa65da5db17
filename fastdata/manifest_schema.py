"""The manifest's JSON schema: field types and basic ranges, checked on every open.

A manifest is read from a file anyone can edit or damage; a wrong type
(``"count": 200.0``, ``"classes": 5``) must become a one-line ManifestError
naming the file and the field, never a TypeError deep inside a reader.
"""

from __future__ import annotations

from typing import Any

from fastdata.contained import check_name, is_plain_name
from fastdata.errors import ManifestError

_HINT = "the manifest is damaged or was edited by hand; re-pack the dataset or restore it"


def _is_int(value: Any) -> bool:
    # JSON true/false load as bool, a subclass of int: never a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(field: str, what: str, value: Any, path: str | None) -> ManifestError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ManifestError(f"manifest field {field!r} must be {what}, not {shown}; {_HINT}",
                         path=path)


def _count(data: dict, field: str, path: str | None, *, name: str | None = None) -> int:
    value = data[field]
    if not _is_int(value) or value < 0:
        raise _fail(name or field, "an integer >= 0", value, path)
    return value


def _typed(data: dict, field: str, kind: type, what: str, path: str | None) -> Any:
    value = data[field]
    if not isinstance(value, kind):
        raise _fail(field, what, value, path)
    return value


def validate_manifest(data: dict, path: str | None = None) -> None:
    """Check the types and basic ranges of every field of a parsed manifest.

    Args:
        data: the manifest JSON object (its ``kind`` and ``version`` already checked).
        path: where it came from, for error messages.

    Raises:
        ManifestError: a field has the wrong type or an impossible value; the
            message names the field.
    """
    for field in ("format", "created_at", "fastdata_version"):
        _typed(data, field, str, "a string", path)
    if not data["format"]:
        raise _fail("format", "a format name", data["format"], path)
    for field in ("encoding", "bytes", "checksums", "source", "pack_options"):
        _typed(data, field, dict, "a JSON object", path)
    if "extra" in data:
        _typed(data, "extra", dict, "a JSON object", path)
        _check_sidecar_names(data["extra"], path)
    count = _count(data, "count", path)
    _check_classes(data, count, path)
    _check_bytes(data["bytes"], path)
    _check_encoding(data["encoding"], path)
    _check_shards(data, count, path)


def _check_classes(data: dict, count: int, path: str | None) -> None:
    classes = _typed(data, "classes", list, "a list of class names", path)
    if not all(isinstance(c, str) for c in classes):
        raise _fail("classes", "a list of strings", classes, path)
    counts = _typed(data, "class_counts", list, "a list of record counts", path)
    if not all(_is_int(n) and n >= 0 for n in counts):
        raise _fail("class_counts", "a list of integers >= 0", counts, path)
    if len(counts) != len(classes):
        raise ManifestError(f"manifest lists {len(classes)} classes but {len(counts)} class "
                            f"counts; {_HINT}", path=path)
    if classes and sum(counts) != count:  # no classes: unlabelled records (label -1)
        raise ManifestError(f"manifest class counts add up to {sum(counts)}, not its record "
                            f"count {count}; {_HINT}", path=path)


def _check_bytes(sizes: dict, path: str | None) -> None:
    for name, value in sizes.items():
        if not _is_int(value) or value < 0:
            raise _fail(f"bytes.{name}", "an integer >= 0", value, path)


def _check_encoding(encoding: dict, path: str | None) -> None:
    storage = encoding.get("storage")
    if storage is not None and not isinstance(storage, str):
        raise _fail("encoding.storage", "a string", storage, path)
    formats = encoding.get("formats", {})
    if not isinstance(formats, dict) or not all(_is_int(n) and n >= 0 for n in formats.values()):
        raise _fail("encoding.formats", "an object of counts", formats, path)
    shape = encoding.get("shape")
    if shape is not None and not (isinstance(shape, list) and len(shape) == 3
                                  and all(_is_int(n) and n > 0 for n in shape)):
        raise _fail("encoding.shape", "null or [height, width, channels] (positive integers)",
                    shape, path)


def _plain_numbers(shard: dict) -> bool:
    """A shard's ``bytes`` and ``first``, where present, are integers >= 0."""
    for field in ("bytes", "first"):
        value = shard.get(field, 0)
        if type(value) is not int or value < 0:
            return False
    return True


def _check_shards(data: dict, count: int, path: str | None) -> None:
    shards = _typed(data, "shards", list, "a list of shard entries", path)
    total = 0
    for n, shard in enumerate(shards):
        # A shard as fastdata writes it passes in a few tests (10^5 of them
        # are checked at every open); anything else is checked field by field.
        if type(shard) is dict and type(name := shard.get("path")) is str \
                and is_plain_name(name) and type(held := shard.get("count")) is int \
                and held >= 0 and _plain_numbers(shard) \
                and type(shard.get("sha256", "")) is str:
            total += held
            continue
        where = f"shards[{n}]"
        if not isinstance(shard, dict):
            raise _fail(where, "a JSON object", shard, path)
        if not isinstance(shard.get("path"), str) or not shard["path"]:
            raise _fail(f"{where}.path", "a file name", shard.get("path"), path)
        check_name(shard["path"], field=f"{where}.path", where=path)
        if "count" not in shard:
            raise ManifestError(f"manifest field {where} has no 'count'; {_HINT}", path=path)
        total += _count(shard, "count", path, name=f"{where}.count")
        for field in ("bytes", "first"):
            if field in shard:
                _count(shard, field, path, name=f"{where}.{field}")
        if "sha256" in shard and not isinstance(shard["sha256"], str):
            raise _fail(f"{where}.sha256", "a hex string", shard["sha256"], path)
    if shards and total != count:
        raise ManifestError(f"manifest shards hold {total} records, not its record count "
                            f"{count}; {_HINT}", path=path)


#: The fields of ``extra`` that name a file beside the manifest (sharded formats).
SIDECAR_FIELDS = (("index",), ("keys",), ("metadata", "index"), ("index_pieces", "file"),
                  ("metadata", "index_pieces", "file"), ("keys_pieces", "file"))


def sidecar_fields(extra: dict) -> list[tuple[dict, str, tuple[str, ...]]]:
    """(the object holding it, its key, its field) of each of
    :data:`SIDECAR_FIELDS` whose holder ``extra`` has (the key may be absent)."""
    out = []
    for field in SIDECAR_FIELDS:
        holder = extra
        for part in field[:-1]:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if isinstance(holder, dict):
            out.append((holder, field[-1], field))
    return out


def _check_sidecar_names(extra: dict, path: str | None) -> None:
    for holder, key, field in sidecar_fields(extra):
        if key in holder:
            name = f"extra.{'.'.join(field)}"
            if not isinstance(holder[key], str):
                raise _fail(name, "a file name", holder[key], path)
            check_name(holder[key], field=name, where=path)

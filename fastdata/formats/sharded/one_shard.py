"""One shard of a fastdata set, opened by its own name (``x-000003.tar``).

Scanned on its own, such a shard would read as another tool's: its classes the
label numbers, its keys the tar members' stems. Its set's manifest, beside it,
knows better: the shard's name with its number taken off names the set
(``x-000003.tar`` -> ``x.tar.fastdata.json``; ``x-00003-of-00008.tfrecord``
-> ``x.tfrecord.fastdata.json``), and when that manifest lists the shard, the
shard opens as that part of the set: its records, with the set's classes,
keys, labels, checksums and metadata. No torch here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np

from fastdata.formats.remote_files import exists, manifest_bytes
from fastdata.formats.sharded.layout import ShardLayout, parse_output
from fastdata.records import Manifest

_NUMBERED = re.compile(r"(?P<prefix>.+?)[-_.]\d+(?:-of-\d+)?")


def set_of_shard(path: str, extensions: tuple[str, ...], *, total_in_name: bool
                 ) -> tuple[ShardLayout, str, int] | None:
    """(the set's layout, its manifest, the shard's number in it) when ``path``
    is a numbered shard that a set's manifest beside it lists; else None."""
    name = os.path.basename(path.rstrip("/"))
    ext = next((e for e in extensions if name.lower().endswith(e.lower())), None)
    numbered = _NUMBERED.fullmatch(name[: len(name) - len(ext)]) if ext else None
    if numbered is None:
        return None
    folder = path[: len(path) - len(name)]
    layout = parse_output(folder + numbered.group("prefix") + ext, extensions, sharded=False,
                          total_in_name=total_in_name)
    for manifest_path in dict.fromkeys((layout.manifest_path, layout.legacy_manifest_path)):
        shard = _listed(manifest_path, name)
        if shard is not None:
            return layout, manifest_path, shard
    return None


def _listed(manifest_path: str, name: str) -> int | None:
    """The number of shard ``name`` in the manifest at ``manifest_path``, or None
    (no such manifest, not one of ours, or not listing it)."""
    try:
        if not exists(manifest_path):
            return None
        data = json.loads(manifest_bytes(manifest_path))
    except (OSError, ValueError):
        return None
    shards = data.get("shards") if isinstance(data, dict) else None
    names = [s.get("path") if isinstance(s, dict) else None
             for s in (shards if isinstance(shards, list) else [])]
    return names.index(name) if name in names else None


def shard_manifest(manifest: Manifest, shard: int, index: np.ndarray, labels: np.ndarray,
                   set_name: str) -> Manifest:
    """The manifest of shard ``shard`` of the set ``manifest`` describes: its
    records (``index`` and ``labels``, the shard's rows), the set's classes,
    and ``extra.shard_of`` naming the set's manifest."""
    counts = np.bincount(labels[labels >= 0], minlength=len(manifest.classes)).tolist() \
        if manifest.classes else []
    entry = manifest.shards[shard]
    extra = dict(manifest.extra, shard_of=set_name)
    if isinstance(extra.get("metadata"), dict):  # its count is the set's
        extra["metadata"] = {k: v for k, v in extra["metadata"].items() if k != "records"}
    checksums = {k: v for k, v in manifest.checksums.items() if k != "payload_sha256"}
    return dataclasses.replace(
        manifest, count=len(labels), class_counts=counts,
        shards=[{**entry, **({"first": 0} if "first" in entry else {})}],
        bytes={"payload": int(index["size"].sum()), "on_disk": int(entry.get("bytes", 0))},
        checksums=checksums, extra=extra)

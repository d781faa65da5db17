"""A sharded dataset at a URL, as a pack to that URL sees it
(``fastdata.packers.upload``): the object that says a dataset is there, and the
objects an overwrite may delete."""

from __future__ import annotations

import json
from collections.abc import Callable

from fastdata.contained import name_problem
from fastdata.formats.remote_files import MANIFEST_LIMIT
from fastdata.formats.sharded.layout import parse_output
from fastdata.manifest_schema import sidecar_fields


def manifest_url(url: str, extensions: tuple[str, ...]) -> str:
    """The manifest of the sharded output ``url``: readers find the dataset
    through it, so it is there exactly when a dataset is."""
    return parse_output(url, extensions, sharded=False).manifest_path


def dataset_objects(url: str, extensions: tuple[str, ...],
                    shard_files: Callable[[str], list[str]]) -> list[str]:
    """The objects of the sharded dataset at ``url`` (its manifest last), from
    its manifest; ``shard_files(name)``: a shard's files (with its side files).
    The pack's report beside the manifest is the pack's to name (see
    ``fastdata.packers.upload``).

    Only names that are provably this output's own are taken, as a local
    ``--overwrite`` does: its shard naming or its sidecars, plain names in its
    folder. Whatever else the old manifest lists (another dataset's objects,
    ``..``, other prefixes) is never deleted."""
    from fastdata.storage import basename, join, open_remote

    layout = parse_output(url, extensions, sharded=False)
    manifest = json.loads(open_remote(layout.manifest_path).read(limit=MANIFEST_LIMIT))
    manifest = manifest if isinstance(manifest, dict) else {}
    folder = layout.directory
    sidecars = {basename(p) for p in (layout.index_path, layout.keys_path, layout.metadata_path,
                                      layout.index_pieces_path, layout.metadata_pieces_path,
                                      layout.keys_pieces_path)}
    names = []
    for shard in manifest.get("shards") if isinstance(manifest.get("shards"), list) else []:
        name = shard.get("path") if isinstance(shard, dict) else None
        if _plain(name) and layout.owns(name, extensions):
            names += [join(folder, n) for n in shard_files(name)]
    extra = manifest.get("extra") if isinstance(manifest.get("extra"), dict) else {}
    names += [join(folder, n) for n in (holder.get(key) for holder, key, _
                                        in sidecar_fields(extra))
              if _plain(n) and n in sidecars]
    return names + [layout.manifest_path]


def _plain(name) -> bool:
    """A plain file name directly in the dataset's folder (see fastdata.contained)."""
    return isinstance(name, str) and "/" not in name and name_problem(name, remote=True) is None

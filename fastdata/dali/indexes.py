"""Index files for DALI's readers, generated once per shard and cached.

DALI's TFRecord reader takes tfrecord2idx files: fastdata writes one beside
every shard (``<shard>.idx``); shards without one get one generated from the
dataset index. DALI's webdataset reader takes its own format (wds2idx,
``v1.2``), generated here from the tar headers. Generated files go to
``index_dir``, else ``$FASTDATA_CACHE_DIR/dali-index``, else
``~/.cache/fastdata/dali-index``, named after each shard's path, size and
mtime so that a rewritten shard never meets a stale index. A remote shard is
read from its copy in the download cache (see fastdata.dali.downloads), whose
mtime the cache touches on every use: its index is named after the copy's
path, size and identity (its inode and the shard's SHA-256) instead.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

from fastdata.dali.downloads import ShardFiles
from fastdata.errors import FastDataError

#: Version tag of the webdataset index files written here (DALI's wds2idx format).
WDS_INDEX_VERSION = "v1.2"
#: Component names in those index files (they need not match the member names).
IMAGE_COMPONENT = "img"
LABEL_COMPONENT = "cls"
# Digits assumed when a cached index lost its width file: every int64 fits, and it
# only costs a few more pipeline operations.
_MAX_DIGITS = 20


def cache_dir(index_dir: str | os.PathLike | None) -> str:
    """The folder of generated index files."""
    if index_dir is not None:
        return os.fspath(index_dir)
    base = os.environ.get("FASTDATA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "fastdata")
    return os.path.join(base, "dali-index")


def cached_index_path(shard: str, kind: str, index_dir: str | os.PathLike | None,
                      identity: str | None = None) -> str:
    """Where the generated ``kind`` index of ``shard`` lives (keyed by its path,
    size and mtime, or ``identity`` in place of the mtime)."""
    st = os.stat(shard)
    version = f"id {identity}" if identity is not None else str(st.st_mtime_ns)
    tag = f"{os.path.realpath(shard)}\0{st.st_size}\0{version}\0{kind}"
    digest = hashlib.sha256(tag.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    return os.path.join(cache_dir(index_dir), f"{os.path.basename(shard)}.{digest}.{kind}.idx")


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary name, so that readers never
    see half a file."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _identity(files: ShardFiles, shard: int) -> str | None:
    return files.identities[shard] if files.identities is not None else None


def tfrecord_index_paths(reader: Any, files: ShardFiles,
                         index_dir: str | os.PathLike | None) -> list[str]:
    """The tfrecord2idx index of every shard of a TFRecord reader: fastdata's
    ``<shard>.idx`` where it exists (``files.side``), else one generated from
    the dataset index."""
    from fastdata.formats.tfrecord.schema import shard_index_text

    out = []
    for shard, path in enumerate(files.paths):
        if files.side[shard] is not None:
            out.append(files.side[shard])
            continue
        target = cached_index_path(path, "tfrecord", index_dir, _identity(files, shard))
        if not os.path.isfile(target):
            # The dataset index points at whole framed records, as tfrecord2idx does.
            rows = reader.shard_rows(shard)
            write_atomic(target, shard_index_text(zip(rows["offset"].tolist(),
                                                      rows["size"].tolist())))
        out.append(target)
    return out


def webdataset_index_paths(reader: Any, files: ShardFiles,
                           index_dir: str | os.PathLike | None
                           ) -> tuple[list[str], int] | None:
    """DALI webdataset index files for every shard of a tar reader (``files``:
    their local files), and the longest ``.cls`` member in bytes; None when a
    record has no ``.cls`` member (its label comes from ``.json``, which the
    DALI reader path does not parse)."""
    paths, digits = [], 1
    for shard, path in enumerate(files.paths):
        target = cached_index_path(path, "wds", index_dir, _identity(files, shard))
        if os.path.isfile(target):
            paths.append(target)
            digits = max(digits, _read_width(target))
            continue
        built = build_wds_index(reader, shard, path)
        if built is None:
            return None
        text, width = built
        # The widest label goes beside the index (DALI's format has no room for
        # it), so a cached index needs no rescan; written first, the index last.
        write_atomic(target + ".width", str(width))
        write_atomic(target, text)
        paths.append(target)
        digits = max(digits, width)
    return paths, digits


def _read_width(index_path: str) -> int:
    try:
        with open(index_path + ".width", encoding="ascii") as f:
            return max(1, int(f.read().strip()))
    except (OSError, ValueError):
        return _MAX_DIGITS


def build_wds_index(reader: Any, shard: int, path: str) -> tuple[str, int] | None:
    """(wds2idx text, widest label member) of one tar shard (read at ``path``, a
    local file), or None when a record has no label member.

    Each index line names the sample's image member that the reader indexes
    (as component ``img``) and its ``.cls`` member (as ``cls``).

    Raises:
        FastDataError: the dataset index points at no member of the shard.
    """
    from fastdata.formats.tar.members import iter_sample_members
    from fastdata.formats.tar.schema import LABEL_EXT

    offsets = reader.shard_rows(shard)["offset"].tolist()
    wanted = {off: i for i, off in enumerate(offsets)}
    image: list[Any] = [None] * len(offsets)
    label: list[Any] = [None] * len(offsets)
    for _key, members in iter_sample_members(path):
        for member in members.values():
            record = wanted.get(member.offset)
            if record is not None:
                image[record] = member
                label[record] = members.get(LABEL_EXT)
                break
    if None in image:
        first = reader.shard_ranges()[shard][0]
        raise FastDataError(f"the dataset index points at no tar member for record "
                            f"{first + image.index(None)}; re-pack the dataset",
                            path=reader.shard_paths[shard])  # the URL of a remote shard
    if None in label:
        return None
    return _wds_index_text(image, label), max(c.size for c in label)


def _wds_index_text(image: list[Any], label: list[Any]) -> str:
    # v1.2 lines carry member names, which must not hold spaces; v1.1 lines do without.
    names_ok = all(not any(ch.isspace() for ch in m.name) for m in (*image, *label))
    version = WDS_INDEX_VERSION if names_ok else "v1.1"

    def component(ext: str, m: Any) -> str:
        return f"{ext} {m.offset} {m.size} {m.name}" if names_ok else f"{ext} {m.offset} {m.size}"

    lines = [f"{version} {len(image)}\n"]
    lines.extend(f"{component(IMAGE_COMPONENT, i)} {component(LABEL_COMPONENT, c)}\n"
                 for i, c in zip(image, label))
    return "".join(lines)

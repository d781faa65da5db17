"""``_info.json``: the dataset info that timm's webdataset reader opens at a
dataset's root, so ``timm.data.create_dataset("wds/NAME", root=FOLDER,
split=SPLIT)`` reads a folder of fastdata tar shards.

timm (``timm/data/readers/reader_wds.py``) loads ``FOLDER/_info.json`` and takes
``splits[SPLIT]``: ``name``, ``num_samples``, ``filenames`` (shard names, each
joined to FOLDER) and ``shard_lengths`` (records per shard, in that order)::

    {"splits": {"train": {"name": "train", "num_samples": 1281167,
                          "filenames": ["train-000000.tar", ...],
                          "shard_lengths": [5000, ...]}}}

One file serves every split packed into the folder: a tar pack writes its own
split's entry and keeps the others (read, change, write a temporary file,
rename; under a lock, so two packs finishing in one folder lose no entry). An
entry that lists only this output's shards under another split name goes: one
output is one split. Other fields (a ``name`` of the dataset) are kept; fastdata
writes none, so the file depends on the shards alone, not on the folder.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from fastdata.errors import FastDataError, OutputExistsError
from fastdata.formats.output import OutputLock, fsync_dir, lock_path
from fastdata.storage.partial import replace_file

#: The file timm looks for first (then ``info.json``) at the dataset's root.
INFO_NAME = "_info.json"
#: Largest info file read back (one split of 10,000 shards takes ~300 kB).
INFO_LIMIT = 64 << 20
#: Seconds to wait for another pack's update of the same file.
_LOCK_WAIT = 60.0


def split_problem(split: object) -> str | None:
    """Why timm cannot take ``split`` as a split name from ``_info.json``, or None.

    timm reads a split that contains ``tar`` or ``..`` as a shard pattern
    (``train-{0000..0009}.tar|N``), never as a name to look up.
    """
    if not isinstance(split, str) or not split.strip():
        return "a split name is a non-empty string"
    if "tar" in split or ".." in split:
        return (f"timm reads a split containing 'tar' or '..' as a shard pattern, so "
                f"{split!r} would not find its entry")
    return None


def check_split(split: str) -> str:
    """``split``, or FastDataError saying why timm could not use it."""
    problem = split_problem(split)
    if problem:
        raise FastDataError(f"split {split!r}: {problem}; give another split name")
    return split


def default_split(prefix: str) -> str | None:
    """The split a tar output is written as without ``split=``: its prefix
    (``train-%06d.tar`` -> ``train``); None when timm could not use that name
    (then no entry is written)."""
    return prefix if split_problem(prefix) is None else None


def read_info(path: str) -> dict:
    """The info file at ``path`` as data ({} when there is none).

    Raises:
        FastDataError: it is there but not a JSON object with a ``splits`` object
            (a file of someone else's that an update would lose).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(INFO_LIMIT + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FastDataError(f"cannot read timm's dataset info ({exc.strerror or exc}); fix "
                            "its permissions or remove it", path=path) from None
    try:
        data = json.loads(raw) if len(raw) <= INFO_LIMIT else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("splits", {}), dict):
        raise FastDataError("this is not a timm dataset info file (a JSON object with a "
                            "\"splits\" object): fastdata adds each tar dataset packed here to "
                            "it; move or remove the file, or pack into another folder",
                            path=path)
    return data


def update_info(directory: str, split: str, shards: list[tuple[str, int]], *,
                owns: Callable[[str], bool]) -> str:
    """Write ``split``'s entry (shard names and record counts, in order) into
    ``directory/_info.json``, keeping the other splits; the file's path.

    ``owns(name)`` says whether a shard name is this output's: another split's
    entry that lists only such names is dropped (this output was that split).
    """
    path = os.path.join(directory, INFO_NAME)
    with _locked(directory, path):
        info = read_info(path)
        splits = {name: entry for name, entry in info.get("splits", {}).items()
                  if name == split or not _only_ours(entry, owns)}
        splits[split] = {"name": split, "num_samples": sum(n for _, n in shards),
                         "filenames": [name for name, _ in shards],
                         "shard_lengths": [n for _, n in shards]}
        info = {**info, "splits": splits}
        _remove_leftovers(directory)
        replace_file(path, json.dumps(info, indent=2, ensure_ascii=False) + "\n")
        fsync_dir(directory)
    return path


def stage_remote_info(folder: str, staging: str) -> Callable[[], None] | None:
    """For a pack to a URL in ``folder``, staged in the local ``staging``: the
    info file at the URL, copied in, so that the pack adds its split to it and
    the upload keeps the other splits. Returns what to call after the pack:
    it drops the copy when the pack added nothing (no upload then); None when
    the URL has no info file."""
    from fastdata.storage import exists, join, open_remote

    url = join(folder, INFO_NAME)
    if not exists(url):
        return None
    fetched = open_remote(url).read(limit=INFO_LIMIT)
    path = os.path.join(staging, INFO_NAME)
    with open(path, "wb") as f:
        f.write(fetched)

    def drop_unchanged() -> None:
        with open(path, "rb") as f:
            unchanged = f.read() == fetched
        if unchanged:
            os.remove(path)

    return drop_unchanged


def _remove_leftovers(directory: str) -> None:
    """Remove the temporary files of updates killed half-way (called under the
    folder's lock, so none is an update under way): the names of
    :func:`~fastdata.storage.partial.partial_file`, and the one fixed name
    earlier versions used. Links among them are removed, never followed."""
    old = f".{INFO_NAME}.fastdata-tmp"
    for entry in os.scandir(directory):
        if entry.name == old or entry.name.startswith(f"{INFO_NAME}.partial-"):
            try:
                os.remove(entry.path)
            except FileNotFoundError:
                pass


def _only_ours(entry: object, owns: Callable[[str], bool]) -> bool:
    files = entry.get("filenames") if isinstance(entry, dict) else None
    return (isinstance(files, list) and bool(files)
            and all(isinstance(n, str) and "/" not in n and owns(n) for n in files))


class _locked:
    """The folder's info-file lock, waited for (an update takes milliseconds)."""

    def __init__(self, directory: str, path: str) -> None:
        self._path = lock_path(directory, INFO_NAME)
        self._what = path
        self._lock: OutputLock | None = None

    def __enter__(self):
        deadline = time.monotonic() + _LOCK_WAIT
        while True:
            try:
                self._lock = OutputLock(self._path, self._what)
                return self
            except OutputExistsError:
                if time.monotonic() > deadline:
                    raise FastDataError(
                        f"another process has been updating this file for {_LOCK_WAIT:.0f} "
                        "s (it holds its lock); the dataset is complete: pack again with "
                        "--overwrite once that process is done", path=self._what) from None
                time.sleep(0.02)

    def __exit__(self, *exc):
        if self._lock is not None:
            self._lock.release()
        return False

"""``fastdata.append``: add a source's images to a packed dataset as a new
version, without rewriting what exists (no torch).

The new records are packed, as a complete dataset of the same format, into
``NAME.versions/parts/``; the version lists the earlier parts and this one,
so the dataset reads like one pack of both sources: the same records,
labels, keys and checksums, classes new to the dataset appended to its list.
A key the dataset already holds is refused (or, with ``skip_existing``,
passed over and counted). What grows with the dataset in this process: its
keys, held as a set while the source's keys are checked against them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from fastdata.errors import FastDataError
from fastdata.packers.options import PackOptions

#: Keys listed in a refusal or a summary.
SHOWN = 10


class _AppendSource:
    """A source's entries relabelled to the dataset's classes (its own new
    ones appended), without the keys the dataset holds when ``skip``."""

    def __init__(self, source, classes: list[str], existing: set[str], skip: bool) -> None:
        self.source = source
        self.classes = classes
        self._labels = [classes.index(c) for c in source.classes]
        clashes = [e.key for e in source if e.key in existing]
        if clashes and not skip:
            shown = ", ".join(clashes[:SHOWN]) + (" ..." if len(clashes) > SHOWN else "")
            raise FastDataError(
                f"{len(clashes):,} key(s) of the source are in the dataset already ({shown}); "
                f"append only new images, or pass skip_existing=True (CLI: --skip-existing) "
                f"to pass over them")
        self.existing = set(clashes)
        self._count = len(source) - len(self.existing)

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        import dataclasses

        for entry in self.source:
            if entry.key in self.existing:
                continue
            label = self._labels[entry.label] if entry.label >= 0 else entry.label
            yield entry if label == entry.label else dataclasses.replace(entry, label=label)

    def describe(self) -> dict[str, Any]:
        return self.source.describe()

    def warnings(self) -> list[str]:
        return self.source.warnings()


@dataclass(frozen=True)
class AppendResult:
    """What :func:`append` did.

    Attributes:
        dataset: the dataset appended to.
        version: the new version's number.
        added: records added.
        records: the new version's records.
        new_classes: classes the dataset did not have, appended to its list.
        skipped_existing: how many of the source's keys the dataset held
            (passed over with ``skip_existing``); ``skipped_keys`` the first ones.
        part: the part written (its manifest or file).
        summary: the pack's summary of the part.
    """

    dataset: str
    version: int
    added: int
    records: int
    new_classes: list[str]
    skipped_existing: int
    skipped_keys: list[str] = field(default_factory=list)
    part: str = ""
    summary: Any = None

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "summary"}
        out["pack"] = self.summary.to_dict() if self.summary is not None else None
        return out


def append(source, dataset: str | os.PathLike, *, options: PackOptions | None = None,
           skip_existing: bool = False, progress: bool | None = None, on_event=None,
           allow_outside: bool = False) -> AppendResult:
    """Add the images of ``source`` (any source ``fastdata.pack`` takes) to the
    packed dataset ``dataset`` (local or at a URL) as a new version.

    Args:
        options: the pack options of the new records (``fastdata.PackOptions``);
            give those of the first pack (encoding, resize, shard size), since
            a part stored another way is refused. ``options.resume``
            continues an interrupted append.
        skip_existing: pass over the source's images whose key the dataset
            holds, instead of refusing them all.

    Returns:
        an :class:`AppendResult`.

    Raises:
        FastDataError: keys already in the dataset (without ``skip_existing``),
            nothing new to add, a part stored unlike the dataset, or another
            process changed the dataset meanwhile.
    """
    import dataclasses

    from fastdata.formats import open_reader
    from fastdata.formats.registry import detect_format
    from fastdata.packers.pack import pack
    from fastdata.packers.source import Source
    from fastdata.packers.sources.dispatch import open_source
    from fastdata.dataset import history

    dataset = os.fspath(dataset)
    options = options or PackOptions()
    with open_reader(dataset, allow_outside=allow_outside) as reader:
        if getattr(reader, "is_view", False):
            raise FastDataError("a view cannot be appended to; append to its dataset, then "
                                "make the view again", path=dataset)
        current = reader.version if getattr(reader, "is_version", False) else None
        base = reader.dataset_path  # whatever named it: a pattern, a shard, the manifest
        classes = list(reader.classes)
        existing = set(reader.keys)
        base_manifest = reader.manifest
        first_part = None if current is not None else history.Part(
            _part_name(base, base), len(reader), _digest(reader.manifest))
        records, counts = len(reader), list(reader.manifest.class_counts)
    if not isinstance(source, Source):
        source = open_source(source, extensions=options.extensions,
                             allow_outside=allow_outside)
    new_classes = [c for c in source.classes if c not in classes]
    wrapped = _AppendSource(source, classes + new_classes, existing, skip_existing)
    if len(wrapped) == 0:
        raise FastDataError(f"nothing to append: every one of the source's {len(source):,} "
                            f"images is in the dataset already", path=dataset)
    number = (current.number if current is not None else 1) + 1
    spec = detect_format(dataset)
    part = history.history_dir(base) + _sep(base) + f"parts{_sep(base)}" \
        f"{number:06d}{spec.extensions[0]}"
    summary = pack(wrapped, part, options=dataclasses.replace(options, format=spec.name),
                   progress=progress, on_event=on_event)
    part_path = part + (".fastdata.json" if spec.sharded else "")
    with open_reader(part_path, allow_outside=allow_outside, versions=False) as packed:
        try:
            _check_alike(base_manifest, packed.manifest, part_path)
        except FastDataError:
            packed.close()
            _remove_part(base, number)  # no version names it: it goes now
            raise
        added = history.Part(_part_name(base, part_path), len(packed),
                             _digest(packed.manifest))
        part_counts = list(packed.manifest.class_counts)
    parts = list(current.parts) if current is not None else [first_part]
    counts = counts + [0] * len(new_classes)
    counts = [a + b for a, b in zip(counts, part_counts)]
    if current is None:  # the first change: the pack becomes version 1
        current = history.write_version(base, history.Version(
            number=1, format=spec.name, change="pack", summary="packed",
            records=records, classes=classes, class_counts=list(base_manifest.class_counts),
            parts=parts, created_at=base_manifest.created_at))
    what = f"appended {added.records:,} records" + (
        f" ({len(new_classes)} new class(es): {', '.join(new_classes[:5])})"
        if new_classes else "")
    version = history.write_version(base, history.Version(
        number=number, format=spec.name, change="append", summary=what,
        records=current.records + added.records, classes=classes + new_classes,
        class_counts=counts, parts=parts + [added], parent=current.number,
        parent_sha256=current.sha256, columns=list(current.columns),
        labels=current.labels))
    return AppendResult(dataset, version.number, added.records, version.records, new_classes,
                        len(wrapped.existing), sorted(wrapped.existing)[:SHOWN], part_path,
                        summary)


def _sep(dataset: str) -> str:
    return "/" if "://" in dataset else os.sep


def _digest(manifest) -> str:
    from fastdata.dataset.view_file import manifest_digest

    return manifest_digest(manifest)


def _part_name(dataset: str, path: str) -> str:
    """``path`` relative to the dataset's folder, "/"-separated."""
    from fastdata.formats.remote_files import absolute
    from fastdata.dataset.history import dataset_folder

    folder = dataset_folder(dataset)
    text = absolute(path)
    if "://" in text:
        return text[len(folder.rstrip("/")) + 1:]
    return os.path.relpath(text, folder).replace(os.sep, "/")


def _check_alike(base, part, where: str) -> None:
    """Refuse a part stored unlike the dataset (raw against encoded, another shape)."""
    mine, theirs = base.encoding or {}, part.encoding or {}
    if (mine.get("storage") == "raw") != (theirs.get("storage") == "raw") or \
            (mine.get("storage") == "raw" and mine.get("shape") != theirs.get("shape")):
        raise FastDataError(
            f"the new records are stored as {theirs.get('storage')} {theirs.get('shape') or ''}"
            f", the dataset's as {mine.get('storage')} {mine.get('shape') or ''}; append "
            f"with the options of the first pack", path=where)


def _remove_part(base: str, number: int) -> None:
    """Remove part ``number``'s files, which no version names."""
    from fastdata.ops.gc import part_files, remove

    for path in part_files(base, number):
        remove(path)

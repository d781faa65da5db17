"""``fastdata.subset``: write a view that selects records of a dataset by
class, key, metadata, a random fraction or content (no torch).

The parent's records are walked a chunk at a time; each selector gives a
flag per record, and the selection is stored as runs or a bitmap
(:mod:`fastdata.dataset.selection`). What grows with the dataset in this
process: one bit per parent record (the flags, packed), the keys given
(``keys``/``exclude_keys``), and 16 bytes per record of each ``exclude``
dataset (its content digests). A subset of a view selects from the view's
parent, so views never chain.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fastdata.errors import FastDataError

#: Parent records flagged at a time.
CHUNK = 1 << 16


@dataclass(frozen=True)
class SubsetResult:
    """What :func:`subset` wrote.

    Attributes:
        path: the view file.
        parent: the dataset it selects from.
        records: records selected.
        parent_records: the parent's records.
        missing_keys: keys of ``keys``/``exclude_keys`` the parent does not
            hold (the first 20), and ``missing_count`` how many in all.
        excluded_by_content: records dropped because an ``exclude`` dataset
            holds the same bytes.
        registered: the view is noted in its dataset's history, so ``fastdata
            gc`` keeps what it reads (not at a read-only URL).
    """

    path: str
    parent: str
    records: int
    parent_records: int
    missing_keys: list[str] = field(default_factory=list)
    missing_count: int = 0
    excluded_by_content: int = 0
    registered: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def read_key_list(path: str | os.PathLike) -> list[str]:
    """Keys from a file, one per line (blank lines and ``#`` comments skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f
                    if line.strip() and not line.lstrip().startswith("#")]
    except OSError as exc:
        raise FastDataError(f"cannot read the key list ({exc.strerror})",
                            path=os.fspath(path)) from None


def subset(dataset: str | os.PathLike, out: str | os.PathLike, *,
           classes: Sequence[str] | None = None,
           keys: Iterable[str] | None = None,
           exclude_keys: Iterable[str] | None = None,
           where: str | None = None,
           fraction: float | None = None,
           seed: int = 0,
           stratify: bool = False,
           exclude: Sequence[str | os.PathLike] = (),
           exclude_indices: Sequence[int] | None = None,
           overwrite: bool = False,
           progress: bool | None = None,
           allow_outside: bool = False) -> SubsetResult:
    """Write a view of ``dataset`` at ``out`` (``NAME.fastdata.json``, in the
    dataset's folder or above it) selecting the records that pass every
    selector given; the payloads are not copied.

    Args:
        classes: keep records of these class names.
        keys: keep only the records with these keys.
        exclude_keys: drop the records with these keys.
        where: keep records whose metadata passes the expression
            (:mod:`fastdata.ops.where`).
        fraction: then keep this fraction (0 < F <= 1) of what is left,
            exactly ``round(F * n)`` records, drawn with ``seed``; with
            ``stratify`` that fraction of each class.
        exclude: drop records whose bytes one of these datasets holds (a
            validation set, by content digest).
        exclude_indices: drop the records at these indices of ``dataset``
            (what ``fastdata dedup --write-view`` drops).
        overwrite: replace an existing view file.

    Returns:
        a :class:`SubsetResult`.

    Raises:
        FastDataError: an unknown class, an expression outside the language,
            a fraction outside (0, 1], a view outside the parent's folder, or
            nothing selected.
    """
    from fastdata.dataset.across_parts import split_selection, stored
    from fastdata.dataset.resolve import open_reader
    from fastdata.dataset.selection import Selection
    from fastdata.dataset.views import register_view, write_view
    from fastdata.ops.where import compile_where
    from fastdata.progress import progress_bar

    if fraction is not None and not 0 < float(fraction) <= 1:
        raise FastDataError(f"fraction must be in (0, 1], not {fraction}")
    if stratify and fraction is None:
        raise FastDataError("stratify applies to a fraction: give fraction= too")
    test = compile_where(where) if where else None
    out = os.fspath(out)
    if not out.lower().endswith(".fastdata.json"):
        raise FastDataError("a view file's name ends in .fastdata.json", path=out)
    out = out if "://" in out else os.path.abspath(out)
    given = open_reader(dataset, allow_outside=allow_outside)
    root = None
    try:
        root, base, record, name = _base_of(given, allow_outside)
        n = len(root)
        names = list(root.classes)
        wanted = None
        if classes:
            unknown = [c for c in classes if c not in names]
            if unknown:
                raise FastDataError(f"no class {', '.join(map(repr, unknown))} in the dataset; "
                                    f"its classes: {', '.join(names[:20])}"
                                    f"{' ...' if len(names) > 20 else ''}",
                                    path=os.fspath(dataset))
            wanted = np.asarray([names.index(c) for c in classes], np.int64)
        keep_keys = set(keys) if keys is not None else None
        drop_keys = set(exclude_keys) if exclude_keys is not None else None
        seen_keys: set[str] = set()
        other = _exclude_digests(exclude, allow_outside, progress)
        drop = None
        if exclude_indices is not None:
            drop = np.unique(np.asarray(list(exclude_indices), np.int64))
            if len(drop) and (drop[0] < 0 or drop[-1] >= len(given)):
                raise FastDataError(f"exclude_indices holds an index outside the "
                                    f"{len(given)} records", path=os.fspath(dataset))
            drop = np.sort(given.base_of(drop)) if root is not given else drop
        excluded = 0
        flags, labels_kept = [], []
        with progress_bar(n, "selecting", enabled=progress) as bar:
            for lo in range(0, n, CHUNK):
                hi = min(n, lo + CHUNK)
                at = np.arange(lo, hi)
                mask = _base_mask(base, lo, hi)
                labels = np.asarray(root.labels[at], np.int64)
                if drop is not None:
                    mask[drop[np.searchsorted(drop, lo):np.searchsorted(drop, hi)] - lo] = False
                if wanted is not None:
                    mask &= np.isin(labels, wanted)
                if keep_keys is not None or drop_keys is not None or test is not None:
                    chunk_keys = [root.key_of(i) or f"#{i}" for i in at.tolist()] \
                        if not hasattr(root.keys, "__getitem__") else list(root.keys[lo:hi])
                    if keep_keys is not None:
                        mask &= np.fromiter((k in keep_keys for k in chunk_keys), bool, len(at))
                        seen_keys.update(k for k in chunk_keys if k in keep_keys)
                    if drop_keys is not None:
                        mask &= ~np.fromiter((k in drop_keys for k in chunk_keys), bool, len(at))
                        seen_keys.update(k for k in chunk_keys if k in drop_keys)
                    if test is not None:
                        mask &= _where_mask(root, test, at, mask, chunk_keys, labels, names)
                if other is not None and mask.any():
                    hit = _content_hits(root, at[mask], other)
                    excluded += int(hit.sum())
                    mask[np.flatnonzero(mask)[hit]] = False
                flags.append(np.packbits(mask, bitorder="little"))
                labels_kept.append(labels[mask])
                bar.update(hi - lo)
        bits = np.concatenate(flags) if flags else np.zeros(0, np.uint8)
        picked = np.concatenate(labels_kept) if labels_kept else np.zeros(0, np.int64)
        if fraction is not None:
            bits, picked = _sample(bits, n, root, picked, float(fraction), int(seed), stratify)
        selection = Selection.from_mask_chunks(
            n, (np.unpackbits(bits[lo // 8:(lo + CHUNK) // 8], bitorder="little",
                              count=min(CHUNK, n - lo)).astype(bool)
                for lo in range(0, n, CHUNK)))
        if selection.count == 0:
            raise FastDataError("the selectors select no record; nothing written", path=out)
        counts = np.bincount(picked[picked >= 0], minlength=len(names)).tolist()
        asked = {k: v for k, v in dict(
            classes=list(classes) if classes else None,
            keys=len(keep_keys) if keep_keys is not None else None,
            exclude_keys=len(drop_keys) if drop_keys is not None else None,
            where=where, fraction=fraction, seed=seed if fraction is not None else None,
            stratify=stratify or None,
            exclude=[os.fspath(p) for p in exclude] or None,
            exclude_indices=len(drop) if drop is not None else None).items() if v is not None}
        pieces = split_selection(selection, [p.records for p in record.parts])
        view = _view_record(record, given, out, name, pieces, counts, asked,
                            _payload_bytes(root, selection), stored)
        view = write_view(view, overwrite=overwrite)
        registered = register_view(name, view) if name else False
    finally:
        if root is not None and root is not given:
            root.parts = []  # the parts are given's, closed with it
        given.close()
    listed = (keep_keys or set()) | (drop_keys or set())
    missing = sorted(listed - seen_keys)
    return SubsetResult(out, (view.of or {}).get("path") or name or os.fspath(dataset),
                        selection.count, n, missing[:20], len(missing), excluded, registered)


def _base_of(given, allow_outside: bool):
    """``(root, base, record, dataset)``: a reader of the base records
    (every part's records, unselected), the selection ``given`` makes of
    them (None: all), its record, and the dataset's name."""
    import dataclasses

    from fastdata.dataset.across_parts import combined_chunks
    from fastdata.dataset.commit import pack_record
    from fastdata.dataset.reader import DatasetReader
    from fastdata.dataset.selection import Selection

    record = getattr(given, "record", None)
    if record is None:  # a pack never changed
        name = given.dataset_path
        return given, None, pack_record(given, name), name
    name = _dataset_of(given)
    whole = dataclasses.replace(
        record, records=record.base_records, class_counts=[0] * len(record.classes),
        parts=[dataclasses.replace(p, selection=None) for p in record.parts], sha256="")
    if all(p.selection is None for p in record.parts):
        return given, None, record, name
    from fastdata.formats.remote_files import absolute

    opened = {absolute(given._inside(p.path, "parts")): r
              for p, r in zip(record.parts, given.parts)}
    for reader in given.parts:
        if reader.sharded:
            reader.coalesce = None
    root = DatasetReader(given.path, record=whole, opened=opened, **given.child_options())
    counts = [p.records for p in record.parts]
    base = Selection.from_mask_chunks(record.base_records,
                                      combined_chunks(given._selections, counts))
    return root, base, record, name


def _dataset_of(given) -> str | None:
    """The dataset a version or a view reads (None: unknown)."""
    record = given.record
    if record.kind == "version":
        return given.dataset_path
    of = (record.of or {}).get("path")
    if not isinstance(of, str):
        return None
    from fastdata.storage.urls import dirname, join

    where = join(dirname(given.path), of)
    return where if "://" in where else os.path.normpath(where)


def _view_record(record, given, out: str, name, pieces, counts, asked, payload, stored):
    """The view to write at ``out``: ``record``'s parts with the new
    selections, every name re-rooted at the view's folder."""
    import dataclasses

    from fastdata.dataset.views import name_in
    from fastdata.storage.urls import join

    root = given.root if getattr(given, "record", None) is not None else _pack_folder(given)

    def moved(rel: str) -> str:
        whole = join(root, rel)
        return name_in(out, whole if "://" in whole else os.path.normpath(whole))

    parts = [dataclasses.replace(p, path=moved(p.path), selection=stored(s, p.records))
             for p, s in zip(record.parts, pieces)]
    columns = [{**c, "path": moved(c["path"])} for c in record.columns]
    labels = record.labels and {**record.labels, "path": moved(record.labels["path"])}
    of = {"path": name_in(out, name) if name else None,
          "version": record.number if record.kind == "version" else (record.of or {}).get(
              "version"),
          "sha256": record.sha256 if record.kind == "version" else (record.of or {}).get(
              "sha256")}
    return dataclasses.replace(
        record, kind="view", records=sum(p.selected for p in parts), class_counts=counts,
        parts=parts, columns=columns, labels=labels, number=None, parent=None,
        parent_sha256=None, change="", summary="", of=of, selected_by=asked,
        payload_bytes=payload, created_at="", path=out, sha256="")


def _pack_folder(reader) -> str:
    from fastdata.dataset.history import dataset_folder

    return dataset_folder(reader.dataset_path)


def _base_mask(base, lo: int, hi: int) -> np.ndarray:
    """The records ``lo..hi`` a view being subset already selects (all, for a dataset)."""
    if base is None:
        return np.ones(hi - lo, bool)
    mask = np.zeros(hi - lo, bool)
    for start, stop in base.runs(lo, hi):
        mask[start - lo:stop - lo] = True
    return mask


def _where_mask(root, test, at, mask, chunk_keys, labels, names) -> np.ndarray:
    """Which records of the chunk pass ``test`` (only those still selected are read)."""
    out = np.zeros(len(at), bool)
    todo = np.flatnonzero(mask)
    if not len(todo):
        return out
    metas = root.metadata_many(at[todo].tolist()) if root.has_metadata else [{}] * len(todo)
    for j, meta in zip(todo.tolist(), metas):
        fields = dict(meta) if isinstance(meta, dict) else {}
        label = int(labels[j])
        fields.update(key=chunk_keys[j], label=label,
                      **{"class": names[label] if 0 <= label < len(names) else None})
        out[j] = test(fields)
    return out


def _exclude_digests(exclude, allow_outside: bool, progress) -> np.ndarray | None:
    """The sorted content digests of every ``exclude`` dataset (None: none)."""
    if not exclude:
        return None
    from fastdata.duplicates import digest_keys, record_digests
    from fastdata.formats import open_reader

    found = []
    for where in exclude:
        with open_reader(where, allow_outside=allow_outside) as reader:
            found.append(record_digests(reader, progress=progress))
    return np.sort(digest_keys(np.concatenate(found)))


def _content_hits(root, indices: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Whether each record's bytes are among ``other``'s digests."""
    from fastdata.duplicates import digest, digest_keys

    mine = np.stack([digest(d) for d in root.read_many(indices.tolist(), check=True)])
    keys = digest_keys(mine)
    at = np.minimum(np.searchsorted(other, keys), len(other) - 1)
    return other[at] == keys


def _sample(bits: np.ndarray, n: int, root, picked: np.ndarray, fraction: float, seed: int,
            stratify: bool) -> tuple[np.ndarray, np.ndarray]:
    """Keep exactly ``round(fraction * m)`` of the ``m`` flagged records (per
    class with ``stratify``): record r of a group is kept when a keyed
    bijection of the group's size sends its rank below that number."""
    from fastdata.order.bijection import Bijection, mix64

    # Group g + 1 is class g's records; group 0 the unlabelled ones (label -1).
    groups = np.bincount(picked + 1, minlength=len(root.classes) + 1) if stratify else \
        np.asarray([len(picked)])
    keep = np.rint(groups * fraction).astype(np.int64)
    base = int(mix64(np.uint64(seed))[0])
    perms = [Bijection(int(size), base ^ g) if size else None for g, size in enumerate(groups)]
    done = np.zeros(len(groups), np.int64)
    out = np.zeros_like(bits)
    kept_labels = []
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        mask = np.unpackbits(bits[lo // 8:-(-hi // 8)], bitorder="little",
                             count=hi - lo).astype(bool)
        at = np.flatnonzero(mask)
        if len(at):
            labels = np.asarray(root.labels[at + lo], np.int64)
            group = labels + 1 if stratify else np.zeros(len(at), np.int64)
            chosen = np.zeros(len(at), bool)
            for g in np.unique(group).tolist():
                here = group == g
                rank = done[g] + np.arange(int(here.sum()))
                chosen[here] = perms[g].at(rank) < keep[g]
                done[g] += int(here.sum())
            mask[:] = False
            mask[at[chosen]] = True
            kept_labels.append(labels[chosen])
        out[lo // 8:lo // 8 + len(np.packbits(mask, bitorder="little"))] = \
            np.packbits(mask, bitorder="little")
    return out, (np.concatenate(kept_labels) if kept_labels else np.zeros(0, np.int64))


def _payload_bytes(root, selection) -> int | None:
    """The selected records' stored bytes, where the parent's index gives
    sizes (sharded formats); None otherwise (a reader then reserves the
    parent's total)."""
    if not root.sharded:
        return None
    total = 0
    for start, stop in selection.runs():
        for lo in range(start, stop, CHUNK):
            total += int(np.asarray(root.placement(np.arange(lo, min(stop, lo + CHUNK)))[1],
                                    np.int64).sum())
    return total

"""``fastdata subset`` as a job (see fastdata.jobs): pieces flag their range
of the parent's records, the machine that writes the view combines them.

A piece is a range of the base records (every part's records, unselected,
one after another) of ``piece_records`` records (a multiple of 64, so each
piece's flags start on a byte). It flags the records the parent selects
(a view's selection), that are not among the indices dropped, of the
classes asked, with the keys asked, and that pass ``where``; it writes the
flags (one bit per record), the labels of the flagged records (4 bytes
each) and, with ``exclude``, a sorted run of their content digests (rows of
fastdata.ops.dedup_pieces: 28 bytes each). Pieces of the ``exclude``
datasets write their digests' runs with ``digest_piece``. The merge finds
the flagged records whose digest an excluded dataset holds (runs of equal
digests, as ``fastdata dedup`` does); the draw of ``fraction`` and the
view's selection are made from the flags in piece order.
"""

from __future__ import annotations

import os

import numpy as np

from fastdata.errors import FastDataError
from fastdata.formats.reader import key_at
from fastdata.ops.append_pieces import keys_of
from fastdata.ops.dedup_pieces import ORDER, READ_BATCH, digest_piece, piece_records
from fastdata.ops.piece_readers import open_root

#: Records flagged at a time inside a piece: their keys, metadata and
#: ``where`` fields are Python objects (a few hundred bytes a record), so a
#: chunk, not the piece (up to 2**18 records), bounds them.
CHUNK = 1 << 12


def plan(count: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each piece over ``count`` base records: about as
    many as fastdata.ops.dedup_pieces plans, each a multiple of 64 records
    long (the last apart), so that its flags start on a byte."""
    size = -(-piece_records(count) // 64) * 64
    return [(start, min(start + size, count)) for start in range(0, count, size)]


def subset_piece(number: int, piece: tuple, work: str, datasets: list[dict],
                 rules: dict) -> dict:
    """One piece: ``("select", start, end, dropped)`` of the parent
    ``datasets[0]`` (:func:`select_piece`) or ``("exclude", dataset, start,
    end)``: the digests of records of an excluded dataset
    (``digest_piece``)."""
    if piece[0] == "exclude":
        return digest_piece(number, tuple(piece[1:]), work, datasets)
    return select_piece(number, tuple(piece[1:]), work, datasets[0], rules)


def select_piece(number: int, piece: tuple, work: str, spec: dict, rules: dict) -> dict:
    """Flag the records ``start..end`` of the parent ``spec`` that pass
    ``rules`` (``classes``: label numbers or None; ``keep``/``drop``: key
    lists or None; ``where``: an expression or None; ``digests``: write the
    flagged records' digests) and are not in ``dropped`` (base indices).

    Returns:
        the files written (``flags``, ``labels``, ``run``, ``seen``: None
        when not written), and ``groups``: the flagged records per label + 1.

    Raises:
        CorruptDataError: a damaged record (read for its digest).
        FastDataError: a record ``where`` cannot be evaluated for (named).
    """
    from fastdata.jobs.files import save_array

    start, end, dropped = piece
    given, root = open_root(spec)
    test = _compiled(rules.get("where"))
    keys = _key_sets(rules)
    names = list(root.classes)
    flags, labels, seen = [], [], set()
    gone = np.asarray(dropped, np.int64)
    for lo in range(start, end, CHUNK):
        hi = min(end, lo + CHUNK)
        at = np.arange(lo, hi)
        mask = base_mask(given, lo, hi)
        chunk_labels = np.asarray(root.labels[at], np.int64)
        # The piece's dropped indices, ascending: those of this chunk by bisection.
        mask[gone[np.searchsorted(gone, lo):np.searchsorted(gone, hi)] - lo] = False
        if rules.get("classes") is not None:
            mask &= np.isin(chunk_labels, np.asarray(rules["classes"], np.int64))
        if keys or test is not None:
            chunk_keys = keys_of(root, lo, hi) if keys or rules.get("where_key") else \
                [None] * len(at)  # an expression that names no key reads none
            if "keep" in keys:
                mask &= np.fromiter((k in keys["keep"] for k in chunk_keys), bool, len(at))
            if "drop" in keys:
                mask &= ~np.fromiter((k in keys["drop"] for k in chunk_keys), bool, len(at))
            if "listed" in keys:
                seen.update(keys["listed"][k] for k in chunk_keys if k in keys["listed"])
            if test is not None:
                mask &= where_mask(root, test, at, mask, chunk_keys, chunk_labels, names)
        flags.append(mask)
        labels.append(chunk_labels[mask])
    flags = np.concatenate(flags) if flags else np.zeros(0, bool)
    labels = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    out = {"flags": f"flags-{number:06d}.npy", "labels": f"labels-{number:06d}.npy",
           "run": None, "seen": None, "selected": int(flags.sum()),
           "groups": np.bincount(labels + 1, minlength=len(names) + 1).tolist()}
    save_array(os.path.join(work, out["flags"]), np.packbits(flags, bitorder="little"))
    save_array(os.path.join(work, out["labels"]), labels.astype(np.int32))
    if "listed" in keys:
        out["seen"] = f"seen-{number:06d}.npy"
        save_array(os.path.join(work, out["seen"]), np.asarray(sorted(seen), np.int64))
    if rules.get("digests"):
        out["run"] = f"mine-{number:06d}.npy"
        _write_digests(root, np.flatnonzero(flags) + start, os.path.join(work, out["run"]))
    return out


def _write_digests(root, indices: np.ndarray, path: str) -> None:
    """The sorted run of the records ``indices``' content digests (dataset 0)."""
    import hashlib

    from fastdata.jobs.sorted_runs import write_run
    from fastdata.ops.dedup_pieces import digest_rows

    found = np.empty((len(indices), 16), np.uint8)
    for at in range(0, len(indices), READ_BATCH):
        batch = indices[at:at + READ_BATCH].tolist()
        for k, data in enumerate(root.read_many(batch, check=True)):
            found[at + k] = np.frombuffer(hashlib.blake2b(data, digest_size=16).digest(),
                                          np.uint8)
    rows = digest_rows(found, 0, 0)
    rows["index"] = indices
    write_run(path, rows, ORDER)


def _compiled(where: str | None):
    if not where:
        return None
    from fastdata.ops.where import compile_where

    return compile_where(where)


#: Key sets built from the key lists of a job, by the lists' digest: a
#: worker running many pieces of one job builds them once.
_KEY_SETS: dict = {}


def _key_sets(rules: dict) -> dict:
    """``keep``/``drop`` as sets, and ``listed``: key -> its position in the
    sorted list of both (for the keys seen), of the lists ``rules`` gives."""
    if rules.get("keep") is None and rules.get("drop") is None:
        return {}
    token = (os.getpid(), rules["keys_digest"])
    found = _KEY_SETS.get(token)
    if found is None:
        _KEY_SETS.clear()  # one job's at a time
        found = {}
        if rules.get("keep") is not None:
            found["keep"] = set(rules["keep"])
        if rules.get("drop") is not None:
            found["drop"] = set(rules["drop"])
        found["listed"] = {k: i for i, k in enumerate(rules["listed"])}
        _KEY_SETS[token] = found
    return found


def where_mask(root, test, at, mask, chunk_keys, labels, names) -> np.ndarray:
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
        try:
            out[j] = test(fields)
        except FastDataError as exc:  # the limits of the language, met by this record's values
            index = int(at[j])
            raise FastDataError(f"{exc.message}; this record cannot be tested: select it "
                                f"by other fields, or leave --where out",
                                path=getattr(root, "path", None),
                                key=chunk_keys[j] or key_at(root, index), record=index) from None
    return out


def base_mask(given, lo: int, hi: int) -> np.ndarray:
    """Which base records ``lo..hi`` ``given`` selects (all, without selections)."""
    from fastdata.dataset.across_parts import mask_chunks

    selections = getattr(given, "selections", None)
    if not selections or all(s is None for s in selections):
        return np.ones(hi - lo, bool)
    mask = np.zeros(hi - lo, bool)
    first = 0
    for selection, part in zip(selections, given.record.parts):
        a, b = max(lo, first), min(hi, first + part.records)
        if a < b:
            mask[a - lo:b - lo] = np.concatenate(list(mask_chunks(
                selection, part.records, a - first, b - first, step=b - a)))
        first += part.records
    return mask

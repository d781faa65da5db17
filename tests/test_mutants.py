"""Pinned behaviour of versions, views and joins that plausible bugs would
change (each test names the mutant of ``tests/mutate.py`` it kills):

- a version record is created once: a change computed on an older version
  lands after the newer one, which stays byte for byte; ``HEAD`` only moves
  forward;
- a part is read only as it was recorded (its manifest's digest), and a
  record whose fields do not add up is refused, naming the field;
- joined columns keep null values and missing fields as None, for every
  kind of column; a later join without labels keeps an earlier join's;
- ``gc`` keeps every part and column folder a kept version names, and
  unrecorded files younger than its grace period;
- a resume state of another dataset at the same version number (or of
  another version of it) is refused, for a dataset and a mixture's source;
- a stratified subset's picks, pinned.

Every image is generated at test time (``fastdata.demo.synthesize``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import no_hang

import fastdata
from fastdata.dataset import history
from fastdata.dataset.commit import Conflict, move_head, pointer
from fastdata.dataset.resolve import open_reader
from fastdata.demo import synthesize
from fastdata.errors import ManifestError
from fastdata.ops.gc import gc

OPTIONS = fastdata.PackOptions(workers=1)
BASE = {"cat": range(4), "dog": range(4, 8)}
MORE = {"dog": range(8, 10), "eel": range(10, 12)}
OTHER = {"dog": range(12, 14), "eel": range(14, 16)}  # MORE's shape, other images


@pytest.fixture(autouse=True)
def _time_limit():
    with no_hang(120):
        yield


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mutants_pool")
    synthesize(tmp / "pool", kind="tiny", n=20, classes=1, seed=3, progress=False)
    files = sorted((tmp / "pool").rglob("*.png"))
    assert len({f.read_bytes() for f in files}) == 20
    return files


def tree(pool, root: Path, spec: dict) -> Path:
    for cls, indices in spec.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in indices:
            shutil.copyfile(pool[i], root / cls / f"{cls}{i:02d}.png")
    return root


def dataset(pool, tmp_path: Path, spec=BASE, name: str = "ds") -> str:
    return fastdata.pack(tree(pool, tmp_path / f"{name}-src", spec), tmp_path / name / "d.lmdb",
                         options=OPTIONS, progress=False).output


def append(pool, tmp_path: Path, ds: str, spec=MORE, name: str = "more"):
    return fastdata.append(tree(pool, tmp_path / name, spec), ds, options=OPTIONS,
                           progress=False)


def jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def keys_of(ds, version=None) -> list[str]:
    with open_reader(ds, version=version) as r:
        return list(r.keys)


# -- a version record is created once (commit-overwrites-record, head-moves-back) ----------


def test_a_change_on_an_older_version_lands_after_the_newer_one(pool, tmp_path):
    ds = dataset(pool, tmp_path)
    assert append(pool, tmp_path, ds).version == 2
    v2 = Path(history.record_path(ds, 2)).read_bytes()
    table = jsonl(tmp_path / "notes.jsonl",
                  [{"path": k, "note": f"n{i}"} for i, k in enumerate(keys_of(ds, 1))])
    done = fastdata.join(history.record_path(ds, 1), table, key="path")  # computed on v1
    assert done.version == 3 and done.matched == 8
    assert Path(history.record_path(ds, 2)).read_bytes() == v2  # untouched
    v3 = history.read_version(ds, 3)
    assert (v3.parent, v3.parent_sha256) == (2, hashlib.sha256(v2).hexdigest())
    with open_reader(ds) as r:
        assert len(r) == 12 and r.metadata(0) == {"note": "n0"} and r.metadata(8) == {}
    # HEAD names 3; a writer that recorded 2 and moves HEAD late never moves it back.
    head = Path(history.head_path(ds))
    assert head.read_bytes() == pointer(3)
    move_head(ds, 2)
    assert head.read_bytes() == pointer(3) and history.head_number(ds) == 3


def test_appends_on_an_older_version_rebase_or_refuse_colliding_keys(pool, tmp_path):
    """append-rebase-ignores-collisions / reader-labels-not-remapped: appends
    computed on version 1 after version 2 landed (as writers that read it
    before): new keys land after it, their own new class mapped by name; the
    keys version 2 added are refused, and leave no part behind."""
    ds = dataset(pool, tmp_path)
    append(pool, tmp_path, ds, MORE)  # v2: dog08-09, eel10-11
    late = fastdata.append(tree(pool, tmp_path / "late", {"dog": [12], "owl": [13, 14]}),
                           history.record_path(ds, 1), options=OPTIONS, progress=False)
    assert (late.version, late.rebased, late.records) == (3, 1, 15)
    with open_reader(ds) as r:
        assert list(r.classes) == ["cat", "dog", "eel", "owl"]
        labels = dict(zip(list(r.keys), np.asarray(r.labels).tolist()))
        assert [int(r.labels[i]) for i in range(12, 15)] == [1, 3, 3]
        assert list(r.manifest.class_counts) == [4, 7, 2, 2]
    assert [labels[k] for k in ("dog/dog12.png", "owl/owl13.png", "owl/owl14.png",
                                "eel/eel10.png", "cat/cat00.png")] == [1, 3, 3, 2, 0]
    parts = Path(history.history_dir(ds)) / "parts"
    before = sorted(p.name for p in parts.iterdir())
    with pytest.raises(Conflict) as err:
        fastdata.append(tree(pool, tmp_path / "again", {"eel": [10, 15]}),
                        history.record_path(ds, 1), options=OPTIONS, progress=False)
    assert err.value.message == (
        "1 of the new key(s) (eel/eel10.png) were appended meanwhile by another writer (now "
        "version 3); append again, with --skip-existing (skip_existing=True) to pass over them")
    assert history.head_number(ds) == 3 and sorted(p.name for p in parts.iterdir()) == before


# -- parts and records that do not add up ------------------------------------------------------


def test_a_part_replaced_by_one_of_the_same_size_is_refused(pool, tmp_path):
    """reader-part-digest-unchecked: the appended part packed again from other
    images (4 records, the same classes): its manifest differs."""
    ds = dataset(pool, tmp_path)
    part = append(pool, tmp_path, ds).part
    shutil.rmtree(part)
    fastdata.pack(tree(pool, tmp_path / "other", OTHER), part, options=OPTIONS, progress=False)
    rel = history.read_version(ds, 2).parts[1].path
    with pytest.raises(ManifestError) as err:
        open_reader(ds)
    assert err.value.message == (
        f"part {rel} is not the dataset version 2 was made with (it had 4 records, it has 4, "
        f"and the manifests differ); restore it, or open a version made since")
    with open_reader(ds, version=1) as r:  # version 1 never read that part
        assert len(r) == 8


def _edit(ds: str, number: int, change) -> None:
    path = Path(history.record_path(ds, number))
    data = json.loads(path.read_bytes())
    change(data)
    path.write_text(json.dumps(data, indent=1))


def _dup(name):
    def change(d):
        d["parts"][1][name] = d["parts"][0][name]
    return change


REDO = "; restore it from a copy, or make it again"


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(records=d["records"] + 1),
     "the parts' records do not add up to the record's"),            # record-parts-dont-add-up
    (_dup("id"), "two parts have the same id"),                       # record-duplicate-parts
    (_dup("path"), "two parts have the same path"),
    (lambda d: d["class_counts"].__setitem__(0, d["class_counts"][0] + 1),
     "the class counts add up to 13, more than the 12 records"),      # record-class-counts-exceed
    (lambda d: d.update(parent=5),
     "version 2's parent is not version 1 with its digest"),          # record-parent-unchecked
    (lambda d: d.update(parent_sha256="z" * 64),
     "version 2's parent is not version 1 with its digest"),
    (lambda d: d.update(parent=None, parent_sha256=None),
     "version 2's parent is not version 1 with its digest"),
], ids=["records", "part-ids", "part-paths", "class-counts", "parent", "parent-digest",
        "no-parent"])
def test_a_record_that_does_not_add_up_is_refused(pool, tmp_path, change, message):
    ds = dataset(pool, tmp_path)
    append(pool, tmp_path, ds)
    _edit(ds, 2, change)
    with pytest.raises(ManifestError) as err:
        open_reader(ds)
    assert err.value.message == message + REDO
    assert err.value.path == history.record_path(ds, 2)


# -- joined columns: null values and labels -------------------------------------------------


def test_null_values_and_missing_fields_read_as_none_in_every_kind(pool, tmp_path):
    """columns-null-flags-ignored / -not-written: a null value (row 1) and a
    field a row lacks (row 2's "s") read None, never 0, NaN, False or ""."""
    ds = dataset(pool, tmp_path)
    keys = keys_of(ds)
    rows = []
    for i, k in enumerate(keys[:6]):  # records 6 and 7 get no row
        row = {"path": k, "n": i, "x": i + 0.5, "flag": i % 2 == 0, "s": f"s{i}",
               "j": {"a": i}, "v": [i, i + 1.5]}
        if i == 1:
            row = {"path": k, **{c: None for c in row if c != "path"}}
        if i == 2:
            del row["s"]
        rows.append(row)
    done = fastdata.join(ds, jsonl(tmp_path / "t.jsonl", rows), key="path")
    assert {c: spec["kind"] for c, spec in done.columns.items()} == {
        "n": "number", "x": "number", "flag": "bool", "s": "string", "j": "json",
        "v": "vector"}
    with open_reader(ds) as r:
        metas = r.metadata_many(list(range(8)))
    assert metas[1] == {c: None for c in ("n", "x", "flag", "s", "j", "v")}
    assert metas[2]["s"] is None and metas[2]["n"] == 2 and metas[2]["flag"] is True
    assert metas[6] == metas[7] == {}
    for i in (0, 3, 4, 5):
        meta = metas[i]
        vector = meta.pop("v")
        assert meta == {"n": i, "x": i + 0.5, "flag": i % 2 == 0, "s": f"s{i}", "j": {"a": i}}
        assert type(meta["n"]) is int and vector.tolist() == [i, i + 1.5]


def test_a_join_without_labels_keeps_an_earlier_joins_labels(pool, tmp_path):
    """join-drops-earlier-labels."""
    ds = dataset(pool, tmp_path)
    keys = keys_of(ds)
    fixes = jsonl(tmp_path / "fixes.jsonl", [{"path": keys[0], "fixed": "dog"},
                                             {"path": keys[5], "fixed": "owl"}])
    first = fastdata.join(ds, fixes, key="path", label_column="fixed")
    assert (first.version, first.new_classes, first.relabelled) == (2, ["owl"], 2)
    want = [1, 0, 0, 0, 1, 2, 1, 1]
    notes = jsonl(tmp_path / "notes.jsonl", [{"path": k, "note": i} for i, k in enumerate(keys)])
    assert fastdata.join(ds, notes, key="path").version == 3
    for version in (2, 3):
        with open_reader(ds, version=version) as r:
            assert list(r.classes) == ["cat", "dog", "owl"]
            assert np.asarray(r.labels).tolist() == want
            assert list(r.manifest.class_counts) == [3, 4, 1]
    assert [y for _, y in fastdata.open_dataset(ds, decode=fastdata.Decode(output="bytes"))] \
        == want


# -- gc -----------------------------------------------------------------------------------


def test_gc_keeps_every_part_and_column_folder_of_kept_versions(pool, tmp_path):
    """gc-removes-kept-parts / gc-removes-kept-columns."""
    ds = dataset(pool, tmp_path)
    append(pool, tmp_path, ds)
    keys = keys_of(ds)
    fastdata.join(ds, jsonl(tmp_path / "t.jsonl", [{"path": k, "i": i} for i, k in
                                                  enumerate(keys)]), key="path")
    folder = Path(history.history_dir(ds))
    before = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    swept = gc(ds, grace=0)
    assert (swept.kept, swept.removed_versions, swept.removed_files, swept.young) == \
        ([1, 2, 3], [], [], [])
    swept = gc(ds, keep=1, grace=0)
    assert (swept.kept, swept.removed_versions, swept.removed_files) == ([3], [1, 2], [])
    after = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    assert after == before
    with open_reader(ds) as r:
        assert list(r.keys) == keys and len(r.read_many(list(range(12)))) == 12
        assert [m["i"] for m in r.metadata_many(list(range(12)))] == list(range(12))


def test_gc_keeps_unrecorded_files_younger_than_its_grace(pool, tmp_path):
    """gc-ignores-grace: a part and a column folder no version names (a
    writer between its files and its record)."""
    ds = dataset(pool, tmp_path)
    append(pool, tmp_path, ds)
    folder = Path(history.history_dir(ds))
    orphans = [folder / "parts" / ("a" * 32), folder / "columns" / ("b" * 32)]
    for orphan in orphans:
        orphan.mkdir(parents=True)
        (orphan / "data.bin").write_bytes(b"being written")
    kept = gc(ds)  # the default grace: a day
    assert (kept.removed_files, sorted(kept.young)) == ([], sorted(map(str, orphans)))
    assert all(o.exists() for o in orphans)
    old = time.time() - 2 * 86400
    os.utime(orphans[0] / "data.bin", (old, old))
    swept = gc(ds)
    assert (swept.removed_files, swept.young) == ([str(orphans[0])], [str(orphans[1])])
    assert gc(ds, grace=0).removed_files == [str(orphans[1])]
    assert len(keys_of(ds)) == 12


# -- resume states of another dataset or version -------------------------------------------


def _state(ds, steps: int = 1, version=None) -> dict:
    sampler = fastdata.EpochBatches(fastdata.open_dataset(fastdata.DatasetRef(
        ds, version=version)), order=fastdata.Order(shuffle=True, seed=2, batch_size=3))
    it = iter(sampler)
    for _ in range(steps):
        next(it)
    return json.loads(json.dumps(sampler.state_dict()))


def _load(ds, state, version=None):
    fastdata.EpochBatches(fastdata.open_dataset(fastdata.DatasetRef(ds, version=version)),
                          order=fastdata.Order(shuffle=True, seed=2, batch_size=3)
                          ).load_state_dict(state)


def test_a_state_of_another_dataset_at_the_same_version_is_refused(pool, tmp_path):
    """state-other-dataset-same-version: two datasets of 8 records, each with 4
    more appended (other images): both at version 2 of 12 records."""
    one = dataset(pool, tmp_path, name="one")
    two = dataset(pool, tmp_path, name="two")
    append(pool, tmp_path, one, MORE, "m1")
    append(pool, tmp_path, two, OTHER, "m2")
    state = _state(one)
    _load(one, state)  # its own: taken
    with pytest.raises(ValueError) as err:
        _load(two, state)
    assert str(err.value) == ("this state was saved reading another dataset (or another "
                              "view) at this version number; resume it on the dataset it "
                              "was saved with")


def test_a_state_of_another_version_with_as_many_records_is_refused(pool, tmp_path):
    """state-version-unchecked: a join makes version 2 of the same records."""
    ds = dataset(pool, tmp_path)
    fastdata.join(ds, jsonl(tmp_path / "t.jsonl", [{"path": k, "i": 1} for k in keys_of(ds)]),
                  key="path")
    state = _state(ds)
    with pytest.raises(ValueError) as err:
        _load(ds, state, version=1)
    assert str(err.value) == (
        "this state was saved reading version 2 of the dataset; this reads version 1. Open "
        "version 2 (version=2) to resume exactly, or start the epoch afresh on the new "
        "version (fastdata info --history lists the versions)")
    _load(ds, state, version=2)


def test_a_mixture_state_of_another_source_at_the_same_version_is_refused(pool, tmp_path):
    """state-source-other-dataset-same-version."""
    one, two = dataset(pool, tmp_path, name="one"), dataset(pool, tmp_path, name="two")
    append(pool, tmp_path, one, MORE, "m1")
    append(pool, tmp_path, two, OTHER, "m2")
    base = dataset(pool, tmp_path, name="base")

    def sampler(source):
        mixed = fastdata.mix({"base": {"path": base, "weight": 1},
                              "zoo": {"path": source, "weight": 1}}, samples_per_epoch=12,
                             decode=fastdata.Decode(output="bytes"),
                             order=fastdata.Order(shuffle=True, seed=5, batch_size=4))
        return fastdata.EpochBatches(mixed)

    taken = sampler(one)
    next(iter(taken))
    state = json.loads(json.dumps(taken.state_dict()))
    sampler(one).load_state_dict(state)
    with pytest.raises(ValueError) as err:
        sampler(two).load_state_dict(state)
    assert str(err.value) == ("mixture source 'zoo': this state was saved reading another "
                              "dataset (or view) at this version number; resume it on the "
                              "one it was saved with")


# -- subsets -------------------------------------------------------------------------------


def test_stratified_and_plain_fractions_pick_pinned_records(pool, tmp_path):
    """subset-strata-share-key / subset-fraction-floored: which records a
    seeded fraction keeps is part of what a view means."""
    spec = {"cat": range(7), "dog": range(7, 14), "eel": range(14, 20)}
    ds = dataset(pool, tmp_path, spec)
    keys = keys_of(ds)

    def picked(name, **options) -> list[int]:
        out = Path(ds).parent / f"{name}.fastdata.json"
        fastdata.subset(ds, out, seed=4, **options)
        kept = set(keys_of(out))
        return [i for i, k in enumerate(keys) if k in kept]

    strata = picked("strata", fraction=0.3, stratify=True)
    plain = picked("plain", fraction=0.3)
    assert len(strata) == 2 + 2 + 2 and len(plain) == 6  # rint(2.1), rint(2.1), rint(1.8)
    assert strata == [0, 1, 10, 11, 14, 18]  # cat 0-6, dog 7-13, eel 14-19
    assert plain == [1, 5, 6, 7, 14, 15]
    assert picked("most", fraction=0.9, stratify=True) == [  # rint(6.3), rint(6.3), rint(5.4)
        0, 1, 2, 3, 4, 5, 7, 8, 10, 11, 12, 13, 14, 16, 17, 18, 19]

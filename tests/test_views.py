"""Views (``fastdata subset``, ``fastdata dedup --write-view``): a small JSON
file selecting records of a parent dataset, read like a dataset everywhere
(map-style, streams, DataLoader workers, info / verify / convert), and its
selection (``fastdata.dataset.selection.Selection``) on its own.

Every dataset is packed at test time from tiny generated images (lossless
formats, so a record's bytes identify it); what a view should hold is worked
out here from the parent's own records, never from the view code."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import shutil
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import optional
import pytest
from click.testing import CliRunner
from conftest import build_tree, run_python, uniform_spec
from torch.utils.data import DataLoader

import fastdata
from fastdata.cli import main
from fastdata.errors import (
    FastDataError,
    ManifestError,
    OutputExistsError,
    UnsafeNameError,
)
from fastdata.dataset.resolve import open_reader
from fastdata.packers.pack import PackOptions
from fastdata.dataset.selection import Selection, SelectionError

pytestmark = [pytest.mark.filterwarnings("ignore::ResourceWarning")]

#: Uneven classes (32 records): fractions per class differ from the whole's.
COUNTS = {"ant": 5, "bee": 9, "cat": 7, "dog": 11}
LOSSLESS = (".png", ".bmp", ".ppm")
FORMATS = {"lmdb": ".lmdb", "hdf5": ".h5", "tfrecord": "-%05d.tfrecord", "tar": "-%06d.tar"}
SHARDED = ("tfrecord", "tar")


def spec_of(counts) -> tuple[str, ...]:
    return tuple(e for name, n in counts.items() for e in uniform_spec((name,), n, LOSSLESS))


def pack(src, out, **options) -> str:
    return fastdata.pack(src, out, options=PackOptions(**options), progress=False).output


def digest(data) -> str:
    return hashlib.sha1(bytes(data)).hexdigest()


def everything(path) -> list[tuple[str, bytes, int]]:
    """(key, payload, label) of every record of a dataset or view, in order."""
    with open_reader(path) as reader:
        return [(reader.keys[i], reader.read(i), int(reader.labels[i]))
                for i in range(len(reader))]


def selected(view) -> list[int]:
    """The parent indices a view selects, from its reader."""
    with open_reader(view) as reader:
        return reader.base_of(np.arange(len(reader))).tolist()


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The tree (tmp/src) packed in every format into tmp/data (tar and
    TFRecord in shards of 5 records: 7 shards), and the same tree listed in a
    JSON Lines file with per-record metadata, packed to tmp/data/meta.lmdb."""
    tmp = tmp_path_factory.mktemp("views")
    tree = build_tree(tmp / "src", spec_of(COUNTS))
    folder = tmp / "data"
    packs = {fmt: pack(tree.root, folder / f"d{ext}", **({"shard_size": 5} if fmt in SHARDED
                                                         else {}))
             for fmt, ext in FORMATS.items()}
    metas = []
    with open(tree.root / "list.jsonl", "w") as f:
        for i, s in enumerate(tree.samples):
            meta = {"width": 10 + i, "source": ["web", "scan", "book"][i % 3],
                    "info": {"score": i / 32}}
            if i % 7 == 3:
                del meta["width"]  # a missing field is None: never >= a number
            metas.append(meta)
            f.write(json.dumps({"path": s.key, "label": tree.classes[s.label], **meta}) + "\n")
    meta_lmdb = pack(tree.root / "list.jsonl", folder / "meta.lmdb")
    return {"tmp": tmp, "tree": tree, "folder": folder, "packs": packs,
            "meta": meta_lmdb, "metas": metas}


# -- 1. a view by class, in every format ---------------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_class_view_reads_the_parents_records_of_those_classes(data, fmt):
    parent = data["packs"][fmt]
    view = data["folder"] / f"classes-{fmt}.fastdata.json"
    done = invoke("subset", parent, view, "--classes", "bee,dog", "--no-progress")
    assert done.exit_code == 0, done.output
    assert f"20 of 32 records of {os.path.basename(parent)}" in done.output
    records = everything(parent)
    classes = data["tree"].classes
    wanted = {classes.index("bee"), classes.index("dog")}
    expected = [i for i, (_, _, label) in enumerate(records) if label in wanted]
    assert len(expected) == COUNTS["bee"] + COUNTS["dog"]
    # The tree's own files, by key: the parent holds them unchanged.
    files = {s.key: (s.data, s.label) for s in data["tree"].samples}
    with open_reader(view) as reader:
        assert reader.is_view and reader.format_name == fmt
        assert len(reader) == len(expected) and reader.classes == classes
        assert reader.base_of(np.arange(len(reader))).tolist() == expected
        assert reader.record.base_records == 32 and len(reader.parts) == 1
        got = [(reader.keys[i], reader.read(i), int(reader.labels[i]))
               for i in range(len(reader))]
        assert got == [records[i] for i in expected]
        assert reader.read_many(list(range(len(reader)))) == [records[i][1] for i in expected]
        assert reader.manifest.class_counts == [0, COUNTS["bee"], 0, COUNTS["dog"]]
        for key, payload, label in got:
            assert files[key] == (payload, label)
    # The map-style dataset of the view gives the same records.
    with fastdata.open_dataset(view, decode=fastdata.Decode(output="bytes")) as ds:
        assert len(ds) == len(expected)
        assert [(bytes(ds[i][0]), int(ds[i][1])) for i in range(len(ds))] == \
            [(records[i][1], records[i][2]) for i in expected]
    if fmt in SHARDED:
        stream = fastdata.open_dataset(view, streaming=True,
                                       order=fastdata.Order(shuffle=True, seed=3),
                                       decode=fastdata.Decode(output="bytes"))
        got = [(digest(data_), int(label)) for data_, label in stream]
        assert Counter(got) == Counter((digest(records[i][1]), records[i][2])
                                       for i in expected)
        # A shuffled stream, not the parent's order.
        assert [d for d, _ in got] != [digest(records[i][1]) for i in expected]


# -- 2. the selection ----------------------------------------------------------------


def random_chunks(mask: np.ndarray, rng) -> list[np.ndarray]:
    cuts = np.sort(rng.choice(np.arange(1, len(mask)), size=6, replace=False))
    cuts = np.concatenate([[0], cuts, [cuts[-1]], [len(mask)]])  # one empty chunk
    return [mask[a:b] for a, b in itertools.pairwise(cuts)]


MASKS = ["none", "sparse", "half", "dense", "all", "runs"]


def make_mask(kind: str, n: int, rng) -> np.ndarray:
    if kind == "none":
        return np.zeros(n, bool)
    if kind == "all":
        return np.ones(n, bool)
    if kind == "runs":  # a few long runs (a chunk edge may cut one)
        mask = np.zeros(n, bool)
        for lo in (3, 4000, 9000):
            mask[lo:lo + 1500] = True
        return mask
    return rng.random(n) < {"sparse": 0.0008, "half": 0.5, "dense": 0.9993}[kind]


@pytest.mark.parametrize("n", [3 * 4096 + 517, 3 * 4096])  # a partial last block, or none
def test_selection_from_random_masks_maps_like_numpy(n):
    rng = np.random.default_rng(n)
    encodings = set()
    for kind in MASKS:
        mask = make_mask(kind, n, rng)
        sel = Selection.from_mask_chunks(n, random_chunks(mask, rng))
        encodings.add(sel.encoding)
        idx = np.flatnonzero(mask)
        assert sel.count == len(idx) and sel.parent_count == n, kind
        assert np.array_equal(sel.parents(np.arange(sel.count)), idx), kind
        if sel.count:
            some = rng.integers(0, sel.count, size=(7, 3))
            assert np.array_equal(sel.parents(some), idx[some]), kind  # any shape
        everywhere = np.arange(n + 1)
        assert np.array_equal(sel.rank(everywhere), np.searchsorted(idx, everywhere)), kind
        runs = list(sel.runs())
        assert all(a < b for a, b in runs), kind
        assert np.array_equal(np.concatenate([np.arange(a, b) for a, b in runs])
                              if runs else np.zeros(0, int), idx), kind
        for lo, hi in ((0, n), (1, 4097), (4095, 9001), (5000, 5000), (n - 9, n)):
            inside = [i for a, b in sel.runs(lo, hi) for i in range(a, b)]
            assert inside == idx[(idx >= lo) & (idx < hi)].tolist(), (kind, lo, hi)
        with pytest.raises(IndexError):
            sel.parents([sel.count])
        with pytest.raises(IndexError):
            sel.parents([-1])
        stored = json.loads(json.dumps(sel.encode()))
        assert stored["encoding"] == sel.encoding and stored["records"] == sel.count
        back = Selection.decode(stored, n)
        assert back.encoding == sel.encoding and back.count == sel.count
        assert np.array_equal(back.parents(np.arange(back.count)), idx), kind
        assert list(back.runs()) == runs, kind
    assert encodings == {"ranges", "bitmap"}


def test_selection_runs_meeting_at_chunk_edges_are_merged():
    mask = np.zeros(1000, bool)
    mask[100:300] = True
    sel = Selection.from_mask_chunks(1000, [mask[:150], mask[150:200], mask[200:]])
    assert sel.encoding == "ranges" and list(sel.runs()) == [(100, 300)]
    with pytest.raises(SelectionError, match="cover 999 records"):
        Selection.from_mask_chunks(1000, [mask[:999]])


def tampered(stored: dict, raw: bytes) -> dict:
    """``stored`` holding ``raw`` instead, with a matching SHA-256."""
    return dict(stored, data=base64.b64encode(zlib.compress(raw)).decode("ascii"),
                sha256=hashlib.sha256(raw).hexdigest())


def test_a_damaged_stored_selection_is_refused():
    rng = np.random.default_rng(5)
    n = 5000
    bitmap = Selection.from_mask_chunks(n, [rng.random(n) < 0.5])
    ranges = Selection.from_ranges(n, [(10, 20), (30, 45)])
    assert bitmap.encoding == "bitmap" and ranges.encoding == "ranges"
    for sel in (bitmap, ranges):
        stored = sel.encode()
        with pytest.raises(SelectionError, match="SHA-256"):
            Selection.decode(dict(stored, sha256="0" * 64), n)
        with pytest.raises(SelectionError, match="cannot be decoded"):
            Selection.decode(dict(stored, data="not base64 at all!"), n)
        with pytest.raises(SelectionError, match="holds"):
            Selection.decode(dict(stored, records=sel.count + 1), n)
        with pytest.raises(SelectionError, match="encoding"):
            Selection.decode(dict(stored, encoding="lines"), n)
    with pytest.raises(SelectionError, match="bits for"):  # another parent's size
        Selection.decode(bitmap.encode(), n + 8)
    bits = np.frombuffer(zlib.decompress(base64.b64decode(bitmap.encode()["data"])), np.uint8)
    with pytest.raises(SelectionError, match="bits for"):  # one byte short, digest fine
        Selection.decode(tampered(bitmap.encode(), bits[:-1].tobytes()), n)
    for pairs in ([(10, 20), (15, 30)], [(10, 10)], [(0, n + 1)], [(-1, 3)]):
        raw = np.asarray(pairs, "<i8").tobytes()
        with pytest.raises(SelectionError, match="ascending"):
            Selection.decode(tampered(ranges.encode(), raw), n)
    with pytest.raises(SelectionError, match="int64 pairs"):
        Selection.decode(tampered(ranges.encode(), b"\x00" * 24), n)


# -- 3. --fraction -------------------------------------------------------------------


def test_fraction_is_exact_and_seeded(data):
    parent, folder = data["packs"]["lmdb"], data["folder"]
    labels = [label for _, _, label in everything(parent)]
    n = len(labels)
    for fraction in (0.3, 0.5, 0.77, 1.0):
        got = fastdata.subset(parent, folder / "f.fastdata.json", fraction=fraction,
                              overwrite=True, progress=False)
        assert got.records == round(fraction * n) == len(selected(got.path))
        strat = fastdata.subset(parent, folder / "s.fastdata.json", fraction=fraction,
                                stratify=True, overwrite=True, progress=False)
        per_class = Counter(labels[i] for i in selected(strat.path))
        assert [per_class[c] for c in range(4)] == \
            [round(fraction * c) for c in COUNTS.values()], fraction
        assert json.loads(Path(strat.path).read_text())["class_counts"] == \
            [per_class[c] for c in range(4)]
    # After a class selector, the fraction is of what is left.
    left = fastdata.subset(parent, folder / "cf.fastdata.json", classes=["bee", "dog"],
                           fraction=0.4, overwrite=True, progress=False)
    assert left.records == round(0.4 * 20)
    assert {labels[i] for i in selected(left.path)} <= {1, 3}
    # Same seed, same records; another seed, others.
    runs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        done = invoke("subset", parent, folder / f"seed-{name}.fastdata.json", "--fraction",
                      "0.3", "--seed", seed, "--no-progress")
        assert done.exit_code == 0, done.output
        runs[name] = selected(folder / f"seed-{name}.fastdata.json")
    assert runs["a"] == runs["b"] and runs["a"] != runs["c"]
    assert len(runs["c"]) == round(0.3 * n)
    a, b = (json.loads((folder / f"seed-{x}.fastdata.json").read_text()) for x in "ab")
    assert a["parts"] == b["parts"] and a["parts"][0]["selection"] is not None
    assert a["selected_by"] == {"fraction": 0.3, "seed": 7}
    for bad in (0, 1.5, -0.1):
        with pytest.raises(FastDataError, match="fraction"):
            fastdata.subset(parent, folder / "bad.fastdata.json", fraction=bad)
    with pytest.raises(FastDataError, match="stratify"):
        fastdata.subset(parent, folder / "bad.fastdata.json", stratify=True)
    assert not (folder / "bad.fastdata.json").exists()


# -- 4. key lists --------------------------------------------------------------------


def test_key_lists_with_a_missing_key(data):
    parent, folder, tmp = data["packs"]["tar"], data["folder"], data["tmp"]
    records = everything(parent)
    keys = [k for k, _, _ in records]
    (tmp / "keep.txt").write_text(f"# wanted\n{keys[20]}\n\n{keys[3]}\n  {keys[31]}  \n"
                                  "nope/missing.png\n", encoding="utf-8")
    done = invoke("subset", parent, folder / "keys.fastdata.json", "--keys", tmp / "keep.txt",
                  "--no-progress")
    assert done.exit_code == 0, done.output
    assert "3 of 32 records" in done.output
    assert "1 listed key(s) are not in the dataset: nope/missing.png" in done.output
    assert selected(folder / "keys.fastdata.json") == [3, 20, 31]  # the parent's order
    assert [k for k, _, _ in everything(folder / "keys.fastdata.json")] == \
        [keys[3], keys[20], keys[31]]

    (tmp / "drop.txt").write_text(f"{keys[0]}\n{keys[17]}\nnot/here.bmp\nnor/here.png\n",
                                  encoding="utf-8")
    result = fastdata.subset(parent, folder / "drop.fastdata.json",
                             exclude_keys=[line for line in
                                           (tmp / "drop.txt").read_text().splitlines()],
                             progress=False)
    assert result.records == 30 and result.parent_records == 32
    assert result.missing_count == 2 and result.missing_keys == ["nor/here.png", "not/here.bmp"]
    assert selected(result.path) == [i for i in range(32) if i not in (0, 17)]
    done = invoke("subset", parent, folder / "drop.fastdata.json", "--exclude-keys",
                  tmp / "drop.txt", "--overwrite", "--json", "--no-progress")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["missing_count"] == 2


# -- 5. --where ----------------------------------------------------------------------


def test_where_over_metadata_and_key_label_class(data):
    parent, folder, metas = data["meta"], data["folder"], data["metas"]
    records = everything(parent)
    classes = data["tree"].classes

    def expect(test) -> list[int]:
        out = []
        for i, ((key, _, label), meta) in enumerate(zip(records, metas)):
            fields = {**meta, "key": key, "label": label, "class": classes[label]}
            if test(fields):
                out.append(i)
        return out

    cases = {
        'width >= 25 and source == "web"':
            lambda f: f.get("width") is not None and f["width"] >= 25 and f["source"] == "web",
        'source in ["scan", "book"] and not info.score > 0.5':
            lambda f: f["source"] in ("scan", "book") and not f["info"]["score"] > 0.5,
        'width < 20 or label == 3':
            lambda f: (f.get("width") is not None and f["width"] < 20) or f["label"] == 3,
        'width * 2 % 4 == 0':
            lambda f: f.get("width") is not None and f["width"] * 2 % 4 == 0,
        "label == 2": lambda f: f["label"] == 2,
        f'key == "{records[9][0]}" or key == "{records[30][0]}"':
            lambda f: f["key"] in (records[9][0], records[30][0]),
        "width == None": lambda f: "width" not in f,
    }
    for k, (expr, test) in enumerate(cases.items()):
        want = expect(test)
        assert 0 < len(want) < 32, expr
        result = fastdata.subset(parent, folder / f"where{k}.fastdata.json", where=expr,
                                 progress=False)
        assert result.records == len(want), expr
        assert selected(result.path) == want, expr
    # Over a dataset without metadata: the key and label are there.
    done = invoke("subset", data["packs"]["hdf5"], folder / "wh5.fastdata.json", "--where",
                  'label == 2 and key != "cat/img000.png"', "--no-progress")
    assert done.exit_code == 0, done.output
    assert [k for k, _, _ in everything(folder / "wh5.fastdata.json")] == \
        [f"cat/img{i:03d}{LOSSLESS[i % 3]}" for i in range(1, COUNTS["cat"])]
    for expr, part in (("len(key) > 3", "len(key)"),
                       ('key.startswith("cat")', 'key.startswith("cat")'),
                       ("[x for x in key]", "[x for x in key]")):
        with pytest.raises(FastDataError, match="not allowed") as refused:
            fastdata.subset(parent, folder / "refused.fastdata.json", where=expr)
        assert repr(part) in str(refused.value)
        done = invoke("subset", parent, folder / "refused.fastdata.json", "--where", expr)
        assert done.exit_code == 1 and repr(part) in done.output, done.output
    with pytest.raises(FastDataError, match="not an expression"):
        fastdata.subset(parent, folder / "refused.fastdata.json", where="width >=")
    assert not (folder / "refused.fastdata.json").exists()


def test_where_can_name_the_class(data):
    parent, folder = data["packs"]["hdf5"], data["folder"]
    done = invoke("subset", parent, folder / "wclass.fastdata.json", "--where",
                  'class == "cat" and key != "cat/img000.png"', "--no-progress")
    assert done.exit_code == 0, done.output
    assert [k for k, _, _ in everything(folder / "wclass.fastdata.json")] == \
        [f"cat/img{i:03d}{LOSSLESS[i % 3]}" for i in range(1, COUNTS["cat"])]
    result = fastdata.subset(parent, folder / "wclass2.fastdata.json",
                             where='class in ["ant", "dog"]', progress=False)
    assert result.records == COUNTS["ant"] + COUNTS["dog"]


def test_a_subset_of_an_unlabelled_dataset(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 4, LOSSLESS))
    (tree.root / "list.jsonl").write_text("".join(
        json.dumps({"path": sample.key, "n": i}) + "\n" for i, sample in enumerate(tree.samples)))
    parent = pack(tree.root / "list.jsonl", tmp_path / "u.lmdb")
    with open_reader(parent) as reader:
        assert reader.classes == [] and set(reader.labels.tolist()) == {-1}
    for k, selectors in enumerate(({"keys": tree.keys[2:5]}, {"where": "n >= 5"},
                                   {"fraction": 0.5})):
        result = fastdata.subset(parent, tmp_path / f"u{k}.fastdata.json", progress=False,
                                 **selectors)
        assert result.records == (3 if k < 2 else 4)
        assert {label for _, _, label in everything(result.path)} == {-1}


# -- 6 and 7: by content: --exclude and dedup --write-view -----------------------------


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A training folder with exact copies planted in it (one image twice, one
    three times, across classes), and a validation folder holding copies of two
    other training images and three images of its own; both packed to lmdb."""
    tmp = tmp_path_factory.mktemp("planted")
    train = build_tree(tmp / "train", uniform_spec(("a", "b", "c"), 6, LOSSLESS))
    shutil.copy(train.root / "a/img001.bmp", train.root / "b/copy-a1.bmp")
    shutil.copy(train.root / "c/img002.bmp", train.root / "a/dup-c2.bmp")
    shutil.copy(train.root / "c/img002.bmp", train.root / "c/zz-c2.bmp")
    build_tree(tmp / "val", uniform_spec(("a", "c"), 2, LOSSLESS), seed=99)
    shutil.copy(train.root / "b/img004.ppm", tmp / "val/a/from-b4.ppm")
    shutil.copy(train.root / "c/img005.bmp", tmp / "val/c/from-c5.bmp")
    data = tmp / "data"
    return {"tmp": tmp, "data": data,
            "train": pack(train.root, data / "train.lmdb"),
            "val": pack(tmp / "val", data / "val-%03d.tar")}


def groups_by_bytes(path) -> list[list[int]]:
    by = {}
    for i, (_, payload, _) in enumerate(everything(path)):
        by.setdefault(payload, []).append(i)
    return list(by.values())


def test_exclude_drops_exactly_the_records_another_dataset_holds(planted):
    train, val = planted["train"], planted["val"]
    records = everything(train)
    val_bytes = {payload for _, payload, _ in everything(val)}
    dropped = [i for i, (_, payload, _) in enumerate(records) if payload in val_bytes]
    assert [records[i][0] for i in dropped] == ["b/img004.ppm", "c/img005.bmp"]
    done = invoke("subset", train, planted["data"] / "noval.fastdata.json", "--exclude", val,
                  "--no-progress")
    assert done.exit_code == 0, done.output
    assert f"2 record(s) dropped: their bytes are in {val}" in done.output
    assert selected(planted["data"] / "noval.fastdata.json") == \
        [i for i in range(len(records)) if i not in dropped]
    result = fastdata.subset(train, planted["data"] / "noval-a.fastdata.json", exclude=[val],
                             classes=["b"], progress=False)
    # Only what the other selectors left is compared: b/img004 is the one dropped.
    assert result.excluded_by_content == 1 and result.records == 7 - 1
    result = fastdata.subset(train, planted["data"] / "noval.fastdata.json", exclude=[val],
                             overwrite=True, progress=False)
    assert result.excluded_by_content == 2 and result.records == len(records) - 2


def test_dedup_write_view_keeps_the_first_of_each_group(planted):
    train, folder = planted["train"], planted["data"]
    groups = [g for g in groups_by_bytes(train) if len(g) > 1]
    records = everything(train)
    assert sorted({records[i][0] for i in g} for g in groups) == sorted(
        [{"a/img001.bmp", "b/copy-a1.bmp"}, {"a/dup-c2.bmp", "c/img002.bmp", "c/zz-c2.bmp"}],
        key=sorted)
    drop = sorted(i for g in groups for i in g[1:])
    done = invoke("dedup", train, "--write-view", folder / "clean.fastdata.json",
                  "--no-progress")
    assert done.exit_code == 0, done.output
    assert f"{len(records) - 3} of {len(records)} records (without 3)" in done.output
    kept = selected(folder / "clean.fastdata.json")
    assert kept == [i for i in range(len(records)) if i not in drop]
    assert all(min(g) in kept for g in groups)
    assert len({records[i][1] for i in kept}) == len(kept)  # no two alike left
    with open_reader(folder / "clean.fastdata.json") as reader:
        assert len({digest(reader.read(i)) for i in range(len(reader))}) == len(reader)
    # With --against, what the other dataset holds goes too.
    done = invoke("dedup", train, "--against", planted["val"], "--write-view",
                  folder / "clean.fastdata.json", "--no-progress", "--json")
    assert done.exit_code == 1 and "--overwrite" in done.output  # it exists
    done = invoke("dedup", train, "--against", planted["val"], "--write-view",
                  folder / "clean.fastdata.json", "--overwrite", "--no-progress", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["view"]["records"] == len(records) - 5
    val_bytes = {payload for _, payload, _ in everything(planted["val"])}
    shared = [i for i, (_, payload, _) in enumerate(records) if payload in val_bytes]
    assert [records[i][0] for i in shared] == ["b/img004.ppm", "c/img005.bmp"]
    assert selected(folder / "clean.fastdata.json") == \
        [i for i in range(len(records)) if i not in drop and i not in shared]
    # The first of a group is the first in the dataset's order (a/ before c/).
    assert [records[i][0] for i in drop] == ["b/copy-a1.bmp", "c/img002.bmp", "c/zz-c2.bmp"]


def test_dedup_of_a_view_writes_a_view_of_the_root_parent(planted):
    train, folder = planted["train"], planted["data"]
    records = everything(train)
    outer = fastdata.subset(train, folder / "ac.fastdata.json", classes=["a", "c"],
                            progress=False)
    inside = selected(outer.path)
    # In the view: a/dup-c2 = c/img002 = c/zz-c2; a/img001's copy is in b/, left out.
    report = fastdata.dedup(outer.path, progress=False)
    assert [{m.key for m in g.members} for g in report.within()] == \
        [{"a/dup-c2.bmp", "c/img002.bmp", "c/zz-c2.bmp"}]
    assert all(records[inside[m.index]][0] == m.key for g in report.groups for m in g.members)
    done = invoke("dedup", outer.path, "--write-view", folder / "ac-clean.fastdata.json",
                  "--no-progress")
    assert done.exit_code == 0, done.output
    stored = json.loads((folder / "ac-clean.fastdata.json").read_text())
    assert stored["of"]["path"] == "train.lmdb" == stored["parts"][0]["path"]
    assert [records[i][0] for i in sorted(set(inside) - set(selected(
        folder / "ac-clean.fastdata.json")))] == ["c/img002.bmp", "c/zz-c2.bmp"]


def test_fastdata_dedup_stays_the_function_after_a_subset_by_content(planted):
    done = run_python("""
        import sys, fastdata
        train, val, out = sys.argv[1:]
        fastdata.subset(train, out, exclude=[val], progress=False)
        print(fastdata.dedup(train, progress=False).redundant())
    """, planted["train"], planted["val"], str(planted["data"] / "fresh.fastdata.json"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3"]


# -- 8. a subset of a view -----------------------------------------------------------


def test_a_subset_of_a_view_selects_from_the_root_parent(data):
    parent, folder = data["packs"]["tar"], data["folder"]
    labels = [label for _, _, label in everything(parent)]
    first = fastdata.subset(parent, folder / "abc.fastdata.json",
                            classes=["ant", "bee", "cat"], progress=False)
    second = fastdata.subset(first.path, folder / "bcd.fastdata.json",
                             classes=["bee", "cat", "dog"], progress=False)
    stored = json.loads(Path(second.path).read_text())
    assert stored["of"]["path"] == os.path.basename(parent) == second.parent
    assert [p["path"] for p in stored["parts"]] == [os.path.basename(parent)]
    assert second.parent_records == 32
    assert selected(second.path) == [i for i, c in enumerate(labels) if c in (1, 2)]
    with open_reader(second.path) as reader:  # the dataset's own part, not the first view
        assert reader.record.kind == "view" and reader.record.base_records == 32
        assert [r.path for r in reader.parts] == [parent]
    # Indices given for the view are the view's own.
    outer = selected(first.path)
    third = fastdata.subset(first.path, folder / "abc-less.fastdata.json",
                            exclude_indices=[0, 6, len(outer) - 1], progress=False)
    assert selected(third.path) == [p for k, p in enumerate(outer)
                                    if k not in (0, 6, len(outer) - 1)]
    with pytest.raises(FastDataError, match="outside"):
        fastdata.subset(first.path, folder / "x.fastdata.json", exclude_indices=[len(outer)])
    # A fraction of a view is a fraction of the view's records.
    fourth = fastdata.subset(first.path, folder / "abc-half.fastdata.json", fraction=0.5,
                             progress=False)
    assert fourth.records == round(0.5 * len(outer))
    assert set(selected(fourth.path)) <= set(outer)


# -- 9. refusals ---------------------------------------------------------------------


def test_a_view_lives_beside_its_parent_or_above_it(data):
    parent, tmp = data["packs"]["lmdb"], data["tmp"]
    (tmp / "data" / "below").mkdir(exist_ok=True)
    (tmp / "aside").mkdir(exist_ok=True)
    for out in (tmp / "data" / "below" / "v.fastdata.json", tmp / "aside" / "v.fastdata.json"):
        with pytest.raises(FastDataError, match="outside") as refused:
            fastdata.subset(parent, out, classes=["ant"])
        assert type(refused.value) is FastDataError
        assert not out.exists()
        done = invoke("subset", parent, out, "--classes", "ant")
        assert done.exit_code == 1 and "beside the dataset" in done.output
    # Above the parent's folder is allowed: the parent is then data/d.lmdb.
    above = fastdata.subset(parent, tmp / "above.fastdata.json", classes=["ant"],
                            progress=False)
    assert above.parent == "data/d.lmdb"
    assert [k for k, _, _ in everything(above.path)] == \
        [k for k, _, label in everything(parent) if label == 0]
    with pytest.raises(FastDataError, match="fastdata.json"):
        fastdata.subset(parent, data["folder"] / "v.json", classes=["ant"])


def test_a_view_of_a_repacked_parent_is_refused(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 5, LOSSLESS))
    parent = pack(tree.root, tmp_path / "d.lmdb")
    view = fastdata.subset(parent, tmp_path / "v.fastdata.json", classes=["b"],
                           progress=False).path
    assert len(everything(view)) == 5
    pack(tree.root, tmp_path / "d.lmdb", overwrite=True, shuffle=3)  # same records, reordered
    for opening in (open_reader, fastdata.open_dataset):
        with pytest.raises(ManifestError, match="not the dataset this view was made with"):
            opening(view)
    done = invoke("info", view)
    assert done.exit_code == 1 and "not the dataset this view was made with" in done.output
    shutil.rmtree(tmp_path / "src" / "a")  # fewer records
    pack(tree.root, tmp_path / "d.lmdb", overwrite=True)
    with pytest.raises(ManifestError, match="had 10 records, it has 5"):
        open_reader(view)


def test_a_damaged_view_file_is_refused(data, tmp_path):
    parent, folder = data["packs"]["tfrecord"], data["folder"]
    good = fastdata.subset(parent, folder / "dmg.fastdata.json", fraction=0.5, seed=1,
                           progress=False).path
    stored = json.loads(Path(good).read_text())
    [part] = stored["parts"]

    def with_part(**changes):
        return dict(stored, parts=[dict(part, **changes)])

    variants = {
        "sha": with_part(selection=dict(part["selection"], sha256="ab" * 32)),
        "records": with_part(selection=dict(part["selection"], records=3)),
        "data": with_part(selection=dict(part["selection"], data="AAAA")),
        "count": dict(stored, records=stored["records"] + 1),
    }
    for name, bad in variants.items():
        path = folder / f"dmg-{name}.fastdata.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ManifestError, match="selection is damaged|do not add up"):
            open_reader(path)
        with pytest.raises(ManifestError):
            fastdata.open_dataset(path, streaming=True)
        done = invoke("verify", path)
        assert done.exit_code != 0, (name, done.output)
    path = folder / "dmg-noparts.fastdata.json"
    path.write_text(json.dumps({k: v for k, v in stored.items() if k != "parts"}))
    with pytest.raises(ManifestError, match="parts"):
        open_reader(path)
    # A part named outside the view's folder, or of another format; a newer file.
    hostile = {"../data/d.lmdb": UnsafeNameError, str(Path(parent).resolve()): UnsafeNameError,
               "d.h5": ManifestError}
    for name, error in hostile.items():
        path.write_text(json.dumps(with_part(path=name)))
        with pytest.raises(error):
            open_reader(path)
    path.write_text(json.dumps(dict(stored, schema=3)))
    with pytest.raises(ManifestError, match="newer"):
        open_reader(path)
    assert len(everything(good)) == 16


def test_a_view_naming_itself_as_parent_is_refused(data):
    folder = data["folder"]
    good = fastdata.subset(data["packs"]["lmdb"], folder / "selfish-src.fastdata.json",
                           classes=["ant"], progress=False).path
    stored = json.loads(Path(good).read_text())
    path = folder / "selfish.fastdata.json"
    path.write_text(json.dumps(dict(stored, parts=[dict(stored["parts"][0],
                                                         path=path.name)])))
    with pytest.raises(ManifestError, match="a part is a packed dataset"):
        open_reader(path)


def test_a_view_never_replaces_its_parents_manifest(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 4, LOSSLESS))
    parent = pack(tree.root, tmp_path / "d-%03d.tar")
    with pytest.raises(FastDataError):
        fastdata.subset(parent, parent, classes=["a"], overwrite=True, progress=False)
    assert len(everything(parent)) == 8


def test_a_view_inside_an_lmdb_folder_is_refused_or_opens(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), 4, LOSSLESS))
    parent = pack(tree.root, tmp_path / "d.lmdb")
    out = Path(parent) / "inside.fastdata.json"
    try:
        result = fastdata.subset(parent, out, classes=["a"], progress=False)
    except FastDataError:
        assert not out.exists()
        return
    assert len(everything(result.path)) == 4


def test_an_existing_view_needs_overwrite_and_an_empty_one_is_not_written(data):
    parent, folder = data["packs"]["hdf5"], data["folder"]
    view = folder / "exists.fastdata.json"
    fastdata.subset(parent, view, classes=["ant"], progress=False)
    with pytest.raises(OutputExistsError, match="overwrite"):
        fastdata.subset(parent, view, classes=["bee"], progress=False)
    assert len(everything(view)) == COUNTS["ant"]
    done = invoke("subset", parent, view, "--classes", "bee")
    assert done.exit_code == 1 and "--overwrite" in done.output
    done = invoke("subset", parent, view, "--classes", "bee", "--overwrite", "--no-progress")
    assert done.exit_code == 0, done.output
    assert len(everything(view)) == COUNTS["bee"]
    assert not [n for n in os.listdir(folder) if ".tmp-" in n]
    empty = folder / "empty.fastdata.json"
    for kwargs in ({"keys": ["no/such.png"]}, {"classes": ["ant"], "where": "label == 1"}):
        with pytest.raises(FastDataError, match="select no record"):
            fastdata.subset(parent, empty, progress=False, **kwargs)
        assert not empty.exists()
    with pytest.raises(FastDataError, match="no class 'eel'"):
        fastdata.subset(parent, empty, classes=["ant", "eel"], progress=False)


# -- 10. DataLoader workers ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_a_view_in_dataloader_workers(data, ctx):
    parent, folder = data["packs"]["lmdb"], data["folder"]
    view = folder / f"dl-{ctx}.fastdata.json"
    fastdata.subset(parent, view, classes=["ant", "cat"], fraction=0.75, seed=2,
                    overwrite=True, progress=False)
    labels = [label for _, _, label in everything(view)]
    assert set(labels) == {0, 2} and len(labels) == round(0.75 * 12)
    ds = fastdata.open_dataset(view, decode=fastdata.Decode(size=(32, 32)))
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=ctx,
                        timeout=120)
    got, shapes = [], set()
    for images, targets in loader:
        shapes.add(tuple(images.shape[1:]))
        got.extend(targets.tolist())
    assert got == labels and shapes == {(3, 32, 32)}
    if ctx == "fork":  # a stream of a tar view, its shards split between the workers
        tar_view = folder / "dl-tar.fastdata.json"
        fastdata.subset(data["packs"]["tar"], tar_view, classes=["bee", "dog"], fraction=0.5,
                        overwrite=True, progress=False)
        stream = fastdata.open_dataset(tar_view, streaming=True,
                                       decode=fastdata.Decode(size=(32, 32)))
        got = [t for _, targets in DataLoader(stream, batch_size=3, num_workers=2,
                                              multiprocessing_context=ctx, timeout=120)
               for t in targets.tolist()]
        assert Counter(got) == Counter(label for _, _, label in everything(tar_view))


# -- everywhere a dataset opens: loader(), mix, metadata --------------------------------


def test_a_view_through_loader_mix_and_metadata(data):
    folder = data["folder"]
    view = folder / "everywhere.fastdata.json"
    fastdata.subset(data["meta"], view, where="info.score >= 0.5", progress=False)
    parents = selected(view)
    assert parents == list(range(16, 32))
    records = everything(view)
    ds = fastdata.open_dataset(view, decode=fastdata.Decode(size=(16, 16)),
                               order=fastdata.Order(batch_size=5))
    labels = [t for _, targets in fastdata.loader(ds, num_workers=0) for t in targets.tolist()]
    assert labels == [label for _, _, label in records]
    with fastdata.open_dataset(view, with_metadata=True,
                               decode=fastdata.Decode(output="bytes")) as ds:
        assert [ds[i][2] for i in range(len(ds))] == [data["metas"][p] for p in parents]
    mixed = fastdata.mix({"view": {"path": str(view), "count": len(records)}},
                         decode=fastdata.Decode(output="bytes"))
    assert Counter((bytes(mixed[i][0]), int(mixed[i][1])) for i in range(len(mixed))) == \
        Counter((payload, label) for _, payload, label in records)
    tar_view = folder / "everywhere-tar.fastdata.json"
    fastdata.subset(data["packs"]["tar"], tar_view, classes=["ant", "cat", "dog"],
                    fraction=0.5, seed=4, progress=False)
    expected = Counter(digest(payload) for _, payload, _ in everything(tar_view))
    got = Counter()
    for rank in range(2):  # two ranks' streams split the view between them
        stream = fastdata.open_dataset(tar_view, streaming=True, decode=fastdata.Decode(
            output="bytes"), order=fastdata.Order(shuffle=True, seed=1, rank=rank,
                                                  world_size=2, drop_last=False))
        got.update(digest(payload) for payload, _ in stream)
    assert got == expected


@optional.skip_unless("dali")
@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_dali_reads_a_view_through_its_external_source(data, fmt):
    from fastdata.dali import DALILoader

    view = data["folder"] / f"dali-{fmt}.fastdata.json"
    fastdata.subset(data["packs"][fmt], view, classes=["cat", "dog"], overwrite=True,
                    progress=False)
    want = sorted(label for _, _, label in everything(view))
    loader = DALILoader(str(view), decode=fastdata.Decode(size=(16, 16)), device="cpu",
                        order=fastdata.Order(batch_size=4, drop_last=False))
    got = sorted(int(t) for _, labels in loader for t in labels.tolist())
    assert got == want
    with pytest.raises(FastDataError, match="view"):
        fastdata.dali.build_pipeline(str(view), reader="dali", device="cpu",
                                     decode=fastdata.Decode(size=(16, 16)),
                                     order=fastdata.Order(batch_size=4))


# -- 11. info, verify, convert -------------------------------------------------------


def test_info_verify_and_convert_of_a_view(data, tmp_path):
    parent, folder = data["meta"], data["folder"]
    view = folder / "cli.fastdata.json"
    fastdata.subset(parent, view, where='source != "scan"', classes=["bee", "cat", "dog"],
                    progress=False)
    info = invoke("info", view)
    assert info.exit_code == 0, info.output
    rows = {line.split()[0]: line for line in info.output.splitlines()[1:] if line.strip()}
    count = len(selected(view))
    assert rows["view"].split()[1:5] == [f"{count}", "of", "32", "records"]
    assert "of meta.lmdb" in rows["view"]
    assert "classes=bee,cat,dog" in rows["selected"] and "where=" in rows["selected"]
    assert f"records    {count}" in info.output
    verified = invoke("verify", view)
    assert verified.exit_code == 0, verified.output
    assert f"{count} records checked, 0 damaged" in verified.output
    out = folder / "converted.lmdb"
    done = invoke("convert", view, out)
    assert done.exit_code == 0, done.output
    assert everything(out) == everything(view)
    with open_reader(out) as copy, open_reader(view) as reader:
        assert not getattr(copy, "is_view", False)
        assert copy.classes == reader.classes and len(copy) == count
        assert copy.manifest.class_counts == reader.manifest.class_counts
        metas = [data["metas"][p] for p in selected(view)]
        assert [copy.metadata(i) for i in range(len(copy))] == metas
        assert [reader.metadata(i) for i in range(len(reader))] == metas
    # A tar view converts too, its records in the parent's order.
    tar_view = folder / "cli-tar.fastdata.json"
    made = fastdata.subset(data["packs"]["tar"], tar_view,
                           keys=["dog/img010.bmp", "ant/img001.bmp"], progress=False)
    assert made.records == 2 and made.missing_count == 0
    assert invoke("convert", tar_view, tmp_path / "t.h5").exit_code == 0
    assert everything(tmp_path / "t.h5") == everything(tar_view)
    assert [k for k, _, _ in everything(tmp_path / "t.h5")] == ["ant/img001.bmp",
                                                                  "dog/img010.bmp"]


# -- views of the first layout ------------------------------------------------------


def test_a_view_file_of_the_first_layout_still_opens(data, tmp_path):
    """A view written before views became records (``"version": 1``: one
    parent and one selection over all of its records) reads the same records."""
    from fastdata.dataset.record import manifest_digest

    parent = data["packs"]["tar"]
    records = everything(parent)
    with open_reader(parent) as reader:
        digest, n = manifest_digest(reader.manifest), len(reader)
        counts = [0] * len(reader.classes)
    chosen = [i for i, (_, _, label) in enumerate(records) if label in (1, 3)][::2]
    for i in chosen:
        counts[records[i][2]] += 1
    flags = np.zeros(n, bool)
    flags[chosen] = True
    selection = Selection.from_mask_chunks(n, [flags])
    old = {"kind": "fastdata-view", "format": "tar", "version": 1,
           "parent": {"path": os.path.basename(parent), "records": n,
                      "manifest_sha256": digest},
           "records": len(chosen), "class_counts": counts, "payload_bytes": None,
           "selection": selection.encode(), "selected_by": {"by": "hand"},
           "created_at": "2026-11-01T00:00:00+00:00", "fastdata_version": "0.1.0"}
    path = data["folder"] / "first-layout.fastdata.json"
    path.write_text(json.dumps(old))
    assert everything(path) == [records[i] for i in chosen]
    with open_reader(path) as reader:
        assert reader.record.kind == "view" and reader.manifest.class_counts == counts
    stream = fastdata.open_dataset(path, streaming=True,
                                   decode=fastdata.Decode(output="bytes"))
    assert sorted(bytes(x) for x, _ in stream) == sorted(records[i][1] for i in chosen)
    # A subset of it is a view of today's layout over the same part.
    again = fastdata.subset(path, data["folder"] / "from-first.fastdata.json",
                            classes=[data["tree"].classes[1]], progress=False)
    stored = json.loads(Path(again.path).read_text())
    assert stored["schema"] == 2 and stored["parts"][0]["path"] == os.path.basename(parent)
    assert [k for k, _, _ in everything(again.path)] == \
        [records[i][0] for i in chosen if records[i][2] == 1]

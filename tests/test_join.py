"""Joined columns (``fastdata.join`` / ``fastdata join``): per-record captions,
embeddings, scores and corrected labels from a table (JSON Lines, CSV/TSV,
Parquet), stored beside a dataset as a new version and merged into each
record's metadata; batched by ``fastdata.loader`` as ``metas.columns``.

Covered: values per record (reader, map-style, stream, loader batches) in
LMDB and tar; keys missing on either side, counted and listed exactly;
CSV/Parquet giving JSON Lines' values; ``--label-column`` (new classes,
counts, records appended later keep their labels); versions (``info
--history``, the previous version without the columns, the dataset's files
untouched, a later join's value replacing an earlier one's); refusals;
SHA-256 checks of the stored column files; a join at an s3:// URL (moto);
column names that never become file names (``../x``, ``present``, ``a/b``)
and entries of the first layout read through the same checks; values that
keep their types (CSV text unless ``types`` says, JSON Lines and Parquet
ints int64, floats float64, vectors of their element type, label names as
written); tables that are not UTF-8, refused naming the line.

Every image is generated at test time (``fastdata.demo.synthesize``); the
dataset is packed from a JSON Lines list so that each record has metadata of
its own (``{"own": i}``), which joined values must add to, never replace.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import optional
import pytest
import torch
from click.testing import CliRunner

import fastdata
from fastdata.cli import main
from fastdata.demo import synthesize
from fastdata.errors import CorruptDataError, FastDataError, ManifestError
from fastdata.dataset.resolve import open_reader
from fastdata.loaders.collate import MetadataBatch
from fastdata.dataset import history

N = 12
DIM = 512
#: format -> (output name, shard size: several shards for tar)
FORMATS = {"lmdb": ("d.lmdb", None), "tar": ("d-%06d.tar", 4)}
BYTES = fastdata.Decode(output="bytes")


# -- the data ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A tree of N distinct tiny PNGs, a JSON Lines list of them (each line with
    metadata of its own), and a second tree of other images to append."""
    tmp = tmp_path_factory.mktemp("join_src")
    synthesize(tmp / "pool", kind="tiny", n=N + 4, classes=1, seed=11, progress=False)
    pool = sorted((tmp / "pool").rglob("*.png"))
    assert len({p.read_bytes() for p in pool}) == N + 4  # every image differs
    src = tmp / "src"
    lines = []
    for i in range(N):
        cls = f"class_{i // 4:03d}"
        rel = f"{cls}/img_{i:03d}.png"
        (src / cls).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pool[i], src / rel)
        lines.append(json.dumps({"path": rel, "label": cls, "own": i}))
    (src / "list.jsonl").write_text("\n".join(lines) + "\n")
    more = tmp / "more"  # to append: a class the dataset has, and "zebra"
    for j, rel in enumerate(["class_001/late_0.png", "class_001/late_1.png",
                             "zebra/late_2.png", "zebra/late_3.png"]):
        (more / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pool[N + j], more / rel)
    return {"list": src / "list.jsonl", "more": more}


def pack(images, folder, fmt: str = "lmdb") -> str:
    name, shard_size = FORMATS[fmt]
    return fastdata.pack(images["list"], folder / name,
                         options=fastdata.PackOptions(workers=1, shard_size=shard_size),
                         progress=False).output


def dataset_keys(ds) -> list[str]:
    with open_reader(ds) as r:
        return list(r.keys)


def make_rows(keys, seed: int = 0, tag: str = "") -> dict:
    """key -> row: a unicode caption, 512 float64s, a score, an int count."""
    rng = np.random.default_rng(seed)
    return {k: {"path": k, "caption": f"a photo of {k} — ünï 猫{tag}",
                "emb": rng.standard_normal(DIM).tolist(),
                "score": float(rng.uniform(0, 1)), "count": int(rng.integers(0, 1000))}
            for k in keys}


def write_jsonl(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return str(path)


def write_csv(path, rows, fields, delimiter=",") -> str:
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.DictWriter(f, fieldnames=fields, delimiter=delimiter)
        out.writeheader()
        for row in rows:
            out.writerow({k: (repr(row[k]) if isinstance(row[k], float) else row[k])
                          for k in fields})
    return str(path)


def own(i: int) -> dict:
    return {"own": i}


def assert_row(meta: dict, row: dict, i: int, columns=("caption", "emb", "score", "count"),
               types: bool = True, emb=np.float64):
    """``meta`` is record i's own metadata plus ``row``'s columns, the vector as
    ``emb`` (float64 as JSON gives it, or float32 where asked) equal to the
    row's floats at that precision (the others of the row's type too, unless
    ``types`` is False)."""
    assert set(meta) == {"own", *columns}, meta.keys()
    assert meta["own"] == i
    for c in columns:
        if c == "emb":
            got = meta["emb"]
            assert isinstance(got, np.ndarray) and got.dtype == emb
            assert got.shape == (DIM,)
            np.testing.assert_array_equal(got, np.asarray(row["emb"], emb))
        else:
            assert meta[c] == row[c], (c, meta[c], row[c])
            assert not types or type(meta[c]) is type(row[c]), (c, meta[c], row[c])


def kinds(columns: dict) -> dict:
    """A join's column descriptions without the names of their files."""
    return {name: {k: v for k, v in spec.items() if k != "files"}
            for name, spec in columns.items()}


def joined(ds) -> tuple:
    """The column folder the latest join wrote, and its entry in the version."""
    entry = history.versions(ds)[-1].columns[-1]
    return os.path.join(history.dataset_folder(ds), entry["path"]), entry


def stored_file(ds, column, role: str = "values") -> str:
    """The path of a column's file (``present.npy`` when ``column`` is None)."""
    folder, entry = joined(ds)
    name = "present.npy" if column is None else entry["columns"][column]["files"][role]
    return os.path.join(folder, name)


def file_digests(folder) -> dict:
    """relative path -> SHA-256 of every file under ``folder`` outside ``*.versions``."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.is_file() and not any(part.endswith(".versions") for part in rel.parts):
            out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def cli(*args, ok: bool = True):
    done = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert done.exit_code == 0, done.output
    return done


# -- 1. captions and embeddings, every way the metadata is read -------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_captions_and_embeddings_reach_every_sample(images, tmp_path, fmt):
    ds = pack(images, tmp_path / "ds", fmt)
    keys = dataset_keys(ds)
    rows = make_rows(keys, seed=1)
    table = write_jsonl(tmp_path / "t.jsonl", list(rows.values())[::-1])  # another order

    result = fastdata.join(ds, table, key="path", types={"emb": "float32"})
    assert (result.version, result.matched) == (2, N)
    assert (result.missing_in_table, result.missing_in_dataset) == (0, 0)
    assert result.missing_keys == [] and result.unknown_keys == []
    assert kinds(result.columns) == {"caption": {"kind": "string"},
                              "emb": {"kind": "vector", "dtype": "float32", "shape": [DIM]},
                              "score": {"kind": "number", "dtype": "float64"},
                              "count": {"kind": "number", "dtype": "int64"}}

    with open_reader(ds) as r:
        assert r.has_metadata and len(r) == N
        payloads = r.read_many(list(range(N)))
        for i, k in enumerate(keys):
            assert_row(r.metadata(i), rows[k], i, emb=np.float32)
        for i, meta in zip([5, 0, 11, 5], r.metadata_many([5, 0, 11, 5])):
            assert_row(meta, rows[keys[i]], i, emb=np.float32)
    by_payload = {bytes(p): i for i, p in enumerate(payloads)}
    assert len(by_payload) == N

    mapped = fastdata.open_dataset(ds, with_metadata=True, decode=BYTES)
    for i in range(N):
        data, label, meta = mapped[i]
        assert bytes(data) == bytes(payloads[i])
        assert label == i // 4
        assert_row(meta, rows[keys[i]], i, emb=np.float32)

    if fmt == "tar":
        stream = fastdata.open_dataset(ds, streaming=True, with_metadata=True, decode=BYTES,
                                       order=fastdata.Order(shuffle=True, seed=3))
        seen = []
        for data, label, meta in stream:
            i = by_payload[bytes(data)]  # the record the sample is
            assert label == i // 4
            assert_row(meta, rows[keys[i]], i, emb=np.float32)
            seen.append(i)
        assert sorted(seen) == list(range(N))

    decode = fastdata.Decode(size=(16, 16))
    plain = fastdata.open_dataset(ds, decode=decode)
    pixels = torch.stack([plain[i][0] for i in range(N)]).float() / 255  # uint8 [N, C, H, W]

    def which(image) -> int:
        """The record whose pixels the loader's (float, scaled) image holds."""
        far = (pixels - image.float().cpu()).abs().flatten(1).amax(1)
        assert int((far < 1e-3).sum()) == 1, far
        return int(far.argmin())

    batched = fastdata.open_dataset(ds, with_metadata=True, decode=decode,
                                    order=fastdata.Order(batch_size=5, shuffle=True, seed=2))
    seen = []
    for images_, labels, metas in fastdata.loader(batched, num_workers=2):
        b = len(labels)
        at = [which(images_[j]) for j in range(b)]
        seen += at
        assert isinstance(metas, MetadataBatch) and len(metas) == b
        assert labels.tolist() == [i // 4 for i in at]
        for j, i in enumerate(at):
            assert_row(metas[j], rows[keys[i]], i, emb=np.float32)
        emb = metas.columns["emb"]
        assert emb.dtype == torch.float32 and tuple(emb.shape) == (b, DIM)
        want = np.stack([np.asarray(rows[keys[i]]["emb"], np.float32) for i in at])
        np.testing.assert_array_equal(emb.numpy(), want)
        score = metas.columns["score"]
        assert isinstance(score, torch.Tensor) and tuple(score.shape) == (b,)
        assert score.dtype.is_floating_point
        np.testing.assert_allclose(score.double().numpy(),
                                   [rows[keys[i]]["score"] for i in at], rtol=1e-6)
        assert metas.columns["count"].tolist() == [rows[keys[i]]["count"] for i in at]
        assert metas.columns["own"].tolist() == at
        assert "caption" not in metas.columns  # text is never stacked
    assert sorted(seen) == list(range(N))


# -- 2. keys missing on either side ------------------------------------------------------


def test_missing_and_unknown_keys_are_counted_and_listed(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    rows = make_rows(keys, seed=2)
    lacking = [2, 7, 10, 11]
    ghosts = [f"ghost/{j:02d}.png" for j in range(13)]  # more than the 10 listed
    table_rows = [rows[k] for i, k in enumerate(keys) if i not in lacking]
    table_rows[3:3] = [{**make_rows([g], seed=j)[g]} for j, g in enumerate(ghosts)]
    table = write_jsonl(tmp_path / "t.jsonl", table_rows)

    result = fastdata.join(ds, table, key="path")
    assert result.matched == N - len(lacking)
    assert result.missing_in_table == len(lacking)
    assert result.missing_keys == [keys[i] for i in lacking]
    assert result.missing_in_dataset == len(ghosts)
    assert result.unknown_keys == ghosts[:10]
    with open_reader(ds) as r:
        for i, k in enumerate(keys):
            meta = r.metadata(i)
            if i in lacking:
                assert meta == own(i)  # its own metadata, no joined column
            else:  # values
                assert_row(meta, rows[k], i, types=False)
    mapped = fastdata.open_dataset(ds, with_metadata=True, decode=BYTES)
    assert mapped[7][2] == own(7) and mapped[11][2] == own(11)
    assert_row(mapped[8][2], rows[keys[8]], 8, types=False)

    shown = cli("join", ds, table, "--key", "path")
    text = shown.output
    assert f"{N - len(lacking)} records matched" in text
    assert re.search(rf"\b{len(lacking)} record\(s\) have no row in the table: "
                     rf"{re.escape(', '.join(keys[i] for i in lacking))}", text), text
    assert re.search(rf"\b{len(ghosts)} table key\(s\) are not in the dataset: "
                     rf"{re.escape(', '.join(ghosts[:5]))} \.\.\.", text), text

    as_json = json.loads(cli("join", ds, table, "--key", "path", "--json").output)
    assert as_json["version"] == 4
    assert (as_json["matched"], as_json["missing_in_table"], as_json["missing_in_dataset"]) == \
        (N - len(lacking), len(lacking), len(ghosts))
    assert as_json["missing_keys"] == [keys[i] for i in lacking]
    assert as_json["unknown_keys"] == ghosts[:10]
    assert kinds(as_json["columns"])["emb"] == \
        {"kind": "vector", "dtype": "float64", "shape": [DIM]}


def test_an_int_column_stays_int_when_some_records_lack_a_row(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    big = 2**53 + 1
    table = write_jsonl(tmp_path / "t.jsonl",
                        [{"path": k, "count": big + i} for i, k in enumerate(keys[:-1])])
    result = fastdata.join(ds, table, key="path")
    assert result.missing_in_table == 1
    with open_reader(ds) as r:
        got = [r.metadata(i).get("count") for i in range(N - 1)]
    assert got == [big + i for i in range(N - 1)]
    assert all(type(v) is int for v in got)
    assert kinds(result.columns)["count"] == {"kind": "number", "dtype": "int64"}


# -- 3. CSV, TSV and Parquet give JSON Lines' values --------------------------------------


def test_csv_tsv_and_parquet_tables_give_the_jsonl_values(images, tmp_path):
    pa = optional.require("pyarrow")
    pq = optional.require("pyarrow", "pyarrow.parquet")
    keys = dataset_keys(pack(images, tmp_path / "probe"))
    rows = make_rows(keys, seed=3)
    order = list(rows.values())[::-1]
    flat = ["path", "caption", "score", "count"]
    tables = {
        "jsonl": write_jsonl(tmp_path / "t.jsonl", order),
        "csv": write_csv(tmp_path / "t.csv", order, flat),
        "tsv": write_csv(tmp_path / "t.tsv", order, flat, delimiter="\t"),
    }
    pq.write_table(pa.table({"path": [r["path"] for r in order],
                             "caption": [r["caption"] for r in order],
                             "emb": pa.array([r["emb"] for r in order],
                                             type=pa.list_(pa.float64())),
                             "score": [r["score"] for r in order],
                             "count": pa.array([r["count"] for r in order], pa.int64())}),
                   tmp_path / "t.parquet")
    tables["parquet"] = str(tmp_path / "t.parquet")

    got = {}
    for kind, table in tables.items():
        ds = pack(images, tmp_path / kind)
        types = {"score": "float", "count": "int"} if kind in ("csv", "tsv") else None
        result = fastdata.join(ds, table, key="path", types=types)
        assert result.matched == N and result.missing_in_dataset == 0, kind
        described = kinds(result.columns)
        assert described["caption"] == {"kind": "string"}, kind
        assert described["score"] == {"kind": "number", "dtype": "float64"}, kind
        assert described["count"] == {"kind": "number", "dtype": "int64"}, kind
        with open_reader(ds) as r:
            got[kind] = [r.metadata(i) for i in range(N)]
    for i, k in enumerate(keys):
        assert_row(got["jsonl"][i], rows[k], i)
        assert_row(got["parquet"][i], rows[k], i)
        for kind in ("csv", "tsv"):  # the cells as the types given read them
            assert_row(got[kind][i], rows[k], i, columns=("caption", "score", "count"))
            assert {c: got[kind][i][c] for c in flat[1:]} == \
                {c: got["jsonl"][i][c] for c in flat[1:]}


# -- 4. --label-column --------------------------------------------------------------------


def test_label_column_relabels_only_its_rows_and_appends_keep_their_labels(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    with open_reader(ds) as r:
        classes = list(r.classes)
        before = np.asarray(r.labels).tolist()
    assert classes == ["class_000", "class_001", "class_002"]
    assert before == [i // 4 for i in range(N)]
    fixes = {0: "class_002", 1: "zebra", 5: "class_001", 6: "zebra", 9: "class_000"}
    table = write_csv(tmp_path / "fixes.csv",
                      [{"path": keys[i], "fixed": name, "note": f"n{i}"}
                       for i, name in fixes.items()], ["path", "fixed", "note"])

    done = cli("join", ds, table, "--key", "path", "--label-column", "fixed")
    assert "4 label(s) changed; new classes: zebra" in done.output, done.output
    classes_after = classes + ["zebra"]
    want = list(before)
    for i, name in fixes.items():
        want[i] = classes_after.index(name)
    assert want != before and want[5] == before[5]  # row 5 names the class it has
    with open_reader(ds) as r:
        assert list(r.classes) == classes_after
        assert np.asarray(r.labels).tolist() == want
        assert [int(r.labels[i]) for i in range(N)] == want
        counts = list(r.manifest.class_counts)
        assert counts == np.bincount(want, minlength=4).tolist() == [3, 3, 4, 2]
        assert sum(counts) == N
        # the label column is not a joined column; the others are
        assert r.metadata(1) == {"own": 1, "note": "n1"} and r.metadata(2) == own(2)
    mapped = fastdata.open_dataset(ds, decode=BYTES)
    assert [mapped[i][1] for i in range(N)] == want
    with open_reader(ds, version=1) as r:
        assert list(r.classes) == classes and np.asarray(r.labels).tolist() == before

    appended = fastdata.append(images["more"], ds,
                               options=fastdata.PackOptions(workers=1), progress=False)
    assert appended.version == 3 and appended.records == N + 4
    assert appended.new_classes == []  # "zebra" came from the join
    late = [classes_after.index(c) for c in ("class_001", "class_001", "zebra", "zebra")]
    with open_reader(ds) as r:
        assert list(r.classes) == classes_after
        labels = np.asarray(r.labels).tolist()
        assert labels == want + late
        assert [int(r.labels[i]) for i in range(N + 4)] == want + late
        counts = list(r.manifest.class_counts)
        assert counts == np.bincount(labels, minlength=4).tolist() == [3, 5, 4, 4]
        assert sum(counts) == N + 4
        assert list(r.keys)[N:] == ["class_001/late_0.png", "class_001/late_1.png",
                                    "zebra/late_2.png", "zebra/late_3.png"]
        assert r.metadata(N) == {} and r.metadata(1) == {"own": 1, "note": "n1"}
    mapped = fastdata.open_dataset(ds, decode=BYTES)
    assert [mapped[i][1] for i in range(N + 4)] == want + late


# -- 5. versions ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_join_is_a_version_and_leaves_the_dataset_alone(images, tmp_path, fmt):
    ds = pack(images, tmp_path / "ds", fmt)
    keys = dataset_keys(ds)
    untouched = file_digests(tmp_path / "ds")
    assert len(untouched) >= (1 if fmt == "lmdb" else 3)
    first = make_rows(keys, seed=4)
    fastdata.join(ds, write_jsonl(tmp_path / "a.jsonl", first.values()), key="path",
                  columns=["caption", "emb"])
    assert file_digests(tmp_path / "ds") == untouched

    shown = cli("info", ds, "--history").output
    lines = shown.splitlines()
    assert "2 version(s)" in lines[0], shown
    assert re.search(r"^\s*v1\s.*\bpack:", lines[1]), shown
    assert re.search(r"^\s*v2\s.*\bjoin: joined caption, emb from a\.jsonl", lines[2]), shown
    assert [(v.number, v.change) for v in history.versions(ds)] == [(1, "pack"), (2, "join")]

    old = fastdata.open_dataset(fastdata.DatasetRef(ds, version=1), with_metadata=True,
                                decode=BYTES)
    assert [old[i][2] for i in range(N)] == [own(i) for i in range(N)]
    with open_reader(ds, version=1) as r:
        assert [r.metadata(i) for i in range(N)] == [own(i) for i in range(N)]

    # A second join: a new column, and new captions for some records only.
    second = make_rows(keys, seed=5, tag=" (v3)")
    redone = [0, 3, 4, 9]
    fastdata.join(ds, write_jsonl(tmp_path / "b.jsonl",
                                  [{"path": keys[i], "caption": second[keys[i]]["caption"],
                                    "extra": [i, "x"]} for i in redone]), key="path")
    assert file_digests(tmp_path / "ds") == untouched
    assert history.head_number(ds) == 3
    with open_reader(ds) as r:
        for i, k in enumerate(keys):
            meta = r.metadata(i)
            caption = (second if i in redone else first)[k]["caption"]
            assert meta["caption"] == caption
            np.testing.assert_array_equal(meta["emb"], np.asarray(first[k]["emb"]))
            assert meta["emb"].dtype == np.float64
            assert meta["own"] == i
            if i in redone:
                assert meta["extra"] == [i, "x"]
            else:
                assert "extra" not in meta
            assert "score" not in meta  # the first join took caption and emb only
    mapped = fastdata.open_dataset(ds, with_metadata=True, decode=BYTES)
    assert mapped[3][2]["caption"] == second[keys[3]]["caption"]
    with open_reader(ds, version=2) as r:
        meta = r.metadata(3)
        assert set(meta) == {"own", "caption", "emb"}
        assert meta["caption"] == first[keys[3]]["caption"]
    v1 = fastdata.open_dataset(fastdata.DatasetRef(ds, version=1), with_metadata=True,
                                decode=BYTES)
    assert [v1[i][2] for i in range(N)] == [own(i) for i in range(N)]


# -- 6. refusals ----------------------------------------------------------------------------


def test_refusals_name_what_is_wrong_and_write_nothing(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    rows = make_rows(keys[:4], seed=6)
    table = write_jsonl(tmp_path / "t.jsonl", rows.values())
    listed = "path, caption, emb, score, count"

    def nothing_written():  # a view made below registers itself; nothing else is there
        assert history.head_number(ds) is None
        folder = history.history_dir(ds)
        assert not os.path.exists(folder) or os.listdir(folder) == ["views"]

    with pytest.raises(FastDataError, match="'key'") as refused:
        fastdata.join(ds, table, key="key")
    assert listed in str(refused.value)
    with pytest.raises(FastDataError, match="'colour'") as refused:
        fastdata.join(ds, table, key="path", columns=["caption", "colour"])
    assert listed in str(refused.value) and "'caption'" not in str(refused.value)
    with pytest.raises(FastDataError, match="'fixed'") as refused:
        fastdata.join(ds, table, key="path", label_column="fixed")
    assert listed in str(refused.value)
    done = cli("join", ds, table, "--key", "path", "--columns", "caption,colour", ok=False)
    assert done.exit_code != 0 and "'colour'" in done.output and listed in done.output
    done = cli("join", ds, table, "--key", "key", ok=False)
    assert done.exit_code != 0 and "'key'" in done.output and listed in done.output
    nothing_written()

    twice = write_jsonl(tmp_path / "twice.jsonl",
                        [rows[keys[0]], rows[keys[3]], rows[keys[1]], rows[keys[3]]])
    with pytest.raises(FastDataError, match=re.escape(repr(keys[3]))) as refused:
        fastdata.join(ds, twice, key="path")
    assert "two rows" in str(refused.value)
    nothing_written()

    strangers = write_jsonl(tmp_path / "strangers.jsonl",
                            [{"path": f"elsewhere/{j}.png", "caption": "x"} for j in range(3)])
    with pytest.raises(FastDataError, match="no row of the table matches"):
        fastdata.join(ds, strangers, key="path")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(FastDataError, match="no rows"):
        fastdata.join(ds, empty, key="path")
    nothing_written()

    for name in ("t.txt", "t.json", "t.xlsx"):
        other = tmp_path / name
        shutil.copyfile(table, other)
        with pytest.raises(FastDataError, match=r"\.csv, \.tsv, \.jsonl or \.parquet"):
            fastdata.join(ds, other, key="path")
    done = cli("join", ds, tmp_path / "t.txt", "--key", "path", ok=False)
    assert done.exit_code != 0 and ".parquet" in done.output
    nothing_written()

    view = tmp_path / "ds" / "half.fastdata.json"
    fastdata.subset(ds, view, fraction=0.5, seed=3, progress=False)
    with pytest.raises(FastDataError, match="not a view"):
        fastdata.join(view, table, key="path")
    nothing_written()

    assert fastdata.join(ds, table, key="path").version == 2  # the table itself is fine


# -- 7. integrity of the stored columns -------------------------------------------------------


@pytest.mark.parametrize("column, role", [("caption", "text"), ("emb", "values"),
                                          (None, "present")])
def test_a_flipped_byte_in_a_column_file_is_refused_naming_it(images, tmp_path, column,
                                                              role):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    rows = make_rows(keys, seed=7)
    fastdata.join(ds, write_jsonl(tmp_path / "t.jsonl", rows.values()), key="path")
    with open_reader(ds) as r:
        assert_row(r.metadata(0), rows[keys[0]], 0)
    stored = Path(stored_file(ds, column, role))
    name = stored.name
    assert stored.is_file()
    raw = bytearray(stored.read_bytes())
    raw[len(raw) - 7] ^= 0x01  # in the data, past any header
    stored.write_bytes(bytes(raw))

    with open_reader(ds) as r:
        with pytest.raises(CorruptDataError, match=re.escape(name)) as refused:
            r.metadata(0)
        assert "SHA-256" in str(refused.value)
    mapped = fastdata.open_dataset(ds, with_metadata=True, decode=BYTES)
    with pytest.raises(CorruptDataError, match=re.escape(name)):
        mapped[0]
    with open_reader(ds, version=1) as r:  # the version before the join reads on
        assert r.metadata(0) == own(0)


def test_an_emptied_text_column_file_is_refused(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    fastdata.join(ds, write_jsonl(tmp_path / "t.jsonl", make_rows(keys, seed=8).values()),
                  key="path")
    stored = Path(stored_file(ds, "caption", "text"))
    stored.write_bytes(b"")
    with open_reader(ds) as r, pytest.raises(CorruptDataError,
                                             match=re.escape(stored.name)) as refused:
        r.metadata(0)
    assert "'caption'" in str(refused.value)


def test_jsonl_fields_absent_from_the_first_row_are_joined(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    lines = [{"path": keys[0], "caption": "first"}] + \
        [{"path": k, "caption": f"c{i}", "score": i / 2} for i, k in enumerate(keys[1:], 1)]
    table = write_jsonl(tmp_path / "t.jsonl", lines)
    result = fastdata.join(ds, table, key="path")
    assert set(result.columns) == {"caption", "score"}
    with open_reader(ds) as r:
        assert r.metadata(3) == {"own": 3, "caption": "c3", "score": 1.5}


# -- 8. at an s3:// URL ---------------------------------------------------------------------


def test_join_at_an_s3_url(images, tmp_path, s3_env, monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTDATA_CACHE_LIMIT", raising=False)
    local = pack(images, tmp_path / "ds", "tar")
    keys = dataset_keys(local)
    prefix = f"s3://fastdata-join/{tmp_path.name}"
    s3_env.upload_dir(tmp_path / "ds", prefix)
    url = f"{prefix}/d.tar.fastdata.json"
    rows = make_rows(keys[:9], seed=9)
    table = write_jsonl(tmp_path / "t.jsonl", list(rows.values()) + [
        {"path": "ghost/x.png", "caption": "-", "emb": [0.0] * DIM, "score": 0.0, "count": 0}])

    result = fastdata.join(url, table, key="path")
    assert (result.version, result.matched) == (2, 9)
    assert (result.missing_in_table, result.missing_in_dataset) == (3, 1)
    assert result.unknown_keys == ["ghost/x.png"]
    assert [(v.number, v.change) for v in history.versions(url)] == [(1, "pack"), (2, "join")]
    entry = history.versions(url)[-1].columns[-1]
    stored = s3_env.client().list_objects_v2(
        Bucket="fastdata-join", Prefix=f"{tmp_path.name}/{entry['path']}/")
    files = {f for spec in result.columns.values() for f in spec["files"].values()}
    assert len(files) == 5 and set(entry["sha256"]) == files | {"present.npy"}
    assert {o["Key"].rsplit("/", 1)[1] for o in stored.get("Contents", [])} == \
        files | {"present.npy"}
    assert not os.path.exists(history.history_dir(local))  # nothing written locally

    with open_reader(url) as r:
        assert len(r) == N
        for i, k in enumerate(keys):
            if i < 9:  # values (an int column of a partial table reads as float: see above)
                assert_row(r.metadata(i), rows[k], i, types=False)
            else:
                assert r.metadata(i) == own(i)
    mapped = fastdata.open_dataset(url, with_metadata=True, decode=BYTES)
    assert_row(mapped[4][2], rows[keys[4]], 4, types=False)
    with open_reader(url, version=1) as r:
        assert r.metadata(4) == own(4)


# -- 9. names from the table never become paths --------------------------------------------


def test_column_names_never_become_file_names(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    outside = str(tmp_path / "abs")  # an absolute name, outside the dataset

    def row(i: int) -> dict:
        return {"path": keys[i], "present": i % 2 == 0, "labels": i * 7, "x": f"text {i}",
                "x.offsets": i + 100, "x.missing": None if i == 3 else i / 4,
                "../escape": f"esc{i}", "../../../escape": [i, i + 1], outside: {"k": i},
                "a/b": "日本" * i, "a\\b": True, "é 日本": [0.5 * i, 1.5], "": "empty",
                "fixed": "class_002" if i == 0 else f"class_{i // 4:03d}"}

    table = write_jsonl(tmp_path / "t.jsonl", [row(i) for i in range(N - 1)])
    before = set(tmp_path.rglob("*"))
    result = fastdata.join(ds, table, key="path", label_column="fixed")
    names = [c for c in row(0) if c not in ("path", "fixed")]
    assert list(result.columns) == names

    folder, entry = joined(ds)
    files = {f for spec in entry["columns"].values() for f in spec["files"].values()}
    assert all(re.fullmatch(r"c\d{4}\.(npy|utf8|offsets\.npy|missing\.npy)", f)
               for f in files), files
    assert set(os.listdir(folder)) == files | {"present.npy", "labels.npy"} == \
        set(entry["sha256"])
    for p in set(tmp_path.rglob("*")) - before:  # no column file outside its folder
        assert Path(folder) in p.parents or not p.name.endswith((".npy", ".utf8")), p
    assert not any(tmp_path.rglob("*escape*")) and not (tmp_path / "abs.npy").exists()

    with open_reader(ds) as r:
        for i in range(N - 1):
            meta, want = r.metadata(i), row(i)
            assert set(meta) == {"own", *names}, meta.keys()
            for c in names:
                if isinstance(want[c], list):
                    assert isinstance(meta[c], np.ndarray), c
                    np.testing.assert_array_equal(meta[c], want[c])
                else:
                    assert meta[c] == want[c] and type(meta[c]) is type(want[c]), \
                        (c, meta[c], want[c])
        assert meta["../../../escape"].dtype == np.int64
        assert meta["é 日本"].dtype == np.float64
        assert r.metadata(N - 1) == own(N - 1)
        assert np.asarray(r.labels).tolist() == [2] + [i // 4 for i in range(1, N)]


def _digests(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_entries_of_the_earlier_layout_read_and_unsafe_file_names_are_refused(tmp_path):
    from fastdata.dataset.columns import JoinedColumns

    old = tmp_path / "old"  # the files as the earlier layout named them
    old.mkdir()
    np.save(old / "present.npy", np.array([True, True, False]))
    np.save(old / "score.npy", np.array([0.5, np.nan, np.nan]))
    np.save(old / "score.missing.npy", np.array([False, True, False]))
    np.save(old / "count.npy", np.array([3, 2**62 + 1, 0], np.int64))
    np.save(old / "emb.npy", np.array([[1, 2], [3, 4], [np.nan, np.nan]], np.float32))
    (old / "caption.utf8").write_bytes("ab猫".encode())
    np.save(old / "caption.offsets.npy", np.array([0, 1, 5, 5], np.int64))
    np.save(tmp_path / "up.npy", np.array([1, 2, 3], np.int64))  # outside the folder
    entry = {"path": "d.lmdb.versions/columns/000002", "records": 3,
             "columns": {"score": {"kind": "number", "dtype": "float64"},
                         "count": {"kind": "number", "dtype": "int64"},
                         "emb": {"kind": "vector", "dtype": "float32", "shape": [2]},
                         "caption": {"kind": "string"}},
             "sha256": _digests(old)}
    got = JoinedColumns(str(old), entry).values([0, 1, 2, 3])
    assert got[2:] == [{}, {}]
    np.testing.assert_array_equal(got[0].pop("emb"), [1, 2])
    np.testing.assert_array_equal(got[1].pop("emb"), [3, 4])
    assert got[:2] == [{"score": 0.5, "count": 3, "caption": "a"},
                       {"score": None, "count": 2**62 + 1, "caption": "b猫"}]

    def refused(bad: dict, call=lambda c: c.values([0, 1])):
        with pytest.raises(ManifestError, match=re.escape(bad["path"])):
            call(JoinedColumns(str(old), bad))

    up_digest = hashlib.sha256((tmp_path / "up.npy").read_bytes()).hexdigest()
    refused({**entry, "columns": {"../up": {"kind": "number", "dtype": "int64"}},
             "sha256": {**entry["sha256"], "../up.npy": up_digest}})
    refused({**entry, "sha256": {k: v for k, v in entry["sha256"].items()
                                 if k != "count.npy"}})  # a file its map does not list

    new = {"path": "d.lmdb.versions/columns/ID", "records": 3, "sha256": entry["sha256"],
           "columns": {"n": {"kind": "number", "dtype": "int64",
                             "files": {"values": "count.npy"}}}}
    assert JoinedColumns(str(old), new).values([1]) == [{"n": 2**62 + 1}]
    for name in ("../up.npy", str(tmp_path / "up.npy"), "sub/count.npy", "sub\\count.npy",
                 "..", "c9999.npy"):
        listed = {**entry["sha256"], name: up_digest} if name != "c9999.npy" \
            else entry["sha256"]
        refused({**new, "sha256": listed,
                 "columns": {"n": {"kind": "number", "dtype": "int64",
                                   "files": {"values": name}}}})
    refused({**new, "columns": {"n": {"kind": "number", "dtype": "int64", "files": {}}}})
    for name in ("../up.npy", "nothing.npy"):
        refused(new, lambda c, name=name: c.array(name))


# -- 10. values keep their types ---------------------------------------------------------------


def test_csv_cells_stay_text_unless_types_are_given(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    fields = ["path", "zip", "big", "n", "score", "flag", "meta", "note", "id"]
    rows = [{"path": k, "zip": f"0{2134 + i}", "big": "1e3", "n": str(i), "id": str(2**62 + i),
             "score": f"{i / 4}", "flag": "true" if i % 2 else "False",
             "meta": json.dumps({"i": i, "l": [i]}), "note": "" if i % 3 else str(i * 10)}
            for i, k in enumerate(keys)]
    table = write_csv(tmp_path / "t.csv", rows, fields)
    result = fastdata.join(ds, table, key="path")
    assert kinds(result.columns) == {c: {"kind": "string"} for c in fields[1:]}
    with open_reader(ds) as r:
        for i in range(N):
            assert r.metadata(i) == {"own": i, **{c: rows[i][c] for c in fields[1:]}}
        assert r.metadata(0)["zip"] == "02134" and r.metadata(0)["big"] == "1e3"

    done = cli("join", ds, table, "--key", "path", "--types", "n=int,score=float,flag=bool",
               "--types", "meta=json,big=float,note=int,id=int", "--json")
    assert kinds(json.loads(done.output)["columns"]) == {
        "zip": {"kind": "string"}, "big": {"kind": "number", "dtype": "float64"},
        "n": {"kind": "number", "dtype": "int64"},
        "score": {"kind": "number", "dtype": "float64"},
        "flag": {"kind": "bool", "dtype": "bool"}, "meta": {"kind": "json"},
        "note": {"kind": "number", "dtype": "int64"},
        "id": {"kind": "number", "dtype": "int64"}}
    with open_reader(ds) as r:
        for i in range(N):
            meta = r.metadata(i)
            assert meta == {"own": i, "zip": rows[i]["zip"], "big": 1000.0, "n": i,
                            "score": i / 4, "flag": i % 2 == 1, "meta": {"i": i, "l": [i]},
                            "note": None if i % 3 else i * 10, "id": 2**62 + i}
            assert [type(meta[c]) for c in ("n", "big", "flag")] == [int, float, bool]
    head = history.head_number(ds)

    bad = [dict(row) for row in rows]
    bad[5]["score"] = "high"
    bad_table = write_csv(tmp_path / "bad.csv", bad, fields)
    with pytest.raises(FastDataError, match=r"\brow 6\b") as refused:
        fastdata.join(ds, bad_table, key="path", types={"score": "float"})
    assert "'score'" in str(refused.value) and "'high'" in str(refused.value)
    with pytest.raises(FastDataError, match=r"\brow 1 \(line 2\), column 'score': '0\.0'"):
        fastdata.join(ds, table, key="path", types={"score": "int"})
    with pytest.raises(FastDataError, match="'integer'") as refused:
        fastdata.join(ds, table, key="path", types={"n": "integer"})
    assert "int, float" in str(refused.value)
    with pytest.raises(FastDataError, match="'colour'"):
        fastdata.join(ds, table, key="path", types={"colour": "int"})
    with pytest.raises(FastDataError, match="label"):
        fastdata.join(ds, table, key="path", label_column="zip", types={"zip": "int"})
    done = cli("join", ds, table, "--key", "path", "--types", "score", ok=False)
    assert done.exit_code != 0 and "NAME=TYPE" in done.output, done.output
    done = cli("join", ds, bad_table, "--key", "path", "--types", "score=float", ok=False)
    assert done.exit_code != 0 and "row 6" in done.output and "'score'" in done.output
    assert history.head_number(ds) == head


def test_jsonl_values_keep_their_types(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    big = 2**62 + 1

    def row(i: int) -> dict:
        return {"path": keys[i], "id": big + i, "score": i / 2, "flag": i % 2 == 0,
                "maybe": None if i == 2 else i, "ints": [i, -i, 2**40], "floats": [0.5, i],
                "bools": [True, i % 2 == 0], "ragged": [1] * (i % 3 + 1), "mixed": [i, "a"],
                "small": [0.1, 0.2 * i], "nested": {"big": 2**70 + i}}

    rows = [row(i) for i in range(N)]
    result = fastdata.join(ds, write_jsonl(tmp_path / "t.jsonl", rows), key="path",
                           types={"small": "float32"})
    assert kinds(result.columns) == {
        "id": {"kind": "number", "dtype": "int64"},
        "score": {"kind": "number", "dtype": "float64"},
        "flag": {"kind": "bool", "dtype": "bool"},
        "maybe": {"kind": "number", "dtype": "int64"},
        "ints": {"kind": "vector", "dtype": "int64", "shape": [3]},
        "floats": {"kind": "vector", "dtype": "float64", "shape": [2]},
        "bools": {"kind": "vector", "dtype": "bool", "shape": [2]},
        "ragged": {"kind": "json"}, "mixed": {"kind": "json"},
        "small": {"kind": "vector", "dtype": "float32", "shape": [2]},
        "nested": {"kind": "json"}}
    with open_reader(ds) as r:
        assert r.metadata(0)["id"] == 2**62 + 1
        for i in range(N):
            meta, want = r.metadata(i), row(i)
            for c in ("id", "score", "flag", "maybe"):
                assert meta[c] == want[c] and type(meta[c]) is type(want[c]), (c, meta[c])
            for c, dtype in (("ints", np.int64), ("floats", np.float64), ("bools", np.bool_),
                             ("small", np.float32)):
                assert isinstance(meta[c], np.ndarray) and meta[c].dtype == dtype, c
                np.testing.assert_array_equal(meta[c], np.asarray(want[c], dtype))
            for c in ("ragged", "mixed", "nested"):
                assert meta[c] == want[c], c
    head = history.head_number(ds)

    for bad, column in (({"id": 2**63}, "id"), ({"ints": [1, -2**63 - 1, 3]}, "ints")):
        table = write_jsonl(tmp_path / "bad.jsonl", [rows[0], {**rows[1], **bad}])
        with pytest.raises(FastDataError) as refused:
            fastdata.join(ds, table, key="path")
        message = str(refused.value)
        assert "row 2" in message and f"'{column}'" in message and "int64" in message
    assert history.head_number(ds) == head


def test_parquet_values_keep_their_types(images, tmp_path):
    pa = optional.require("pyarrow")
    pq = optional.require("pyarrow", "pyarrow.parquet")
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    pq.write_table(pa.table({
        "path": keys,
        "emb32": pa.array([[i, 0.5] for i in range(N)], pa.list_(pa.float32())),
        "emb64": pa.array([[i / 3, 0.25] for i in range(N)], pa.list_(pa.float64())),
        "ids": pa.array([[2**62 + i] for i in range(N)], pa.list_(pa.int64())),
        "id": pa.array([2**62 + 1 + i for i in range(N)], pa.int64()),
        "small": pa.array(list(range(N)), pa.int8()),
        "flag": pa.array([i % 2 == 0 for i in range(N)], pa.bool_()),
        "score": pa.array([None if i == 4 else i / 8 for i in range(N)], pa.float64()),
        "f32": pa.array([i / 8 for i in range(N)], pa.float32())}), tmp_path / "t.parquet")
    result = fastdata.join(ds, tmp_path / "t.parquet", key="path")
    assert kinds(result.columns) == {
        "emb32": {"kind": "vector", "dtype": "float32", "shape": [2]},
        "emb64": {"kind": "vector", "dtype": "float64", "shape": [2]},
        "ids": {"kind": "vector", "dtype": "int64", "shape": [1]},
        "id": {"kind": "number", "dtype": "int64"},
        "small": {"kind": "number", "dtype": "int64"},
        "flag": {"kind": "bool", "dtype": "bool"},
        "score": {"kind": "number", "dtype": "float64"},
        "f32": {"kind": "number", "dtype": "float32"}}
    with open_reader(ds) as r:
        for i in range(N):
            meta = r.metadata(i)
            assert meta["emb32"].dtype == np.float32 and meta["emb64"].dtype == np.float64
            np.testing.assert_array_equal(meta["emb32"], np.float32([i, 0.5]))
            np.testing.assert_array_equal(meta["emb64"], [i / 3, 0.25])
            assert meta["ids"].tolist() == [2**62 + i] and meta["id"] == 2**62 + 1 + i
            assert (meta["small"], meta["flag"], meta["f32"]) == (i, i % 2 == 0, i / 8)
            assert meta["score"] == (None if i == 4 else i / 8)
            assert [type(meta[c]) for c in ("id", "small", "flag", "f32")] == \
                [int, int, bool, float]

    pq.write_table(pa.table({"path": keys[:2], "u": pa.array([1, 2**64 - 1], pa.uint64())}),
                   tmp_path / "u.parquet")
    with pytest.raises(FastDataError) as refused:
        fastdata.join(ds, tmp_path / "u.parquet", key="path")
    message = str(refused.value)
    assert "row 2" in message and "'u'" in message and "int64" in message


def test_a_label_column_names_classes_exactly_as_written(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    table = write_csv(tmp_path / "l.csv", [{"path": keys[i], "cls": name} for i, name in
                                           enumerate(["010", "10", "1e1", "010"])],
                      ["path", "cls"])
    result = fastdata.join(ds, table, key="path", label_column="cls")
    assert result.new_classes == ["010", "10", "1e1"]
    fastdata.join(ds, write_jsonl(tmp_path / "l.jsonl", [{"path": keys[4], "cls": "007"},
                                                         {"path": keys[5], "cls": 7}]),
                  key="path", label_column="cls")
    with open_reader(ds) as r:
        classes = list(r.classes)
        assert classes[3:] == ["010", "10", "1e1", "007", "7"]
        assert [classes[int(r.labels[i])] for i in range(6)] == \
            ["010", "10", "1e1", "010", "007", "7"]


# -- 11. tables that are not UTF-8 -----------------------------------------------------------


def test_tables_that_are_not_utf8_are_refused_naming_the_line(images, tmp_path):
    ds = pack(images, tmp_path / "ds")
    keys = dataset_keys(ds)
    csv_text = "path,caption\n" + "".join(f"{k},café {i}\n" for i, k in enumerate(keys[:4]))
    jsonl_text = "".join(json.dumps({"path": k, "caption": f"café {i}"}, ensure_ascii=False)
                         + "\n" for i, k in enumerate(keys[:4]))
    for name, text in (("bom.csv", csv_text), ("bom.jsonl", jsonl_text)):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
        result = fastdata.join(ds, tmp_path / name, key="path")
        assert list(result.columns) == ["caption"], name
        with open_reader(ds) as r:
            assert r.metadata(1) == {"own": 1, "caption": "café 1"}
    head = history.head_number(ds)

    latin = csv_text.encode("latin-1")
    for name, data, where in (("u16.csv", csv_text.encode("utf-16"), "UTF-16"),
                              ("u16.jsonl", jsonl_text.encode("utf-16"), "UTF-16"),
                              ("u16le.csv", csv_text.encode("utf-16-le"), "line 1"),
                              ("latin.csv", latin, "line 2"),
                              ("latin.jsonl", jsonl_text.encode("latin-1"), "line 1")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(FastDataError) as refused:
            fastdata.join(ds, tmp_path / name, key="path")
        message = str(refused.value)
        assert where in message and "save it as UTF-8" in message, message
        assert name in message, message
    at = latin.index("é".encode("latin-1"))  # the first byte that is not UTF-8
    with pytest.raises(FastDataError) as refused:
        fastdata.join(ds, tmp_path / "latin.csv", key="path")
    assert refused.value.offset == at and f"byte offset {at}" in str(refused.value)
    done = cli("join", ds, tmp_path / "latin.csv", "--key", "path", ok=False)
    assert done.exit_code != 0 and "save it as UTF-8" in done.output
    assert history.head_number(ds) == head

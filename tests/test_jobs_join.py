"""``fastdata join`` as a job (fastdata.ops.join_pieces): the same result,
column files and version on this machine's processes (one and two), a real
Dask cluster and a real Ray cluster on 127.0.0.1, for JSON Lines, CSV and
Parquet tables read in many pieces; keys whose hashes collide still match
by their text; a CSV whose quotes mislead the plan is read whole.

The pieces are made small (a plan of the driver's: the same for every
executor) so that the dataset's keys and the table's lines fall in many
pieces; every image is generated at test time.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import optional
import pytest
from click.testing import CliRunner
from clusters import killing_a_local_worker

import fastdata
from fastdata.cli import main
from fastdata.dataset import history
from fastdata.dataset.resolve import open_reader
from fastdata.demo import synthesize
from fastdata.errors import FastDataError
from fastdata.ops import join_pieces

#: Records of the dataset (tar shards of 100): 14 pieces of keys with small_pieces.
RECORDS = 210
DIM = 8


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """A tar dataset of ``RECORDS`` tiny PNGs in 3 classes, packed once."""
    tmp = tmp_path_factory.mktemp("join_jobs")
    synthesize(tmp / "images", kind="tiny", n=RECORDS, classes=3, seed=4, progress=False)
    fastdata.pack(tmp / "images", tmp / "ds" / "d.tar", progress=False,
                  options=fastdata.PackOptions(shard_size=100, workers=1))
    return tmp / "ds"


@pytest.fixture()
def small_pieces(monkeypatch):
    """Pieces of 16 records and of about 2 KB of table (the driver's plan)."""
    monkeypatch.setattr(join_pieces, "MIN_PIECE_RECORDS", 16)
    monkeypatch.setattr(join_pieces, "MIN_TABLE_BYTES", 2048)


def copy_of(packed: Path, folder: Path) -> str:
    shutil.copytree(packed, folder)
    return str(folder / "d.tar.fastdata.json")


def keys_of(dataset: str) -> list[str]:
    with open_reader(dataset) as r:
        return list(r.keys)


def rows_for(keys: list[str]) -> list[dict]:
    """A row for most records (some twice as a ghost, some lacking), in
    another order: text, a vector, numbers, JSON, a label column."""
    rng = np.random.default_rng(7)
    rows = []
    for i, k in enumerate(keys):
        if i % 17 == 5:
            continue  # a record without a row
        rows.append({"path": k, "caption": f"a photo of {k} — ünï {i}",
                     "emb": rng.standard_normal(DIM).round(6).tolist(),
                     "score": None if i % 11 == 0 else float(i) / 7, "count": i * 1000,
                     "meta": {"i": i, "l": [i, "x"]} if i % 3 else [i],
                     "fixed": ["red", "green", "blue", f"class_{i % 3:03d}"][i % 4]})
    rows += [{"path": f"ghost/{j:03d}.png", "caption": "-", "count": -j} for j in range(14)]
    order = np.random.default_rng(3).permutation(len(rows))
    return [rows[k] for k in order]


def write_table(folder: Path, keys: list[str], fmt: str) -> str:
    rows = rows_for(keys)
    if fmt == "jsonl":
        path = folder / "t.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                        encoding="utf-8")
    elif fmt == "csv":
        path = folder / "t.csv"
        with open(path, "w", encoding="utf-8", newline="") as f:
            out = csv.writer(f)
            out.writerow(["path", "caption", "score", "count", "fixed"])
            for r in rows:  # a caption over two lines, quoted: a part starts outside it
                out.writerow([r["path"], r["caption"].replace(" of ", " of\n"),
                              "" if r.get("score") is None else repr(r["score"]),
                              r["count"], r.get("fixed", "")])
    else:
        pa = optional.require("pyarrow")
        pq = optional.require("pyarrow", "pyarrow.parquet")
        path = folder / "t.parquet"
        pq.write_table(pa.table({
            "path": [r["path"] for r in rows], "caption": [r["caption"] for r in rows],
            "emb": pa.array([r.get("emb") for r in rows], pa.list_(pa.float32())),
            "score": [r.get("score") for r in rows], "count": [r["count"] for r in rows],
            "fixed": [r.get("fixed") for r in rows]}), path, row_group_size=23)
    return str(path)


def outcome(dataset: str, table: str, **options) -> dict:
    """A join's result, its column files (name -> SHA-256) and version record,
    without the names that differ between copies (ids, paths)."""
    result = fastdata.join(dataset, table, key="path", label_column="fixed",
                           types={"score": "float", "count": "int"}
                           if table.endswith(".csv") else None, **options).to_dict()
    result.pop("dataset")
    version = history.versions(dataset)[-1]
    entry = dict(version.columns[-1])
    folder = Path(history.dataset_folder(dataset)) / entry.pop("path")
    entry.pop("id")
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(folder.iterdir())}
    labels = {k: v for k, v in version.labels.items() if k != "path"}
    return {"result": result, "files": files, "entry": entry, "labels": labels,
            "classes": version.classes, "counts": version.class_counts,
            "summary": version.summary}


def jsonl_join(packed: Path, tmp_path: Path) -> tuple[list[str], str, dict]:
    """The dataset's keys, a JSON Lines table of them, and the outcome of its
    join in this process (on a copy of the dataset)."""
    keys = keys_of(copy_of(packed, tmp_path / "probe"))
    table = write_table(tmp_path, keys, "jsonl")
    return keys, table, outcome(copy_of(packed, tmp_path / "plain"), table, workers=1)


def new_classes(keys: list[str]) -> list[str]:
    """The label column's names the dataset lacks, as the table first names
    them on a row that matches a record."""
    known = set(keys)
    found = [r["fixed"] for r in rows_for(keys) if r["path"] in known]
    return [c for c in dict.fromkeys(found) if not c.startswith("class_")]


def check_values(dataset: str, keys: list[str], fmt: str) -> None:
    """Every record's joined values are its row's, read back."""
    rows = {r["path"]: r for r in rows_for(keys)}
    with open_reader(dataset) as r:
        classes = list(r.classes)
        assert classes == ["class_000", "class_001", "class_002"] + new_classes(keys)
        labels = np.asarray(r.labels).tolist()
        for i, k in enumerate(keys):
            meta, row = r.metadata(i), rows.get(k)
            if row is None:
                assert meta == {}, (i, meta)
                assert classes[labels[i]] == k.split("/")[0]  # its own
                continue
            assert meta["caption"] == (row["caption"] if fmt != "csv" else
                                       row["caption"].replace(" of ", " of\n"))
            assert meta["count"] == row["count"] and meta["score"] == row["score"]
            assert classes[labels[i]] == row["fixed"]
            if fmt == "jsonl":
                np.testing.assert_array_equal(meta["emb"], row["emb"])
                assert meta["meta"] == row["meta"]


def test_jsonl_join_is_the_same_on_every_executor(packed, tmp_path, dask, ray_address,
                                                  small_pieces):
    keys = keys_of(copy_of(packed, tmp_path / "probe"))
    table = write_table(tmp_path, keys, "jsonl")
    found = {}
    for name, options in (("one", {"workers": 1}), ("two", {"workers": 2}),
                          ("dask", {"scheduler": dask.scheduler.address}),
                          ("ray", {"ray": ray_address})):
        dataset = copy_of(packed, tmp_path / name)
        found[name] = outcome(dataset, table, **options)
        check_values(dataset, keys, "jsonl")
    first = found["one"]
    for name, got in found.items():
        assert got == first, name
    result = first["result"]
    lacking = [k for i, k in enumerate(keys) if i % 17 == 5]
    assert result["matched"] == RECORDS - len(lacking)
    assert result["missing_in_table"] == len(lacking)
    assert result["missing_keys"] == lacking[:10]
    assert result["missing_in_dataset"] == 14
    ghosts = [r["path"] for r in rows_for(keys) if r["path"].startswith("ghost/")]
    assert result["unknown_keys"] == ghosts[:10]
    assert result["new_classes"] == new_classes(keys)
    assert sorted(result["new_classes"]) == ["blue", "green", "red"]
    assert {k: v["kind"] for k, v in result["columns"].items()} == {
        "caption": "string", "emb": "vector", "score": "number", "count": "number",
        "meta": "json"}
    assert set(first["files"]) == {"present.npy", "labels.npy", "c0000.utf8",
                                   "c0000.offsets.npy", "c0001.npy", "c0002.npy",
                                   "c0002.missing.npy", "c0003.npy", "c0004.utf8",
                                   "c0004.offsets.npy"}


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_csv_and_parquet_joins_are_the_same_in_one_piece_or_many(packed, tmp_path,
                                                                 monkeypatch, fmt):
    keys = keys_of(copy_of(packed, tmp_path / "probe"))
    table = write_table(tmp_path, keys, fmt)
    whole = outcome(copy_of(packed, tmp_path / "whole"), table, workers=1)
    monkeypatch.setattr(join_pieces, "MIN_PIECE_RECORDS", 16)
    monkeypatch.setattr(join_pieces, "MIN_TABLE_BYTES", 2048)
    parts = join_pieces.plan_table(table)["parts"]
    assert len(parts) > 3, parts
    for workers in (1, 2):
        dataset = copy_of(packed, tmp_path / f"pieces{workers}")
        assert outcome(dataset, table, workers=workers) == whole
        check_values(dataset, keys, fmt)


def test_keys_whose_hashes_collide_match_by_their_text(packed, tmp_path, monkeypatch,
                                                       small_pieces):
    keys, table, plain = jsonl_join(packed, tmp_path)

    # Keys with the same first 8 characters hash alike (runs of 16-48 keys),
    # and every key collides with every other: still the same join.
    for width in (8, 0):
        monkeypatch.setattr(join_pieces, "key_hash", lambda data, width=width:
                            hashlib.blake2b(data[:width], digest_size=16).digest())
        dataset = copy_of(packed, tmp_path / f"collide{width}")
        assert outcome(dataset, table, workers=1) == plain, width
        check_values(dataset, keys, "jsonl")

    # A record and a row whose hashes collide, their keys differ: no match; a
    # record and two rows of one hash: the row of its key matches.
    monkeypatch.setattr(join_pieces, "key_hash", lambda data: hashlib.blake2b(
        data[5:] if data.startswith(b"ghost") else data, digest_size=16).digest())
    lone = tmp_path / "lone.jsonl"
    lone.write_text("".join(json.dumps(r) + "\n" for r in [
        {"path": keys[0], "n": 1}, {"path": "ghost" + keys[1], "n": 2},
        {"path": "ghost" + keys[2], "n": 3}, {"path": keys[2], "n": 4}]))
    dataset = copy_of(packed, tmp_path / "lone")
    done = fastdata.join(dataset, str(lone), key="path", workers=1)
    assert (done.matched, done.missing_in_table, done.missing_in_dataset) == \
        (2, RECORDS - 2, 2)
    assert done.unknown_keys == ["ghost" + keys[1], "ghost" + keys[2]]
    assert done.missing_keys == keys[1:2] + keys[3:12]
    with open_reader(dataset) as r:
        assert [r.metadata(i) for i in range(3)] == [{"n": 1}, {}, {"n": 4}]


def test_a_key_given_twice_is_refused_naming_the_second_row(packed, tmp_path,
                                                           small_pieces):
    keys = keys_of(copy_of(packed, tmp_path / "probe"))
    lines = [{"path": k, "n": i} for i, k in enumerate(keys)] + \
        [{"path": "ghost/a.png"}, {"path": "ghost/a.png"}, {"path": keys[40], "n": -1}]
    table = tmp_path / "twice.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in lines))
    dataset = copy_of(packed, tmp_path / "ds")
    for workers in (1, 2):
        with pytest.raises(FastDataError, match=rf"key '{keys[40]}' has two rows "
                                                rf"\(row {RECORDS + 3} is the second\)"):
            fastdata.join(dataset, str(table), key="path", workers=workers)
    assert history.head_number(dataset) is None


def test_a_csv_whose_quotes_mislead_the_plan_is_read_whole(packed, tmp_path,
                                                          small_pieces):
    keys = keys_of(copy_of(packed, tmp_path / "probe"))
    lines = ["path,note"]
    for i, k in enumerate(keys):
        lines.append(f'{k},"two\nlines {i}"' if i % 2 else f"{k},plain {i}")
        if i == 20:
            lines.append('ghost/x.png,12" pizza')  # a quote inside an unquoted cell
    table = tmp_path / "quotes.csv"
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    dataset = copy_of(packed, tmp_path / "ds")
    done = fastdata.join(dataset, str(table), key="path", workers=2)
    assert (done.matched, done.unknown_keys) == (RECORDS, ["ghost/x.png"])
    with open_reader(dataset) as r:
        assert r.metadata(3) == {"note": "two\nlines 3"}
        assert r.metadata(4) == {"note": "plain 4"}


def test_cli_join_takes_the_job_options(packed, tmp_path, small_pieces):
    keys = keys_of(copy_of(packed, tmp_path / "probe"))
    table = write_table(tmp_path, keys, "jsonl")
    dataset = copy_of(packed, tmp_path / "ds")
    done = CliRunner().invoke(main, ["join", dataset, table, "--key", "path", "--workers",
                                     "2", "--resume", "--json"])
    assert done.exit_code == 0, done.output
    assert "no interrupted join of these inputs to resume" in done.stderr
    shown = json.loads(done.stdout)
    assert shown["matched"] == RECORDS - len([i for i in range(RECORDS) if i % 17 == 5])
    assert "--scheduler" in CliRunner().invoke(main, ["join", "--help"]).output


def test_an_interrupted_join_resumes_from_its_finished_pieces(packed, tmp_path,
                                                               monkeypatch, small_pieces):
    from fastdata.ops.join_match import Matcher

    _, table, plain = jsonl_join(packed, tmp_path)
    dataset = copy_of(packed, tmp_path / "ds")

    def interrupted(self, classes):
        raise KeyboardInterrupt  # Ctrl-C after the pieces, during the merge

    monkeypatch.setattr(Matcher, "match", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fastdata.join(dataset, table, key="path", label_column="fixed", workers=1)
    assert history.head_number(dataset) is None
    monkeypatch.undo()
    monkeypatch.setattr(join_pieces, "MIN_PIECE_RECORDS", 16)
    monkeypatch.setattr(join_pieces, "MIN_TABLE_BYTES", 2048)
    ran, piece = [], join_pieces.join_piece
    monkeypatch.setattr(join_pieces, "join_piece",
                        lambda *args: ran.append(args[0]) or piece(*args))
    notes = []
    assert outcome(dataset, table, workers=1, resume=True, on_event=notes.append) == plain
    assert ran == [] and notes == []  # every piece was kept


_PIECE = join_pieces.join_piece


def slow_piece(*args):
    """A join's piece that takes 0.1 s more (the forked workers run it by name)."""
    import time

    time.sleep(0.1)
    return _PIECE(*args)


def test_a_killed_local_worker_has_its_pieces_run_again(packed, tmp_path, monkeypatch,
                                                       small_pieces):
    _, table, plain = jsonl_join(packed, tmp_path)
    monkeypatch.setattr(join_pieces, "join_piece", slow_piece)
    dataset = copy_of(packed, tmp_path / "ds")
    with killing_a_local_worker() as when:
        got = outcome(dataset, table, workers=2)
    assert when.fired
    assert got == plain


def test_a_version_file_is_joined_and_a_view_is_refused(packed, tmp_path, small_pieces):
    dataset = copy_of(packed, tmp_path / "ds")
    keys = keys_of(dataset)
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"path": k, name: i}) + "\n" for i, k in enumerate(keys)))
    fastdata.join(dataset, str(tmp_path / "a.jsonl"), key="path", workers=2)
    done = fastdata.join(history.record_path(dataset, 1), str(tmp_path / "b.jsonl"),
                         key="path", workers=2)
    assert (done.version, done.matched) == (3, RECORDS)
    with open_reader(dataset) as r:
        assert r.metadata(7) == {"a": 7, "b": 7}
    view = tmp_path / "ds" / "half.fastdata.json"
    fastdata.subset(dataset, view, fraction=0.5, seed=3, progress=False)
    with pytest.raises(FastDataError, match="not a view of it"):
        fastdata.join(str(view), str(tmp_path / "a.jsonl"), key="path", workers=2)
    assert history.head_number(dataset) == 3

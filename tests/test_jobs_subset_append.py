"""``fastdata.subset`` and ``fastdata.append`` as jobs (fastdata.ops.subset_pieces,
fastdata.ops.append_pieces): the same view, and the same version, on this
machine's processes (one and two, one of them killed amid its pieces), a real
Dask cluster and a real Ray cluster on 127.0.0.1 (each started once for the
module)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from clusters import killing_a_local_worker

import fastdata
from fastdata.cli import main
from fastdata.demo import synthesize
from fastdata.errors import FastDataError
from fastdata.ops import append_pieces, dedup_pieces, subset_pieces

#: Records of the parent: 6 pieces of 256 (see subset_pieces.plan).
RECORDS = 1_400
#: Images of the pool the excluded dataset holds copies of (every 97th).
SHARED_EVERY = 97
#: The selections every executor makes, by name.
CASES = {
    "where": {"where": "label == 1 or key < 'class_000/00300.png'"},
    "fraction": {"fraction": 0.3, "seed": 5},
    "stratify": {"fraction": 0.25, "seed": 2, "stratify": True,
                 "where": "key != 'class_000/00007.png'"},
    "exclude": {"exclude": ["VAL"]},
    "exclude-fraction": {"exclude": ["VAL"], "fraction": 0.5, "seed": 9},
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """A tar parent of ``RECORDS`` tiny PNGs in two classes, a dataset
    holding copies of every ``SHARED_EVERY``-th, and, for appends, a folder
    of 400 of the images packed and one of 250 that holds 50 of those keys
    again."""
    tmp = tmp_path_factory.mktemp("subset-append")
    synthesize(tmp / "pool", kind="tiny", n=RECORDS, classes=2, seed=4)
    pool = sorted((tmp / "pool").rglob("*.png"))
    for i, path in enumerate(pool):
        (tmp / "images" / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp / "images" / path.parent.name / f"{i:05d}.png")
    (tmp / "val" / "v").mkdir(parents=True)
    for i in range(0, RECORDS, SHARED_EVERY):
        shutil.copy(pool[i], tmp / "val" / "v" / f"{i:05d}.png")
    for name, span in (("base", range(400)), ("new", range(350, 600))):
        for i in span:
            folder = tmp / name / pool[i].parent.name
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(pool[i], folder / f"{i:05d}.png")
    options = fastdata.PackOptions(shard_size=200)
    return {
        "tmp": tmp,
        "parent": fastdata.pack(tmp / "images", tmp / "d" / "all.tar", progress=False,
                                options=options).output,
        "val": fastdata.pack(tmp / "val", tmp / "d" / "val.lmdb", progress=False).output,
        "base": fastdata.pack(tmp / "base", tmp / "base-ds" / "b.tar", progress=False,
                              options=fastdata.PackOptions(shard_size=100)).output,
    }


def _case(data: dict, name: str) -> dict:
    case = dict(CASES[name])
    if "exclude" in case:
        case["exclude"] = [data["val"]]
    return case


def _view(data: dict, name: str, label: str, **where) -> tuple[dict, bytes]:
    out = Path(data["parent"]).parent / f"{name}-{label}.fastdata.json"
    result = fastdata.subset(data["parent"], out, progress=False, **_case(data, name),
                             **where)
    return {k: v for k, v in result.to_dict().items() if k != "path"}, out.read_bytes()


def _without_stamp(view: bytes) -> dict:
    """A view file less its creation time (its only field that differs)."""
    record = json.loads(view)
    record.pop("created_at", None)
    record.pop("sha256", None)
    return record


@pytest.fixture(scope="module")
def local_views(data) -> dict:
    return {name: _view(data, name, "local1", workers=1) for name in CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_subset_on_two_local_processes_is_the_one_process_view(data, local_views, name):
    result, view = _view(data, name, "local2", workers=2)
    assert result == local_views[name][0]
    assert _without_stamp(view) == _without_stamp(local_views[name][1])


@pytest.mark.parametrize("name", list(CASES))
def test_subset_on_dask_is_the_local_view(data, local_views, dask, staging, name):
    result, view = _view(data, name, "dask", scheduler=dask.scheduler.address)
    assert result == local_views[name][0]
    assert _without_stamp(view) == _without_stamp(local_views[name][1])
    assert not list(staging.iterdir())  # the work folder goes when the job ends well


@pytest.mark.parametrize("name", list(CASES))
def test_subset_on_ray_is_the_local_view(data, local_views, ray_address, staging, name):
    result, view = _view(data, name, "ray", ray=ray_address)
    assert result == local_views[name][0]
    assert _without_stamp(view) == _without_stamp(local_views[name][1])
    assert not list(staging.iterdir())


@pytest.mark.parametrize("name", ["where", "stratify", "exclude"])
def test_a_piece_flagged_in_small_chunks_gives_the_same_view(data, local_views, name,
                                                             monkeypatch):
    # Chunks of 100 records cut every 256-record piece off the byte and
    # the 64-record grid its flags are packed on.
    monkeypatch.setattr(subset_pieces, "CHUNK", 100)
    result, view = _view(data, name, "chunked", workers=1)
    assert result == local_views[name][0]
    assert _without_stamp(view) == _without_stamp(local_views[name][1])


def _selected(view_path) -> list[int]:
    with fastdata.open_reader(view_path) as reader:
        return [int(reader.base_of([i])[0]) for i in range(len(reader))]


def test_the_selections_are_the_ones_pinned(data, local_views):
    from fastdata.order.bijection import Bijection, mix64

    folder = Path(data["parent"]).parent
    with fastdata.open_reader(data["parent"]) as reader:
        keys, labels = list(reader.keys), reader.labels.tolist()
    where = [i for i in range(RECORDS) if labels[i] == 1 or keys[i] < "class_000/00300.png"]
    assert _selected(folder / "where-local1.fastdata.json") == where
    # --fraction: record i is kept when a keyed bijection of n sends i below round(f n).
    keep = round(0.3 * RECORDS)
    draw = Bijection(RECORDS, int(mix64(np.uint64(5))[0]))
    assert _selected(folder / "fraction-local1.fastdata.json") == \
        [i for i in range(RECORDS) if draw.at(np.asarray([i]))[0] < keep]
    assert local_views["fraction"][0]["records"] == keep
    with fastdata.open_reader(data["val"]) as val:
        held = {val.read(i) for i in range(len(val))}
    with fastdata.open_reader(data["parent"]) as reader:
        shared = [i for i in range(RECORDS) if reader.read(i) in held]
    assert len(shared) == len(range(0, RECORDS, SHARED_EVERY))
    assert _selected(folder / "exclude-local1.fastdata.json") == \
        [i for i in range(RECORDS) if i not in shared]
    assert local_views["exclude"][0]["excluded_by_content"] == len(shared)


def test_cli_subset_on_dask_and_ray_writes_the_local_view(data, local_views, dask,
                                                          ray_address):
    runner = CliRunner()
    folder = Path(data["parent"]).parent
    for label, cluster in (("cli-dask", ["--scheduler", dask.scheduler.address]),
                           ("cli-ray", ["--ray", ray_address])):
        out = folder / f"where-{label}.fastdata.json"
        done = runner.invoke(main, ["subset", data["parent"], str(out), "--where",
                                    CASES["where"]["where"], "--no-progress", "--json",
                                    *cluster])
        assert done.exit_code == 0, done.output
        assert json.loads(done.output)["records"] == local_views["where"][0]["records"]
        assert _without_stamp(out.read_bytes()) == \
            _without_stamp(local_views["where"][1])


# -- append ---------------------------------------------------------------------------


def _fresh_copy(data: dict, label: str) -> str:
    """A copy of the dataset appended to, for one executor."""
    folder = data["tmp"] / f"ds-{label}"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(Path(data["base"]).parent, folder)
    return str(folder / Path(data["base"]).name)


def _append(data: dict, label: str, **where) -> tuple[dict, dict]:
    """Refused, then skipping the keys it holds: the refusal, the result,
    the version record and the part's files' digests, less what names the
    new part (its id) and the times (the manifests' ``created_at``, and so
    the part's manifest digest)."""
    from fastdata.dataset import history

    dataset = _fresh_copy(data, label)
    with pytest.raises(FastDataError, match="skip_existing") as refused:
        fastdata.append(data["tmp"] / "new", dataset, progress=False, **where)
    assert history.head_number(dataset) is None
    result = fastdata.append(data["tmp"] / "new", dataset, progress=False,
                             skip_existing=True, **where)
    record = json.loads(Path(history.record_path(dataset, result.version)).read_text())
    part = record["parts"][-1]
    files = sorted(Path(result.part).parent.iterdir())
    digests = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files
               if not f.name.endswith(".fastdata.json")}
    manifest = json.loads(Path(result.part).read_text())
    manifest.pop("created_at")
    digests["manifest"] = manifest
    for name in ("created_at", "sha256", "parent_sha256"):
        record.pop(name, None)
    for name in ("id", "path", "manifest_sha256"):
        part.pop(name)
    out = result.to_dict()
    for name in ("part", "pack", "dataset"):
        out.pop(name)
    return {"refused": str(refused.value).replace(dataset, "DS"), "result": out,
            "record": record, "files": digests}, result


@pytest.fixture(scope="module")
def local_append(data) -> dict:
    found, result = _append(data, "local1", workers=1)
    assert (result.skipped_existing, result.added, result.records) == (50, 200, 600)
    assert "50 key(s) of the source are in the dataset already" in found["refused"]
    return found


def test_append_pins_what_it_refuses_and_passes_over(data, local_append):
    with fastdata.open_reader(data["base"]) as reader:
        held = sorted(set(reader.keys))
    new = sorted(str(p.relative_to(data["tmp"] / "new")).replace(os.sep, "/")
                 for p in (data["tmp"] / "new").rglob("*.png"))
    clashes = sorted(set(held) & set(new))
    assert len(clashes) == 50
    assert f"({', '.join(clashes[:10])} ...)" in local_append["refused"]
    assert local_append["result"]["skipped_keys"] == clashes[:10]


def test_append_on_two_local_processes_is_the_one_process_version(data, local_append):
    assert _append(data, "local2", workers=2)[0] == local_append


def test_append_on_dask_is_the_local_version(data, local_append, dask, staging):
    assert _append(data, "dask", scheduler=dask.scheduler.address)[0] == local_append
    assert not list(staging.iterdir())


def test_append_on_ray_is_the_local_version(data, local_append, ray_address, staging):
    assert _append(data, "ray", ray=ray_address)[0] == local_append
    assert not list(staging.iterdir())


def test_cli_pack_append_takes_a_cluster(data, local_append, dask, ray_address):
    runner = CliRunner()
    for label, cluster in (("cli-dask", ["--scheduler", dask.scheduler.address]),
                           ("cli-ray", ["--ray", ray_address])):
        dataset = _fresh_copy(data, label)
        refused = runner.invoke(main, ["pack", str(data["tmp"] / "new"), dataset,
                                       "--append", "--no-progress", *cluster])
        assert refused.exit_code != 0
        assert "--skip-existing" in refused.output and "50 key(s)" in refused.output
        done = runner.invoke(main, ["pack", str(data["tmp"] / "new"), dataset, "--append",
                                    "--skip-existing", "--no-progress", "--json", *cluster])
        assert done.exit_code == 0, done.output
        out = json.loads(done.output)
        assert (out["version"], out["added"], out["records"], out["skipped_existing"]) == \
            (2, 200, 600, 50)
        assert out["skipped_keys"] == local_append["result"]["skipped_keys"]


def test_append_key_hashes_that_collide_are_told_apart_by_their_keys(tmp_path, monkeypatch):
    """Two keys with one hash: only the key the dataset holds is passed over."""
    real = append_pieces.key_hashes

    def colliding(keys):
        return np.zeros(len(real(keys)), np.uint64)  # every key: one hash

    monkeypatch.setattr(append_pieces, "key_hashes", colliding)
    synthesize(tmp_path / "pool", kind="tiny", n=12, classes=2, seed=1)
    pool = sorted((tmp_path / "pool").rglob("*.png"))
    for name, span in (("a", range(6)), ("b", range(4, 12))):
        for i in span:
            (tmp_path / name / "x").mkdir(parents=True, exist_ok=True)
            shutil.copy(pool[i], tmp_path / name / "x" / f"{i:02d}.png")
    dataset = fastdata.pack(tmp_path / "a", tmp_path / "d.lmdb", progress=False).output
    with pytest.raises(FastDataError, match=r"2 key\(s\) .*\(x/04.png, x/05.png\)"):
        fastdata.append(tmp_path / "b", dataset, progress=False, workers=1)
    result = fastdata.append(tmp_path / "b", dataset, progress=False, workers=1,
                             skip_existing=True)
    assert (result.skipped_existing, result.skipped_keys, result.added) == \
        (2, ["x/04.png", "x/05.png"], 6)
    with fastdata.open_reader(dataset) as reader:
        assert list(reader.keys) == [f"x/{i:02d}.png" for i in range(12)]


# -- a killed worker ------------------------------------------------------------------

_SUBSET_PIECE, _KEY_PIECE = subset_pieces.subset_piece, append_pieces.key_piece


def slow_subset_piece(*args):
    """A subset's piece that takes 0.1 s more (the forked workers run it by name)."""
    import time

    time.sleep(0.1)
    return _SUBSET_PIECE(*args)


def slow_key_piece(*args):
    """An append's piece that takes 0.05 s more."""
    import time

    time.sleep(0.05)
    return _KEY_PIECE(*args)


def test_a_killed_local_worker_leaves_the_subset_the_same(data, local_views, monkeypatch):
    monkeypatch.setattr(subset_pieces, "subset_piece", slow_subset_piece)
    with killing_a_local_worker() as when:
        result, view = _view(data, "exclude-fraction", "killed", workers=2)
    assert when.fired
    assert result == local_views["exclude-fraction"][0]
    assert _without_stamp(view) == _without_stamp(local_views["exclude-fraction"][1])


def test_a_killed_local_worker_leaves_the_append_the_same(data, local_append, monkeypatch):
    monkeypatch.setattr(dedup_pieces, "MIN_PIECE_RECORDS", 16)  # 25 pieces of the 400 keys
    monkeypatch.setattr(append_pieces, "key_piece", slow_key_piece)
    with killing_a_local_worker() as when:
        found, _ = _append(data, "killed", workers=2)
    assert when.fired
    assert found == local_append

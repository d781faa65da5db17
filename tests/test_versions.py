"""Dataset versions and ``fastdata.append`` / ``fastdata pack --append``: a
dataset grown by appends reads like one pack of all its sources, in every
format, locally and at an s3:// URL (moto, real sockets); readers of an old
version keep reading it while another process appends; ``fastdata info
--history``, resume states tied to a version, ``fastdata gc``, damaged parts,
views made before an append, and appends stored unlike the first pack.

Every image is generated at test time: one pool of tiny PNGs
(``fastdata.demo.synthesize``), copied under the keys each test needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import no_hang

import fastdata
from fastdata.cli import main
from fastdata.demo import synthesize
from fastdata.errors import FastDataError, ManifestError
from fastdata.dataset.resolve import open_reader
from fastdata.packers.preprocess import Preprocess
from fastdata.dataset import history
from fastdata.ops.gc import gc

#: format -> (output name pattern, shard size: several shards for the sharded ones)
FORMATS = {
    "lmdb": ("d.lmdb", None),
    "hdf5": ("d.h5", None),
    "tfrecord": ("d-%05d.tfrecord", 4),
    "tar": ("d-%06d.tar", 4),
}
SHARDED = ("tfrecord", "tar")

#: The sources, as class -> [(file name, pool image)]: B shares "dog" with A and
#: brings "ant", which sorts before A's classes (a pack of A and B together
#: labels the classes ant, cat, dog; appending B to A gives cat, dog, ant).
A = {"cat": [(f"a{i:02d}.png", i) for i in range(6)],
     "dog": [(f"a{i:02d}.png", i) for i in range(6, 12)]}
B = {"dog": [(f"b{i:02d}.png", i) for i in range(12, 16)],
     "ant": [(f"b{i:02d}.png", i) for i in range(16, 20)]}
C = {"eel": [(f"c{i:02d}.png", i) for i in range(20, 24)],
     "cat": [(f"c{i:02d}.png", i) for i in range(24, 26)]}
POOL = 32


def _union(*specs: dict) -> dict:
    out: dict = {}
    for spec in specs:
        for cls, files in spec.items():
            out.setdefault(cls, []).extend(files)
    return out


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """The pool of distinct tiny PNGs, and a maker of source folders from it."""
    tmp = tmp_path_factory.mktemp("versions_pool")
    synthesize(tmp / "pool", kind="tiny", n=POOL, classes=1, seed=7, progress=False)
    files = sorted((tmp / "pool").rglob("*.png"))
    assert len(files) == POOL
    assert len({f.read_bytes() for f in files}) == POOL  # every image differs
    return files


def make_tree(pool, root, spec: dict):
    """An ImageFolder at ``root``: ``spec`` class -> [(name, pool index)]."""
    for cls, files in spec.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for name, i in files:
            shutil.copyfile(pool[i], root / cls / name)
    return root


@pytest.fixture(scope="module")
def sources(pool, tmp_path_factory):
    """Folders A, B, C, A∪B and A∪B∪C of the pool's images."""
    tmp = tmp_path_factory.mktemp("versions_src")
    return {"A": make_tree(pool, tmp / "A", A), "B": make_tree(pool, tmp / "B", B),
            "C": make_tree(pool, tmp / "C", C), "AB": make_tree(pool, tmp / "AB", _union(A, B)),
            "ABC": make_tree(pool, tmp / "ABC", _union(A, B, C))}


def options(fmt: str, **more) -> fastdata.PackOptions:
    return fastdata.PackOptions(shard_size=FORMATS[fmt][1], workers=1, **more)


def pack(source, folder, fmt: str, **more) -> str:
    """Pack ``source`` into ``folder`` in format ``fmt``; the dataset's path."""
    return fastdata.pack(source, folder / FORMATS[fmt][0], options=options(fmt, **more),
                         progress=False).output


def append(source, dataset, fmt: str, **more):
    return fastdata.append(source, dataset, options=options(fmt), progress=False, **more)


def records(path, version: int | None = None) -> dict:
    """key -> (payload bytes, class name, stored CRC) of every record."""
    with open_reader(path, version=version) as r:
        n = len(r)
        at = list(range(n))
        keys = list(r.keys)
        data = r.read_many(at)
        labels = np.asarray(r.labels).tolist()
        crcs = r.crcs_of(at)
        assert crcs is not None and len(keys) == len(data) == len(labels) == n
        out = {k: (bytes(d), r.classes[y], int(c)) for k, d, y, c in zip(keys, data, labels, crcs)}
        assert len(out) == n, "a key twice"
        return out


def labels_by_key(path, version: int | None = None) -> dict:
    with open_reader(path, version=version) as r:
        return dict(zip(list(r.keys), np.asarray(r.labels).tolist()))


def verify_cli(path) -> str:
    done = CliRunner().invoke(main, ["verify", str(path), "--no-progress"])
    assert done.exit_code == 0, done.output
    return done.output


def stream_payloads(path, **more) -> list[bytes]:
    ds = fastdata.open_dataset(path, streaming=True, decode=fastdata.Decode(output="bytes"),
                               order=fastdata.Order(shuffle=True, seed=1, **more))
    with no_hang(120):
        return [bytes(x) for x, _ in ds]


# -- 1. an append reads like one pack of the union ----------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_append_equals_one_pack_of_the_union(sources, tmp_path, fmt):
    ds = pack(sources["A"], tmp_path / "ds", fmt)
    before = labels_by_key(ds)
    with open_reader(ds) as r:
        classes_before = list(r.classes)
    assert classes_before == ["cat", "dog"]

    result = append(sources["B"], ds, fmt)
    assert (result.version, result.added, result.records) == (2, 8, 20)
    assert result.new_classes == ["ant"] and result.skipped_existing == 0

    union = pack(sources["AB"], tmp_path / "union", fmt)
    got, want = records(ds), records(union)
    assert len(got) == 20
    assert got == want
    with open_reader(union) as u:
        assert list(u.classes) == ["ant", "cat", "dog"]  # the union labels them otherwise

    with open_reader(ds) as r:
        assert r.record.kind == "version" and r.version == 2
        assert list(r.classes) == ["cat", "dog", "ant"]  # the new class at the end
        assert r.manifest.count == 20 and list(r.manifest.class_counts) == [6, 10, 4]
        if fmt in SHARDED:
            assert len(r.shard_paths) == 5  # 3 shards of A, 2 of B
    after = labels_by_key(ds)
    assert {k: after[k] for k in before} == before  # A's labels unchanged

    assert "20 records checked, 0 damaged" in verify_cli(ds)

    if fmt in SHARDED:
        streamed = stream_payloads(ds)
        assert sorted(streamed) == sorted(d for d, _, _ in want.values())
        assert len(set(streamed)) == 20


# -- 2. append at an s3:// URL --------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_append_at_an_s3_url(sources, tmp_path, s3_env, monkeypatch, fmt):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTDATA_CACHE_LIMIT", raising=False)
    local = pack(sources["A"], tmp_path / "ds", fmt)
    prefix = f"s3://fastdata-versions/{tmp_path.name}"
    s3_env.upload_dir(tmp_path / "ds", prefix)
    url = f"{prefix}/{os.path.basename(local)}"

    result = append(sources["B"], url, fmt)
    assert (result.version, result.added, result.records) == (2, 8, 20)
    assert result.part.startswith(prefix + "/")

    union = pack(sources["AB"], tmp_path / "union", fmt)
    assert records(url) == records(union)
    assert [(v.number, v.change, v.records) for v in history.versions(url)] == \
        [(1, "pack", 12), (2, "append", 20)]
    assert records(url, version=1) == records(local)
    with open_reader(url) as r:
        assert list(r.classes) == ["cat", "dog", "ant"]
    if fmt in SHARDED:
        assert sorted(stream_payloads(url)) == sorted(d for d, _, _ in records(union).values())


# -- 3. an old version's reader while another process appends ------------------------------

APPEND_SCRIPT = """
import json, sys
import fastdata
shard_size = json.loads(sys.argv[3])
fastdata.append(sys.argv[1], sys.argv[2],
                options=fastdata.PackOptions(shard_size=shard_size, workers=1), progress=False)
"""


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_old_reader_keeps_reading_while_another_process_appends(sources, tmp_path, fmt):
    ds = pack(sources["A"], tmp_path / "ds", fmt)
    append(sources["B"], ds, fmt)
    bytes_only = fastdata.Decode(output="bytes")
    old = fastdata.open_dataset(ds, decode=bytes_only)
    expected = [old[i] for i in range(len(old))]
    assert len(expected) == 20

    proc = subprocess.Popen([sys.executable, "-c", APPEND_SCRIPT, str(sources["C"]), ds,
                             json.dumps(FORMATS[fmt][1])],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        rounds = 0
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            assert len(old) == 20
            assert [old[i] for i in range(len(old))] == expected
            rounds += 1
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out.decode(errors="replace")
    assert rounds >= 1
    # After the append: the old reader still reads its version, whole.
    assert len(old) == 20
    assert [old[i] for i in range(len(old))] == expected

    fresh = fastdata.open_dataset(ds, decode=bytes_only)
    assert len(fresh) == 26
    assert history.head_number(ds) == 3
    first = fastdata.open_dataset(fastdata.DatasetRef(ds, version=1), decode=bytes_only)
    assert len(first) == 12
    assert records(ds, version=1) == records(pack(sources["A"], tmp_path / "a", fmt))
    assert records(ds, version=2) == records(pack(sources["AB"], tmp_path / "ab", fmt))
    assert records(ds) == records(pack(sources["ABC"], tmp_path / "abc", fmt))


# -- 4. keys the dataset holds ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_keys_already_present(pool, sources, tmp_path, fmt):
    ds = pack(sources["A"], tmp_path / "ds", fmt)
    # B, plus an image under a key of A's (other bytes than A's there).
    clash = make_tree(pool, tmp_path / "clash", _union(B, {"cat": [("a00.png", 30)]}))
    with pytest.raises(FastDataError, match="skip_existing") as refused:
        append(clash, ds, fmt)
    assert "cat/a00.png" in str(refused.value) and "--skip-existing" in str(refused.value)
    assert history.head_number(ds) is None and history.versions(ds) == []
    assert not os.path.exists(history.history_dir(ds))  # nothing written
    assert len(records(ds)) == 12

    result = append(clash, ds, fmt, skip_existing=True)
    assert result.skipped_existing == 1 and result.skipped_keys == ["cat/a00.png"]
    assert (result.version, result.added, result.records) == (2, 8, 20)
    got = records(ds)
    assert got == records(pack(sources["AB"], tmp_path / "union", fmt))
    assert got["cat/a00.png"][0] == pool[0].read_bytes()  # the dataset's record kept

    with pytest.raises(FastDataError, match="nothing to append"):
        append(sources["A"], ds, fmt, skip_existing=True)
    with pytest.raises(FastDataError, match="skip_existing"):
        append(sources["A"], ds, fmt)
    assert history.head_number(ds) == 2 and len(history.versions(ds)) == 2


def test_cli_append_refuses_present_keys_then_skips_them(pool, sources, tmp_path):
    ds = pack(sources["A"], tmp_path / "ds", "lmdb")
    clash = make_tree(pool, tmp_path / "clash", _union(B, {"dog": [("a07.png", 31)]}))
    runner = CliRunner()
    refused = runner.invoke(main, ["pack", str(clash), ds, "--append", "--no-progress"])
    assert refused.exit_code != 0
    assert "dog/a07.png" in refused.output and "--skip-existing" in refused.output
    assert history.head_number(ds) is None
    done = runner.invoke(main, ["pack", str(clash), ds, "--append", "--skip-existing",
                                "--no-progress", "--json"])
    assert done.exit_code == 0, done.output
    out = json.loads(done.output)
    assert (out["version"], out["added"], out["records"], out["skipped_existing"]) == \
        (2, 8, 20, 1)
    assert out["new_classes"] == ["ant"]
    assert records(ds) == records(pack(sources["AB"], tmp_path / "union", "lmdb"))


# -- 5. fastdata info --history / --version ------------------------------------------------


def test_info_history_and_version(sources, tmp_path):
    ds = pack(sources["A"], tmp_path / "ds", "tar")
    runner = CliRunner()
    never = runner.invoke(main, ["info", ds, "--history"])
    assert never.exit_code == 0 and "one version" in never.output
    append(sources["B"], ds, "tar")

    shown = runner.invoke(main, ["info", ds, "--history"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert "2 version(s)" in lines[0]
    assert re.search(r"^\s*v1\s.*\b12 records\b.*\bpack:", lines[1]), lines
    assert re.search(r"^\s*v2\s.*\b20 records\b.*\bappend: appended 8 records", lines[2]), lines
    assert "ant" in lines[2]

    old = runner.invoke(main, ["info", ds, "--version", "1"])
    assert old.exit_code == 0, old.output
    assert re.search(r"^\s*records\s+12$", old.output, re.MULTILINE), old.output
    now = runner.invoke(main, ["info", ds])
    assert re.search(r"^\s*records\s+20$", now.output, re.MULTILINE), now.output
    assert re.search(r"^\s*version\s+2 \(append", now.output, re.MULTILINE), now.output
    missing = runner.invoke(main, ["info", ds, "--version", "3"])
    assert missing.exit_code != 0 and "no version 3" in missing.output

    listed = runner.invoke(main, ["info", ds, "--json", "--history"])
    assert listed.exit_code == 0, listed.output
    found = json.loads(listed.output)
    assert [(v["number"], v["change"], v["records"], v["parent"]) for v in found] == \
        [(1, "pack", 12, None), (2, "append", 20, 1)]
    assert found[1]["classes"] == ["cat", "dog", "ant"]
    assert found[1]["parent_sha256"] == found[0]["sha256"]
    assert [p["records"] for p in found[1]["parts"]] == [12, 8]


# -- 6. resume states are tied to a version ------------------------------------------------


def _stream(ds, version=None):
    return fastdata.open_dataset(fastdata.DatasetRef(ds, version=version), streaming=True,
                                 decode=fastdata.Decode(output="bytes"),
                                 order=fastdata.Order(shuffle=True, seed=1, batch_size=4))


def test_resume_point_is_refused_on_another_version(sources, tmp_path):
    ds = pack(sources["A"], tmp_path / "ds", "tar")
    append(sources["B"], ds, "tar")
    full = [bytes(x) for x, _ in _stream(ds)]
    assert len(full) == 20
    point = json.loads(json.dumps(_stream(ds).resume_point(batches=2)))

    on_v1 = _stream(ds, version=1)
    with pytest.raises(ValueError, match="version 2") as refused:
        on_v1.load_state_dict(point)
    assert "version 1" in str(refused.value)

    again = _stream(ds, version=2)
    again.load_state_dict(point)
    assert [bytes(x) for x, _ in again] == full[8:]
    current = _stream(ds)
    current.load_state_dict(point)
    assert [bytes(x) for x, _ in current] == full[8:]


def test_map_style_resume_is_refused_on_another_version(sources, tmp_path):
    ds = pack(sources["A"], tmp_path / "ds", "lmdb")
    append(sources["B"], ds, "lmdb")
    order = fastdata.Order(shuffle=True, seed=1, batch_size=4)
    sampler = fastdata.EpochBatches(fastdata.open_dataset(ds), order=order)
    full = list(sampler)
    sampler = fastdata.EpochBatches(fastdata.open_dataset(ds), order=order)
    walk = iter(sampler)
    next(walk), next(walk)
    state = json.loads(json.dumps(sampler.state_dict()))
    assert state["consumed"] == 8

    other = fastdata.EpochBatches(fastdata.open_dataset(fastdata.DatasetRef(ds, version=1)),
                                  order=order)
    with pytest.raises(ValueError, match="version 2"):
        other.load_state_dict(state)
    same = fastdata.EpochBatches(fastdata.open_dataset(fastdata.DatasetRef(ds, version=2)),
                                 order=order)
    same.load_state_dict(state)
    assert list(same) == full[2:]


def test_resume_point_from_before_the_first_append_resumes_on_version_1(sources, tmp_path):
    ds = pack(sources["A"], tmp_path / "ds", "tar")
    full = [bytes(x) for x, _ in _stream(ds)]
    point = _stream(ds).resume_point(batches=1)
    append(sources["B"], ds, "tar")
    with pytest.raises(ValueError, match="version 1"):
        _stream(ds).load_state_dict(point)  # the current version is 2: refused
    first = _stream(ds, version=1)
    first.load_state_dict(point)
    assert [bytes(x) for x, _ in first] == full[4:]


# -- 7. fastdata gc ------------------------------------------------------------------------


def test_gc_removes_old_versions_never_used_parts(sources, tmp_path):
    ds = pack(sources["A"], tmp_path / "ds", "tar")
    append(sources["B"], ds, "tar")
    append(sources["C"], ds, "tar")
    want = records(pack(sources["ABC"], tmp_path / "union", "tar"))
    folder = tmp_path / "ds"
    files_before = sorted(p for p in folder.rglob("*") if p.is_file())

    planned = gc(ds, keep=1, dry_run=True)
    assert planned.dry_run and planned.kept == [3]
    assert planned.removed_versions == [1, 2]
    assert planned.removed_files == []  # version 3 uses every part
    assert sorted(p for p in folder.rglob("*") if p.is_file()) == files_before
    assert records(ds, version=1) and records(ds, version=2)

    safe = CliRunner().invoke(main, ["gc", ds, "--dry-run", "--json"])
    assert safe.exit_code == 0, safe.output
    assert json.loads(safe.output)["removed_versions"] == []  # none without --keep
    cli = CliRunner().invoke(main, ["gc", ds, "--keep", "1", "--dry-run", "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.output)["removed_versions"] == [1, 2]
    assert gc(ds).removed_versions == [] and len(history.versions(ds)) == 3

    done = gc(ds, keep=1)
    assert done.removed_versions == [1, 2] and not done.dry_run
    for n in (1, 2):  # a tombstone each: the numbers stay taken
        assert json.loads(open(history.record_path(ds, n)).read())["removed"]
    assert [v.number for v in history.versions(ds)] == [3]
    assert records(ds) == want
    assert "26 records checked, 0 damaged" in verify_cli(ds)
    with pytest.raises(FastDataError):
        records(ds, version=1)


def test_a_refused_append_leaves_no_part_and_gc_removes_orphans(sources, tmp_path):
    raw = Preprocess(resize=(8, 8), encoding="raw")
    ds = pack(sources["A"], tmp_path / "ds", "tar", preprocess=raw)
    fastdata.append(sources["B"], ds, options=options("tar", preprocess=raw), progress=False)
    parts = tmp_path / "ds" / "d.tar.versions" / "parts"
    kept = sorted(p.name for p in parts.iterdir())
    assert len(kept) == 1 and re.fullmatch(r"[0-9a-f]{32}", kept[0])  # named by an id
    other = Preprocess(resize=(6, 6), encoding="raw")
    with pytest.raises(FastDataError, match="packed with resize"):
        fastdata.append(sources["C"], ds, options=options("tar", preprocess=other),
                        progress=False)  # refused before anything is packed
    assert history.head_number(ds) == 2
    assert sorted(p.name for p in parts.iterdir()) == kept

    orphan = parts / ("f" * 32)  # what no version names (a part an append left)
    orphan.mkdir()
    (orphan / "part-000000.tar").write_bytes(b"x" * 10)
    young = gc(ds, keep=2, dry_run=True)  # younger than the grace period: kept
    assert young.kept == [1, 2] and young.removed_files == [] and young.young == [str(orphan)]
    old = time.time() - 2 * 24 * 3600
    os.utime(orphan / "part-000000.tar", (old, old))
    planned = gc(ds, keep=2, dry_run=True)
    assert planned.kept == [1, 2] and planned.removed_versions == []
    assert planned.removed_files == [str(orphan)] and orphan.exists()
    gc(ds, keep=2)
    assert not orphan.exists()
    assert len(records(ds)) == 20 and len(records(ds, version=1)) == 12

    again = fastdata.append(sources["C"], ds, options=options("tar"), progress=False)
    assert again.version == 3 and again.records == 26  # the dataset's own preprocessing
    with open_reader(ds) as r:
        assert r.parts[-1].manifest.encoding["shape"] == [8, 8, 3]
    assert "26 records checked, 0 damaged" in verify_cli(ds)


def test_gc_keeps_the_version_a_view_names(sources, tmp_path):
    ds = pack(sources["A"], tmp_path / "ds", "lmdb")
    append(sources["B"], ds, "lmdb")
    view = tmp_path / "ds" / "v.fastdata.json"
    fastdata.subset(ds, view, fraction=0.5, seed=3, progress=False)
    seen = records(view)
    assert len(seen) == 10
    append(sources["C"], ds, "lmdb")

    done = gc(ds, keep=1)
    assert done.kept == [2, 3] and done.removed_versions == [1]
    assert os.path.exists(history.record_path(ds, 2))
    assert records(view) == seen
    assert len(records(ds, version=2)) == 20
    assert len(records(ds)) == 26
    assert "26 records checked, 0 damaged" in verify_cli(ds)


# -- 8. a part that changed ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_a_repacked_base_is_refused_naming_the_part(sources, tmp_path, fmt):
    ds = pack(sources["A"], tmp_path / "ds", fmt)
    append(sources["B"], ds, fmt)
    pack(sources["C"], tmp_path / "ds", fmt, overwrite=True)  # other images, in place
    name = os.path.basename(ds)
    with pytest.raises(ManifestError, match=rf"part {re.escape(name)} ") as refused:
        open_reader(ds)
    assert "version 2" in str(refused.value)
    with pytest.raises(ManifestError, match=re.escape(name)):
        open_reader(ds, version=1)
    with pytest.raises(ManifestError):
        fastdata.open_dataset(ds)


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_a_replaced_appended_part_is_refused_naming_it(sources, tmp_path, fmt):
    ds = pack(sources["A"], tmp_path / "ds", fmt)
    result = append(sources["B"], ds, fmt)
    part = result.part.removesuffix(".fastdata.json")
    if fmt == "tar":  # the part's shards: parts/ID/part-NNNNNN.tar
        part = part.removesuffix(".tar") + "-%06d.tar"
    repacked = fastdata.pack(sources["C"], part, options=options(fmt, overwrite=True),
                             progress=False)
    assert repacked.output == result.part
    assert records(ds, version=1)  # version 1 does not use it
    part_id = os.path.basename(os.path.dirname(result.part))
    with pytest.raises(ManifestError, match=f"parts/{part_id}/"):
        open_reader(ds)


# -- 9. a view made before the append -------------------------------------------------------


@pytest.mark.parametrize("fmt", ["hdf5", "tfrecord"])
def test_a_view_from_before_an_append_keeps_its_records(sources, tmp_path, fmt):
    ds = pack(sources["A"], tmp_path / "ds", fmt)
    view = tmp_path / "ds" / "half.fastdata.json"
    fastdata.subset(ds, view, fraction=0.5, seed=1, progress=False)
    seen = records(view)
    assert len(seen) == 6
    append(sources["B"], ds, fmt)
    assert len(records(ds)) == 20
    assert records(view) == seen
    with open_reader(view) as r:
        assert list(r.classes) == ["cat", "dog"]
    gc(ds, keep=1)  # the view names the pack itself, never removed
    assert records(view) == seen


# -- 10. an append stored unlike the first pack ----------------------------------------------


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_append_takes_the_datasets_preprocessing_and_refuses_another(sources, tmp_path, fmt):
    raw = Preprocess(resize=(8, 8), encoding="raw")
    ds = pack(sources["A"], tmp_path / "ds", fmt, preprocess=raw)
    other = Preprocess(resize=(6, 6), encoding="raw")  # raw, another shape
    with pytest.raises(FastDataError, match=r"packed with resize \[8, 8\]") as refused:
        fastdata.append(sources["B"], ds, options=options(fmt, preprocess=other),
                        progress=False)
    assert "give none, and it is used" in str(refused.value)
    assert history.head_number(ds) is None and history.versions(ds) == []
    assert not os.path.exists(history.history_dir(ds))  # refused before packing
    with open_reader(ds) as r:
        assert len(r) == 12 and r.identity is None
    result = append(sources["B"], ds, fmt)  # no preprocessing given: the dataset's
    assert result.version == 2 and result.records == 20
    with open_reader(ds) as r:
        assert {p.manifest.encoding["storage"] for p in r.parts} == {"raw"}
        assert r.parts[1].manifest.encoding["shape"] == [8, 8, 3]
        assert all(len(d) == 8 * 8 * 3 for d in r.read_many(list(range(20))))


def test_damaged_bytes_in_an_appended_part_fail_verify(sources, tmp_path):
    ds = pack(sources["A"], tmp_path / "ds", "tar")
    append(sources["B"], ds, "tar")
    [shard] = (tmp_path / "ds" / "d.tar.versions" / "parts").glob("*/part-000000.tar")
    with open_reader(ds) as r:
        data = r.read_many([12])[0]
    raw = bytearray(shard.read_bytes())
    at = raw.find(bytes(data))
    assert at > 0
    raw[at + len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    done = CliRunner().invoke(main, ["verify", ds, "--no-progress"])
    assert done.exit_code == 1, done.output
    assert "1 damaged" in done.output and "part-000000.tar" in done.output
    with open_reader(ds) as r:
        assert len(r.read_many(list(range(12)))) == 12  # the first part is whole
        with pytest.raises(FastDataError):
            r.read_many([12])


# -- the dataset's names ----------------------------------------------------------------------


def test_append_by_the_output_pattern_reaches_the_dataset(sources, tmp_path):
    ds = pack(sources["A"], tmp_path / "ds", "tar")
    pattern = str(tmp_path / "ds" / FORMATS["tar"][0])
    assert len(records(pattern)) == 12  # the pattern opens the dataset
    result = append(sources["B"], pattern, "tar")
    assert result.records == 20 and len(records(pattern)) == 20
    assert len(records(ds)) == 20

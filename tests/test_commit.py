"""Changes many writers can trust (``fastdata.dataset.commit``): appends and
joins from real processes at once, locally and at moto's S3, each landing
exactly once or failing with a message, with ``fastdata gc`` running all
along; a process killed at every step boundary of a commit, in every
format; gc's rules (grace period, known views, links never followed); and
the version pointer at servers that hide missing objects (403) or answer
every path with a page (200).

Every image is generated at test time: one pool of distinct tiny PNGs
copied under the keys each test needs; what a dataset should hold is
worked out from a single pack of the same sources.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter

import numpy as np
import optional
import pytest
from click.testing import CliRunner
from conftest import no_hang

import fastdata
from fastdata.cli import main
from fastdata.dataset import history
from fastdata.dataset.commit import CRASH_AT, Conflict
from fastdata.dataset.resolve import open_reader
from fastdata.demo import synthesize
from fastdata.errors import FastDataError, ManifestError
from fastdata.ops.gc import gc

#: format -> (output name, shard size)
FORMATS = {"lmdb": ("d.lmdb", None), "hdf5": ("d.h5", None),
           "tfrecord": ("d-%05d.tfrecord", 4), "tar": ("d-%06d.tar", 4)}
WRITERS = 8
POOL = 12 + 2 * WRITERS + 8


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("commit_pool")
    synthesize(tmp / "pool", kind="tiny", n=POOL, classes=1, seed=11, progress=False)
    files = sorted((tmp / "pool").rglob("*.png"))
    assert len({f.read_bytes() for f in files}) == POOL
    return files


def tree(pool, root, spec: dict):
    """An ImageFolder: class -> [(file name, pool index)]."""
    for cls, files in spec.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for name, i in files:
            shutil.copyfile(pool[i], root / cls / name)
    return root


BASE = {"cat": [(f"a{i:02d}.png", i) for i in range(6)],
        "dog": [(f"a{i:02d}.png", i) for i in range(6, 12)]}


def writer_spec(k: int) -> dict:
    """Writer k's images: one of a shared class, one of a class of its own."""
    return {"dog": [(f"w{k}-0.png", 12 + 2 * k)], f"new{k}": [(f"w{k}-1.png", 13 + 2 * k)]}


def options(fmt: str, **more) -> fastdata.PackOptions:
    return fastdata.PackOptions(shard_size=FORMATS[fmt][1], workers=1, **more)


def pack(source, folder, fmt: str) -> str:
    return fastdata.pack(source, folder / FORMATS[fmt][0], options=options(fmt),
                         progress=False).output


def records(path, version: int | None = None) -> dict:
    """key -> (payload, class name, CRC) of every record."""
    with open_reader(path, version=version) as r:
        at = list(range(len(r)))
        out = {k: (bytes(d), r.classes[y], int(c)) for k, d, y, c in zip(
            list(r.keys), r.read_many(at), np.asarray(r.labels).tolist(), r.crcs_of(at))}
        assert len(out) == len(r)
        return out


def union(pool, tmp, fmt: str, specs: list[dict]) -> dict:
    """The records one pack of all ``specs`` together holds."""
    merged: dict = {}
    for spec in specs:
        for cls, files in spec.items():
            merged.setdefault(cls, []).extend(files)
    folder = tmp / f"union-{len(specs)}-{time.monotonic_ns()}"
    return records(pack(tree(pool, folder / "src", merged), folder, fmt))


def verify_ok(path) -> None:
    done = CliRunner().invoke(main, ["verify", str(path), "--no-progress"])
    assert done.exit_code == 0, done.output


WRITE = """
import json, sys, fastdata
what, source, dataset, out, shard = sys.argv[1:]
shard = int(shard) or None
try:
    if what == "append":
        r = fastdata.append(source, dataset, progress=False,
                            options=fastdata.PackOptions(shard_size=shard, workers=1))
        done = {"ok": True, "version": r.version, "rebased": r.rebased}
    else:
        r = fastdata.join(dataset, source, key="path")
        done = {"ok": True, "version": r.version}
except fastdata.FastDataError as exc:
    done = {"ok": False, "type": type(exc).__name__, "error": str(exc)}
with open(out, "w") as f:
    json.dump(done, f)
"""


def start(what: str, source, dataset, out, fmt: str = "tar", env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITE, what, str(source), str(dataset),
                             str(out), str(FORMATS[fmt][1] or 0)],
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def finish(procs, outs, timeout: float = 240) -> list[dict]:
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("a writer did not finish in time")
    results = []
    for proc, out in zip(procs, outs):
        log = proc.stdout.read().decode(errors="replace")
        assert proc.returncode == 0, log[-3000:]
        results.append(json.loads(out.read_text()))
    return results


class GCLoop:
    """``fastdata gc --keep 1`` over and over in a thread, as a cron job would."""

    def __init__(self, dataset) -> None:
        self.dataset, self.runs, self.errors = dataset, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                gc(self.dataset, keep=1)
                self.runs += 1
            except Exception:  # reported by the test, never lost
                self.errors.append(traceback.format_exc(limit=-4))
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


# -- 1. writers at once ----------------------------------------------------------------


def _appends_at_once(pool, tmp_path, dataset, fmt: str, *, with_gc: bool) -> None:
    sources = [tree(pool, tmp_path / f"w{k}", writer_spec(k)) for k in range(WRITERS)]
    before = records(dataset)
    reader = open_reader(dataset)  # opened before every change: it keeps its version
    outs = [tmp_path / f"out{k}.json" for k in range(WRITERS)]
    loop = GCLoop(dataset) if with_gc else None
    if loop:
        loop.__enter__()
    try:
        procs = [start("append", s, dataset, o, fmt) for s, o in zip(sources, outs)]
        results = finish(procs, outs)
    finally:
        if loop:
            loop.__exit__()
    assert all(r["ok"] for r in results), results  # none collide: all land, rebased
    assert sorted(r["version"] for r in results) == list(range(2, 2 + WRITERS))
    assert sum(r["rebased"] > 0 for r in results) >= 1  # they did race
    if loop:
        assert loop.errors == [] and loop.runs >= 1
    want = union(pool, tmp_path, fmt, [BASE] + [writer_spec(k) for k in range(WRITERS)])
    assert records(dataset) == want
    with open_reader(dataset) as r:
        assert r.version == 1 + WRITERS and len(r.parts) == 1 + WRITERS
        assert r.classes[:2] == ["cat", "dog"]  # earlier labels never move
        assert sorted(r.classes[2:]) == [f"new{k}" for k in range(WRITERS)]
    verify_ok(dataset)
    at = list(range(len(reader)))
    assert len(reader) == 12 and dict(zip(list(reader.keys), reader.read_many(at))) == \
        {k: v[0] for k, v in before.items()}
    reader.close()


def test_eight_appends_at_once_each_land_exactly_once(pool, tmp_path):
    base = tree(pool, tmp_path / "base", BASE)
    dataset = pack(base, tmp_path / "ds", "tar")
    with no_hang(300):
        _appends_at_once(pool, tmp_path, dataset, "tar", with_gc=False)


def test_eight_appends_at_once_with_gc_running_throughout(pool, tmp_path):
    base = tree(pool, tmp_path / "base", BASE)
    dataset = pack(base, tmp_path / "ds", "lmdb")
    with no_hang(300):
        _appends_at_once(pool, tmp_path, dataset, "lmdb", with_gc=True)
    gc(dataset, keep=1)  # the loop's last run may have ended before the last commit
    assert [v.number for v in history.versions(dataset)] == [1 + WRITERS]
    assert len(records(dataset)) == 12 + 2 * WRITERS


def test_eight_appends_at_once_at_moto_s3_with_gc(pool, tmp_path, s3_env, monkeypatch):
    optional.require("obstore")
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    base = tree(pool, tmp_path / "base", BASE)
    local = pack(base, tmp_path / "ds", "tar")
    prefix = f"s3://fastdata-commit/{tmp_path.name}"
    s3_env.upload_dir(tmp_path / "ds", prefix)
    url = f"{prefix}/{os.path.basename(local)}"
    with no_hang(400):
        _appends_at_once(pool, tmp_path, url, "tar", with_gc=True)


def test_appends_whose_keys_collide_one_lands_the_other_says_what_to_do(pool, tmp_path):
    base = tree(pool, tmp_path / "base", BASE)
    dataset = pack(base, tmp_path / "ds", "tar")
    same = writer_spec(0)
    sources = [tree(pool, tmp_path / f"same{k}", same) for k in range(2)]
    outs = [tmp_path / f"out{k}.json" for k in range(2)]
    results = finish([start("append", s, dataset, o) for s, o in zip(sources, outs)], outs)
    landed = [r for r in results if r["ok"]]
    refused = [r for r in results if not r["ok"]]
    assert len(landed) >= 1
    for r in refused:  # raced: the second was refused, naming the keys and the cure
        assert r["type"] in ("Conflict", "FastDataError")
        assert "w0-0.png" in r["error"] and "skip-existing" in r["error"]
    assert len(records(dataset)) == 12 + 2  # the images once
    parts = tmp_path / "ds" / "d.tar.versions" / "parts"
    assert len(list(parts.iterdir())) == 1  # the refused writer's part is gone
    verify_ok(dataset)


def test_two_joins_of_different_columns_at_once_both_land(pool, tmp_path):
    base = tree(pool, tmp_path / "base", BASE)
    dataset = pack(base, tmp_path / "ds", "lmdb")
    keys = list(records(dataset))
    tables = []
    for name in ("caption", "score"):
        table = tmp_path / f"{name}.jsonl"
        table.write_text("".join(json.dumps({"path": k, name: f"{name}-{k}"}) + "\n"
                                 for k in keys))
        tables.append(table)
    outs = [tmp_path / f"join{k}.json" for k in range(2)]
    results = finish([start("join", t, dataset, o, "lmdb") for t, o in zip(tables, outs)],
                     outs)
    assert all(r["ok"] for r in results), results
    assert sorted(r["version"] for r in results) == [2, 3]
    with open_reader(dataset) as r:
        metas = r.metadata_many(list(range(len(r))))
    assert all(m == {"caption": f"caption-{k}", "score": f"score-{k}"}
               for k, m in zip(keys, metas))
    # The same column again, from a version that does not have it yet: refused.
    with pytest.raises(Conflict, match="'caption'.*joined meanwhile"):
        fastdata.join(history.record_path(dataset, 1), tables[0], key="path")
    verify_ok(dataset)


def test_a_join_to_an_older_version_lands_on_the_current_one(pool, tmp_path):
    base = tree(pool, tmp_path / "base", BASE)
    dataset = pack(base, tmp_path / "ds", "tar")
    keys = list(records(dataset))
    first = tmp_path / "first.jsonl"
    first.write_text("".join(json.dumps({"path": k, "a": 1}) + "\n" for k in keys))
    fastdata.join(dataset, first, key="path")
    fastdata.append(tree(pool, tmp_path / "w0", writer_spec(0)), dataset,
                    options=options("tar"), progress=False)
    second = tmp_path / "second.jsonl"
    second.write_text("".join(json.dumps({"path": k, "b": 2}) + "\n" for k in keys))
    done = fastdata.join(history.record_path(dataset, 1), second, key="path")
    assert done.version == 4
    with open_reader(dataset) as r:
        assert len(r) == 14 and r.metadata(0) == {"a": 1, "b": 2}
        assert r.metadata(13) == {}  # appended after both joins' tables: no row
    verify_ok(dataset)


# -- 2. a kill at every step of a commit -------------------------------------------------


STEPS = ["after-part", "after-first-record", "before-record", "after-record", "after-head"]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_kill_at_every_step_leaves_a_readable_dataset_and_the_next_change_lands(
        pool, tmp_path, fmt):
    extra = {"dog": [("x0.png", 12 + 2 * WRITERS)], "eel": [("x1.png", 13 + 2 * WRITERS)]}
    later = tree(pool, tmp_path / "later", extra)
    for step in STEPS:
        folder = tmp_path / step
        dataset = pack(tree(pool, folder / "base", BASE), folder, fmt)
        out = folder / "out.json"
        proc = start("append", tree(pool, folder / "w0", writer_spec(0)), dataset, out, fmt,
                     env={CRASH_AT: step})
        assert proc.wait(120) == 77, proc.stdout.read().decode()[-2000:]
        landed = step in ("after-record", "after-head")
        with open_reader(dataset) as r:
            assert len(r) == (14 if landed else 12), step
        verify_ok(dataset)
        done = fastdata.append(later, dataset, options=options(fmt), progress=False)
        specs = [BASE] + ([writer_spec(0)] if landed else []) + [extra]
        assert done.version == (3 if landed else 2), step
        assert records(dataset) == union(pool, folder, fmt, specs), step
        verify_ok(dataset)
        # What the killed writer left unrecorded goes with gc, once old enough.
        swept = gc(dataset, grace=0)
        assert len(swept.removed_files) == int(not landed), (step, swept)
        assert records(dataset) == union(pool, folder, fmt, specs), step


def test_a_kill_while_joining_leaves_the_dataset_as_it_was(pool, tmp_path):
    dataset = pack(tree(pool, tmp_path / "base", BASE), tmp_path / "ds", "hdf5")
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps({"path": k, "c": k}) + "\n"
                             for k in records(dataset)))
    for step in ("after-columns", "before-record", "after-record"):
        out = tmp_path / f"{step}.json"
        proc = start("join", table, dataset, out, "hdf5", env={CRASH_AT: step})
        assert proc.wait(120) == 77
        verify_ok(dataset)
    with open_reader(dataset) as r:
        assert r.version == 2 and r.metadata(0) == {"c": r.keys[0]}
    assert fastdata.join(dataset, table, key="path").version == 3  # "c" again: it lands
    assert len(gc(dataset, grace=0).removed_files) == 2  # the two sets never recorded


# -- 3. gc's rules --------------------------------------------------------------------


def test_gc_never_removes_a_part_younger_than_its_grace(pool, tmp_path):
    dataset = pack(tree(pool, tmp_path / "base", BASE), tmp_path / "ds", "tar")
    env = {CRASH_AT: "before-record"}  # an append caught between its part and its record
    proc = start("append", tree(pool, tmp_path / "w0", writer_spec(0)), dataset,
                 tmp_path / "o.json", env=env)
    assert proc.wait(120) == 77
    [part] = (tmp_path / "ds" / "d.tar.versions" / "parts").iterdir()
    kept = gc(dataset)  # the default grace: a day
    assert kept.removed_files == [] and kept.young == [str(part)] and part.exists()
    done = CliRunner().invoke(main, ["gc", dataset, "--dry-run"])
    assert done.exit_code == 0 and "younger than 24h" in done.output
    assert gc(dataset, grace=0).removed_files == [str(part)] and not part.exists()


def test_a_part_removed_before_its_commit_fails_the_append_clearly(pool, tmp_path):
    from fastdata.ops.append import AddPart

    dataset = pack(tree(pool, tmp_path / "base", BASE), tmp_path / "ds", "lmdb")
    gone = tmp_path / "ds" / "d.lmdb.versions" / "parts" / ("e" * 32) / "part.lmdb"
    change = AddPart(None, str(gone), [], [], [], None)
    with pytest.raises(FastDataError, match="removed before it was recorded"):
        change.check_files()


def test_gc_never_follows_a_link(pool, tmp_path):
    dataset = pack(tree(pool, tmp_path / "base", BASE), tmp_path / "ds", "lmdb")
    fastdata.append(tree(pool, tmp_path / "w0", writer_spec(0)), dataset,
                    options=options("lmdb"), progress=False)
    outside = tmp_path / "photos"
    (outside / ("a" * 32)).mkdir(parents=True)
    for name in ("000001.jpg", "000002-000000.tar", f"{'a' * 32}/part.lmdb"):
        (outside / name).write_bytes(b"precious")
    old = time.time() - 7 * 86400
    for p in outside.rglob("*"):
        os.utime(p, (old, old))
    parts = tmp_path / "ds" / "d.lmdb.versions" / "parts"
    (parts / ("b" * 32)).symlink_to(outside / ("a" * 32))  # a linked part folder
    (tmp_path / "ds" / "d.lmdb.versions" / "columns").symlink_to(outside)
    swept = gc(dataset, keep=1, grace=0)
    assert swept.removed_files == []
    assert sorted(swept.links) == ["columns", f"parts/{'b' * 32}"]
    assert sorted(p.name for p in outside.rglob("*")) == \
        sorted(["000001.jpg", "000002-000000.tar", "a" * 32, "part.lmdb"])
    # The whole history folder as a link: refused, nothing listed through it.
    moved = tmp_path / "elsewhere.versions"
    shutil.move(tmp_path / "ds" / "d.lmdb.versions", moved)
    (tmp_path / "ds" / "d.lmdb.versions").symlink_to(moved)
    with pytest.raises(FastDataError, match="symbolic link"):
        gc(dataset, grace=0)


def test_gc_keeps_what_a_view_above_the_folder_reads(pool, tmp_path):
    dataset = pack(tree(pool, tmp_path / "data" / "base", BASE), tmp_path / "data", "tar")
    fastdata.append(tree(pool, tmp_path / "w0", writer_spec(0)), dataset,
                    options=options("tar"), progress=False)
    view = tmp_path / "dogs.fastdata.json"  # above the dataset's folder
    fastdata.subset(dataset, view, classes=["dog", "new0"], progress=False)
    seen = records(view)
    fastdata.append(tree(pool, tmp_path / "w1", writer_spec(1)), dataset,
                    options=options("tar"), progress=False)
    registered = list((tmp_path / "data" / "d.tar.versions" / "views").iterdir())
    assert len(registered) == 1
    swept = gc(dataset, keep=1, grace=0)
    assert swept.kept == [2, 3] and swept.removed_versions == [1]
    assert records(view) == seen
    os.unlink(view)  # the view is gone: nothing keeps version 2 now
    assert gc(dataset, keep=1, grace=0).removed_versions == [2]


def test_a_resume_state_on_a_removed_version_says_what_to_do(pool, tmp_path):
    dataset = pack(tree(pool, tmp_path / "base", BASE), tmp_path / "ds", "tar")
    fastdata.append(tree(pool, tmp_path / "w0", writer_spec(0)), dataset,
                    options=options("tar"), progress=False)
    order = fastdata.Order(shuffle=True, seed=3, batch_size=2)
    batches = fastdata.EpochBatches(fastdata.open_dataset(dataset), order=order)
    next(iter(batches))
    state = json.loads(json.dumps(batches.state_dict()))  # saved on version 2
    fastdata.append(tree(pool, tmp_path / "w1", writer_spec(1)), dataset,
                    options=options("tar"), progress=False)
    assert gc(dataset, keep=1).removed_versions == [1, 2]
    now = fastdata.EpochBatches(fastdata.open_dataset(dataset), order=order)
    with pytest.raises(ValueError, match="saved reading version 2.*reads version 3"):
        now.load_state_dict(state)
    with pytest.raises(FastDataError, match="version 2 of the dataset was removed by "
                                            "fastdata gc .the current one is 3.") as gone:
        fastdata.open_dataset(fastdata.DatasetRef(dataset, version=2))
    assert "start again from a state saved on one" in str(gone.value)
    # Its number stays taken: a writer that read version 2 lands as version 4.
    raced = fastdata.append(tree(pool, tmp_path / "w2", writer_spec(2)),
                            history.record_path(dataset, 3), options=options("tar"),
                            progress=False)
    assert raced.version == 4


# -- 4. the version pointer where a store hides missing objects ----------------------------


@pytest.mark.parametrize("missing", [403, "page"])
def test_a_never_changed_dataset_opens_where_missing_files_are_403_or_a_page(
        pool, tmp_path, http_server, monkeypatch, missing):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    pack(tree(pool, tmp_path / "base", BASE), http_server.root, "tar")
    http_server.missing = missing
    url = f"{http_server.url}/d.tar.fastdata.json"
    with open_reader(url) as r:
        assert len(r) == 12 and r.identity is None
    heads = [p for m, p, _ in http_server.log if p.endswith("d.tar.versions/HEAD")]
    assert len(heads) == 1  # one GET of the pointer per open
    # A changed dataset at the same server reads its current version.
    local = http_server.root / "d.tar.fastdata.json"
    fastdata.append(tree(pool, tmp_path / "w0", writer_spec(0)), local,
                    options=options("tar"), progress=False)
    with open_reader(url) as r:
        assert len(r) == 14 and r.version == 2


# -- 5. records checked as strictly as manifests ------------------------------------------


def test_damaged_version_records_are_refused_naming_the_field(pool, tmp_path):
    dataset = pack(tree(pool, tmp_path / "base", BASE), tmp_path / "ds", "lmdb")
    fastdata.append(tree(pool, tmp_path / "w0", writer_spec(0)), dataset,
                    options=options("lmdb"), progress=False)
    where = history.record_path(dataset, 2)
    good = json.loads(open(where).read())
    part = good["parts"][1]
    bad = {
        "classes shorter than the labels": dict(good, classes=good["classes"][:2],
                                                class_counts=good["class_counts"][:2]),
        "two parts have the same id": dict(good, parts=[good["parts"][0],
                                                        dict(part, id=good["parts"][0]["id"])]),
        "the same part twice": dict(good, parts=[good["parts"][0], good["parts"][0]],
                                    records=24),
        "counts that do not add up": dict(good, records=good["records"] + 1),
        "a digest that is not one": dict(good, parts=[good["parts"][0],
                                                      dict(part, manifest_sha256="x")]),
        "a parent that is not the last version": dict(good, parent=7),
    }
    for what, data in bad.items():
        with open(where, "w") as f:
            json.dump(data, f)
        with pytest.raises(ManifestError) as refused:
            records(dataset)
        assert "v000002.json" in str(refused.value), what


def test_verify_checks_joined_columns_and_convert_carries_them(pool, tmp_path):
    dataset = pack(tree(pool, tmp_path / "base", BASE), tmp_path / "ds", "tar")
    keys = list(records(dataset))
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps({"path": k, "caption": f"c-{k}", "n": i}) + "\n"
                             for i, k in enumerate(keys)))
    fastdata.join(dataset, table, key="path")
    copy = fastdata.convert(dataset, tmp_path / "copy.lmdb", progress=False).output
    with open_reader(copy) as r:
        assert [r.metadata(i) for i in range(len(r))] == \
            [{"caption": f"c-{k}", "n": i} for i, k in enumerate(keys)]
    [folder] = (tmp_path / "ds" / "d.tar.versions" / "columns").iterdir()
    text = next(folder.glob("*.utf8"))
    raw = bytearray(text.read_bytes())
    raw[3] ^= 0x20
    text.write_bytes(bytes(raw))
    done = CliRunner().invoke(main, ["verify", dataset, "--no-progress"])
    assert done.exit_code == 1 and text.name in done.output, done.output


def test_info_of_a_view_names_the_version_it_was_made_from(pool, tmp_path):
    dataset = pack(tree(pool, tmp_path / "base", BASE), tmp_path / "ds", "lmdb")
    fastdata.append(tree(pool, tmp_path / "w0", writer_spec(0)), dataset,
                    options=options("lmdb"), progress=False)
    view = tmp_path / "ds" / "cats.fastdata.json"
    fastdata.subset(dataset, view, classes=["cat"], progress=False)
    fastdata.append(tree(pool, tmp_path / "w1", writer_spec(1)), dataset,
                    options=options("lmdb"), progress=False)
    done = CliRunner().invoke(main, ["info", str(view), "--history"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == f"a view made from version 2 of {tmp_path / 'ds' / 'd.lmdb'}"
    assert "3 version(s)" in lines[1] and len(lines) == 5
    shown = CliRunner().invoke(main, ["info", str(view)])
    assert "6 of 14 records (42.9%) of d.lmdb (version 2)" in shown.output, shown.output


# -- 6. one open per part ----------------------------------------------------------------


def test_a_version_opens_each_part_once(pool, tmp_path, monkeypatch):
    from fastdata.formats.reader import Reader

    dataset = pack(tree(pool, tmp_path / "base", BASE), tmp_path / "ds", "tfrecord")
    for k in range(2):
        fastdata.append(tree(pool, tmp_path / f"w{k}", writer_spec(k)), dataset,
                        options=options("tfrecord"), progress=False)
    opened = []
    real = Reader.__init__

    def counting(self, path, **kw):
        opened.append(os.fspath(path))
        real(self, path, **kw)

    monkeypatch.setattr(Reader, "__init__", counting)

    def parts_opened() -> list[str]:  # the record's own reader aside
        return [p for p in opened if not p.endswith("v000003.json")]

    with open_reader(dataset) as r:
        assert len(r) == 16 and len(r.parts) == 3
    assert len(parts_opened()) == 3, opened
    opened.clear()
    fastdata.open_dataset(dataset)
    assert len(parts_opened()) == 3, opened


def test_a_version_at_s3_asks_for_each_file_once(pool, tmp_path, s3_env, monkeypatch):
    optional.require("obstore")
    from counting_proxy import CountingProxy

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    base = tree(pool, tmp_path / "base", BASE)
    local = pack(base, tmp_path / "ds", "tar")
    for k in range(2):
        fastdata.append(tree(pool, tmp_path / f"w{k}", writer_spec(k)), local,
                        options=options("tar"), progress=False)
    prefix = f"s3://fastdata-commit/{tmp_path.name}"
    s3_env.upload_dir(tmp_path / "ds", prefix)
    with CountingProxy(s3_env.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with open_reader(f"{prefix}/d.tar.fastdata.json") as r:
            assert len(r) == 16 and r.version == 3
        gets = Counter(q.key for q in proxy.log if q.method == "GET")
    history_dir = f"fastdata-commit/{tmp_path.name}/d.tar.versions"
    for name in ("HEAD", "v000003.json", "v000004.json"):  # v4: the look past the pointer
        assert gets[f"{history_dir}/{name}"] == 1, gets
    manifests = [k for k in gets if k.endswith(".fastdata.json")]
    assert len(manifests) == 3  # the pack's and each appended part's
    assert max(gets.values()) == 1, gets  # every file asked for once


# -- 7. the conditional create at Azure (Azurite) -----------------------------------------


def test_appends_at_azure_take_each_number_once(pool, tmp_path, azure_env, monkeypatch):
    from fastdata.storage import create_bytes, open_remote

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    container = azure_env.make_container("commit")
    url = f"{container}/once.json"
    assert create_bytes(b"first", url) is True
    assert create_bytes(b"second", url) is False  # If-None-Match: *
    assert open_remote(url).read() == b"first"
    dataset = fastdata.pack(tree(pool, tmp_path / "base", BASE),
                            f"{container}/d/{FORMATS['tar'][0]}", options=options("tar"),
                            progress=False).output
    sources = [tree(pool, tmp_path / f"w{k}", writer_spec(k)) for k in range(3)]
    outs = [tmp_path / f"out{k}.json" for k in range(3)]
    results = finish([start("append", s, dataset, o) for s, o in zip(sources, outs)], outs)
    assert sorted(r["version"] for r in results) == [2, 3, 4], results
    want = union(pool, tmp_path, "tar", [BASE] + [writer_spec(k) for k in range(3)])
    assert records(dataset) == want

"""``--workers N`` does not change what a pack writes: for every registered
format, packing with 1 and with 3 worker processes gives the same files byte
for byte, except the manifest's ``created_at`` (wherever the manifest is
stored: its own file, LMDB's ``data.mdb``, the ``.h5``) and LMDB's lock file
``lock.mdb``, which holds process state, no data (README: Packing, "Parallel")."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from conftest import build_tree, uniform_spec
from worker_pids import PreparedIn, assert_other_processes, assert_this_process

import fastdata
from fastdata.formats import FORMATS
from fastdata.packers.preprocess import Preprocess

#: Files that may differ whatever the data: LMDB's lock file (process state).
NOT_DATA = {"lock.mdb"}

VARIANTS = {
    "keep": {},
    "resize-jpeg": {"preprocess": Preprocess(resize=12, center_crop=True, encoding="jpeg")},
}


CASES = [(name, variant) for name in sorted(FORMATS) for variant in sorted(VARIANTS)]


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict:
    """{(format, variant, workers): (output, skipped report, log of the processes
    that prepared the images)}: every case packed with 1 worker, then, a second
    later (so that created_at differs), with 3."""
    base = tmp_path_factory.mktemp("workers")
    # 60 images and a bad file: pack() runs min(N, files // 16) workers, so 3 run.
    tree = build_tree(base / "src", uniform_spec(("cat", "dog", "eel"), per_class=20))
    (tree.root / "dog" / "zz_bad.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    done = {}
    for workers in (1, 3):
        if done:
            time.sleep(1.01 - time.time() % 1)  # into the next second
        for name, variant in CASES:
            folder = base / f"{name}-{variant}-w{workers}"
            done[name, variant, workers] = _pack(tree.root, folder, FORMATS[name], workers,
                                                 VARIANTS[variant])
    return done


def _pack(source: Path, folder: Path, spec, workers: int, options: dict):
    """(output path, the report of skipped files as JSON, the log of the
    processes that prepared the images, kept beside ``folder``)."""
    folder.mkdir(parents=True)
    out = folder / (f"out-%06d{spec.extensions[0]}" if spec.sharded else
                    f"out{spec.extensions[0]}")
    log = f"{folder}.pids"
    pre = options.get("preprocess", Preprocess())
    # The variant's preprocess, recording the process preparing each image;
    # every worker takes some of the images.
    recorded = PreparedIn(**{f.name: getattr(pre, f.name) for f in dataclasses.fields(pre)},
                          log=log, meet=workers)
    opts = fastdata.PackOptions(workers=workers, shard_size=16 if spec.sharded else None,
                                **{**options, "preprocess": recorded})
    summary = fastdata.pack(source, out, options=opts, progress=False)
    assert [s.key for s in summary.skipped] == ["dog/zz_bad.jpg"]
    return out, json.loads(Path(summary.report).read_text()), log


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in NOT_DATA and not p.name.endswith(".report.json")}


def _without_created_at(data: bytes, created_at: str) -> bytes:
    stamp = json.dumps(created_at).encode()  # as the manifest JSON holds it
    return data.replace(stamp, b'"CREATED_AT"')


@pytest.mark.parametrize("name,variant", CASES)
def test_output_is_the_same_whatever_the_workers(packs, name, variant):
    spec = FORMATS[name]
    # The images were prepared here with 1 worker, by 3 worker processes with 3.
    assert_this_process(packs[name, variant, 1][2])
    assert_other_processes(packs[name, variant, 3][2], count=3)
    outs = {n: packs[name, variant, n][0] for n in (1, 3)}
    manifests = {n: fastdata.formats.read_manifest(out) for n, out in outs.items()}
    dicts = {n: json.loads(m.to_json()) for n, m in manifests.items()}
    assert dicts[1].pop("created_at") != dicts[3].pop("created_at")
    assert dicts[1] == dicts[3]  # created_at is the only manifest field that differs
    if spec.sharded:
        assert len(manifests[1].shards) > 1

    files = {n: _files(out.parent) for n, out in outs.items()}
    assert sorted(files[1]) == sorted(files[3])
    for rel in files[1]:
        one, three = files[1][rel], files[3][rel]
        if one != three:  # only where the manifest is stored, only its created_at
            assert _without_created_at(one, manifests[1].created_at) == \
                _without_created_at(three, manifests[3].created_at), rel
    assert packs[name, variant, 1][1]["skipped"] == packs[name, variant, 3][1]["skipped"]

"""Jobs on every executor (fastdata.jobs): this machine's processes, a real
Dask cluster and a real Ray cluster on 127.0.0.1. The same report wherever
the pieces ran; a worker killed mid-job has its pieces run again; a lost
cluster keeps the finished pieces for ``--resume``."""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optional
import pytest
from click.testing import CliRunner
from clusters import (
    When,
    kill_ray_head,
    local_workers_since,
    ray_cluster,
    ray_task_pids,
)

import fastdata
from fastdata.cli import main
from fastdata.demo import synthesize
from fastdata.errors import FastDataError
from fastdata.jobs.choose import open_executor
from fastdata.jobs.runner import JobInterrupted

REPO = Path(__file__).resolve().parent.parent
#: Records of the dataset: 6 pieces of 256 (see dedup_pieces.piece_records).
RECORDS = 1_400
#: (copy, original) positions in the image list: copies in other pieces.
PLANTED = [(1300, 5), (1301, 5), (900, 260), (640, 641), (1399, 0)]


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """A tar dataset of ``RECORDS`` tiny PNGs with the ``PLANTED`` copies."""
    tmp = tmp_path_factory.mktemp("jobs")
    synthesize(tmp / "pool", kind="tiny", n=RECORDS, classes=2, seed=3)
    pool = sorted((tmp / "pool").rglob("*.png"))
    folder = tmp / "images" / "all"
    folder.mkdir(parents=True)
    for i, path in enumerate(pool):
        shutil.copy(path, folder / f"{i:05d}.png")
    for copy, original in PLANTED:
        shutil.copy(pool[original], folder / f"{copy:05d}.png")
    return fastdata.pack(tmp / "images", tmp / "all.tar", progress=False,
                         options=fastdata.PackOptions(shard_size=200)).output


def _report(path, **options) -> dict:
    return fastdata.dedup(path, progress=False, **options).to_dict()


#: The groups of the planted copies, by key; pinned.
EXPECTED = [["all/00000.png", "all/01399.png"],
            ["all/00005.png", "all/01300.png", "all/01301.png"],
            ["all/00260.png", "all/00900.png"],
            ["all/00640.png", "all/00641.png"]]


def _keys(report: dict) -> list[list[str]]:
    return [[m["key"] for m in g["members"]] for g in report["groups"]]


@pytest.fixture(scope="module")
def local_report(planted) -> dict:
    report = _report(planted, workers=1)
    assert _keys(report) == EXPECTED
    assert report["redundant"] == 5
    return report


def test_dedup_on_local_processes_is_the_one_process_report(planted, local_report):
    assert _report(planted, workers=2) == local_report


def test_dedup_on_dask_is_the_local_report(planted, local_report, dask, staging):
    assert _report(planted, scheduler=dask.scheduler.address) == local_report
    assert not list(staging.iterdir())  # the work folder goes when the job ends well


def test_dedup_on_ray_is_the_local_report(planted, local_report, ray_address, staging):
    assert _report(planted, ray=ray_address) == local_report
    assert not list(staging.iterdir())


def test_cli_dedup_on_ray_and_dask_prints_the_local_json(planted, local_report, dask,
                                                         ray_address):
    runner = CliRunner()
    for cluster in (["--scheduler", dask.scheduler.address], ["--ray", ray_address]):
        done = runner.invoke(main, ["dedup", str(planted), "--json", "--no-progress",
                                    *cluster])
        assert done.exit_code == 0, done.output
        assert json.loads(done.output) == local_report


@pytest.fixture(scope="module")
def near_report(planted) -> dict:
    report = _report(planted, near=True, workers=1)
    groups = [set(g) for g in _keys(report)]
    # Tiny synthetic images look alike: the planted copies are among the groups.
    assert all(any(set(planted) <= g for g in groups) for planted in EXPECTED)
    return report


def test_a_killed_local_worker_has_its_pieces_run_again(planted, near_report):
    import psutil

    workers = local_workers_since()

    def worker_busy() -> bool:
        try:
            return any(c.cpu_times().user > 0.05 for c in workers())
        except psutil.Error:  # a worker ended between the two calls
            return False

    def kill() -> None:
        os.kill(workers()[0].pid, signal.SIGKILL)

    with When(worker_busy, kill) as when:
        report = _report(planted, near=True, workers=2)
    assert when.fired
    assert report == near_report


def test_a_killed_dask_worker_has_its_pieces_run_again(planted, near_report, dask):
    victims = {}

    def busy() -> bool:
        for worker, keys in dask.processing().items():
            if any("hash-piece" in str(k) for k in keys):
                victims["pid"] = dask.run(os.getpid, workers=[worker])[worker]
                return True
        return False

    with When(busy, lambda: os.kill(victims["pid"], signal.SIGKILL)) as when:
        report = _report(planted, near=True, scheduler=dask.scheduler.address)
    assert when.fired
    assert report == near_report


def test_a_killed_ray_worker_has_its_pieces_run_again(planted, near_report, ray_address):
    found = {}

    def busy() -> bool:
        found["pids"] = ray_task_pids("fastdata-hash_piece")
        return bool(found["pids"])

    with When(busy, lambda: os.kill(found["pids"][0], signal.SIGKILL)) as when:
        report = _report(planted, near=True, ray=ray_address)
    assert when.fired
    assert report == near_report


def test_a_lost_dask_scheduler_keeps_the_finished_pieces_for_resume(planted, near_report,
                                                                    staging):
    import distributed as dd

    cluster = dd.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                              host="127.0.0.1", dashboard_address=":0")
    address = cluster.scheduler_address
    journals = []

    def some_done() -> bool:
        journals[:] = list(staging.glob("fastdata-dedup-*/journal.jsonl"))
        return bool(journals) and journals[0].read_text().count("\n") >= 2

    try:
        with When(some_done, lambda: cluster.close(timeout=5)):
            with pytest.raises(JobInterrupted, match="--resume continues the dedup"):
                _report(planted, near=True, scheduler=address)
    finally:
        cluster.close(timeout=5)
    kept = journals[0].read_text().count("\n")
    assert 2 <= kept < 6
    resumed = fastdata.dedup(planted, near=True, progress=False, resume=True, workers=1)
    assert resumed.to_dict() == near_report
    assert not journals[0].exists()


def test_a_scheduler_lost_while_pairing_keeps_every_hashed_piece(planted, near_report,
                                                                   staging):
    """The near pairs are found on the cluster too: a scheduler lost then keeps
    the hashes, and --resume pairs them without hashing again."""
    import distributed as dd

    cluster = dd.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                              host="127.0.0.1", dashboard_address=":0")
    address = cluster.scheduler_address

    def pairing() -> bool:
        return bool(list(staging.glob("fastdata-dedup-*/near/index/*.npy")))

    try:
        with When(pairing, lambda: cluster.close(timeout=5)) as when:
            with pytest.raises(JobInterrupted, match="the 6 finished pieces of 6 are kept"):
                _report(planted, near=True, scheduler=address)
    finally:
        cluster.close(timeout=5)
    assert when.fired
    journal, = staging.glob("fastdata-dedup-*/journal.jsonl")
    assert journal.read_text().count("\n") == 6
    resumed = fastdata.dedup(planted, near=True, progress=False, resume=True, workers=1)
    assert resumed.to_dict() == near_report
    assert not journal.exists()


def test_a_lost_ray_head_stops_the_job_with_its_resume_line(planted, near_report, staging):
    """Ray ends a driver whose head has been gone for 60 s: the job stops
    first, with the line that names --resume, and the hashes are kept."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ray_cluster(port) as address:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastdata.cli", "dedup", str(planted), "--near",
             "--ray", address, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        journals = []

        def some_done() -> bool:
            journals[:] = list(staging.glob("fastdata-dedup-*/journal.jsonl"))
            return bool(journals) and journals[0].read_text().count("\n") >= 1

        try:
            with When(some_done, lambda: kill_ray_head(port)) as when:
                _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert when.fired
    assert proc.returncode == 1, err[-2000:]
    assert "does not answer" in err and "--resume continues the dedup" in err, err[-2000:]
    resumed = fastdata.dedup(planted, near=True, progress=False, resume=True, workers=1)
    assert resumed.to_dict() == near_report
    assert not journals[0].exists()


def test_jobs_read_a_version_file_as_the_version_it_names(tmp_path):
    from fastdata.ops.verify import verify_dataset

    synthesize(tmp_path / "a", kind="tiny", n=60, classes=2, seed=1)
    synthesize(tmp_path / "b", kind="tiny", n=20, classes=2, seed=2)
    out = fastdata.pack(tmp_path / "a", tmp_path / "d.tar", progress=False).output
    fastdata.append(tmp_path / "b", out, skip_existing=True, progress=False)
    first, second = sorted((tmp_path / "d.tar.versions").glob("v*.json"))
    for path, records in ((first, 60), (second, 70), (out, 70)):
        assert verify_dataset(path, progress=False, workers=2).checked == records
        assert fastdata.dedup(path, progress=False, workers=2).records == [records]


def test_resume_refuses_a_job_of_other_options(planted, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_STAGING_DIR", str(tmp_path))
    notes = []
    fastdata.dedup(planted, progress=False, resume=True, workers=1, on_event=notes.append)
    assert notes == ["no interrupted dedup of these inputs to resume; starting from the "
                     "start"]
    assert not list(tmp_path.iterdir())


def test_both_clusters_at_once_are_refused():
    with pytest.raises(FastDataError, match="either a Dask scheduler .* or a Ray cluster"):
        open_executor(scheduler="tcp://127.0.0.1:1", ray="127.0.0.1:2")


def test_ray_true_without_the_environment_variable_says_what_to_set(monkeypatch):
    monkeypatch.delenv("FASTDATA_RAY", raising=False)
    with pytest.raises(FastDataError, match=r"\$FASTDATA_RAY, which is not set"):
        open_executor(ray=True)


def test_an_unreachable_ray_cluster_is_one_line_at_once(refused_port):
    optional.require("ray")
    started = time.monotonic()
    with pytest.raises(FastDataError, match=f"cannot reach the Ray cluster at "
                                            f"127.0.0.1:{refused_port}"):
        open_executor(ray=f"127.0.0.1:{refused_port}")
    assert time.monotonic() - started < 5


def test_only_the_executors_import_dask_or_ray():
    allowed = {"dask_executor.py", "dask_connect.py", "ray_executor.py"}
    found = []
    for path in (REPO / "fastdata").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] in ("dask", "distributed", "ray") for n in names):
                found.append(str(path.relative_to(REPO)))
    assert found and {Path(f).name for f in found} <= allowed
    assert all(f.startswith("fastdata/jobs/") for f in found)


def _files(folder: Path) -> dict[str, bytes]:
    """Every file's bytes, the manifest's created_at left out."""
    out = {}
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        if path.name.endswith(".fastdata.json"):
            manifest = json.loads(data)
            manifest.pop("created_at", None)
            data = json.dumps(manifest, sort_keys=True).encode()
        out[path.name] = data
    return out


@pytest.fixture(scope="module")
def images(planted) -> Path:
    return Path(planted).parent / "images"


@pytest.mark.parametrize("how", ["pack", "convert"])
def test_pack_and_convert_on_ray_and_dask_write_the_local_files(images, planted, how,
                                                                tmp_path, dask,
                                                                ray_address):
    def run(name: str, **cluster) -> dict[str, bytes]:
        out = tmp_path / name
        out.mkdir()
        options = fastdata.PackOptions(shard_size=300)
        if how == "pack":
            fastdata.pack(images, out / "out.tfrecord", options=options, progress=False,
                          **cluster)
        else:
            fastdata.convert(planted, out / "out.tfrecord", options=options,
                             progress=False, **cluster)
        return _files(out)

    local = run("local")
    assert len([n for n in local if n.endswith(".tfrecord")]) == 5
    assert run("dask", scheduler=dask.scheduler.address) == local
    assert run("ray", ray=ray_address) == local


def _dies(number: int, arg, *common) -> None:
    """A piece that kills the process running it."""
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_piece_that_kills_every_worker_stops_the_job_naming_it():
    executor = open_executor(workers=2)
    try:
        with pytest.raises(FastDataError, match=r"piece [01]: every worker process that ran "
                                                r"it died \(4 times"):
            list(executor.results(_dies, [(0, None), (1, None)], (), in_order=False))
    finally:
        executor.close()


def test_a_job_stopped_by_a_damaged_record_leaves_no_work_folder(planted, tmp_path,
                                                                 monkeypatch):
    from fastdata.errors import CorruptDataError

    folder = tmp_path / "damaged"
    shutil.copytree(Path(planted).parent, folder,
                    ignore=shutil.ignore_patterns("pool", "images"))
    shard = sorted(folder.glob("all-*.tar"))[3]
    data = bytearray(shard.read_bytes())
    data[2000] ^= 0xFF  # inside the shard's first record's payload
    shard.write_bytes(bytes(data))
    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setenv("FASTDATA_STAGING_DIR", str(staging))
    with pytest.raises(CorruptDataError, match="'all/00600.png': record 600 fails its CRC32"):
        fastdata.dedup(folder / "all.tar.fastdata.json", progress=False, workers=2)
    assert not list(staging.iterdir())


@pytest.fixture(scope="module")
def damaged(planted, tmp_path_factory) -> Path:
    """The planted dataset with one record's payload flipped (shard 3) and
    shard 5's last byte changed (its SHA-256)."""
    folder = tmp_path_factory.mktemp("damaged")
    for path in Path(planted).parent.iterdir():
        if path.is_file() and path.name.startswith("all"):
            shutil.copy(path, folder / path.name)
    for number, at in ((3, 2000), (5, -1)):
        shard = folder / f"all-{number:06d}.tar"
        data = bytearray(shard.read_bytes())
        data[at] ^= 0xFF
        shard.write_bytes(bytes(data))
    return folder / "all.tar.fastdata.json"


def _verified(path, **options) -> dict:
    from fastdata.ops.verify import verify_dataset

    result = verify_dataset(path, progress=False, **options).to_dict()
    result["problems"] = [dict(p, path=Path(p["path"]).name) for p in result["problems"]]
    return result


def test_verify_in_pieces_is_the_one_process_report(damaged, dask, ray_address):
    one = _verified(damaged, workers=1)
    assert [(p["index"], p["key"], p["path"]) for p in one["problems"]] == [
        (600, "all/00600.png", "all.tar.fastdata.json"),
        (None, None, "all-000003.tar"), (None, None, "all-000005.tar")]
    assert one["checked"] == RECORDS and one["damaged"] == 1 and not one["ok"]
    assert _verified(damaged, workers=2) == one
    assert _verified(damaged, scheduler=dask.scheduler.address) == one
    assert _verified(damaged, ray=ray_address) == one


def test_verify_in_pieces_reads_the_keys_in_pieces_and_finds_their_damage(planted,
                                                                          tmp_path):
    for path in Path(planted).parent.iterdir():
        if path.is_file() and path.name.startswith("all"):
            shutil.copy(path, tmp_path / path.name)
    keys = tmp_path / "all.tar.fastdata.keys.json"
    data = bytearray(keys.read_bytes())
    data[len(data) // 2] ^= 0x01  # a key's letter changed: still JSON
    keys.write_bytes(bytes(data))
    one = _verified(tmp_path / "all.tar.fastdata.json", workers=1)
    assert [(p["index"], p["path"]) for p in one["problems"]] == [
        (None, "all.tar.fastdata.keys.json")]
    assert "SHA-256" in one["problems"][0]["reason"]
    assert _verified(tmp_path / "all.tar.fastdata.json", workers=2) == one

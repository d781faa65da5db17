"""Packing on a Dask cluster (``pack(..., scheduler=)``, ``--scheduler``): a real
scheduler and real worker processes on 127.0.0.1 (README: "Packing on a Dask
cluster"). The output is a local pack's, byte for byte (the manifest's
created_at apart); a worker killed mid-pack has its pieces redone; a lost
scheduler leaves the finished pieces for ``--resume``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optional
import pytest
from clusters import When
from conftest import build_tree, list_partials, run_python, uniform_spec

import fastdata
from fastdata.errors import BadImageError, FastDataError, UnsafeNameError
from fastdata.formats import read_manifest
from fastdata.packers.preprocess import Preprocess

REPO = str(Path(__file__).resolve().parent.parent)
#: Files that hold process state, not data (LMDB's lock file).
NOT_DATA = {"lock.mdb"}
VARIANTS = {"keep": {}, "resize": {"preprocess": Preprocess(resize=12)}}
SPEC = uniform_spec(per_class=12, exts=(".png", ".jpg", ".bmp"))
BAD = next(key for key in SPEC if key.startswith("dog/img00") and key.endswith(".png"))


@pytest.fixture(scope="module")
def dd():
    """distributed, imported by this module's tests only (not when collected):
    it makes every exception pickle through tblib (copyreg), which other
    tests' restricted unpicklers refuse (DALI's), so the table is put back."""
    import copyreg

    saved = dict(copyreg.dispatch_table)
    yield optional.require("distributed")
    copyreg.dispatch_table.clear()
    copyreg.dispatch_table.update(saved)


@pytest.fixture(scope="module")
def cluster(dd):
    """A scheduler and 2 single-thread worker processes; a client of them."""
    with dd.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=":0") as cluster, \
            dd.Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """36 images, one of them damaged (a skip inside a piece)."""
    root = tmp_path_factory.mktemp("cluster") / "src"
    build_tree(root, SPEC)
    data = (root / BAD).read_bytes()
    (root / BAD).write_bytes(data[: len(data) // 2])
    return root


@pytest.fixture(scope="module")
def local_packs(source, tmp_path_factory):
    """The local pack of (format, variant), made once each."""
    made: dict = {}

    def local(fmt: str, variant: str) -> Path:
        if (fmt, variant) not in made:
            folder = tmp_path_factory.mktemp(f"local-{fmt}-{variant}")
            fastdata.pack(source, _output(folder, fmt), options=_options(fmt, variant),
                          progress=False)
            made[fmt, variant] = folder
        return made[fmt, variant]

    return local


def _output(folder: Path, fmt: str) -> Path:
    return folder / {"tar": "out-%06d.tar", "tfrecord": "out.tfrecord",
                     "lmdb": "out.lmdb", "hdf5": "out.h5"}[fmt]


def _options(fmt: str, variant: str, **more) -> fastdata.PackOptions:
    sharded = fmt in ("tar", "tfrecord")
    return fastdata.PackOptions(shard_size=3 if sharded else None, **VARIANTS[variant], **more)


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too: nothing may be left over),
    the manifest's created_at blanked wherever it is stored."""
    files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name not in NOT_DATA}
    manifest = next(p for p in folder.iterdir() if p.name.endswith((".fastdata.json", ".lmdb",
                                                                    ".h5")))
    stamp = json.dumps(read_manifest(str(manifest)).created_at).encode()
    for name, data in files.items():
        files[name] = data.replace(stamp, b'"CREATED_AT"')
        if name.endswith(".report.json"):  # it names the output: the folders differ
            files[name] = data.replace(str(folder).encode(), b"FOLDER")
    return files


def assert_same_pack(cluster_folder: Path, local_folder: Path) -> None:
    got, want = _files(cluster_folder), _files(local_folder)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name


def _worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cluster_pack_writes_the_local_pack(dd, cluster, source, local_packs, tmp_path, fmt,
                                            variant):
    with dd.get_task_stream(client=cluster) as stream:
        summary = fastdata.pack(source, _output(tmp_path, fmt),
                                options=_options(fmt, variant), progress=False,
                                scheduler=cluster)
    assert summary.records == 35 and [s.key for s in summary.skipped] == [BAD]
    assert_same_pack(tmp_path, local_packs(fmt, variant))
    # One task per piece (a shard of 3 entries), each run by a worker process,
    # and both worker processes ran some.
    ran = [t for t in stream.data if "fastdata-pack" in str(t["key"])]
    assert len(ran) == 12
    pids = _worker_pids(cluster)
    assert {pids[t["worker"]] for t in ran} == set(pids.values()) and len(pids) == 2
    assert os.getpid() not in pids.values()


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_cluster_pack_of_a_single_file_format(cluster, source, local_packs, tmp_path, fmt):
    summary = fastdata.pack(source, _output(tmp_path, fmt), options=_options(fmt, "resize"),
                            progress=False, scheduler=cluster.scheduler.address)
    assert summary.records == 35 and [s.key for s in summary.skipped] == [BAD]
    assert_same_pack(tmp_path, local_packs(fmt, "resize"))


def test_a_list_that_leads_outside_is_refused_before_any_task(cluster, source, tmp_path):
    """A cluster pack reads the names a list holds on the client, with the same
    rule as a local pack: nothing leaves the list's folder, no task runs."""
    image = next(p for p in sorted(source.rglob("*.png")) if p.name != Path(BAD).name)
    (tmp_path / "lists").mkdir()
    listed = tmp_path / "lists" / "list.csv"
    listed.write_text(f"path,label\n../outside.png,a\n{image},b\n")
    (tmp_path / "outside.png").write_bytes(image.read_bytes())
    with pytest.raises(UnsafeNameError, match="line 2"):
        fastdata.pack(listed, tmp_path / "x.lmdb", progress=False,
                      scheduler=cluster.scheduler.address)
    assert not (tmp_path / "x.lmdb").exists()


def test_strict_names_the_first_bad_image_in_plan_order(cluster, source, tmp_path):
    with pytest.raises(BadImageError) as err:
        fastdata.pack(source, tmp_path / "out" / "x.tar", options=_options(
            "tar", "keep", strict=True), progress=False, scheduler=cluster)
    assert err.value.key == BAD and "strict" in str(err.value)
    assert not list_partials(tmp_path / "out")  # nothing left, as after a local pack
    assert not list((tmp_path / "out").glob("*.fastdata.json"))
    assert not list((tmp_path / "out").glob(".*.pack-state"))


def _journaled(folder: Path) -> int:
    """Pieces the pack to ``folder`` has journaled so far."""
    journals = list(folder.glob(".*.pack-state/journal.jsonl"))
    return journals[0].read_text().count("\n") if journals else 0


def test_a_killed_worker_has_its_pieces_redone(cluster, source, local_packs, tmp_path):
    victim, victim_pid = sorted(_worker_pids(cluster).items())[0]
    seen = {}

    def victim_has_a_piece() -> bool:
        seen["pieces"] = [key for key in cluster.processing(workers=[victim])[victim]
                          if "fastdata-pack" in str(key)]
        return bool(seen["pieces"])

    def kill() -> None:
        os.kill(victim_pid, signal.SIGKILL)
        seen["journaled"] = _journaled(tmp_path)

    with When(victim_has_a_piece, kill):
        fastdata.pack(source, _output(tmp_path, "tar"), options=_options("tar", "resize"),
                      progress=False, scheduler=cluster.scheduler.address)
    assert seen["journaled"] < 12  # it died with its piece, in the middle of the pack
    assert victim not in _worker_pids(cluster)
    assert_same_pack(tmp_path, local_packs("tar", "resize"))


def test_workers_that_cannot_see_the_output_folder_fail_in_one_line(cluster, source,
                                                                    tmp_path):
    """As if the partial output were on a disk the workers do not share: it
    goes away under them once a piece is journaled."""
    import shutil

    def remove_partial() -> None:
        # Moved away in one step, then removed: workers may still be writing
        # into it, and a plain rmtree would race them.
        for partial in tmp_path.glob(".*.partial-*"):
            gone = tmp_path / "gone"
            os.rename(partial, gone)
            shutil.rmtree(gone, ignore_errors=True)

    with When(lambda: _journaled(tmp_path), remove_partial), \
            pytest.raises(FastDataError) as err:
        fastdata.pack(source, _output(tmp_path, "tar"), options=_options("tar", "keep"),
                      progress=False, scheduler=cluster)
    assert "shared file system" in str(err.value) and "\n" not in str(err.value)


class _Scheduler:
    """``dask scheduler`` and one ``dask worker`` (no nanny: its pid is the
    worker's), as separate processes."""

    def __init__(self, dd, folder: Path) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get(
            "PYTHONPATH", "")]))
        common = dict(cwd=folder, env=env, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
        # Port 0: the scheduler binds a free port and writes its address to the file.
        info = folder / "scheduler.json"
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--scheduler-file", str(info), "--no-dashboard"], **common)
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "dask", "worker", "--scheduler-file", str(info),
             "--no-nanny", "--nthreads", "1", "--no-dashboard"], **common)
        with dd.Client(scheduler_file=str(info), timeout=30) as client:
            client.wait_for_workers(1, timeout=30)
            self.address = json.loads(info.read_text())["address"]

    def close(self) -> None:
        for proc in (self.worker, self.scheduler):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.mark.parametrize("resume_on", ["local", "cluster"])
def test_a_lost_scheduler_keeps_the_finished_pieces(dd, cluster, source, local_packs, tmp_path,
                                                     resume_on):
    (tmp_path / "procs").mkdir()
    lost = _Scheduler(dd, tmp_path / "procs")
    folder = tmp_path / "out"

    def lose_scheduler() -> None:
        os.kill(lost.worker.pid, signal.SIGSTOP)  # no piece finishes from here
        lost.scheduler.kill()

    out = _output(folder, "tar")
    try:
        with When(lambda: _journaled(folder), lose_scheduler), \
                pytest.raises(FastDataError) as err:
            fastdata.pack(source, out, options=_options("tar", "keep"), progress=False,
                          scheduler=lost.address)
    finally:
        lost.close()
    message = str(err.value)
    assert f"lost the Dask scheduler at {lost.address}" in message and "--resume" in message
    assert "\n" not in message
    state = next(folder.glob(".*.pack-state"))
    journaled = (state / "journal.jsonl").read_text().count("\n")
    assert f"the {journaled} finished piece" in message and 0 < journaled < 12
    assert not list(folder.glob("*.fastdata.json"))  # nothing published

    resume = _options("tar", "keep", resume=True)
    if resume_on == "local":
        fastdata.pack(source, out, options=resume, progress=False)
    else:
        with dd.get_task_stream(client=cluster) as stream:
            fastdata.pack(source, out, options=resume, progress=False, scheduler=cluster)
        ran = [t for t in stream.data if "fastdata-pack" in str(t["key"])]
        assert len(ran) == 12 - journaled  # only the missing pieces
    assert_same_pack(folder, local_packs("tar", "keep"))


def test_cli_scheduler_that_does_not_answer_is_one_error_line(source, tmp_path, refused_port):
    address = f"tcp://127.0.0.1:{refused_port}"
    try:  # the pack gives up on its own; the timeout only guards against a hang
        proc = subprocess.run(
            [sys.executable, "-m", "fastdata.cli", "pack", str(source), str(tmp_path / "x.tar"),
             "--scheduler", address], capture_output=True, text=True, timeout=180,
            env=dict(os.environ, PYTHONPATH=REPO))
    except subprocess.TimeoutExpired:
        pytest.fail("hang: the pack was still waiting for a scheduler that does not answer "
                    "after 180 s")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and address in lines[0], \
        proc.stderr
    assert not any(tmp_path.iterdir())


def test_cluster_pack_to_a_url_needs_a_shared_staging_folder(source, monkeypatch):
    monkeypatch.delenv("FASTDATA_STAGING_DIR", raising=False)
    with pytest.raises(FastDataError, match="FASTDATA_STAGING_DIR"):
        fastdata.pack(source, "s3://bucket/x.tar", scheduler="tcp://127.0.0.1:1")


def test_cluster_pack_to_a_url(cluster, source, local_packs, tmp_path, monkeypatch, s3_server,
                               s3_env):
    """The workers write the shards into the shared staging folder; the client
    uploads them, the manifest last."""
    monkeypatch.setenv("FASTDATA_STAGING_DIR", str(tmp_path / "staging"))
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    s3_server.make_bucket("cluster")
    summary = fastdata.pack(source, "s3://cluster/d/out-%06d.tar", options=_options("tar", "keep"),
                            progress=False, scheduler=cluster.scheduler.address)
    remote = fastdata.open_dataset(summary.output, decode=fastdata.Decode(output="bytes"))
    local = fastdata.open_dataset(_output(local_packs("tar", "keep"), "tar").parent
                                  / "out.tar.fastdata.json",
                                  decode=fastdata.Decode(output="bytes"))
    assert [remote[i] for i in range(len(remote))] == [local[i] for i in range(len(local))]
    assert os.listdir(tmp_path / "staging") == []


def test_a_local_pack_does_not_import_dask(source, tmp_path):
    proc = run_python(f"""
        import sys
        import fastdata
        fastdata.pack({str(source)!r}, {str(tmp_path / 'x.tar')!r}, progress=False)
        print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))
    """, env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_cluster_pack_carries_per_sample_metadata(cluster, source, tmp_path, fmt):
    """Metadata travels with the records through the workers, as in a local pack."""
    folder = fastdata.ImageFolderSource(source)
    src = _WithMetadata(folder)
    local = fastdata.pack(src, _output(tmp_path / "local", fmt), options=_options(fmt, "keep"),
                          progress=False)
    remote = fastdata.pack(src, _output(tmp_path / "cluster", fmt),
                           options=_options(fmt, "keep"), progress=False,
                           scheduler=cluster.scheduler.address)
    a, b = fastdata.open_dataset(local.output), fastdata.open_dataset(remote.output)
    assert [b.metadata(i) for i in range(len(b))] == [a.metadata(i) for i in range(len(a))]
    assert b.metadata(0) == {"boxes": [[0, 1, 2, 3]], "key": a.keys[0]}


class _WithMetadata:
    """A folder's entries with a metadata dict each."""

    def __init__(self, inner) -> None:
        self.inner, self.classes = inner, inner.classes

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        from fastdata.packers.source import SourceEntry

        for e in self.inner:
            yield SourceEntry(e.key, e.label, path=e.path,
                              metadata={"boxes": [[0, 1, 2, 3]], "key": e.key})

    def describe(self):
        return self.inner.describe()

    def warnings(self):
        return []


def test_workers_with_a_scheduler_is_said_to_be_local_only(cluster, source, tmp_path):
    events = []
    fastdata.pack(source, _output(tmp_path, "tar"), options=_options("tar", "keep", workers=3),
                  progress=False, scheduler=cluster.scheduler.address, on_event=events.append)
    assert any("workers= applies to a local pack" in e for e in events)


class _BytesSource:
    """Records whose bytes the source holds: a piece's task input is its
    entries, bytes and all (each record carries ``MARK``)."""

    MARK = b"piece-input-" + bytes(range(32))

    def __init__(self, n: int) -> None:
        self.n, self.classes = n, ["a", "b"]

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        from fastdata.packers.source import SourceEntry

        for i in range(self.n):
            yield SourceEntry(key=f"{i:05d}", label=i % 2, data=self.MARK + bytes(48 - 44),
                              raw_shape=(1, 16, 3))

    def describe(self) -> dict:
        return {"root": None, "files": self.n, "kind": "records held in memory"}

    def warnings(self) -> list[str]:
        return []


def _logged_with(mark: bytes, streams) -> int:
    """Messages holding ``mark`` in what ``streams`` keep of the messages
    they sent (distributed keeps the last 1,000 under 1 MB). A logged
    message may hold a frame as a memoryview, which pickle refuses: it is
    pickled as the bytes it shows."""
    import io
    import pickle

    def dumped(message) -> bytes:
        out = io.BytesIO()
        pickler = pickle.Pickler(out)
        pickler.dispatch_table = {memoryview: lambda view: (bytes, (view.tobytes(),))}
        pickler.dump(message)
        return out.getvalue()

    return sum(mark in dumped(message) for stream in streams
               for message in stream.recent_message_log)


def _scheduler_logged_with(mark: bytes, dask_scheduler=None) -> int:
    return _logged_with(mark, [*dask_scheduler.stream_comms.values(),
                               *dask_scheduler.client_comms.values()])


def _worker_logged_with(mark: bytes, dask_worker=None) -> int:
    return _logged_with(mark, [dask_worker.batched_stream])


def test_piece_inputs_are_not_kept_in_the_clusters_message_logs(cluster, tmp_path):
    """A task that carried its piece's entries would stay, entries and all,
    in the scheduler's log of what it sent its worker; they go by scatter."""
    source = _BytesSource(60)
    fastdata.pack(source, tmp_path / "out.tfrecord", progress=False,
                  options=fastdata.PackOptions(shard_size=4),
                  scheduler=cluster.scheduler.address)
    with fastdata.open_reader(tmp_path / "out.tfrecord") as reader:
        assert len(reader) == 60
    assert cluster.run_on_scheduler(_scheduler_logged_with, _BytesSource.MARK) == 0
    assert set(cluster.run(_worker_logged_with, _BytesSource.MARK).values()) == {0}

"""Readers give back what they hold: descriptors when a dataset is dropped or
closed, a clear error when the descriptor limit is reached (no "corruption"),
and shared-memory blocks of killed processes are removed by the next cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import build_tree, run_python, uniform_spec

import fastdata
from fastdata import Decode
from fastdata.storage import shared_block

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
def datasets(tmp_path):
    """Manifests of a small tar and a small TFRecord dataset, two shards each."""
    tree = build_tree(tmp_path / "src", uniform_spec(("a", "b"), per_class=4, exts=(".png",)))
    out = {}
    for ext in (".tar", ".tfrecord"):
        fastdata.pack(tree.root, tmp_path / ext[1:] / f"x{ext}",
                      options=fastdata.PackOptions(shard_size=4, workers=1), progress=False)
        out[ext[1:]] = str(tmp_path / ext[1:] / f"x{ext}.fastdata.json")
    return out


def _held(folder: str) -> list[str]:
    """The files under ``folder`` this process has open, once per descriptor
    (the targets of /proc/self/fd, sorted)."""
    held = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since the listing (the listing's own descriptor)
            continue
        if target.startswith(folder + os.sep):
            held.append(target)
    return sorted(held)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
@pytest.mark.parametrize("fmt,cache,rounds", [("tar", None, 1000), ("tfrecord", None, 1000),
                                              ("tar", "ram", 300)])
def test_dropped_datasets_give_back_their_descriptors(datasets, fmt, cache, rounds):
    """Open and drop many datasets under a limit of 256 descriptors: no error,
    and the number of open descriptors stays flat."""
    code = """
        import json, os, resource, sys
        import fastdata
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        path, cache, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
        cache = None if cache == "-" else cache
        counts = []
        for i in range(rounds):
            ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"), cache=cache)
            ds[0], ds[len(ds) - 1]  # a descriptor for each shard
            del ds
            if i % 50 == 0:
                counts.append(len(os.listdir("/proc/self/fd")))
        print(json.dumps(counts))
    """
    proc = run_python(code, datasets[fmt], cache or "-", str(rounds), env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert max(counts[1:]) <= counts[1] + 1, counts  # +1: the resource tracker's pipe, once


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_with_and_close_give_back_descriptors(datasets):
    """A dataset holds one descriptor for each shard it has read and, closed,
    none of its files: judged by the files the descriptors name, not by their
    number, which a descriptor of another library or of pytest would change."""
    folder = os.path.dirname(os.path.realpath(datasets["tar"]))
    assert _held(folder) == []
    with fastdata.open_dataset(datasets["tar"], decode=Decode(output="bytes")) as ds:
        shards = sorted(os.path.realpath(p) for p in ds.reader.shard_paths)
        ds[0], ds[len(ds) - 1]  # a record of each of its 2 shards
        assert len(shards) == 2 and _held(folder) == shards
    assert _held(folder) == []
    folder = os.path.dirname(os.path.realpath(datasets["tfrecord"]))
    ds = fastdata.open_dataset(datasets["tfrecord"], decode=Decode(output="bytes"))
    first = os.path.realpath(ds.reader.shard_paths[0])
    ds[0]
    assert _held(folder) == [first]
    ds.close()
    assert _held(folder) == []
    assert ds[1][0]  # reopened on use
    assert _held(folder) == [first]
    ds.close()
    assert _held(folder) == []


@pytest.mark.parametrize("fmt,on_error", [("tar", "raise"), ("tfrecord", "skip")])
def test_exhausted_descriptor_limit_is_not_corruption(datasets, fmt, on_error):
    """Reading a shard with no descriptor left raises a FastDataError that says
    so and what to do, not a CorruptDataError (and skip mode does not hide it),
    map-style and streaming."""
    code = """
        import json, os, sys
        import fastdata
        from fastdata.errors import CorruptDataError, FastDataError
        path, on_error = sys.argv[1], sys.argv[2]
        as_bytes = fastdata.Decode(output="bytes")
        ds = fastdata.open_dataset(path, decode=as_bytes, on_error=on_error)
        stream = fastdata.ShardedIterableDataset(path, decode=as_bytes, on_error=on_error)
        held = []
        while True:  # use up every descriptor
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        out = []
        for read in (lambda: ds[0], lambda: list(stream)):
            try:
                read()
                out.append(None)
            except FastDataError as exc:
                out.append([type(exc).__name__, str(exc), exc.path])
        for fd in held:
            os.close(fd)
        out.append(len(ds[0][0]) > 0)  # fine again once descriptors are free
        print(json.dumps(out))
    """
    proc = run_python(code, datasets[fmt], on_error, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    *errors, recovered = json.loads(proc.stdout.strip().splitlines()[-1])
    for error in errors:
        assert error is not None
        name, message, path = error
        assert name == "FastDataError"
        assert "too many open files" in message and "ulimit -n" in message
        assert "close" in message
        # Names the file it could not read: a shard, or the index before it.
        assert path and os.path.basename(path).startswith(("x-", "x.tar.fastdata.index",
                                                           "x.tfrecord.fastdata.index"))
    assert recovered


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_block_of_a_killed_process_is_removed_by_the_next_cache(datasets):
    """kill -9 of a whole process group (Python's resource tracker included)
    leaves the RAM cache's block in /dev/shm; the next cache removes it."""
    code = """
        import os, signal, sys
        import fastdata
        ds = fastdata.open_dataset(sys.argv[1], cache="ram")
        print(ds.cache.name, flush=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), datasets["tar"]],
                          capture_output=True,
                          text=True, timeout=120, env=_env(), start_new_session=True)
    assert proc.returncode == -9, proc.stderr[-3000:]
    name = proc.stdout.strip()
    assert name.startswith("fastdata-")
    block = Path("/dev/shm") / name
    assert block.exists()
    ds = fastdata.open_dataset(datasets["tar"], cache="ram")
    try:
        assert not block.exists()
        assert (Path("/dev/shm") / ds.cache.name).exists()  # its own block stays
    finally:
        ds.close()
        ds.cache.close()


def test_only_blocks_of_dead_processes_of_this_namespace_are_removed(tmp_path):
    dead = subprocess.Popen(["true"])  # a pid that no longer runs
    dead.wait()
    ns = shared_block._pid_namespace()
    me, start = os.getpid(), shared_block._start_time(os.getpid()) or 0
    names = {
        f"fastdata-{ns}-{dead.pid}-0-aaaa": False,  # creator gone
        f"fastdata-{ns}-{me}-{start + 1}-bbbb": not start,  # this pid, another process
        f"fastdata-{ns}-{me}-{start}-cccc": True,  # this process
        f"fastdata-{ns + 1}-{dead.pid}-0-dddd": True,  # another namespace: not ours to judge
        "fastdata-notours": True,
        "psm_12345": True,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = shared_block.remove_stale_blocks(str(tmp_path))
    assert sorted(removed) == sorted(n for n, kept in names.items() if not kept)
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, kept in names.items() if kept)

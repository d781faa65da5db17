"""Publishing an output safely (issue 10): an overwrite removes only what it can
prove it wrote (item 1); an interrupted overwrite keeps the old dataset whole
(item 12); two packs never write one output at once (item 11); a full disk is
one clear error and leaves the old dataset as it was (item 10); files reach the
disk before they are renamed into place (item 13)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import Interrupt, build_tree, list_partials, uniform_spec
from PIL import Image

import fastdata
import fastdata.formats.output
from fastdata.cli import main
from fastdata.errors import FastDataError, OutputExistsError
from fastdata.packers.pack import PackOptions

#: (case, output name, pack options): every format, sharded formats also sharded.
CASES = [
    ("tar", "out.tar", {}),
    ("tar-sharded", "out-%06d.tar", {"shard_size": 3}),
    ("tfrecord", "out.tfrecord", {}),
    ("tfrecord-sharded", "out.tfrecord", {"shard_size": 3}),
    ("lmdb", "out.lmdb", {}),
    ("hdf5", "out.h5", {}),
]
SHARDED = [c for c in CASES if c[0].startswith(("tar", "tfrecord"))]
IDS = [c[0] for c in CASES]
#: Child processes import this checkout's fastdata.
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [str(Path(fastdata.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def trees(tmp_path):
    """Two different sources: the old dataset's and the new one's (more records, so
    with 3 records a shard the new packs have more shards than the old ones: some
    shard names are new, some are the old ones')."""
    old = build_tree(tmp_path / "old-src", uniform_spec(("cat", "dog"), 4), seed=1)
    new = build_tree(tmp_path / "new-src", uniform_spec(("cat", "dog", "eel", "fox"), 3),
                     seed=2)
    return old, new


def pack(src, out, **options):
    return fastdata.pack(src, out, options=PackOptions(workers=1, **options), progress=False)


def records(path) -> list[tuple[str, bytes, int]]:
    """Every record of the dataset at ``path``: (key, bytes, label)."""
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
    try:
        return [(ds.keys[i], *ds[i]) for i in range(len(ds))]
    finally:
        ds.reader.close()


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def hidden_leftovers(folder) -> list[str]:
    """Temporary, set-aside and lock entries left in ``folder``."""
    return sorted(n for n in os.listdir(folder)
                  if n.startswith(".") or "partial" in n or n.endswith(".old"))


def sharded_files(manifest_path) -> set[str]:
    """The files a sharded dataset consists of, from its manifest (a tar
    dataset's with timm's ``_info.json``, which the folder's tar datasets share)."""
    m = json.loads(Path(manifest_path).read_text(encoding="utf-8"))
    names = {os.path.basename(manifest_path), m["extra"]["index"], m["extra"]["keys"],
             m["extra"]["index_pieces"]["file"], m["extra"]["keys_pieces"]["file"]}
    if m["format"] == "tar":
        names.add("_info.json")
    for s in m["shards"]:
        names.add(s["path"])
        if m["format"] == "tfrecord":
            names.add(s["path"] + ".idx")
    return names


# -- item 1: overwrite removes only what it can prove it wrote -------------------------


@pytest.mark.parametrize("ext", [".tar", ".tfrecord"])
def test_overwrite_never_removes_paths_an_old_manifest_names_outside(tmp_path, trees, ext):
    old, new = trees
    out_dir = tmp_path / "out"
    pack(old.root, out_dir / f"a{ext}", shard_size=3)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "important.txt").write_text("keep me")
    (victim / "important.txt.idx").write_text("keep me too")
    abs_dir = tmp_path / "abs" / "dir"
    (abs_dir / "sub").mkdir(parents=True)
    (abs_dir / "sub" / "file").write_text("keep")
    # Names that look like this output's shards but are a folder and a symlink,
    # and a plain file of the user's.
    folder = out_dir / f"a-{7:06d}{ext}"
    folder.mkdir()
    (folder / "inside").write_text("keep")
    link = out_dir / f"a-{8:06d}{ext}"
    link.symlink_to(victim / "important.txt")
    (out_dir / "notes.txt").write_text("mine")
    manifest_path = out_dir / f"a{ext}.fastdata.json"
    m = json.loads(manifest_path.read_text(encoding="utf-8"))
    m["shards"] += [{"path": "../victim/important.txt"}, {"path": str(abs_dir)},
                    {"path": folder.name}, {"path": link.name}, {"path": "notes.txt"}]
    manifest_path.write_text(json.dumps(m), encoding="utf-8")

    result = invoke("pack", new.root, out_dir / f"a{ext}", "--overwrite", "--no-progress",
                    "--workers", "1")
    assert result.exit_code == 0, result.output

    assert (victim / "important.txt").read_text() == "keep me"
    assert (victim / "important.txt.idx").read_text() == "keep me too"
    assert (abs_dir / "sub" / "file").read_text() == "keep"
    assert (folder / "inside").read_text() == "keep"
    assert link.is_symlink() and link.read_text() == "keep me"
    assert (out_dir / "notes.txt").read_text() == "mine"
    assert [r[0] for r in records(manifest_path)] == new.keys


@pytest.mark.parametrize("case,name,options", SHARDED, ids=[c[0] for c in SHARDED])
def test_overwrite_removes_the_old_shards_it_wrote(tmp_path, trees, case, name, options):
    """The old dataset's own files go (more old shards than new ones included);
    what is left is exactly the new dataset."""
    old, new = trees
    out = tmp_path / "out" / name
    pack(new.root, out, **options)  # 12 records
    pack(old.root, out, overwrite=True, shard_size=1)  # 8 shards: more names than before
    summary = pack(new.root, out, overwrite=True, **options)
    assert set(os.listdir(out.parent)) == sharded_files(summary.output)
    assert [r[0] for r in records(summary.output)] == new.keys


# -- item 12: an interrupted overwrite keeps the old dataset ---------------------------


@pytest.mark.parametrize("call", ["replace", "link", "remove"])
@pytest.mark.parametrize("case,name,options", CASES + [("lmdb-two-renames", "out.lmdb", {})],
                         ids=IDS + ["lmdb-two-renames"])
def test_interrupted_overwrite_leaves_the_old_or_the_new_dataset(
        tmp_path, monkeypatch, trees, case, name, options, call):
    """Interrupted at every rename, link and removal of the publish, the dataset
    at the path reads fully as the old or the new one; the next pack cleans up.
    (A folder output is swapped in one step where the system can; the
    "two-renames" case takes the other way, for systems that cannot.)"""
    if case == "lmdb-two-renames":
        monkeypatch.setattr(fastdata.formats.output, "exchange_paths", lambda a, b: False)
    old, new = trees
    reference = tmp_path / "reference" / name
    new_records = records(pack(new.root, reference, **options).output)
    out = tmp_path / "out" / name
    output = pack(old.root, out, **options).output
    old_records = records(output)
    old_files = set(os.listdir(out.parent))
    for n in range(1, 100):
        with monkeypatch.context() as m:
            patch = Interrupt(m, call, n)
            try:
                pack(new.root, out, overwrite=True, **options)
                finished = True
            except KeyboardInterrupt:
                finished = False
        got = records(output)
        assert got == old_records or got == new_records, (call, n)
        assert not list_partials(out.parent), (call, n)
        if finished:
            assert got == new_records
            assert patch.calls < n
            break
        # The next overwrite publishes cleanly and leaves nothing of the interrupted one.
        pack(old.root, out, overwrite=True, **options)
        assert records(output) == old_records
        assert set(os.listdir(out.parent)) == old_files, (call, n)
    else:
        pytest.fail("the pack never finished")


_KILLED_PACK = """
    import os, signal, sys
    import fastdata
    from fastdata.packers.pack import PackOptions

    real, calls = os.replace, []

    def replace(*args, **kwargs):
        calls.append(1)
        if len(calls) == int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup of any kind
        return real(*args, **kwargs)

    os.replace = replace
    fastdata.pack(sys.argv[1], sys.argv[2], options=PackOptions(
        workers=1, overwrite=True, shard_size=3), progress=False)
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["out.tfrecord", "out-%06d.tar"])
def test_overwrite_killed_at_any_rename_keeps_a_whole_dataset(tmp_path, trees, name):
    """``kill -9`` at every rename of an overwrite: the dataset reads as the old
    or the new one, and the next overwrite leaves no set-aside file behind."""
    old, new = trees
    new_records = records(pack(new.root, tmp_path / "reference" / name, shard_size=3).output)
    out = tmp_path / "out" / name
    for n in range(1, 100):
        output = pack(old.root, out, overwrite=True, shard_size=3).output
        old_records = records(output)
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED_PACK),
                               str(new.root), str(out), str(n)],
                              capture_output=True, text=True, timeout=120, env=ENV)
        got = records(output)
        assert got == old_records or got == new_records, n
        if proc.returncode == 0:
            assert got == new_records
            break
        assert proc.returncode == -9, proc.stderr
    else:
        pytest.fail("the pack never finished")
    pack(old.root, out, overwrite=True, shard_size=3)
    assert [n for n in hidden_leftovers(out.parent) if ".partial-" not in n] == []


# -- item 11: one pack per output at a time --------------------------------------------

_SLOW_PACK = """
    import os, sys, time
    import fastdata
    from fastdata.packers.pack import PackOptions
    from fastdata.packers.source import ImageFolderSource

    class WaitingSource(ImageFolderSource):
        def __iter__(self):
            while not os.path.exists(sys.argv[3]):
                time.sleep(0.02)
            yield from super().__iter__()

    fastdata.pack(WaitingSource(sys.argv[1]), sys.argv[2],
                  options=PackOptions(workers=1), progress=False)
"""


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "fastdata.cli", *map(str, args)]


@pytest.mark.slow
@pytest.mark.parametrize("case,name,options", CASES, ids=IDS)
def test_a_second_pack_to_the_same_output_fails_while_the_first_runs(
        tmp_path, trees, case, name, options):
    src = trees[1]
    out = tmp_path / "out" / name
    out.parent.mkdir()
    go = tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SLOW_PACK), str(src.root),
                              str(out), str(go)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not any(".partial-" in n for n in os.listdir(out.parent)):  # it is writing
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first pack never started writing"
            time.sleep(0.05)
        second = subprocess.run(_cli("pack", src.root, out, "--no-progress"),
                                capture_output=True, text=True, timeout=120, env=ENV)
    finally:
        go.touch()
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert second.returncode == 1, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), second.stderr
    assert str(out) in lines[0] and "another pack is writing this output" in lines[0]
    assert [r[0] for r in records(out)] == src.keys
    assert hidden_leftovers(out.parent) == []


@pytest.mark.slow
@pytest.mark.parametrize("ext", [".tar", ".tfrecord"])
def test_two_packs_started_together_one_wins(tmp_path, trees, ext):
    """Neither with overwrite: exactly one succeeds, the other says why."""
    src = trees[1]
    for attempt in range(2):
        out = tmp_path / f"out{attempt}" / f"data{ext}"
        procs = [subprocess.Popen(_cli("pack", src.root, out, "--no-progress",
                                       "--shard-size", "2"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=ENV)
                 for _ in range(2)]
        results = [(p.wait(timeout=120), p.communicate()[1]) for p in procs]
        codes = sorted(rc for rc, _ in results)
        assert codes == [0, 1], results
        err = next(e for rc, e in results if rc == 1).strip()
        assert err.startswith("error:") and len(err.splitlines()) == 1, err
        assert "another pack is writing" in err or "exists" in err, err
        assert [r[0] for r in records(out)] == src.keys
        assert hidden_leftovers(out.parent) == []


def test_the_lock_is_released_after_a_pack_and_after_a_failure(tmp_path, trees):
    old, new = trees
    out = tmp_path / "out" / "data.tar"
    pack(old.root, out)
    with pytest.raises(OutputExistsError):
        pack(new.root, out)  # refused: exists
    pack(new.root, out, overwrite=True)
    assert hidden_leftovers(out.parent) == []


# -- item 10: a full disk ----------------------------------------------------------------


def _noise_tree(root: Path, count: int, size: int = 160) -> None:
    """Random-pixel PNGs (incompressible): ``count`` images in two classes."""
    rng = np.random.default_rng(7)
    for i in range(count):
        folder = root / ("ab"[i % 2])
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:03d}.png")


@pytest.fixture(scope="module")
def big_source(tmp_path_factory) -> Path:
    """About 3 MB of images: more than the small disk holds."""
    root = tmp_path_factory.mktemp("big") / "src"
    _noise_tree(root, 40)
    return root


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (needs root); skipped where it cannot be mounted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


_CHUNKED_H5 = """
    import sys
    import fastdata
    from fastdata.cli.group import _handle_errors
    from fastdata.packers.pack import PackOptions

    # Small chunks and flushes: the payload is written while packing (not all at
    # the end), so the disk fills inside HDF5's chunked writes.
    _handle_errors(fastdata.pack)(sys.argv[1], sys.argv[2], options=PackOptions(
        overwrite=True, writer_options={"chunk_bytes": 65536, "flush_bytes": 65536}),
        progress=False)
"""


def _assert_disk_full_line(proc, out):
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error:") and "Traceback" not in proc.stderr
    assert str(out) in lines[0] and "disk is full" in lines[0] and "free" in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("case,name,options", CASES + [("hdf5-chunked", "out.h5", {})],
                         ids=IDS + ["hdf5-chunked"])
def test_a_full_disk_is_one_error_and_keeps_the_old_dataset(
        tmp_path, small_disk, big_source, case, name, options):
    small = build_tree(tmp_path / "small-src", uniform_spec(("cat", "dog"), 2), seed=3)
    out = small_disk / name
    output = pack(small.root, out, **options).output
    old_records = records(output)
    if case == "hdf5-chunked":
        cmd = [sys.executable, "-c", textwrap.dedent(_CHUNKED_H5), str(big_source), str(out)]
    else:
        shard = ["--shard-size", str(options["shard_size"])] if "shard_size" in options else []
        cmd = _cli("pack", big_source, out, "--overwrite", "--no-progress", *shard)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV)
    _assert_disk_full_line(proc, out)
    assert records(output) == old_records
    assert hidden_leftovers(small_disk) == []


@pytest.mark.parametrize("where", ["_write", "_close"])
@pytest.mark.parametrize("case,name,options", CASES, ids=IDS)
def test_no_space_while_writing_is_one_fastdata_error(
        tmp_path, monkeypatch, trees, case, name, options, where):
    """Without a small disk to fill: the writer's own write or close fails with
    ENOSPC (as the file system would say it)."""
    old, new = trees
    out = tmp_path / "out" / name
    output = pack(old.root, out, **options).output
    old_records = records(output)
    writer_cls = fastdata.formats.format_for_output(str(out)).load_writer()
    real = getattr(writer_cls, where)
    calls = []

    def no_space(self, *args):
        calls.append(1)
        if len(calls) >= 3 or where == "_close":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args)

    monkeypatch.setattr(writer_cls, where, no_space)
    with pytest.raises(FastDataError) as info:
        pack(new.root, out, overwrite=True, **options)
    message = str(info.value)
    assert "disk is full" in message and "free" in message and str(out) in message
    result = invoke("pack", new.root, out, "--overwrite", "--no-progress", "--workers", "1",
                    *(["--shard-size", options["shard_size"]] if options else []))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "disk is full" in lines[0]
    assert records(output) == old_records
    assert hidden_leftovers(out.parent) == []


_FAILING_PACKS = """
    import errno, sys
    import fastdata
    from fastdata.errors import FastDataError
    from fastdata.formats.tar.writer import TarWriter
    from fastdata.packers.pack import PackOptions

    real = TarWriter._write

    def no_space(self, record, crc):
        if record.index >= 8:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, record, crc)

    TarWriter._write = no_space
    for attempt in range(8):
        try:
            fastdata.pack(sys.argv[1], sys.argv[2], options=PackOptions(
                workers=2, overwrite=True), progress=False)
        except FastDataError:
            print("failed cleanly", flush=True)
"""


@pytest.mark.slow
def test_a_write_failure_with_work_in_flight_ends_the_workers(tmp_path):
    """The writer fails while worker processes still hold results bigger than a
    pipe holds: the pack ends with its error instead of waiting for ever in
    ``Pool.terminate()`` (it did in about one pack in three)."""
    _noise_tree(tmp_path / "src", 60, size=256)  # ~200 KB a result
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_FAILING_PACKS),
                           str(tmp_path / "src"), str(tmp_path / "out" / "data.tar")],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("failed cleanly") == 8


# -- item 13: fsync before rename ----------------------------------------------------------


def _assert_synced(src: str, synced: list[str]) -> None:
    """``src`` (a file, or a folder: every file in it and itself) was fsynced."""
    if os.path.isdir(src):
        wanted = [os.path.join(r, f) for r, _, fs in os.walk(src) for f in fs] + [src]
    else:
        wanted = [src]
    missing = [p for p in wanted if p not in synced]
    assert not missing, f"renamed {src} before fsyncing {missing}"


@pytest.mark.parametrize("case,name,options", CASES, ids=IDS)
def test_every_file_is_fsynced_before_it_is_renamed_into_place(
        tmp_path, monkeypatch, trees, case, name, options):
    old, new = trees
    out = tmp_path / "out" / name
    pack(old.root, out, **options)
    synced: list[str] = []
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")))
        events.append(("fsync", synced[-1]))
        return real_fsync(fd)

    def replace(src, dst, **kwargs):
        if ".partial-" in os.fspath(src):  # new data moving in (not an old output moving out)
            _assert_synced(os.path.realpath(src), synced)
        events.append(("replace", os.path.realpath(dst)))
        return real_replace(src, dst, **kwargs)

    real_exchange = fastdata.formats.output.exchange_paths

    def exchange(a, b):
        _assert_synced(os.path.realpath(a), synced)
        events.append(("replace", os.path.realpath(b)))
        return real_exchange(a, b)

    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc to name fsynced descriptors")
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(fastdata.formats.output, "exchange_paths", exchange)
    pack(new.root, out, overwrite=True, **options)
    monkeypatch.undo()
    renames = [i for i, (kind, _) in enumerate(events) if kind == "replace"]
    assert renames
    # The folder itself is synced after the last rename, so the renames are durable.
    assert ("fsync", os.path.realpath(out.parent)) in events[renames[-1]:]

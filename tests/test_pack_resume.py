"""``pack --resume``: a pack killed at any point (SIGKILL, Ctrl-C) continues
where it stopped, and the result is the one an uninterrupted pack gives.

The packs to interrupt run in a child process that SIGKILLs itself at a chosen
point (the Nth call of a function on the pack's path), so the kill lands where
the test says, and nothing of the dying process gets to clean up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import fastdata
from fastdata.cli import main
from fastdata.packers.plan import ResumeRefused
from conftest import build_tree, list_partials, uniform_spec
from worker_pids import PreparedIn, assert_other_processes, assert_this_process

FORMATS = {"tar": ("out-%06d.tar", "out.tar.fastdata.json"),
           "tfrecord": ("out-%05d.tfrecord", "out.tfrecord.fastdata.json"),
           "lmdb": ("out.lmdb", "out.lmdb"), "hdf5": ("out.h5", "out.h5")}
#: LMDB and HDF5 pieces are commits of this many images here (1000 by default),
#: in the child and in the test, so 30 images make several.
PIECE = 4

#: The child: pack SRC into OUT (shards of 4), dying by SIGKILL at the Nth call
#: of the function named by POINT.
_KILLED_PACK = r"""
import os, signal, sys
import fastdata
from fastdata.packers.options import PackOptions
from fastdata.packers.preprocess import Preprocess

src, out, point, nth, resize = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
shard_size = int(sys.argv[6]) if sys.argv[6] else None

def killing(owner, name, after=False):
    original = getattr(owner, name)
    calls = [0]
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth and not after:
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(*args, **kwargs)
        if calls[0] == nth and after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    setattr(owner, name, wrapper)

import fastdata.packers.plan as plan
plan.SINGLE_FILE_PIECE_ENTRIES = 4
import fastdata.packers.journal as journal
import fastdata.formats.writer as writer
import fastdata.formats.sharded.writer as sharded
import fastdata.formats.sharded.publish as publish
if point == "scan":
    killing(plan, "_plan_entry")
elif point == "mid-shard":
    killing(writer.Writer, "write")
elif point == "between-shards":
    killing(journal.PackJournal, "record", after=True)
elif point == "manifest":
    killing(sharded.Manifest, "to_dict")  # the same class for every format
elif point == "publish" and shard_size:
    killing(publish.os, "replace")  # after some shards moved to their names
elif point == "publish":
    nth = 1
    killing(writer.Writer, "_publish")
pre = Preprocess(resize=int(resize)) if resize != "0" else Preprocess()
fastdata.pack(src, out, options=PackOptions(shard_size=shard_size, workers=1, preprocess=pre),
              progress=False)
print("FINISHED")
"""


def _killed_pack(src, out, point: str, nth: int, resize: int = 0, sharded: bool = True
                 ) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILLED_PACK, str(src), str(out), point,
                           str(nth), str(resize), "4" if sharded else ""],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)


def _files(folder) -> dict[str, bytes]:
    """Every visible file of a dataset folder by path, the manifest sidecar
    apart, and LMDB's lock file (process state)."""
    found = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith(".") and not name.endswith("fastdata.json") \
                    and name != "lock.mdb":
                path = os.path.join(root, name)
                found[os.path.relpath(path, folder)] = open(path, "rb").read()
    return found


def _manifest(path) -> dict:
    data = fastdata.open_dataset(path).manifest.to_dict()
    data.pop("created_at")
    return data


def _records(path) -> list:
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
    return [ds[i] for i in range(len(ds))] + [ds.keys]


def _same_dataset(got, expected, fmt: str) -> None:
    """Identical output: sharded formats byte for byte (the manifest apart from
    its time); LMDB and HDF5 hold that time inside their file, so their records,
    keys and manifests are compared."""
    name, manifest = FORMATS[fmt]
    assert _manifest(got / manifest) == _manifest(expected / manifest)
    if fmt in ("tar", "tfrecord"):
        assert _files(got) == _files(expected)
    else:
        assert _records(got / name) == _records(expected / name)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    # 30 images: 8 shards of 4 (the last of 2).
    return build_tree(tmp_path_factory.mktemp("resume") / "src",
                      uniform_spec(classes=("cat", "dog", "eel"), per_class=10))


@pytest.fixture(scope="module")
def reference(tree, tmp_path_factory):
    """An uninterrupted pack of each format, for comparison."""
    refs = {}
    for fmt, (name, _) in FORMATS.items():
        folder = tmp_path_factory.mktemp(f"ref-{fmt}")
        with pytest.MonkeyPatch.context() as m:
            m.setattr(fastdata.packers.plan, "SINGLE_FILE_PIECE_ENTRIES", PIECE)
            fastdata.pack(tree.root, folder / name, options=_options(fmt, workers=1),
                          progress=False)
        refs[fmt] = folder
    return refs


def _options(fmt: str, **kwargs) -> fastdata.PackOptions:
    if fmt in ("tar", "tfrecord"):
        kwargs["shard_size"] = 4
    return fastdata.PackOptions(**kwargs)


# Killed while publishing, after its last two commits, an LMDB resumes with the
# same records and manifest but pages placed otherwise (LMDB keeps only the
# commit before the last): test_lmdb_killed_while_publishing_resumes.
_KILLS = [(fmt, point, nth) for fmt in sorted(FORMATS)
          for point, nth in [("scan", 7), ("mid-shard", 10), ("between-shards", 3),
                             ("manifest", 1), ("publish", 3)]
          if (fmt, point) != ("lmdb", "publish")]


@pytest.mark.parametrize("fmt,point,nth", _KILLS)
def test_killed_pack_resumes_to_identical_output(tmp_path, monkeypatch, tree, reference, fmt,
                                                 point, nth):
    monkeypatch.setattr(fastdata.packers.plan, "SINGLE_FILE_PIECE_ENTRIES", PIECE)
    name, manifest = FORMATS[fmt]
    _killed_pack(tree.root, tmp_path / name, point, nth, sharded=fmt in ("tar", "tfrecord"))
    assert not (tmp_path / manifest).exists()  # nothing looks complete
    summary = fastdata.pack(tree.root, tmp_path / name, options=_options(fmt, resume=True),
                            progress=False)
    assert summary.records == 30
    _same_dataset(tmp_path, reference[fmt], fmt)
    assert list_partials(tmp_path) == []
    assert not any(n.endswith(".pack-state") for n in os.listdir(tmp_path))


def test_resume_keeps_finished_shards(tmp_path, tree):
    """A resume prepares only the pieces the interrupted pack did not finish."""
    _killed_pack(tree.root, tmp_path / "out-%06d.tar", "between-shards", 5)
    prepared = []
    code = textwrap.dedent(f"""
        import fastdata, fastdata.packers.pieces as pieces
        seen = []
        original = pieces.entries_to_prepare
        def counting(*args):
            for entry in original(*args):
                seen.append(entry.key)
                yield entry
        import fastdata.packers.pack as pack
        pack.entries_to_prepare = counting
        fastdata.pack({str(tree.root)!r}, {str(tmp_path / "out-%06d.tar")!r},
                      options=fastdata.PackOptions(shard_size=4, resume=True), progress=False)
        print(len(seen))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    prepared = int(proc.stdout.split()[-1])
    assert prepared == 30 - 5 * 4  # 5 shards of 4 were journaled and kept


def test_resume_with_changed_options_is_refused_and_keeps_the_partial(tmp_path, tree):
    _killed_pack(tree.root, tmp_path / "out-%06d.tar", "between-shards", 2)
    with pytest.raises(ResumeRefused, match=r"shard_size 5 \(was 4\)"):
        fastdata.pack(tree.root, tmp_path / "out-%06d.tar",
                      options=fastdata.PackOptions(shard_size=5, resume=True), progress=False)
    result = CliRunner().invoke(main, ["pack", str(tree.root), str(tmp_path / "out-%06d.tar"),
                                       "--shard-size", "4", "--resize", "8", "--resume"])
    assert result.exit_code == 1
    assert "preprocess" in result.output and "--resume" in result.output
    assert "Traceback" not in result.output
    # The tar options are pack options like any other: member names and timm's split.
    for flag, named in ((["--source-extensions"], "source_extensions"),
                        (["--split", "other"], "split")):
        result = CliRunner().invoke(main, ["pack", str(tree.root),
                                           str(tmp_path / "out-%06d.tar"),
                                           "--shard-size", "4", *flag, "--resume"])
        assert result.exit_code == 1 and named in result.output, result.output
    # Refusals change nothing: the right options still resume.
    summary = fastdata.pack(tree.root, tmp_path / "out-%06d.tar",
                            options=fastdata.PackOptions(shard_size=4, resume=True),
                            progress=False)
    assert summary.records == 30


def test_resume_with_a_changed_source_is_refused(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(classes=("a", "b"), per_class=6))
    _killed_pack(tree.root, tmp_path / "out" / "out-%06d.tar", "between-shards", 1)
    modified, removed = tree.samples[0].key, tree.samples[-1].key
    (tree.root / modified).write_bytes(tree.samples[0].data + b"more")
    os.remove(tree.root / removed)
    with pytest.raises(ResumeRefused) as info:
        fastdata.pack(tree.root, tmp_path / "out" / "out-%06d.tar",
                      options=fastdata.PackOptions(shard_size=4, resume=True), progress=False)
    text = str(info.value)
    assert f"1 file removed (first: {removed})" in text
    assert f"1 file modified (first: {modified})" in text


def test_ctrl_c_keeps_the_pieces_and_says_how_to_resume(tmp_path, tree, reference):
    """SIGINT to the CLI: the finished shards stay, the message names --resume."""
    out = tmp_path / "out-%06d.tar"
    code = textwrap.dedent(f"""
        import os, signal, sys
        # A runner started in the background passes SIGINT on ignored: Ctrl-C's own handler.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import fastdata.packers.journal as journal
        original = journal.PackJournal.record
        calls = [0]
        def record(self, *args):
            original(self, *args)
            calls[0] += 1
            if calls[0] == 3:
                os.kill(os.getpid(), signal.SIGINT)
        journal.PackJournal.record = record
        from fastdata.cli import main
        sys.argv = ["fastdata", "pack", {str(tree.root)!r}, {str(out)!r}, "--shard-size", "4",
                    "--workers", "1", "--no-progress"]
        main()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "--resume" in proc.stderr, proc.stderr
    state = tmp_path / ".out.tar.pack-state"
    assert len((state / "journal.jsonl").read_text().splitlines()) == 3
    result = CliRunner().invoke(main, ["pack", str(tree.root), str(out), "--shard-size", "4",
                                       "--resume"])
    assert result.exit_code == 0, result.output
    _same_dataset(tmp_path, reference["tar"], "tar")


def test_a_pack_without_resume_starts_over_and_cleans_up(tmp_path, tree, reference):
    _killed_pack(tree.root, tmp_path / "out-%06d.tar", "mid-shard", 9)
    events = []
    fastdata.pack(tree.root, tmp_path / "out-%06d.tar",
                  options=fastdata.PackOptions(shard_size=4), progress=False,
                  on_event=events.append)
    assert any("--resume would have continued it" in e for e in events)
    _same_dataset(tmp_path, reference["tar"], "tar")
    assert list_partials(tmp_path) == []
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []


def test_a_damaged_kept_shard_is_packed_again(tmp_path, tree, reference):
    _killed_pack(tree.root, tmp_path / "out-%06d.tar", "between-shards", 4)
    (partial,) = [n for n in list_partials(tmp_path) if not n.endswith(".records")]
    victim = tmp_path / partial / "piece-000001.tar"
    data = bytearray(victim.read_bytes())
    data[700] ^= 0xFF
    victim.write_bytes(bytes(data))
    events = []
    fastdata.pack(tree.root, tmp_path / "out-%06d.tar",
                  options=fastdata.PackOptions(shard_size=4, resume=True), progress=False,
                  on_event=events.append)
    assert any("piece 1 of the interrupted pack is not whole" in e for e in events)
    _same_dataset(tmp_path, reference["tar"], "tar")


def test_resume_after_a_kill_during_scanning_packs_from_the_start(tmp_path, tree, reference):
    _killed_pack(tree.root, tmp_path / "out-%06d.tar", "scan", 3)
    events = []
    fastdata.pack(tree.root, tmp_path / "out-%06d.tar",
                  options=fastdata.PackOptions(shard_size=4, resume=True), progress=False,
                  on_event=events.append)
    assert any("packing from the start" in e for e in events)
    _same_dataset(tmp_path, reference["tar"], "tar")
    assert list_partials(tmp_path) == []


def test_a_skipped_image_leaves_its_shard_one_record_short(tmp_path):
    """Shards are cut on the plan's entries, so a bad image does not move the
    later shards' boundaries (a cluster pack and a resumed one cut alike)."""
    tree = build_tree(tmp_path / "src", uniform_spec(classes=("a",), per_class=8))
    (tree.root / tree.samples[1].key).write_bytes(b"not an image")
    summary = fastdata.pack(tree.root, tmp_path / "out" / "o-%06d.tar",
                            options=fastdata.PackOptions(shard_size=4), progress=False)
    manifest = json.loads(open(summary.output).read())
    assert [s["count"] for s in manifest["shards"]] == [3, 4]


def test_resume_is_refused_for_a_url_output(tmp_path, tree):
    with pytest.raises(fastdata.FastDataError, match="--resume of a pack to a URL"):
        fastdata.pack(tree.root, "s3://bucket/out.tar",
                      options=fastdata.PackOptions(resume=True), progress=False)


def test_lmdb_killed_while_publishing_resumes(tmp_path, monkeypatch, tree, reference):
    monkeypatch.setattr(fastdata.packers.plan, "SINGLE_FILE_PIECE_ENTRIES", PIECE)
    _killed_pack(tree.root, tmp_path / "out.lmdb", "publish", 1, sharded=False)
    fastdata.pack(tree.root, tmp_path / "out.lmdb", options=_options("lmdb", resume=True),
                  progress=False)
    assert _records(tmp_path / "out.lmdb") == _records(reference["lmdb"] / "out.lmdb")
    got, expected = (_manifest(p / "out.lmdb") for p in (tmp_path, reference["lmdb"]))
    for m in (got, expected):
        m.pop("bytes")
        m.pop("shards")
    assert got == expected


def test_hdf5_pieces_with_worker_processes(tmp_path, monkeypatch):
    """Pack workers forked while the HDF5 file is open hold its descriptor: the
    file closed and opened again at a piece end must not trip over HDF5's own
    file lock (the output's lock already keeps other packs out)."""
    monkeypatch.setattr(fastdata.packers.plan, "SINGLE_FILE_PIECE_ENTRIES", 8)
    tree = build_tree(tmp_path / "src", uniform_spec(classes=("a", "b"), per_class=24))
    outputs = {}
    for workers in (1, 2):  # 48 images: 2 worker processes
        out = tmp_path / f"w{workers}.h5"
        log = tmp_path / f"prepared-{workers}.pids"  # the processes preparing the images
        fastdata.pack(tree.root, out, options=fastdata.PackOptions(
            workers=workers, writer_options={"chunk_bytes": 4096, "flush_bytes": 4096},
            preprocess=PreparedIn(log=str(log), meet=workers)), progress=False)
        outputs[workers] = _records(out)
    assert_this_process(tmp_path / "prepared-1.pids")
    assert_other_processes(tmp_path / "prepared-2.pids", count=2)
    assert outputs[1] == outputs[2]

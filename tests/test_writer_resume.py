"""Resumable single-file writers (LMDB, HDF5): pieces, a SIGKILL, and a resume.

A child process writes pieces and prints each piece's state after its
``end_piece`` (that output stands for the pack's journal), then kills itself
with SIGKILL at a chosen point. The test reopens the partial output with
``resume_path``, adopts the printed pieces, writes the rest and finishes; the
result must hold the records of an uninterrupted pack (read back with
``fastdata.open_dataset``), with the same payload SHA-256 and manifest.

Byte identity (see each format's writer):

- LMDB: a resumed ``data.mdb`` is byte-identical to an uninterrupted one,
  after a kill anywhere in a piece or between pieces, a piece committed but
  never journaled included (that commit is taken back whole). Only keys left
  by an interrupted ``finish`` are deleted by a commit of their own (same
  records, other page placement). A piece-mode pack whose pieces are a plain
  pack's commit batches has its records, manifest and page layout; the files
  differ in the unused bytes of some pages (see ``LMDBWriter._fresh_env``).
- HDF5: a resumed file is byte-identical to an uninterrupted piece-mode file.
  A piece-mode file that writes chunks before ``finish`` differs from a plain
  one in layout and ``on_disk`` (it is reopened at each such piece end, and
  HDF5 forgets its free space); one that does not (a payload under
  ``flush_bytes``) equals it byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import zlib
from pathlib import Path

import pytest
from conftest import lmdb_put, run_python, truncate_to_half

import fastdata
from fastdata.formats.hdf5.writer import HDF5Writer
from fastdata.formats.lmdb.writer import LMDBWriter
from fastdata.formats.writer import PieceLost
from fastdata.records import Manifest, PieceRecord, Record

#: The records every run writes, and how they are cut into pieces; run by the
#: child process too, so both sides build the very same records.
PLAN = '''
import hashlib

COUNT = 150
PIECE = 20


def payload(i):
    size = 5000 if i % 17 == 3 else 40 + (i * 7919) % 700
    seed = hashlib.sha256(b"%d" % i).digest()
    return (seed * (size // len(seed) + 1))[:size]


def record_args(i):
    return i, f"c{i % 3}/{i:04d}.bin", i % 3, payload(i), "raw"


def pieces():
    return [range(s, min(s + PIECE, COUNT)) for s in range(0, COUNT, PIECE)]
'''
_plan: dict = {}
exec(PLAN, _plan)
COUNT, PIECE, payload, record_args, pieces = (
    _plan[name] for name in ("COUNT", "PIECE", "payload", "record_args", "pieces"))

WRITERS = {"lmdb": LMDBWriter, "hdf5": HDF5Writer}
#: Small chunks and flushes (HDF5) so a pack has several chunks and flushes.
OPTIONS = {"lmdb": {}, "hdf5": {"chunk_bytes": 1024, "flush_bytes": 4096}}
NAMES = {"lmdb": "out.lmdb", "hdf5": "out.h5"}

CHILD = PLAN + '''
import json, os, signal, sys
from fastdata.formats.hdf5.writer import HDF5Writer
from fastdata.formats.lmdb.writer import LMDBWriter
from fastdata.records import Record

fmt, out, options, kill_after, mode = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), \\
    int(sys.argv[4]), sys.argv[5]
writer = {"lmdb": LMDBWriter, "hdf5": HDF5Writer}[fmt](out, **options)
writer.piece_mode = True
print(json.dumps({"temp": writer.temp_path}), flush=True)
plan = pieces()
last = kill_after + (mode == "unjournaled")  # that piece is committed but not journaled
for n in range(last + 1):
    for i in plan[n]:
        writer.write(Record(*record_args(i)))
    state = writer.end_piece(n)
    if n <= kill_after:
        print(json.dumps({"piece": n, "state": state}), flush=True)  # the journal
if mode != "after-piece":
    for i in plan[last + 1][:15]:  # most of the next piece (HDF5: chunks written)
        writer.write(Record(*record_args(i)))
os.kill(os.getpid(), signal.SIGKILL)
'''


def _manifest(fmt: str, count: int) -> Manifest:
    return Manifest(
        format=fmt, count=count, classes=["c0", "c1", "c2"],
        class_counts=[len(range(c, count, 3)) for c in range(3)],
        encoding={"storage": "keep", "formats": {"raw": count}, "shape": None},
        bytes={"source": 0, "payload": sum(len(payload(i)) for i in range(count))},
        checksums={}, shards=[], source={}, pack_options={},
        created_at="2024-01-01T00:00:00+00:00", fastdata_version=fastdata.__version__)


def _write(writer, numbers) -> list[dict]:
    """Write pieces ``numbers``; their states (piece mode)."""
    plan, states = pieces(), []
    for n in numbers:
        for i in plan[n]:
            writer.write(Record(*record_args(i)))
        if writer.piece_mode:
            states.append(writer.end_piece(n))
    return states


def _pack(fmt: str, out, *, piece_mode: bool, **options) -> Manifest:
    writer = WRITERS[fmt](out, **{**OPTIONS[fmt], **options})
    writer.piece_mode = piece_mode
    _write(writer, range(len(pieces())))
    return writer.finish(_manifest(fmt, COUNT))


def _piece_records(n: int) -> list[PieceRecord]:
    return [PieceRecord(key, label, zlib.crc32(data), len(data))
            for _, key, label, data, _ in map(record_args, pieces()[n])]


def _data_file(fmt: str, out) -> bytes:
    return (Path(out) / "data.mdb" if fmt == "lmdb" else Path(out)).read_bytes()


def _read_back(out) -> tuple[list, list, list]:
    with fastdata.open_dataset(out, decode=fastdata.Decode(output="bytes")) as ds:
        samples = [ds[i] for i in range(len(ds))]
        keys = list(ds.keys)
    return [bytes(p) for p, _ in samples], [int(label) for _, label in samples], keys


def _expected() -> tuple[list, list, list]:
    rows = [record_args(i) for i in range(COUNT)]
    return [r[3] for r in rows], [r[2] for r in rows], [r[1] for r in rows]


def _without_time(manifest: Manifest) -> dict:
    return {k: v for k, v in manifest.to_dict().items() if k != "created_at"}


def _kill_child(fmt: str, out, kill_after: int, mode: str) -> tuple[str, list[dict]]:
    """Run the child until it kills itself; its temp path and the journaled states."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(fastdata.__file__))),
         os.environ.get("PYTHONPATH", "")]))
    proc = run_python(CHILD, fmt, str(out), json.dumps(OPTIONS[fmt]), str(kill_after), mode,
                      timeout=60, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return lines[0]["temp"], [line["state"] for line in lines[1:]]


def _resume(fmt: str, out, temp: str, states: list[dict]) -> Manifest:
    writer = WRITERS[fmt](out, resume_path=temp, **OPTIONS[fmt])
    writer.piece_mode = True
    for n, state in enumerate(states):
        writer.adopt_piece(n, state, _piece_records(n))
    writer.done_adopting()
    _write(writer, range(len(states), len(pieces())))
    return writer.finish(_manifest(fmt, COUNT))


def _side_files(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".pending-" in n)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Each format packed in piece mode without interruption: its manifest and bytes."""
    done = {}
    for fmt in WRITERS:
        out = tmp_path_factory.mktemp(f"reference-{fmt}") / NAMES[fmt]
        done[fmt] = (_pack(fmt, out, piece_mode=True), _data_file(fmt, out))
    return done


# -- (a) piece mode changes nothing but durability ------------------------------------


def test_lmdb_piece_mode_equals_plain(tmp_path, reference):
    # Pieces of the plain pack's commit batches: the same records, manifest and
    # page layout. (The files still differ in the unused bytes of some pages:
    # a plain pack reuses page buffers across commits without zeroing them.)
    plain = tmp_path / "plain" / NAMES["lmdb"]
    manifest = _pack("lmdb", plain, piece_mode=False, commit_every=PIECE)
    assert _without_time(manifest) == _without_time(reference["lmdb"][0])
    assert _read_back(plain) == _expected()


def test_hdf5_piece_mode_equals_plain_when_no_chunk_is_written_early(tmp_path):
    # A payload under flush_bytes is written whole by finish (contiguous): piece
    # mode never flushes the file, so it is the plain file byte for byte.
    options = {"flush_bytes": 1 << 20}
    files = {}
    for piece_mode in (False, True):
        out = tmp_path / str(piece_mode) / NAMES["hdf5"]
        manifest = _pack("hdf5", out, piece_mode=piece_mode, **options)
        assert manifest.extra["layout"] == "contiguous"
        assert _read_back(out) == _expected()
        files[piece_mode] = (_without_time(manifest), _data_file("hdf5", out))
    assert files[False] == files[True]


def test_hdf5_piece_mode_equals_plain_but_for_the_file_size(tmp_path, reference):
    # Chunks written mid-pack: every piece that wrote some closes and reopens the
    # file, and HDF5 lets go of the free space it knew of, so the layout and
    # the size on disk differ a little; the records and the rest do not.
    out = tmp_path / "plain" / NAMES["hdf5"]
    plain = _without_time(_pack("hdf5", out, piece_mode=False))
    piece = _without_time(reference["hdf5"][0])
    assert plain["extra"]["layout"] == piece["extra"]["layout"] == "chunked"
    for manifest in (plain, piece):
        del manifest["bytes"]["on_disk"], manifest["shards"][0]["bytes"]
    assert plain == piece
    assert _read_back(out) == _expected()


# -- (b) killed, then resumed ---------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("mode, kill_after", [
    ("after-piece", 2),  # SIGKILL right after end_piece(2) and its journal line
    ("mid-piece", 2),  # ... after 15 records of piece 3
    ("unjournaled", 1),  # end_piece(2) ran, its journal line never came; then part of 3
    ("mid-piece", 0),
])
def test_killed_pack_resumes_to_the_uninterrupted_output(tmp_path, reference, fmt, mode,
                                                          kill_after):
    out = tmp_path / NAMES[fmt]
    temp, states = _kill_child(fmt, out, kill_after, mode)
    assert len(states) == kill_after + 1 and os.path.exists(temp) and not out.exists()
    manifest = _resume(fmt, out, temp, states)
    expected_manifest, expected_bytes = reference[fmt]
    assert _read_back(out) == _expected()
    assert manifest.checksums["payload_sha256"] == expected_manifest.checksums["payload_sha256"]
    assert _without_time(manifest) == _without_time(expected_manifest)
    assert _data_file(fmt, out) == expected_bytes  # byte-identical: see the module notes
    assert sorted(os.listdir(tmp_path)) == [NAMES[fmt]]  # no partial, lock or side file


def test_hdf5_side_files_stay_small(tmp_path):
    # Each payload byte goes to a side file once, and a side file goes once the
    # .h5 holds its bytes for good: what is left is about two flushes at most.
    writer = HDF5Writer(tmp_path / NAMES["hdf5"], **OPTIONS["hdf5"])
    writer.piece_mode = True
    try:
        for n in range(len(pieces())):
            _write(writer, [n])
            held = sum(os.path.getsize(tmp_path / name) for name in _side_files(tmp_path))
            assert 0 < held <= 2 * OPTIONS["hdf5"]["flush_bytes"] + 5000
        assert len(_side_files(tmp_path)) < len(pieces()) / 2
    finally:
        writer.abort()
    assert os.listdir(tmp_path) == []  # abort removes the side files too


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_suspended_pack_resumes(tmp_path, reference, fmt):
    writer = WRITERS[fmt](tmp_path / NAMES[fmt], **OPTIONS[fmt])
    writer.piece_mode = True
    states = _write(writer, range(3))
    writer.write(Record(*record_args(pieces()[3][0])))  # not in a piece: dropped
    writer.suspend()  # keeps the partial output (side files included)
    manifest = _resume(fmt, tmp_path / NAMES[fmt], writer.temp_path, states)
    assert _without_time(manifest) == _without_time(reference[fmt][0])
    assert _data_file(fmt, tmp_path / NAMES[fmt]) == reference[fmt][1]


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_resumed_pack_interrupted_again_resumes(tmp_path, reference, fmt):
    # The second run cuts the partial back to the journaled pieces (here after
    # an unjournaled one that wrote chunks) and stops in its first piece: the
    # journaled pieces must still be whole for a third run.
    out = tmp_path / NAMES[fmt]
    temp, states = _kill_child(fmt, out, 1, "unjournaled")
    writer = WRITERS[fmt](out, resume_path=temp, **OPTIONS[fmt])
    writer.piece_mode = True
    for n, state in enumerate(states):
        writer.adopt_piece(n, state, _piece_records(n))
    writer.done_adopting()
    for i in pieces()[len(states)][:9]:
        writer.write(Record(*record_args(i)))
    writer.suspend()
    manifest = _resume(fmt, out, temp, states)
    assert _without_time(manifest) == _without_time(reference[fmt][0])
    assert _data_file(fmt, out) == reference[fmt][1]


# -- (c) a piece the partial output no longer holds ------------------------------------


def _remove_lmdb_records(temp: str, indices) -> None:
    import lmdb

    env = lmdb.open(temp, subdir=True)
    try:
        with env.begin(write=True) as txn:
            for i in indices:
                assert txn.delete(b"%010d" % i)
    finally:
        env.close()


def _adopt_until_lost(fmt: str, out, temp: str, states: list[dict]):
    """Adopt the journaled pieces up to the first lost one, as a resumed pack does;
    the writer and the PieceLost raised (or None)."""
    writer = WRITERS[fmt](out, resume_path=temp, **OPTIONS[fmt])
    writer.piece_mode = True
    for n, state in enumerate(states):
        try:
            writer.adopt_piece(n, state, _piece_records(n))
        except PieceLost as exc:
            return writer, n, exc
    return writer, len(states), None


@pytest.mark.parametrize("fmt, damage, lost", [
    ("lmdb", "records of piece 1 deleted", 1),
    ("lmdb", "a record of piece 2 rewritten", 2),
    ("hdf5", "side file of piece 3 deleted", 3),
    ("hdf5", "side file of piece 3 rewritten", 3),
    ("hdf5", ".h5 cut short", 0),
])
def test_lost_piece_raises_and_is_redone(tmp_path, reference, fmt, damage, lost):
    out = tmp_path / NAMES[fmt]
    temp, states = _kill_child(fmt, out, 3, "mid-piece")
    if damage == "records of piece 1 deleted":
        _remove_lmdb_records(temp, pieces()[1][5:8])
    elif damage == "a record of piece 2 rewritten":
        lmdb_put(temp, {b"%010d" % pieces()[2][4]: b"not the record"})
    elif damage.startswith("side file"):
        side = f"{temp}.pending-3"
        if "deleted" in damage:
            os.remove(side)
        else:
            with open(side, "r+b") as f:
                f.write(b"\0")
    else:
        truncate_to_half(Path(temp))
    writer, stopped, error = _adopt_until_lost(fmt, out, temp, states)
    assert stopped == lost and error is not None, damage
    assert error.path == temp and f"piece {lost}" in str(error)
    # The lost piece and those after it are written again: the same dataset.
    writer.done_adopting()
    _write(writer, range(lost, len(pieces())))
    manifest = writer.finish(_manifest(fmt, COUNT))
    assert _read_back(out) == _expected()
    assert _without_time(manifest)["checksums"] == _without_time(reference[fmt][0])["checksums"]
    assert _side_files(tmp_path) == []


def test_journal_that_does_not_fit_raises(tmp_path):
    out = tmp_path / NAMES["lmdb"]
    temp, states = _kill_child("lmdb", out, 0, "after-piece")
    writer = LMDBWriter(out, resume_path=temp)
    try:
        with pytest.raises(PieceLost, match="piece 0: the journal says 20 records"):
            writer.adopt_piece(0, states[0], _piece_records(0)[:-1])
    finally:
        writer.abort()
    assert os.listdir(tmp_path) == []


def test_lmdb_partial_without_data_file_raises(tmp_path):
    temp = tmp_path / ".out.lmdb.partial-x"
    temp.mkdir()
    with pytest.raises(PieceLost, match="no data.mdb"):
        LMDBWriter(tmp_path / "out.lmdb", resume_path=str(temp))
    assert os.listdir(tmp_path) == []  # the partial output and the lock are gone

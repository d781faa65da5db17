"""Packing keeps nothing per record in memory: the writers spool each record's
facts to disk, the pack's plan keeps its entries in a file, the journal is
read a piece at a time, and the workers are fed only as far as the writer
keeps up (bench/scale.py ``write`` measures the whole process)."""

from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc

import numpy as np
import pytest

import fastdata
from fastdata.formats import get_format
from fastdata.packers import plan as plan_module
from fastdata.packers.journal import PackJournal
from fastdata.packers.options import PackOptions
from fastdata.packers.plan import PackPlan, ResumeRefused
from fastdata.packers.pool import CHUNKS_AHEAD, PreparedStream
from fastdata.packers.source import SourceEntry
from fastdata.records import Manifest, Record

FORMATS = {"lmdb": "out.lmdb", "hdf5": "out.h5", "tfrecord": "out.tfrecord", "tar": "out.tar"}
FLUSH = 4096  # record_spool.FLUSH_ROWS: after a multiple of it, no row waits in memory


def _record(i: int) -> Record:
    return Record(i, f"k/{i:08d}", i % 10, bytes((i & 255, 1, 2)), "raw", 1, 1,
                  b'{"i": %d}' % i if i % 3 == 0 else None)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_writing_holds_nothing_per_record(tmp_path, fmt):
    options = {"shard_size": 1000} if fmt in ("tfrecord", "tar") else {}
    writer = get_format(fmt).load_writer()(tmp_path / FORMATS[fmt], **options)
    n = 0
    for _ in range(FLUSH):  # warm: every structure made once
        writer.write(_record(n))
        n += 1
    tracemalloc.start()
    try:
        while n < 3 * FLUSH:
            writer.write(_record(n))
            n += 1
        early, _ = tracemalloc.get_traced_memory()
        while n < 12 * FLUSH:
            writer.write(_record(n))
            n += 1
        late, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Lists of keys, labels, CRCs and index rows took ~290 bytes a record:
    # 10 MB over these 36,864 records.
    assert late - early < 1_000_000, (early, late)
    classes = [f"c{k}" for k in range(10)]
    counts = np.bincount(np.arange(n) % 10).tolist()
    writer.finish(Manifest(fmt, n, classes, counts, {"storage": "raw", "formats": {"raw": n},
                                                     "shape": [1, 1, 3]},
                           {}, {}, [], {}, {}, "", ""))
    ds = fastdata.open_dataset(writer.output_path if hasattr(writer, "output_path")
                               else tmp_path / FORMATS[fmt], decode=fastdata.Decode(
                                   output="bytes"), with_metadata=True)
    assert len(ds) == n and ds.reader.keys[:2] == ["k/00000000", "k/00000001"]
    for i in (0, 1, 4097, 20_000, 40_000, n - 1):  # in each block of 2^14 rows read back
        payload, label, meta = ds[i]
        assert (bytes(payload), label) == (_record(i).payload, i % 10)
        assert meta == ({"i": i} if i % 3 == 0 else {})
    assert sorted(os.listdir(tmp_path)) == sorted(
        n for n in os.listdir(tmp_path) if not n.startswith("."))  # the spool went


def _finish_peak(folder, n: int) -> int:
    """The traced peak of an HDF5 writer's end, after ``n`` records."""
    writer = get_format("hdf5").load_writer()(folder / "out.h5")
    for i in range(n):
        writer.write(_record(i))
    manifest = Manifest("hdf5", n, [f"c{k}" for k in range(10)],
                        np.bincount(np.arange(n) % 10).tolist(),
                        {"storage": "raw", "formats": {"raw": n}, "shape": [1, 1, 3]},
                        {}, {}, [], {}, {}, "", "")
    tracemalloc.start()
    try:
        writer.finish(manifest)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_end_of_an_hdf5_pack_holds_a_block_not_the_columns(tmp_path):
    """The columns, keys and metadata go into the file a block of 2^14 records
    at a time. Read whole, the end of 4 blocks peaked 8 MB above that of one
    (its keys as str objects, its facts, its columns)."""
    (tmp_path / "one").mkdir()
    (tmp_path / "four").mkdir()
    one = _finish_peak(tmp_path / "one", 2**14 + 5)
    four = _finish_peak(tmp_path / "four", 4 * 2**14 + 5)
    assert four - one < 500_000, (one, four)
    with fastdata.open_reader(tmp_path / "four" / "out.h5") as reader:
        assert reader.keys[-1] == f"k/{4 * 2**14 + 4:08d}"
        assert reader.metadata_many([3, 4 * 2**14 + 2]) == [{"i": 3}, {"i": 4 * 2**14 + 2}]


def test_the_end_of_an_lmdb_pack_fills_its_columns_a_block_at_a_time(tmp_path, monkeypatch):
    """LMDB stores each column whole; its end fills them from the spool a
    block at a time, never reading every record's facts at once (the facts
    and their copies: about 50 B per record more)."""
    from fastdata.formats.writer import Writer

    def whole(self):
        raise AssertionError("every record's facts read at once")

    monkeypatch.setattr(Writer, "facts", whole)
    n = 2 * 2**14 + 5
    writer = get_format("lmdb").load_writer()(tmp_path / "out.lmdb")
    for i in range(n):
        writer.write(_record(i))
    writer.finish(Manifest("lmdb", n, [f"c{k}" for k in range(10)],
                           np.bincount(np.arange(n) % 10).tolist(),
                           {"storage": "raw", "formats": {"raw": n}, "shape": [1, 1, 3]},
                           {}, {}, [], {}, {}, "", ""))
    with fastdata.open_reader(tmp_path / "out.lmdb") as reader:
        assert reader.labels[[0, 2**14 + 3, n - 1]].tolist() == [0, (2**14 + 3) % 10,
                                                                (n - 1) % 10]
        assert reader.metadata_many([3, n - 1]) == [{"i": 3}, {"i": n - 1}]
    # Every whole column and piece against the manifest's SHA-256s and CRC-32s.
    from fastdata.ops.verify import verify_dataset

    result = verify_dataset(tmp_path / "out.lmdb", progress=False)
    assert (result.ok, result.checked, result.problems) == (True, n, [])


def test_the_plan_keeps_its_entries_in_a_file(tmp_path):
    entries = [SourceEntry(f"{i:05d}.png", i % 4, data=b"x%d" % i) for i in range(2500)]
    path = str(tmp_path / "entries.jsonl")
    plan = PackPlan.build(entries, ["a", "b", "c", "d"], {}, entries_path=path,
                          sharded=True, max_records=1000)
    assert not hasattr(plan, "__dict__") or "entries" not in vars(plan)
    assert (plan.count, plan.pieces, plan.labels) == (2500, [(0, 1000), (1000, 2000),
                                                             (2000, 2500)], {0, 1, 2, 3})
    with open(path, encoding="ascii") as f:
        assert sum(1 for _ in f) == 2500
    assert [e.key for e in plan.entries()][:2] == ["00000.png", "00001.png"]
    saved = PackPlan.from_json(plan.to_json(), str(tmp_path), path)
    saved.check_same(plan, "out")  # the same scan: nothing refused


def test_a_changed_source_is_named_past_the_detailed_diff(tmp_path, monkeypatch):
    """Past DIFF_DETAIL entries the refusal names the first entry that differs
    (the detailed one would hold every key in memory)."""
    def build(name, keys):
        return PackPlan.build([SourceEntry(k, 0, data=b"1") for k in keys], ["a"], {},
                              entries_path=str(tmp_path / name), sharded=True)

    keys = [f"{i:03d}" for i in range(20)]
    saved = build("saved", keys)
    fresh = build("fresh", keys[:5] + ["new"] + keys[6:])
    with pytest.raises(ResumeRefused, match="1 file added .first: new.*1 file removed"):
        saved.check_same(fresh, "out")
    monkeypatch.setattr(plan_module, "DIFF_DETAIL", 10)
    with pytest.raises(ResumeRefused, match=r"20 entries \(was 20\); entry 5 is 'new' "
                                            r"\(was '005'\)"):
        saved.check_same(fresh, "out")


def test_the_journal_is_read_a_piece_at_a_time(tmp_path):
    journal = PackJournal(str(tmp_path / "state"))
    os.makedirs(journal.folder)
    for number in range(3):
        journal.record(number, [[f"k{number}", 0, 7, 3, 3, "raw", 1, 1]], {"n": number})
    journal.close()
    with open(os.path.join(journal.folder, "journal.jsonl"), "a", encoding="utf-8") as f:
        f.write('{"piece": 3, "outc')  # torn by a crash
    pieces = journal.pieces()
    assert sorted(pieces) == [0, 1, 2] and 3 not in pieces
    assert pieces[1].records[0].key == "k1" and pieces[1].state == {"n": 1}
    assert list(pieces.only([2])) == [2]


def test_workers_are_fed_only_as_far_as_the_writer_takes(tmp_path):
    """A source is read ahead of the writer by at most CHUNKS_AHEAD chunks of 8
    per worker (Pool.imap alone would read and queue all of it)."""
    pulled = 0

    def source():
        nonlocal pulled
        for i in range(20_000):
            pulled += 1
            yield SourceEntry(f"{i}", 0, data=bytes(3), raw_shape=(1, 1, 3))

    stream = PreparedStream(source(), PackOptions(), 2)
    try:
        items = iter(stream)
        taken = [next(items) for _ in range(10)]
        time.sleep(1.0)  # the feeder would have run far ahead by now
        ahead = pulled
        assert ahead <= 10 + (2 * CHUNKS_AHEAD + 2) * 8, ahead
        assert len(taken) == 10 and threading.active_count() >= 1
        assert sum(1 for _ in items) == 20_000 - 10  # and every entry still comes
    finally:
        stream.close()
    assert pulled == 20_000


def test_a_pack_leaves_no_spool_behind(tmp_path):
    src = tmp_path / "src"
    for k in range(2):
        (src / f"c{k}").mkdir(parents=True)
        for i in range(3):
            (src / f"c{k}" / f"{i}.png").write_bytes(_png())
    fastdata.pack(src, tmp_path / "out.tar", progress=False)
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []
    manifest = json.loads((tmp_path / "out.tar.fastdata.json").read_text())
    assert manifest["count"] == 6


def _png() -> bytes:
    import cv2

    ok, data = cv2.imencode(".png", np.zeros((4, 4, 3), np.uint8))
    assert ok
    return data.tobytes()

"""``fastdata dedup`` / ``fastdata.dedup``: exact duplicates found by content,
within a dataset and against others, in every format and at a URL."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

import fastdata
from fastdata.cli import main
from fastdata.demo import synthesize


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A training folder with planted copies (two of one image, three of
    another, across classes) and a validation folder sharing one image."""
    tmp = tmp_path_factory.mktemp("dedup")
    synthesize(tmp / "pool", kind="tiny", n=40, classes=2, seed=1)
    pool = sorted(p for p in (tmp / "pool").rglob("*.png"))
    train, val = tmp / "train", tmp / "val"
    for name in ("a", "b"):
        (train / name).mkdir(parents=True)
    (val / "a").mkdir(parents=True)
    for i, p in enumerate(pool[:20]):
        shutil.copy(p, train / ("a" if i % 2 else "b") / f"{i:02d}.png")
    shutil.copy(pool[3], train / "b" / "copy-of-03.png")
    shutil.copy(pool[4], train / "a" / "copy-of-04.png")
    shutil.copy(pool[4], train / "b" / "again-04.png")
    shutil.copy(pool[7], val / "a" / "v07.png")      # a validation image also in train
    shutil.copy(pool[30], val / "a" / "v30.png")
    return tmp, train, val


EXPECTED = [{"a/03.png", "b/copy-of-03.png"}, {"b/04.png", "a/copy-of-04.png", "b/again-04.png"}]


@pytest.mark.parametrize("ext", [".lmdb", ".h5", "-%05d.tfrecord", "-%06d.tar"])
def test_groups_are_the_planted_copies_in_every_format(planted, ext):
    tmp, train, val = planted
    out = fastdata.pack(train, tmp / f"train{ext}", progress=False).output
    report = fastdata.dedup(out, progress=False)
    got = [{m.key for m in g.members} for g in report.within()]
    assert sorted(got, key=sorted) == sorted(EXPECTED, key=sorted)
    assert report.redundant() == 3 and report.records == [23]
    assert not report.shared()
    ds = fastdata.open_dataset(out, decode=fastdata.Decode(output="bytes"))
    for group in report.within():  # the members really hold the same bytes
        assert len({ds[m.index][0] for m in group.members}) == 1


def test_against_finds_every_shared_record_and_fails_on_request(planted):
    tmp, train, val = planted
    fastdata.pack(train, tmp / "t.lmdb", progress=False)
    fastdata.pack(val, tmp / "v.tar", progress=False)
    runner = CliRunner()
    done = runner.invoke(main, ["dedup", str(tmp / "t.lmdb"), "--against",
                                str(tmp / "v.tar.fastdata.json"), "--json", "--no-progress"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["shared"] == 1 and report["within"] == 2 and report["redundant"] == 3
    shared = [g for g in report["groups"]
              if len({m["dataset"] for m in g["members"]}) > 1]
    assert [{m["key"] for m in g["members"]} for g in shared] == [{"a/07.png", "a/v07.png"}]
    text = runner.invoke(main, ["dedup", str(tmp / "t.lmdb"), "--against",
                                str(tmp / "v.tar.fastdata.json"), "--no-progress"]).output
    assert "1 record(s) of" in text and "a/07.png (" in text and "a/v07.png (0)" in text
    failed = runner.invoke(main, ["dedup", str(tmp / "t.lmdb"), "--against",
                                  str(tmp / "v.tar.fastdata.json"), "--fail-on-shared",
                                  "--no-progress"])
    assert failed.exit_code == 1
    clean = runner.invoke(main, ["dedup", str(tmp / "v.tar.fastdata.json"), "--against",
                                 str(tmp / "v.tar.fastdata.json"), "--fail-on-shared",
                                 "--no-progress"])
    assert clean.exit_code == 1  # a dataset shares everything with itself


def test_a_dataset_at_a_url(planted, tmp_path):
    from servers import HTTPServer

    tmp, train, val = planted
    www = tmp_path / "www"
    www.mkdir()
    fastdata.pack(train, www / "t-%06d.tar", progress=False,
                  options=fastdata.PackOptions(shard_size=8))
    server = HTTPServer(www)
    try:
        report = fastdata.dedup(f"{server.url}/t.tar.fastdata.json", progress=False)
    finally:
        server.close()
    assert sorted(({m.key for m in g.members} for g in report.within()), key=sorted) \
        == sorted(EXPECTED, key=sorted)


def test_a_damaged_record_is_named(planted, tmp_path):
    tmp, train, val = planted
    out = fastdata.pack(train, tmp_path / "d.tar", progress=False).output
    shard = tmp_path / "d.tar"
    raw = bytearray(shard.read_bytes())
    raw[700] ^= 0xFF  # inside the first record's bytes (its header is 512)
    shard.write_bytes(bytes(raw))
    with pytest.raises(fastdata.CorruptDataError, match="record 0"):
        fastdata.dedup(out, progress=False)

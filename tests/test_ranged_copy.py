"""The dataset index at a URL: read by ranges into one sparse copy per machine
(fastdata.formats.ranged_copy), never downloaded whole.

A real HTTP server honouring Range serves a packed dataset; its request log
shows which bytes of the index were asked for. Other processes are real
processes sharing the test's cache folder. A re-pack at the same URL is a
new copy (keyed by the object's size and the index's piece checksums), and a
block that fails its check is fetched from the server once more before any
error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import no_hang

import fastdata
from fastdata.demo import synthesize
from fastdata.formats.ranged_copy import BLOCK, RangedCopy

N, SHARD = 3000, 300
INDEX = "d.tar.fastdata.index.npy"


@pytest.fixture(autouse=True)
def _time_limit():
    with no_hang(300):
        yield


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranged_copy")
    synthesize(tmp / "src", kind="tiny", n=N, seed=4)
    www = tmp / "www"
    www.mkdir()
    summary = fastdata.pack(tmp / "src", www / "d-%06d.tar",
                            options=fastdata.PackOptions(shard_size=SHARD), progress=False)
    labels = np.asarray(fastdata.open_dataset(summary.output).targets)
    return www, labels


@pytest.fixture
def site(served, monkeypatch, tmp_path):
    from servers import http_site

    www, labels = served
    with http_site(www, monkeypatch, tmp_path / "cache") as server:
        server.www, server.labels = www, labels
        server.manifest = f"{server.url}/d.tar.fastdata.json"
        server.cache = tmp_path / "cache" / "objects"
        yield server


def _index_ranges(site, name: str = INDEX) -> list[tuple[int, int]]:
    """(start, end) of every request for the index; none asks for it whole."""
    out = []
    for method, path, rng in site.log:
        if path.endswith(name):
            assert rng is not None, "the index was fetched whole"
            start, end = rng.split("=", 1)[1].split("-")
            out.append((int(start), int(end) + 1))
    return out


def _blocks(ranges) -> list[int]:
    return [b for start, end in ranges for b in range(start // BLOCK, -(-end // BLOCK))]


def _copy(site):
    return next(p for p in site.cache.iterdir() if p.name.endswith(INDEX + ".ranges"))


def test_one_record_fetches_the_index_blocks_it_needs(site):
    ds = fastdata.open_dataset(site.manifest, decode=fastdata.Decode(output="bytes"))
    ds[N - 1]
    blocks = sorted(set(_blocks(_index_ranges(site))))
    # The header's block, and the one or two blocks of the record's piece.
    size = os.path.getsize(site.www / INDEX)
    assert blocks[0] == 0 and len(blocks) <= 3, blocks
    assert blocks[-1] == (size - 1) // BLOCK


def test_processes_of_a_machine_fetch_each_block_once(site):
    """Two processes, one after the other, read every label: the second finds
    every block in the machine's copy and asks for none."""
    code = ("import sys, numpy as np, fastdata; "
            "ds = fastdata.open_dataset(sys.argv[1]); "
            "np.save(sys.argv[2], np.asarray(ds.targets))")
    for k in range(2):
        out = site.cache.parent / f"labels{k}.npy"
        subprocess.run([sys.executable, "-c", code, site.manifest, str(out)], check=True,
                       timeout=180, env=os.environ.copy())
        assert np.array_equal(np.load(out), site.labels)
        if k == 0:
            first = _index_ranges(site)
    assert _index_ranges(site) == first, "the second process fetched index blocks again"
    blocks = _blocks(first)
    assert len(blocks) == len(set(blocks))
    assert set(blocks) == set(range(-(-os.path.getsize(site.www / INDEX) // BLOCK)))


def test_a_damaged_copy_is_fetched_again(site):
    fastdata.open_dataset(site.manifest).targets  # fills the copy
    before = len(_index_ranges(site))
    copy = _copy(site)
    with open(copy, "r+b") as f:  # a row of the second block, its mark left set
        f.seek(BLOCK + 100)
        f.write(b"\xff" * 8)
    got = np.asarray(fastdata.open_dataset(site.manifest).targets)
    assert np.array_equal(got, site.labels)
    again = _blocks(_index_ranges(site)[before:])
    assert 1 in again, again
    truth = (site.www / INDEX).read_bytes()
    assert copy.read_bytes()[:len(truth)] == truth


def test_bytes_without_their_mark_are_fetched(site, tmp_path):
    """A process killed after writing a block but before marking it: the
    block is fetched again, whatever the bytes there."""
    url = f"{site.url}/{INDEX}"
    truth = (site.www / INDEX).read_bytes()
    copy = RangedCopy(url, len(truth))
    assert copy.read([(0, 10)])[0] == truth[:10]
    path = _copy(site)
    with open(path, "r+b") as f:
        f.seek(BLOCK)
        f.write(b"\xee" * BLOCK)  # junk, unmarked
    assert copy.read([(BLOCK + 5, 20)])[0] == truth[BLOCK + 5:BLOCK + 25]
    assert _blocks(_index_ranges(site)) == [0, 1]


def test_an_evicted_copy_is_made_again(site):
    url = f"{site.url}/{INDEX}"
    truth = (site.www / INDEX).read_bytes()
    copy = RangedCopy(url, len(truth))
    copy.read([(0, 10)])
    # No longer held (a process holds its last 64 copies), then evicted as the
    # cache evicts: the copy and its lock file removed.
    from fastdata.formats.remote_files import process_cache

    process_cache().release()
    path = _copy(site)
    os.unlink(path)
    os.unlink(str(path) + ".lock")
    assert copy.read([(0, 64)])[0] == truth[:64]
    assert _blocks(_index_ranges(site)) == [0, 0]


def test_a_damaged_index_at_the_url_is_refused_naming_its_rows(site, served, tmp_path):
    www = tmp_path / "www"
    for p in site.www.iterdir():
        (www / p.name).parent.mkdir(exist_ok=True)
        (www / p.name).write_bytes(p.read_bytes())
    raw = bytearray((www / INDEX).read_bytes())
    start = len(raw) - N * 32
    raw[start + 200 * 32 + 4] ^= 0x40  # row 200: its piece is rows 128..255
    (www / INDEX).write_bytes(bytes(raw))
    from servers import HTTPServer

    server = HTTPServer(www)
    try:
        ds = fastdata.open_dataset(f"{server.url}/d.tar.fastdata.json",
                                   decode=fastdata.Decode(output="bytes"))
        ds[0]  # another piece: read
        with pytest.raises(fastdata.CorruptDataError, match=r"rows 128\.\.255") as err:
            ds[200]
        assert INDEX in str(err.value)
    finally:
        server.close()


def test_a_range_outside_the_object_is_refused(site):
    copy = RangedCopy(f"{site.url}/{INDEX}", 1000)
    with pytest.raises(fastdata.StorageError, match="outside the object"):
        copy.read([(990, 20)])


# -- a damaged header, a re-pack at the same URL, a short body ------------------------


def _covering(site, block: int, name: str = INDEX) -> int:
    """How many requests for ``name`` asked for bytes of ``block``."""
    return sum(1 for start, end in _index_ranges(site, name)
               if start // BLOCK <= block < -(-end // BLOCK))


def test_a_damaged_header_in_the_copy_is_fetched_again(site):
    """The header's block, damaged in the machine's copy with its mark left
    set, is fetched again once: the dataset opens, and the copy is mended."""
    assert len(fastdata.open_dataset(site.manifest).targets) == N  # fills the copy
    before = _covering(site, 0)
    copy = _copy(site)
    with open(copy, "r+b") as f:  # inside the header's dict
        f.seek(20)
        f.write(b"\xff" * 8)
    got = np.asarray(fastdata.open_dataset(site.manifest).targets)
    assert np.array_equal(got, site.labels)
    assert _covering(site, 0) == before + 1
    truth = (site.www / INDEX).read_bytes()
    assert copy.read_bytes()[:len(truth)] == truth


def test_a_header_damaged_at_the_url_is_fetched_twice_then_refused(site, tmp_path):
    from servers import HTTPServer

    www = tmp_path / "www"
    shutil.copytree(site.www, www)
    raw = bytearray((www / INDEX).read_bytes())
    raw[20:28] = b"\xff" * 8
    (www / INDEX).write_bytes(bytes(raw))
    server = HTTPServer(www)
    try:
        with pytest.raises(fastdata.CorruptDataError, match="header") as err:
            fastdata.open_dataset(f"{server.url}/d.tar.fastdata.json")
        assert INDEX in str(err.value)
        asked = [rng for _, path, rng in server.log if path.endswith(INDEX)]
        assert len([r for r in asked if r and r.startswith("bytes=0-")]) == 2, asked
    finally:
        server.close()


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """Three packs of one name: A and B of the same size (other images), C larger."""
    tmp = tmp_path_factory.mktemp("repacks")
    out = {}
    for name, n, seed in (("A", 600, 4), ("B", 600, 5), ("C", 900, 6)):
        synthesize(tmp / f"src{name}", kind="tiny", n=n, seed=seed)
        summary = fastdata.pack(tmp / f"src{name}", tmp / name / "d-%06d.tar",
                                options=fastdata.PackOptions(shard_size=300), progress=False)
        ds = fastdata.open_dataset(summary.output, decode=fastdata.Decode(output="bytes"))
        out[name] = (tmp / name, np.asarray(ds.targets), [ds[i][0] for i in (0, 299, n - 1)])
    return out


def test_a_repack_at_the_same_url_is_a_new_copy(packs, monkeypatch, tmp_path):
    """The same URL packed again (same size and other bytes, then another
    size): each pack's index is its own copy, never old blocks with new ones."""
    from servers import http_site

    www = tmp_path / "www"
    with http_site(www, monkeypatch, tmp_path / "cache") as server:
        cache = tmp_path / "cache" / "objects"
        for k, name in enumerate("ABC"):
            folder, labels, some = packs[name]
            shutil.rmtree(www, ignore_errors=True)
            shutil.copytree(folder, www)
            url = f"{server.url}/d.tar.fastdata.json"
            with fastdata.open_dataset(url, decode=fastdata.Decode(output="bytes")) as ds:
                assert np.array_equal(np.asarray(ds.targets), labels), name
                n = len(labels)
                assert [ds[i][0] for i in (0, 299, n - 1)] == some, name
            copies = sorted(p for p in cache.iterdir() if p.name.endswith(INDEX + ".ranges"))
            assert len(copies) == k + 1, (name, copies)
            truth = (www / INDEX).read_bytes()
            assert any(p.read_bytes()[:len(truth)] == truth for p in copies), name


def test_a_short_body_is_refused_and_nothing_is_marked(tmp_path, monkeypatch):
    """The server holds fewer bytes than the copy's size: the read is refused,
    no block of it is marked (not even one whose own request was whole),
    and once the object is whole the same copy reads it right."""
    from servers import http_site

    truth = bytes(range(256)) * (20 * BLOCK // 256)  # 20 blocks
    www = tmp_path / "www"
    www.mkdir()
    (www / "obj.bin").write_bytes(truth[:18 * BLOCK + 50])
    with http_site(www, monkeypatch, tmp_path / "cache") as server:
        copy = RangedCopy(f"{server.url}/obj.bin", len(truth))
        # Block 0 and block 18: two requests, the second one answered short.
        with pytest.raises(fastdata.StorageError):
            copy.read([(0, 100), (18 * BLOCK, 100)])
        path = next(p for p in (tmp_path / "cache" / "objects").iterdir()
                    if p.name.endswith("obj.bin.ranges"))
        assert path.read_bytes()[len(truth):] == b"\0" * 20, "a block was marked"
        (www / "obj.bin").write_bytes(truth)
        assert copy.read([(0, 100), (18 * BLOCK, 100)]) == [truth[:100],
                                                            truth[18 * BLOCK:18 * BLOCK + 100]]
        assert path.read_bytes()[len(truth):] == b"\1" + b"\0" * 17 + b"\1\0"


# -- crash order, request merging, fresh reads (issue 49) ------------------------------------


def _object(tmp_path, blocks: int = 20) -> bytes:
    truth = bytes(range(256)) * (blocks * BLOCK // 256)
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "obj.bin").write_bytes(truth)
    return truth


def _sparse(tmp_path):
    return next(p for p in (tmp_path / "cache" / "objects").iterdir()
                if p.name.endswith("obj.bin.ranges"))


def _asked(server) -> list[str]:
    """The Range headers of the requests for the object, sorted (the runs of
    one read are fetched at once)."""
    return sorted(rng for _, path, rng in server.log if path == "obj.bin")


@pytest.mark.parametrize("stop, marks", [
    (1, {5}),          # stopped writing block 0's bytes
    (2, {5}),          # block 0's bytes written, block 18's not
    (3, {5}),          # both blocks' bytes written, no mark yet
    (4, {0, 5}),       # block 0 marked, block 18 not
], ids=["at-bytes-0", "at-bytes-18", "at-mark-0", "at-mark-18"])
def test_a_read_stopped_at_any_write_never_marks_a_block_before_its_bytes(
        tmp_path, monkeypatch, stop, marks):
    """The writes of one read of blocks 0 and 18 (two requests): block 0's
    bytes, block 18's bytes, block 0's mark, block 18's mark. A read stopped
    at any of them leaves every marked block holding the object's bytes, and
    the next read fetches exactly the blocks left unmarked."""
    from conftest import Interrupt
    from servers import http_site

    truth = _object(tmp_path)
    with http_site(tmp_path / "www", monkeypatch, tmp_path / "cache") as server:
        copy = RangedCopy(f"{server.url}/obj.bin", len(truth))
        assert copy.read([(5 * BLOCK, 10)]) == [truth[5 * BLOCK:5 * BLOCK + 10]]
        Interrupt(monkeypatch, "pwrite", stop)
        with pytest.raises(KeyboardInterrupt):
            copy.read([(0, 100), (18 * BLOCK, 100)])
        raw = _sparse(tmp_path).read_bytes()
        marked = {b for b, m in enumerate(raw[len(truth):]) if m}
        assert marked == marks
        for b in marked:
            assert raw[b * BLOCK:(b + 1) * BLOCK] == truth[b * BLOCK:(b + 1) * BLOCK], b
        before = len(_asked(server))
        assert copy.read([(0, 100), (18 * BLOCK, 100)]) == [truth[:100],
                                                            truth[18 * BLOCK:18 * BLOCK + 100]]
        again = sorted(int(r.split("=")[1].split("-")[0]) // BLOCK
                       for _, p, r in server.log[before + 0:] if p == "obj.bin")
        assert again == sorted({0, 18} - marks)
        assert _sparse(tmp_path).read_bytes()[len(truth):] == bytes(
            1 if b in {0, 5, 18} else 0 for b in range(20))


def test_a_short_body_from_an_object_store_is_refused_and_nothing_is_kept(
        tmp_path, monkeypatch, s3_env):
    """At S3 (moto) an object shorter than the copy's size answers a range
    past its end with fewer bytes, and no error: the copy refuses the read,
    naming the range, before it writes or marks anything (the whole request
    of block 0 included); once the object is whole the same copy reads it.
    (Over HTTP the client refuses a short body itself.)"""
    truth = bytes(range(256)) * (20 * BLOCK // 256)
    url = f"s3://fastdata-ranged/{tmp_path.name}/obj.bin"
    s3_env.make_bucket("fastdata-ranged")
    s3_env.put(url, truth[:12 * BLOCK + 7])
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTDATA_CACHE_LIMIT", raising=False)
    copy = RangedCopy(url, len(truth))
    with pytest.raises(fastdata.StorageError) as err:  # blocks 0 and 12: two requests
        copy.read([(0, 10), (12 * BLOCK, 10)])
    assert err.value.message == (f"the server sent 7 bytes for range {12 * BLOCK}+{BLOCK}; "
                                 f"the object is shorter than its {len(truth)} bytes")
    assert err.value.offset == 12 * BLOCK
    assert _sparse(tmp_path).read_bytes() == b"\0" * (len(truth) + 20)
    with pytest.raises(fastdata.StorageError, match="the server sent 16391 bytes for range "
                                                    "32768\\+20480"):
        copy.read([(8 * BLOCK, 10), (12 * BLOCK, 10)])  # one request of blocks 8-12
    assert _sparse(tmp_path).read_bytes() == b"\0" * (len(truth) + 20)
    s3_env.put(url, truth)
    assert copy.read([(0, 10), (12 * BLOCK, 10)]) == [truth[:10],
                                                      truth[12 * BLOCK:12 * BLOCK + 10]]
    raw = _sparse(tmp_path).read_bytes()
    assert raw[len(truth):] == bytes(1 if b in (0, 12) else 0 for b in range(20))
    assert raw[:BLOCK] == truth[:BLOCK] and raw[BLOCK:2 * BLOCK] == b"\0" * BLOCK


def test_missing_blocks_up_to_eight_apart_are_one_request(tmp_path, monkeypatch):
    from servers import http_site

    truth = _object(tmp_path, blocks=40)
    with http_site(tmp_path / "www", monkeypatch, tmp_path / "cache") as server:
        copy = RangedCopy(f"{server.url}/obj.bin", len(truth))
        # Blocks 0 and 9: eight blocks between, fetched with them in one request.
        copy.read([(0, 10), (9 * BLOCK, 10)])
        assert _asked(server) == [f"bytes=0-{10 * BLOCK - 1}"]
        # Blocks 10 and 20: nine between, two requests.
        server.log.clear()
        copy.read([(10 * BLOCK, 10), (20 * BLOCK, 10)])
        assert _asked(server) == [f"bytes={10 * BLOCK}-{11 * BLOCK - 1}",
                                  f"bytes={20 * BLOCK}-{21 * BLOCK - 1}"]
        # Marked blocks between missing ones are fetched again with them.
        server.log.clear()
        assert copy.read([(8 * BLOCK, 10), (11 * BLOCK, 4)], fresh=False) == [
            truth[8 * BLOCK:8 * BLOCK + 10], truth[11 * BLOCK:11 * BLOCK + 4]]
        assert _asked(server) == [f"bytes={11 * BLOCK}-{12 * BLOCK - 1}"]


def test_a_fresh_read_fetches_marked_blocks_again(tmp_path, monkeypatch):
    from servers import http_site

    truth = _object(tmp_path)
    with http_site(tmp_path / "www", monkeypatch, tmp_path / "cache") as server:
        copy = RangedCopy(f"{server.url}/obj.bin", len(truth))
        copy.read([(0, 10)])
        copy.read([(0, 10)])
        assert len(_asked(server)) == 1
        path = _sparse(tmp_path)
        with open(path, "r+b") as f:  # damaged, its mark left set
            f.write(b"\xff" * 10)
        assert copy.read([(0, 10)]) == [b"\xff" * 10]  # trusted: marked
        assert copy.read([(0, 10)], fresh=True) == [truth[:10]]
        assert len(_asked(server)) == 2 and path.read_bytes()[:BLOCK] == truth[:BLOCK]

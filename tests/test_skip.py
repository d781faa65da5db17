"""Streaming with ``on_error="skip"`` skips the damaged record alone, and counts
exactly the records it could not read (tar and TFRecord)."""

from __future__ import annotations


import numpy as np
import pytest
from conftest import build_tree, no_hang, uniform_spec

import fastdata
from fastdata.errors import CorruptDataError

N = 24  # records, in one shard unless a test says otherwise
BAD = 9  # the damaged record: in the middle of its shard
BYTES = fastdata.Decode(output="bytes")  # the stored payloads


@pytest.fixture
def tree(tmp_path):
    return build_tree(tmp_path / "src", uniform_spec(("a", "b", "c"), per_class=N // 3,
                                                     exts=(".png", ".jpg")))


def _pack(tree, tmp_path, ext: str, shard_size=None) -> tuple[str, np.ndarray]:
    out = tmp_path / "out" / f"x{ext}"
    fastdata.pack(tree.root, out, options=fastdata.PackOptions(shard_size=shard_size, workers=1),
                  progress=False)
    manifest = str(tmp_path / "out" / f"x{ext}.fastdata.json")
    return manifest, np.load(tmp_path / "out" / f"x{ext}.fastdata.index.npy")


def _shard(manifest: str, index: np.ndarray, record: int) -> str:
    shards = fastdata.open_dataset(manifest).reader.shard_paths
    return shards[int(index["shard"][record])]


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _payload_offset(ext: str, index: np.ndarray, record: int, tree) -> int:
    """A file offset inside record ``record``'s image bytes."""
    offset = int(index["offset"][record])
    if ext == ".tar":
        return offset + 20  # the index points at the image member's data
    return offset + int(index["size"][record]) - 4 - len(tree.payloads[record]) // 2 - 40


def _stream(manifest: str, order=None) -> tuple[list, fastdata.ShardedIterableDataset]:
    ds = fastdata.ShardedIterableDataset(manifest, decode=BYTES, order=order, on_error="skip")
    with no_hang(), pytest.warns(RuntimeWarning, match=r"skipping (\d+ )?corrupt"):
        got = list(ds)
    return got, ds


def _expected(tree, records) -> list:
    return [(tree.payloads[i], tree.labels[i]) for i in records]


@pytest.mark.parametrize("ext", [".tfrecord", ".tar"])
def test_one_damaged_payload_skips_that_record_alone(tree, tmp_path, ext):
    manifest, index = _pack(tree, tmp_path, ext)
    _flip(_shard(manifest, index, BAD), _payload_offset(ext, index, BAD, tree))
    got, ds = _stream(manifest)
    assert ds.skipped == 1
    assert got == _expected(tree, [i for i in range(N) if i != BAD])


def test_damaged_tfrecord_frame_is_stepped_over(tree, tmp_path):
    """A bad length field breaks the TFRecord stream; the dataset index says
    where the next record starts, so only the damaged one is lost."""
    manifest, index = _pack(tree, tmp_path, ".tfrecord")
    _flip(_shard(manifest, index, BAD), int(index["offset"][BAD]) + 2)  # inside the length
    got, ds = _stream(manifest)
    assert ds.skipped == 1
    assert got == _expected(tree, [i for i in range(N) if i != BAD])


@pytest.mark.parametrize("ext", [".tfrecord", ".tar"])
def test_zeroed_run_counts_each_damaged_record(tree, tmp_path, ext):
    """Zeros over four consecutive records: those four are skipped, counted
    one by one, and every record after them is read."""
    manifest, index = _pack(tree, tmp_path, ext)
    start = int(index["offset"][BAD])
    end = int(index["offset"][BAD + 3]) + int(index["size"][BAD + 3]) - 8
    with open(_shard(manifest, index, BAD), "r+b") as f:
        f.seek(start)
        f.write(bytes(end - start))
    got, ds = _stream(manifest)
    assert ds.skipped == 4
    assert got == _expected(tree, [i for i in range(N) if not BAD <= i < BAD + 4])


@pytest.mark.parametrize("ext", [".tfrecord", ".tar"])
def test_shard_truncated_while_streaming_counts_every_lost_record(tree, tmp_path, ext):
    manifest, index = _pack(tree, tmp_path, ext, shard_size=N // 2)
    cut = N // 2 + 5  # inside the second shard
    ds = fastdata.ShardedIterableDataset(manifest, decode=BYTES, on_error="skip")
    assert ds.reader.read(N - 1)  # opened, then the end of the second shard is lost
    with open(_shard(manifest, index, cut), "r+b") as f:
        f.truncate(int(index["offset"][cut]) + 10)
    with no_hang(), pytest.warns(RuntimeWarning, match=f"skipping {N - cut} corrupt records"):
        got = list(ds)
    assert got == _expected(tree, range(cut))
    assert ds.skipped == N - cut


@pytest.mark.parametrize("ext", [".tfrecord", ".tar"])
def test_split_by_record_skips_only_its_own_records(tree, tmp_path, ext):
    """With fewer shards than workers each worker keeps every W-th record; a
    worker skips (and counts) the damaged record only when it is one of its own."""
    manifest, index = _pack(tree, tmp_path, ext)
    _flip(_shard(manifest, index, BAD), _payload_offset(ext, index, BAD, tree))
    mine = BAD % 2
    got, ds = _stream(manifest, fastdata.Order(rank=mine, world_size=2))
    assert ds.skipped == 1
    assert got == _expected(tree, [i for i in range(mine, N, 2) if i != BAD])
    other = fastdata.ShardedIterableDataset(manifest, decode=BYTES, on_error="skip",
                                            order=fastdata.Order(rank=1 - mine, world_size=2))
    assert list(other) == _expected(tree, range(1 - mine, N, 2)) and other.skipped == 0


@pytest.mark.parametrize("ext", [".tfrecord", ".tar"])
def test_raise_stops_at_the_damaged_record(tree, tmp_path, ext):
    manifest, index = _pack(tree, tmp_path, ext)
    path = _shard(manifest, index, BAD)
    _flip(path, _payload_offset(ext, index, BAD, tree))
    ds = fastdata.ShardedIterableDataset(manifest, decode=BYTES)
    got = []
    with no_hang(), pytest.raises(CorruptDataError) as info:
        for sample in ds:
            got.append(sample)
    assert got == _expected(tree, range(BAD))
    # The error names the shard and offset, or the record's key.
    assert info.value.path == path or info.value.key == tree.keys[BAD]

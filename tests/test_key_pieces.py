"""One record's key is read from its piece of the keys file alone: a message
about a damaged or skipped record names its key without loading the keys of
every record (``NAME.fastdata.keys-pieces.npy``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fastdata
from fastdata import Decode
from fastdata.errors import CorruptDataError
from fastdata.formats.record_spool import PIECE_KEYS
from fastdata.ops.verify import verify_dataset
from fastdata.packers.source import SourceEntry

#: Keys a JSON list must escape, and a separator inside a key.
ODD = ['a, "b"', "ünïcødé/ø", "tab\there", "back\\slash", "x" * 300]


class Keys:
    """``n`` raw 1x1 records whose keys include :data:`ODD` (a Source)."""

    def __init__(self, n: int) -> None:
        self.keys = [ODD[i % len(ODD)] + f"-{i}" if i % 7 == 0 else f"k{i:05d}"
                     for i in range(n)]
        self.classes = ["a", "b"]

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self):
        for i, key in enumerate(self.keys):
            yield SourceEntry(key, i % 2, data=bytes((i & 255, 0, 0)), raw_shape=(1, 1, 3))

    def describe(self) -> dict:
        return {"root": None, "files": len(self.keys)}

    def warnings(self) -> list[str]:
        return []


@pytest.fixture(params=["tar", "tfrecord"])
def packed(request, tmp_path):
    src = Keys(3 * PIECE_KEYS + 5)
    summary = fastdata.pack(src, tmp_path / f"ds.{request.param}",
                            options=fastdata.PackOptions(shard_size=100), progress=False)
    return src, Path(summary.output)


def test_every_key_read_alone_is_the_key(packed):
    src, manifest = packed
    extra = json.loads(manifest.read_text())["extra"]
    assert extra["keys_pieces"] == {"keys": PIECE_KEYS,
                                    "file": manifest.name.replace(".json", ".keys-pieces.npy")}
    reader = fastdata.open_dataset(manifest, decode=Decode(output="bytes")).reader
    assert [reader.key_of(i) for i in range(len(src))] == src.keys
    assert reader._keys is None  # never loaded whole
    assert reader.keys == src.keys


def test_a_damaged_record_is_named_without_loading_the_keys(packed):
    src, manifest = packed
    ds = fastdata.open_dataset(fastdata.DatasetRef(manifest, verify=True),
                               decode=Decode(output="bytes"))
    index = json.loads(manifest.read_text())["extra"]["index"]
    import numpy as np

    row = np.load(manifest.parent / index, allow_pickle=False)[300]
    shard = manifest.parent / json.loads(manifest.read_text())["shards"][int(row["shard"])]["path"]
    data = bytearray(shard.read_bytes())
    data[int(row["offset"]) + int(row["size"]) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError) as caught:
        ds[300]
    assert caught.value.key == src.keys[300] and ds.reader._keys is None


def test_damaged_key_pieces_give_no_key_and_verify_reports_them(packed):
    src, manifest = packed
    keys_file = manifest.parent / json.loads(manifest.read_text())["extra"]["keys"]
    raw = bytearray(keys_file.read_bytes())
    at = raw.index(b"k00130")  # a key of the second piece
    raw[at + 1] = ord("9")
    keys_file.write_bytes(bytes(raw))
    reader = fastdata.open_dataset(manifest, decode=Decode(output="bytes")).reader
    assert reader.key_of(0) == src.keys[0]  # the first piece is whole
    assert reader.key_of(130) is None  # its piece fails its CRC-32: no key, no error
    report = verify_dataset(manifest)
    assert not report.ok and any("keys" in p["reason"] for p in report.problems), report.problems

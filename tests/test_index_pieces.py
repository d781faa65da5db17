"""The dataset index of tar/TFRecord is never whole in memory: memory-mapped,
its rows read for the records used, each piece checked (its CRC-32 from the
pack's ``-crc.npy`` file, rows inside their shards, labels) when a record of
it is first read, so damage is refused where it is, naming the rows, and
other pieces read on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import build_tree, uniform_spec

import fastdata
from fastdata import Decode
from fastdata.errors import CorruptDataError
from fastdata.formats.sharded import index_rows
from fastdata.ops.verify import verify_dataset

BYTES = Decode(output="bytes")


@pytest.fixture(params=["tar", "tfrecord"])
def small_pieces(request, tmp_path, monkeypatch):
    """24 records in 3 classes, 6 shards, index pieces of 4 rows."""
    monkeypatch.setattr(index_rows, "PIECE_ROWS", 4)
    tree = build_tree(tmp_path / "src", uniform_spec(classes=("a", "b", "c"), per_class=8),
                      size=(8, 8))
    summary = fastdata.pack(tree.root, tmp_path / "out" / f"ds.{request.param}",
                            options=fastdata.PackOptions(shard_size=4), progress=False)
    return tree, Path(summary.output)


def _index_file(manifest: Path) -> Path:
    return manifest.parent / json.loads(manifest.read_text())["extra"]["index"]


def _damage_label(manifest: Path, row: int, value: int) -> None:
    """Change one label in the index file, in place (as damage would)."""
    path = _index_file(manifest)
    rows = np.load(path, allow_pickle=False)
    rows["label"][row] = value
    np.save(path, rows, allow_pickle=False)


def test_the_pack_writes_a_crc_per_piece(small_pieces):
    _, manifest = small_pieces
    pieces = json.loads(manifest.read_text())["extra"]["index_pieces"]
    assert pieces == {"rows": 4, "file": "ds.tar.fastdata.index-crc.npy"
                      if manifest.name.startswith("ds.tar") else
                      "ds.tfrecord.fastdata.index-crc.npy"}
    crcs = np.load(manifest.parent / pieces["file"], allow_pickle=False)
    rows = np.load(_index_file(manifest), allow_pickle=False)
    assert crcs.dtype == np.dtype("<u4") and len(crcs) == 6
    assert crcs.tolist() == index_rows.piece_checksums(rows, 4).tolist()


def test_an_open_reads_no_rows_and_a_read_reads_its_pieces_only(small_pieces, monkeypatch):
    tree, manifest = small_pieces
    ds = fastdata.open_dataset(manifest, decode=BYTES)
    index = ds.reader._index
    assert index._rows is None and index.pieces_kept() == []  # nothing read at open
    assert ds[13] == (tree.samples[13].data, tree.samples[13].label)
    assert index.pieces_kept() == [3]
    assert ds.reader.labels[[0, 23]].tolist() == [tree.samples[0].label,
                                                  tree.samples[23].label]
    assert index.pieces_kept() == [3, 0, 5]
    monkeypatch.setattr(index_rows, "PIECES_KEPT", 2)  # the least recently used go
    ds = fastdata.open_dataset(manifest, decode=BYTES)
    index = ds.reader._index
    ds[13], ds[0], ds[23]
    assert index.pieces_kept() == [0, 5]
    assert ds.reader.labels[np.arange(24)].tolist() == [s.label for s in tree.samples]
    assert list(ds.reader.labels) == [s.label for s in tree.samples]
    with pytest.raises(IndexError):
        ds.reader.labels[24]  # inside the last piece's slot, past the last record
    assert [ds[i][1] for i in (13, 0, 9)] == [tree.samples[i].label for i in (13, 0, 9)]


def test_a_damaged_piece_is_refused_where_it_is_and_the_rest_reads(small_pieces):
    tree, manifest = small_pieces
    _damage_label(manifest, 13, 2)  # another class: only the CRC-32 can tell
    ds = fastdata.open_dataset(manifest, decode=BYTES)
    assert [ds[i][1] for i in range(12)] == [s.label for s in tree.samples[:12]]
    with pytest.raises(CorruptDataError, match=r"rows 12\.\.15 of the dataset index fail "
                                               r"their CRC-32") as info:
        ds[14]
    assert info.value.path == str(_index_file(manifest))
    with pytest.raises(CorruptDataError, match=r"rows 12\.\.15"):
        ds[13]  # refused again: a damaged piece is never kept
    assert ds[16][1] == tree.samples[16].label
    result = verify_dataset(manifest, progress=False)
    assert not result.ok
    assert any(p["index"] is None and "rows 12..15" in p["reason"] for p in result.problems)


def test_without_piece_checksums_a_label_outside_the_classes_is_still_named(small_pieces):
    _, manifest = small_pieces
    data = json.loads(manifest.read_text())
    del data["extra"]["index_pieces"]  # as packed before them
    data["checksums"].pop("metadata_sha256", None)
    manifest.write_text(json.dumps(data))
    _damage_label(manifest, 21, 7)
    ds = fastdata.open_dataset(manifest, decode=BYTES)
    assert ds[3][0]  # another piece
    with pytest.raises(CorruptDataError, match="record 21 has label 7, not a class index"):
        ds[20]


def test_a_damaged_piece_checksum_file_is_refused_on_open(small_pieces):
    _, manifest = small_pieces
    crcs = manifest.parent / json.loads(manifest.read_text())["extra"]["index_pieces"]["file"]
    data = bytearray(crcs.read_bytes())
    data[-1] ^= 0x01
    crcs.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="piece checksums fail the SHA-256"):
        fastdata.open_dataset(manifest, decode=BYTES)

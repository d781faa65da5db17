"""The TFRecord container: shards of tf.train.Example, index files, interop with
the ``tfrecord`` package both ways, CRC checks, streaming with DataLoader workers."""

from __future__ import annotations

import glob
import io
import os
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import optional
import pytest
import torch
from conftest import assert_pixels, build_tree, no_hang, uniform_spec
from PIL import Image

import fastdata
from fastdata.errors import CorruptDataError, ManifestError
from fastdata.formats.tfrecord.example import encode_example, parse_example
from fastdata.formats.tfrecord.reader import TFRecordReader
from fastdata.packers.pack import PackOptions
from fastdata.formats.tfrecord.schema import (
    FORMAT_KEY,
    HEIGHT_KEY,
    IMAGE_KEY,
    LABEL_KEY,
    SOURCE_KEY_KEY,
    WIDTH_KEY,
    frame_record,
    masked_crc32c,
)

tfrecord = optional.require("tfrecord")
from tfrecord import example_pb2  # noqa: E402  (after the probe)
from tfrecord.torch.dataset import TFRecordDataset as PkgTFRecordDataset  # noqa: E402

# 18 images, 3 classes, mixed encodings; shard_size=3 gives 6 shards of 3.
SPEC = uniform_spec(per_class=6, exts=(".png", ".jpg", ".bmp"))
BYTES = fastdata.Decode(output="bytes")  # the stored payloads


@pytest.fixture
def tree(tmp_path):
    return build_tree(tmp_path / "src", SPEC)


@pytest.fixture
def sharded(tmp_path, tree):
    """(summary, tree): ``tree`` packed into out.tfrecord with 3 records per shard."""
    summary = fastdata.pack(tree.root, tmp_path / "out" / "out.tfrecord",
                            options=PackOptions(shard_size=3), progress=False)
    return summary, tree


def _shards(summary) -> list[str]:
    return sorted(glob.glob(os.path.join(os.path.dirname(summary.output), "out-*.tfrecord")))


def _frames(path: str) -> list[tuple[int, int, bytes]]:
    """(offset, framed size, data) of every record, walked with plain struct."""
    out = []
    blob = Path(path).read_bytes()
    pos = 0
    while pos < len(blob):
        (length,) = struct.unpack_from("<Q", blob, pos)
        out.append((pos, 16 + length, blob[pos + 12:pos + 12 + length]))
        pos += 16 + length
    return out


# -- packing and reading back --------------------------------------------------------


def test_round_trip_bit_exact_sharded(sharded):
    summary, tree = sharded
    out_dir = os.path.dirname(summary.output)
    assert summary.output.endswith("out.tfrecord.fastdata.json") and os.path.isfile(summary.output)
    assert summary.format == "tfrecord" and summary.records == len(tree) == 18
    names = sorted(os.listdir(out_dir))
    shards = [f"out-{i:05d}-of-00006.tfrecord" for i in range(6)]
    assert names == sorted(shards + [s + ".idx" for s in shards] + [
        "out.tfrecord.fastdata.json", "out.tfrecord.fastdata.index-crc.npy",
        "out.tfrecord.fastdata.index.npy", "out.tfrecord.fastdata.keys-pieces.npy",
        "out.tfrecord.fastdata.keys.json"])

    for path in (summary.output, os.path.join(out_dir, "out.tfrecord"),
                 os.path.join(out_dir, "out-%05d.tfrecord"),
                 os.path.join(out_dir, "out-{00000..00005}.tfrecord")):
        with TFRecordReader(path) as reader:
            assert len(reader) == 18
            assert reader.read_many(range(18)) == tree.payloads
            assert reader.labels.tolist() == tree.labels
            assert reader.keys == tree.keys
            assert reader.classes == tree.classes
            assert [s["count"] for s in reader.manifest.shards] == [3] * 6
            assert [(i, d) for i, d, _ in reader] == list(enumerate(tree.payloads))
            assert reader.read(-1) == tree.payloads[-1]

    ds = fastdata.open_dataset(summary.output, decode=BYTES)
    assert isinstance(ds, fastdata.TFRecordDataset)
    assert [ds[i] for i in range(len(ds))] == list(zip(tree.payloads, tree.labels))
    assert ds.__getitems__([17, 0, 5]) == [(tree.payloads[i], tree.labels[i]) for i in (17, 0, 5)]


def test_single_file_by_default(tmp_path, tree):
    summary = fastdata.pack(tree.root, tmp_path / "one.tfrecord", progress=False)
    assert sorted(os.listdir(tmp_path)) == sorted([
        "one.tfrecord", "one.tfrecord.idx", "one.tfrecord.fastdata.json",
        "one.tfrecord.fastdata.index-crc.npy", "one.tfrecord.fastdata.index.npy",
        "one.tfrecord.fastdata.keys.json", "one.tfrecord.fastdata.keys-pieces.npy", "src"])
    ds = fastdata.TFRecordDataset(tmp_path / "one.tfrecord")
    for i in range(len(ds)):
        image, label = ds[i]
        assert label == tree.labels[i]
        assert_pixels(image.numpy(), tree.payloads[i], chw=True, what=tree.keys[i])
    assert summary.bytes_out == os.path.getsize(tmp_path / "one.tfrecord")


def test_wire_format_is_standard(sharded):
    """Every record parses with protobuf's own Example class, the framing CRCs are
    TFRecord's masked CRC32C, and the .idx files are what tfrecord2idx writes."""
    from tfrecord.tools.tfrecord2idx import create_index
    from tfrecord.writer import TFRecordWriter as PkgWriter

    summary, tree = sharded
    seen = 0
    index = np.load(summary.output.replace(".json", ".index.npy"), allow_pickle=False)
    for number, path in enumerate(_shards(summary)):
        blob = Path(path).read_bytes()
        rows = []
        for offset, framed, data in _frames(path):
            length = blob[offset:offset + 8]
            assert blob[offset + 8:offset + 12] == PkgWriter.masked_crc(length)
            assert blob[offset + framed - 4:offset + framed] == PkgWriter.masked_crc(data)
            assert struct.pack("<I", masked_crc32c(data)) == PkgWriter.masked_crc(data)
            ex = example_pb2.Example()
            ex.ParseFromString(data)
            f = ex.features.feature
            payload = tree.payloads[seen]
            with Image.open(io.BytesIO(payload)) as img:
                width, height, fmt = img.width, img.height, img.format.lower()
            assert f[IMAGE_KEY].bytes_list.value == [payload]
            assert f[LABEL_KEY].int64_list.value == [tree.labels[seen]]
            assert f[SOURCE_KEY_KEY].bytes_list.value == [tree.keys[seen].encode()]
            assert f[FORMAT_KEY].bytes_list.value == [fmt.encode()]
            assert (f[WIDTH_KEY].int64_list.value, f[HEIGHT_KEY].int64_list.value) == (
                [width], [height])
            # Deterministic serialization: the same bytes as protobuf's.
            assert ex.SerializeToString(deterministic=True) == data
            row = index[seen]
            assert (int(row["shard"]), int(row["offset"]), int(row["size"])) == (
                number, offset, framed)
            rows.append(f"{offset} {framed}\n")
            seen += 1
        assert Path(path + ".idx").read_text() == "".join(rows)
        create_index(path, str(Path(path).with_suffix(".ref")))
        assert Path(path + ".idx").read_bytes() == Path(path).with_suffix(".ref").read_bytes()
    assert seen == 18


def _as_pair(features: dict) -> tuple[bytes, int]:
    return bytes(features[IMAGE_KEY]), int(features[LABEL_KEY][0])


def test_tfrecord_package_reads_our_shards_with_our_index(sharded):
    """The ``tfrecord`` package's reader, split over 2 DataLoader workers by OUR
    .idx files, returns every image and label exactly once."""
    summary, tree = sharded
    parts = [PkgTFRecordDataset(p, p + ".idx", description=[IMAGE_KEY, LABEL_KEY],
                                transform=_as_pair) for p in _shards(summary)]
    loader = torch.utils.data.DataLoader(torch.utils.data.ChainDataset(parts),
                                         batch_size=None, num_workers=2)
    with no_hang(60):
        got = [tuple(sample) for sample in loader]  # the loader turns tuples into lists
    assert Counter(got) == Counter(zip(tree.payloads, tree.labels))


def test_tfrecord_package_loader_one_file(sharded):
    summary, tree = sharded
    first = _shards(summary)[0]
    got = [_as_pair(f) for f in tfrecord.reader.tfrecord_loader(first, first + ".idx",
                                                                shard=(0, 1))]
    assert got == list(zip(tree.payloads[:3], tree.labels[:3]))


# -- foreign files ------------------------------------------------------------------


def _write_foreign(path, samples, *, keys=True, image_key=IMAGE_KEY, label_key=LABEL_KEY):
    """Write ``samples`` with the ``tfrecord`` package's writer (no fastdata involved)."""
    writer = tfrecord.TFRecordWriter(os.fspath(path))
    for i, (key, label, data) in enumerate(samples):
        record = {image_key: (data, "byte"), label_key: (label, "int"),
                  "image/format": (b"png", "byte"), "image/height": (8, "int"),
                  "image/width": (8, "int"), "extra/score": ([0.5, 1.5], "float")}
        if keys:
            record[SOURCE_KEY_KEY] = (key.encode(), "byte")
        writer.write(record)
    writer.close()


def test_reads_files_written_by_the_tfrecord_package(tmp_path, tree):
    samples = tree.samples
    a, b = tmp_path / "train-00000-of-00002.tfrecord", tmp_path / "train-00001-of-00002.tfrecord"
    _write_foreign(a, samples[:10])
    _write_foreign(b, samples[10:], keys=False)
    files = [os.fspath(a), os.fspath(b)]

    reader = TFRecordReader(files)
    assert len(reader) == 18 and reader.manifest.extra.get("foreign")
    assert reader.read_many(range(18)) == tree.payloads
    assert reader.labels.tolist() == tree.labels
    assert reader.keys == tree.keys[:10] + [f"{b.name}:{n}" for n in range(8)]
    assert reader.manifest.classes == ["0", "1", "2"]

    single = TFRecordReader(a)  # one file by name: no manifest, scanned
    assert single.read_many(range(10)) == tree.payloads[:10]

    ds = fastdata.TFRecordDataset(files, decode=BYTES)
    assert [ds[i] for i in range(18)] == list(zip(tree.payloads, tree.labels))
    stream = fastdata.ShardedIterableDataset(files, decode=BYTES)
    assert list(stream) == list(zip(tree.payloads, tree.labels))
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
    with no_hang(60):
        got = [tuple(sample) for sample in loader]
    assert Counter(got) == Counter(zip(tree.payloads, tree.labels))


def test_other_feature_names_need_feature_keys(tmp_path, tree):
    path = tmp_path / "other.tfrecord"
    _write_foreign(path, tree.samples, image_key="jpg", label_key="cls")
    with pytest.raises(ManifestError) as info:
        TFRecordReader(path)
    message = str(info.value)
    assert "'image/encoded'" in message and "feature_keys" in message
    assert "jpg" in message and "cls" in message  # lists what the file has
    assert info.value.path == os.fspath(path) and info.value.offset == 0

    keys = {"image": "jpg", "label": "cls"}
    reader = TFRecordReader(path, feature_keys=keys)
    assert reader.read_many(range(18)) == tree.payloads
    assert reader.labels.tolist() == tree.labels
    ref = fastdata.DatasetRef(path, reader_settings={"feature_keys": keys})
    ds = fastdata.TFRecordDataset(ref, decode=BYTES)
    assert ds[3] == (tree.payloads[3], tree.labels[3])
    stream = fastdata.ShardedIterableDataset(ref, decode=BYTES)
    assert list(stream) == list(zip(tree.payloads, tree.labels))

    with pytest.raises(ManifestError, match="'image/class/label'"):
        TFRecordReader(path, feature_keys={"image": "jpg"})  # label still the default
    with pytest.raises(ValueError, match="roles"):
        TFRecordReader(path, feature_keys={"picture": "jpg"})


def test_label_of_the_wrong_type(tmp_path, tree):
    path = tmp_path / "bad_label.tfrecord"
    writer = tfrecord.TFRecordWriter(os.fspath(path))
    writer.write({IMAGE_KEY: (tree.payloads[0], "byte"), LABEL_KEY: (b"cat", "byte")})
    writer.close()
    with pytest.raises(ManifestError, match="int64"):
        TFRecordReader(path)


def _entry(key: bytes, feature: bytes, *, value_first: bool = False) -> bytes:
    k = b"\x0a" + bytes([len(key)]) + key
    v = b"\x12" + _varint(len(feature)) + feature
    return v + k if value_first else k + v


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(field: int, body: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(body)) + body


def test_parser_follows_protobuf_rules():
    """Unpacked int64s, entries in any order with their fields swapped, unknown
    fields at every level (varint, fixed32/64, groups), a repeated map key (last
    wins) and a split Features message: we agree with protobuf's own parser."""
    image = bytes(range(256)) * 3
    unpacked = _varint(1 << 3 | 0) + _varint(7) + _varint(1 << 3 | 0) + _varint(-2)
    unknown = (_varint(9 << 3 | 0) + _varint(300) + _varint(10 << 3 | 1) + b"\x00" * 8
               + _varint(11 << 3 | 5) + b"\x00" * 4 + _varint(12 << 3 | 3)
               + _varint(1 << 3 | 0) + b"\x01" + _varint(12 << 3 | 4))
    label_feature = _ld(3, unpacked + unknown)
    image_feature = unknown + _ld(1, _ld(1, image))
    features_a = (_ld(1, _entry(b"image/class/label", _ld(3, _ld(1, _varint(99))))) + unknown
                  + _ld(1, _entry(IMAGE_KEY.encode(), _ld(1, _ld(1, b"replaced later")))))
    features_b = (_ld(1, _entry(IMAGE_KEY.encode(), image_feature, value_first=True))
                  + _ld(1, _entry(b"image/class/label", label_feature))
                  + _ld(1, _entry(b"score", _ld(2, _ld(1, struct.pack("<2f", 0.5, -1.0)))))
                  + _ld(1, _entry(b"unpacked_floats",
                                  _ld(2, b"\x0d" + struct.pack("<f", 2.5)))))
    data = _varint(7 << 3 | 0) + b"\x05" + _ld(1, features_a) + unknown + _ld(1, features_b)

    ref = example_pb2.Example()
    ref.ParseFromString(data)
    ours = parse_example(data)
    assert set(ours) == set(ref.features.feature)
    assert ours[IMAGE_KEY] == ("bytes", list(ref.features.feature[IMAGE_KEY].bytes_list.value))
    assert ours[IMAGE_KEY][1] == [image]
    assert ours["image/class/label"] == ("int64", [7, -2])
    assert list(ref.features.feature["image/class/label"].int64_list.value) == [7, -2]
    assert ours["score"] == ("float", [0.5, -1.0])
    assert ours["unpacked_floats"] == ("float", [2.5])

    # Unknown fields inside a map entry: protobuf's C++ parser (TensorFlow's) keeps
    # the entry, Python's upb moves it to the unknown fields; we keep it.
    entry = _entry(b"k", _ld(1, _ld(1, b"v"))) + unknown
    assert parse_example(_ld(1, _ld(1, entry))) == {"k": ("bytes", [b"v"])}
    assert parse_example(encode_example({"a": [1, -1], "b": b"x"})) == {
        "a": ("int64", [1, -1]), "b": ("bytes", [b"x"])}


def test_parser_reads_a_hand_made_foreign_file(tmp_path):
    image = b"\x89PNG-not-really" * 20
    label = _ld(3, _varint(1 << 3 | 0) + _varint(4))  # unpacked
    features = (_ld(1, _entry(b"image/key", _ld(1, _ld(1, b"k/1.png"))))
                + _ld(1, _entry(b"image/class/label", label, value_first=True))
                + _ld(1, _entry(IMAGE_KEY.encode(), _ld(1, _ld(1, image)))))
    data = _ld(1, features)
    path = tmp_path / "hand.tfrecord"
    path.write_bytes(frame_record(data) * 2)
    reader = TFRecordReader(path)
    assert reader.read_many([0, 1]) == [image, image]
    assert reader.labels.tolist() == [4, 4]
    assert reader.keys == ["k/1.png", "k/1.png"]


# -- damage ----------------------------------------------------------------------------


def test_flipped_data_byte_fails_crc_with_file_and_offset(sharded):
    summary, tree = sharded
    shard = _shards(summary)[1]
    offset, framed, data = _frames(shard)[2]  # record 5
    with open(shard, "r+b") as f:
        f.seek(offset + 12 + data.index(tree.payloads[5]) + 10)  # inside the payload
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))

    reader = TFRecordReader(summary.output)
    assert reader.read(4) == tree.payloads[4]
    with pytest.raises(CorruptDataError) as info:
        reader.read(5)
    assert info.value.path == shard and info.value.offset == offset
    assert os.path.basename(shard) in str(info.value)
    assert f"byte offset {offset}" in str(info.value)
    assert "CRC32C" in str(info.value)

    stream = fastdata.ShardedIterableDataset(summary.output, decode=BYTES)
    with no_hang(), pytest.raises(CorruptDataError, match=f"offset {offset}"):
        list(stream)
    skipping = fastdata.ShardedIterableDataset(summary.output, decode=BYTES, on_error="skip")
    with no_hang(), pytest.warns(RuntimeWarning, match="skipping corrupt"):
        got = list(skipping)
    assert len(got) == 18 - 1 and skipping.skipped == 1  # the rest of that shard is dropped

    ds = fastdata.TFRecordDataset(summary.output, decode=BYTES, on_error="skip")
    with pytest.warns(RuntimeWarning):
        assert ds.__getitems__([4, 5, 6]) == [(tree.payloads[i], tree.labels[i]) for i in (4, 6)]

    # A file without a manifest is checked while it is scanned.
    with pytest.raises(CorruptDataError, match=f"offset {offset}"):
        TFRecordReader([shard])


def test_flipped_length_byte(sharded):
    summary, _ = sharded
    shard = _shards(summary)[0]
    offset = _frames(shard)[1][0]
    with open(shard, "r+b") as f:
        f.seek(offset + 1)
        f.write(b"\x7f")  # a huge length: must be refused, never allocated or waited for
    reader = TFRecordReader(summary.output)
    for read in (lambda: reader.read(1), lambda: list(reader.iter_shard(0)),
                 lambda: TFRecordReader([shard])):
        with no_hang(), pytest.raises(CorruptDataError, match="length fails its CRC32C"):
            read()


def test_verify_false_skips_the_data_crc(sharded):
    summary, tree = sharded
    shard = _shards(summary)[0]
    offset, _, data = _frames(shard)[0]
    with open(shard, "r+b") as f:
        f.seek(offset + 12 + data.index(tree.payloads[0]) + 10)
        f.write(bytes([tree.payloads[0][10] ^ 0xFF]))
    reader = TFRecordReader(summary.output, verify=False)
    assert reader.read(0) != tree.payloads[0] and reader.read(1) == tree.payloads[1]


@pytest.mark.parametrize("cut", ["mid_record", "mid_header"])
def test_truncated_shard_raises(sharded, cut):
    summary, tree = sharded
    shard = _shards(summary)[-1]
    frames = _frames(shard)
    offset, framed, _ = frames[-1]
    new_size = offset + framed // 2 if cut == "mid_record" else offset + 5

    reader = TFRecordReader(summary.output)  # opened before the damage
    with open(shard, "r+b") as f:
        f.truncate(new_size)
    with no_hang():
        with pytest.raises(CorruptDataError, match="truncated") as info:
            reader.read(17)
        assert info.value.path == shard
        assert reader.read(16) == tree.payloads[16]
        with pytest.raises(CorruptDataError, match="truncated"):
            list(reader.iter_shard(5))
        reopened = TFRecordReader(summary.output)  # a shard is checked as it is read
        with pytest.raises(CorruptDataError, match="truncated"):
            reopened.read(17)
        assert reopened.read(16) == tree.payloads[16]
        with pytest.raises(CorruptDataError, match="truncated") as info:
            TFRecordReader([shard])  # scanned without a manifest
        assert info.value.offset == offset
        with pytest.raises(CorruptDataError):
            list(fastdata.ShardedIterableDataset(_shards(summary)[:5] + [shard]))


def test_not_a_tfrecord_file(tmp_path):
    path = tmp_path / "junk.tfrecord"
    path.write_bytes(b"this is not a TFRecord file at all" * 4)
    with no_hang(), pytest.raises(CorruptDataError, match="not a TFRecord file"):
        TFRecordReader(path)


# -- streaming ---------------------------------------------------------------------------


@pytest.mark.parametrize("shard_size", [3, 100])  # 6 shards; 1 shard (record split)
@pytest.mark.parametrize("shuffle", [False, True])
def test_iterable_two_workers_every_sample_once(tmp_path, tree, shard_size, shuffle):
    summary = fastdata.pack(tree.root, tmp_path / "out" / "s.tfrecord",
                            options=PackOptions(shard_size=shard_size), progress=False)
    stream = fastdata.ShardedIterableDataset(
        summary.output, decode=BYTES, order=fastdata.Order(shuffle=shuffle, window=4, seed=1))
    assert len(stream.reader.shard_paths) == (6 if shard_size == 3 else 1)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
    with no_hang(60):
        got = [tuple(sample) for sample in loader]
    assert len(got) == 18
    assert Counter(got) == Counter(zip(tree.payloads, tree.labels))


def test_streaming_matches_random_access(sharded):
    summary, _ = sharded
    expected = TFRecordReader(summary.output).read_many(range(18))
    for chunk in (1, 100, 3000):  # blocks smaller than a record, or ending inside one
        reader = TFRecordReader(summary.output, chunk_size=chunk)
        assert [p for s in range(6) for _, p in reader.iter_shard(s)] == expected


def test_overwrite_replaces_shards_and_idx(sharded, tmp_path):
    summary, tree = sharded
    fastdata.pack(tree.root, tmp_path / "out" / "out.tfrecord",
                  options=PackOptions(shard_size=10, overwrite=True), progress=False)
    names = sorted(os.listdir(tmp_path / "out"))
    assert [n for n in names if n.endswith((".tfrecord", ".idx"))] == [
        "out-00000-of-00002.tfrecord", "out-00000-of-00002.tfrecord.idx",
        "out-00001-of-00002.tfrecord", "out-00001-of-00002.tfrecord.idx"]
    assert TFRecordReader(summary.output).read_many(range(18)) == tree.payloads


def test_reader_pickles_and_reads_in_workers(sharded):
    summary, tree = sharded
    ds = fastdata.TFRecordDataset(summary.output, decode=BYTES)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2,
                                         collate_fn=lambda batch: batch)
    got = [s for batch in loader for s in batch]
    assert got == list(zip(tree.payloads, tree.labels))


def test_byte_shard_size_counts_framed_records(tmp_path, tree):
    """A byte ``shard_size`` bounds the shard files themselves (framing and
    Example encoding included), except a shard of a single larger record."""
    limit = 2 * max(len(p) for p in tree.payloads)
    summary = fastdata.pack(tree.root, tmp_path / "b.tfrecord",
                            options=PackOptions(shard_size=f"{limit}b"), progress=False)
    shards = sorted(glob.glob(os.fspath(tmp_path / "b-*.tfrecord")))
    assert len(shards) > 1
    for path in shards:
        frames = _frames(path)
        assert os.path.getsize(path) <= limit or len(frames) == 1
    assert TFRecordReader(summary.output).read_many(range(18)) == tree.payloads

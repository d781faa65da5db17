"""The LMDB container: packing, the documented key schema, the reader and the Dataset."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import warnings
import pickle
import zlib
from collections import Counter

import lmdb
import numpy as np
import pytest
import torch
from conftest import (
    DEFAULT_CLASSES,
    IMG_EXTENSIONS,
    assert_pixels,
    build_tree,
    lmdb_get,
    lmdb_put,
    run_python,
    uniform_spec,
)
from PIL import Image

import fastdata
from fastdata.errors import (
    CorruptDataError,
    DecodeError,
    FastDataError,
    ManifestError,
    UnknownFormatError,
)
from fastdata import Decode
from fastdata.loaders.datasets import LMDBDataset
from fastdata.formats.lmdb.reader import LMDBReader
from fastdata.ops.verify import verify_dataset
from fastdata.packers.pack import PackOptions
from fastdata.records import MANIFEST_VERSION


def _encoding_of(data: bytes) -> str:
    """The encoding name a record's bytes should be filed under (test-side sniff)."""
    if data[:2] in (b"P6", b"P3"):
        return "ppm"
    if data[:2] in (b"P5", b"P2"):
        return "pgm"
    with Image.open(io.BytesIO(data)) as img:
        return {"JPEG": "jpeg", "PNG": "png", "BMP": "bmp", "WEBP": "webp",
                "TIFF": "tiff", "GIF": "gif"}[img.format]





# -- a shared, read-only pack -------------------------------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    base = tmp_path_factory.mktemp("lmdb_shared")
    tree = build_tree(base / "src")
    out = base / "train.lmdb"
    summary = fastdata.pack(tree.root, out, progress=False)
    return tree, out, summary


def test_pack_summary(shared):
    tree, out, summary = shared
    assert summary.output == str(out)
    assert summary.format == "lmdb"
    assert summary.records == len(tree.samples)
    assert summary.classes == len(DEFAULT_CLASSES)
    assert summary.bytes_in == sum(len(s.data) for s in tree.samples)
    assert summary.bytes_out > 0 and summary.seconds >= 0
    assert summary.skipped == []
    assert summary.ignored == 8  # 5 hidden, 1 stray, notes.txt, thumbs.db and b3.gif
    assert summary.ignored_extensions == {"db": 1, "gif": 1, "txt": 1}
    assert any("z_empty" in w for w in summary.warnings)
    assert summary.encodings == dict(Counter(_encoding_of(s.data) for s in tree.samples))
    assert os.path.isdir(out) and os.path.isfile(out / "data.mdb")


def test_round_trip_bit_exact(shared):
    tree, out, _ = shared
    with LMDBReader(out) as reader:
        assert len(reader) == len(tree.samples)
        assert reader.keys == tree.keys
        assert reader.labels.tolist() == tree.labels
        assert reader.labels.dtype == np.int64
        assert reader.classes == tree.classes
        for i, sample in enumerate(tree.samples):
            assert reader.read(i) == sample.data, sample.key
        assert reader.read(-1) == tree.samples[-1].data
        order = list(range(len(tree.samples)))[::-3]
        assert reader.read_many(order) == [tree.samples[i].data for i in order]
        assert [(i, bytes(d), lbl) for i, d, lbl in reader] == [
            (i, s.data, s.label) for i, s in enumerate(tree.samples)]
        with pytest.raises(IndexError):
            reader.read(len(tree.samples))
        with pytest.raises(IndexError):
            reader.read(-len(tree.samples) - 1)


def test_open_reader_picks_lmdb(shared):
    _, out, _ = shared
    with fastdata.formats.open_reader(out) as reader:
        assert isinstance(reader, LMDBReader)


def test_manifest_fields(shared):
    tree, out, _ = shared
    m = fastdata.formats.read_manifest(out)
    assert m.format == "lmdb"
    assert m.version == MANIFEST_VERSION == 1
    assert m.count == len(tree.samples)
    assert m.classes == tree.classes
    assert m.class_counts == tree.class_counts == [5, 5, 3, 3, 0]
    assert m.class_to_idx == {c: i for i, c in enumerate(tree.classes)}
    assert m.encoding["storage"] == "keep"
    assert m.encoding["formats"] == dict(Counter(_encoding_of(s.data) for s in tree.samples))
    assert sum(m.encoding["formats"].values()) == m.count
    assert m.checksums["record"] == "crc32"
    assert m.checksums["payload_sha256"] == hashlib.sha256(
        b"".join(s.data for s in tree.samples)).hexdigest()
    total = sum(len(s.data) for s in tree.samples)
    assert m.bytes["source"] == total and m.bytes["payload"] == total
    assert m.bytes["on_disk"] > 0
    assert [s["path"] for s in m.shards] == ["data.mdb"]
    assert m.shards[0]["count"] == m.count
    created = dt.datetime.fromisoformat(m.created_at)
    assert created.tzinfo is not None
    age = dt.datetime.now(dt.timezone.utc) - created
    assert dt.timedelta(seconds=-5) < age < dt.timedelta(hours=1)
    assert m.pack_options["format"] == "lmdb"
    assert m.pack_options["strict"] is False
    assert m.pack_options["verify_decode"] is False
    assert m.source["root"] == os.path.basename(tree.root)  # a name: no machine's folders
    assert m.source["files"] == len(tree.samples)
    assert m.source["skipped"] == 0 and m.source["ignored"] == 8
    assert m.source["extensions"] == [e[1:] for e in IMG_EXTENSIONS]  # torchvision's
    assert m.source["ignored_extensions"] == {"db": 1, "gif": 1, "txt": 1}
    assert m.pack_options["extensions"] is None
    assert m.fastdata_version == fastdata.__version__
    d = m.to_dict()
    assert d["kind"] == "fastdata-manifest"
    assert json.loads(m.to_json()) == d


def test_plain_lmdb_key_schema(tmp_path, image_tree):
    out = tmp_path / "plain.lmdb"
    fastdata.pack(image_tree.root, out, progress=False)
    n = len(image_tree.samples)
    env = lmdb.open(str(out), subdir=True, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            keys = [bytes(k) for k, _ in txn.cursor()]
            sample_keys = [f"{i:010d}".encode() for i in range(n)]
            # Sample keys first, in record order, then the metadata keys.
            # The columns whole, in pieces of 128 values (one here), their pieces' CRC-32s.
            assert keys == sample_keys + [
                b"__crc32__", b"__crc32__/0000000000", b"__crc32_pieces__", b"__keys__",
                b"__labels__", b"__labels__/0000000000", b"__labels_pieces__",
                b"__manifest__"]
            for i, s in enumerate(image_tree.samples):
                assert txn.get(f"{i:010d}".encode()) == s.data
            labels = np.frombuffer(txn.get(b"__labels__"), dtype="<i8")
            assert labels.tolist() == image_tree.labels
            crcs = np.frombuffer(txn.get(b"__crc32__"), dtype="<u4")
            assert crcs.tolist() == [zlib.crc32(s.data) for s in image_tree.samples]
            assert json.loads(txn.get(b"__keys__").decode("utf-8")) == image_tree.keys
            manifest = json.loads(txn.get(b"__manifest__").decode("utf-8"))
            assert manifest["kind"] == "fastdata-manifest"
            assert manifest["count"] == n and manifest["format"] == "lmdb"
            assert manifest["extra"]["key_schema"] == "fastdata-lmdb-1.1"
            for column in (b"__labels__", b"__crc32__"):
                assert txn.get(column + b"/0000000000") == txn.get(column)
                sums = np.frombuffer(txn.get(column[:-2] + b"_pieces__"), dtype="<u4")
                assert sums.tolist() == [zlib.crc32(txn.get(column))]
            assert manifest["extra"]["column_pieces"] == {
                "rows": 128, "checksums": {"__labels__": "__labels_pieces__",
                                            "__crc32__": "__crc32_pieces__"}}
    finally:
        env.close()


def test_small_map_and_commit_batches(tmp_path):
    # The map starts far too small and commits are tiny: it must grow and still round-trip.
    tree = build_tree(tmp_path / "src", uniform_spec(per_class=10), size=(40, 40))
    out = tmp_path / "grow.lmdb"
    fastdata.pack(tree.root, out, progress=False,
                  options=PackOptions(writer_options={"map_size": 1 << 15, "commit_every": 3}))
    with LMDBReader(out) as reader:
        assert [reader.read(i) for i in range(len(reader))] == tree.payloads
    m = fastdata.formats.read_manifest(out)
    assert m.pack_options["commit_every"] == 3


# -- the Dataset ----------------------------------------------------------------------


def test_dataset_tensor_output(shared):
    tree, out, _ = shared
    ds = LMDBDataset(out)
    assert len(ds) == len(tree.samples)
    for i, s in enumerate(tree.samples):
        img, label = ds[i]
        assert isinstance(img, torch.Tensor)
        assert img.dtype == torch.uint8 and img.ndim == 3 and img.shape[0] == 3
        assert_pixels(img.numpy(), s.data, chw=True, what=s.key)
        assert label == s.label and type(label) is int


def test_dataset_other_outputs(shared):
    tree, out, _ = shared
    as_np = LMDBDataset(out, decode=Decode(output="numpy"))
    as_pil = LMDBDataset(out, decode=Decode(output="pil"))
    as_bytes = LMDBDataset(out, decode=Decode(output="bytes"))
    for i, s in enumerate(tree.samples):
        arr, label = as_np[i]
        assert isinstance(arr, np.ndarray) and arr.dtype == np.uint8 and arr.shape[2] == 3
        assert_pixels(arr, s.data, what=s.key)
        assert label == s.label
        img, label = as_pil[i]
        assert isinstance(img, Image.Image) and img.mode == "RGB"
        assert_pixels(np.array(img), s.data, what=s.key)
        assert label == s.label
        raw, label = as_bytes[i]
        assert isinstance(raw, bytes) and raw == s.data and label == s.label
    with pytest.raises(ValueError, match="output"):
        LMDBDataset(out, decode=Decode(output="jpeg"))
    with pytest.raises(ValueError, match="on_error"):
        LMDBDataset(out, on_error="ignore")


def test_dataset_indexing(shared):
    tree, out, _ = shared
    ds = LMDBDataset(out, decode=Decode(output="bytes"))
    n = len(ds)
    assert ds[-1] == ds[n - 1] == (tree.samples[-1].data, tree.samples[-1].label)
    assert ds[-n] == ds[0]
    assert ds[np.int64(2)] == ds[2]
    for bad in (n, n + 5, -n - 1):
        with pytest.raises(IndexError):
            ds[bad]
    with pytest.raises(IndexError):
        ds.__getitems__([0, n])
    # A Python for-loop over a map-style dataset stops at IndexError.
    assert [b for b, _ in ds] == tree.payloads


def test_dataset_metadata(shared):
    tree, out, _ = shared
    ds = fastdata.open_dataset(out)
    assert type(ds) is LMDBDataset
    assert ds.classes == DEFAULT_CLASSES
    assert ds.class_to_idx == {c: i for i, c in enumerate(DEFAULT_CLASSES)}
    assert ds.targets == tree.labels
    assert ds.keys == tree.keys
    assert ds.path == str(out)
    assert ds.manifest.count == len(tree.samples)
    assert "LMDBDataset" in repr(ds)


def test_transforms(shared):
    tree, out, _ = shared
    ds = LMDBDataset(out, decode=Decode(output="numpy"), transform=lambda a: a.shape,
                     target_transform=lambda y: f"label-{y}")
    for i, s in enumerate(tree.samples):
        shape, label = ds[i]
        with Image.open(io.BytesIO(s.data)) as im:
            assert shape == (im.height, im.width, 3)
        assert label == f"label-{s.label}"
    t = LMDBDataset(out, transform=lambda x: x.float() / 255)
    img, _ = t[0]
    assert img.dtype == torch.float32 and float(img.max()) <= 1.0


def test_getitems_equals_getitem(shared):
    tree, out, _ = shared
    ds = LMDBDataset(out)
    idx = [5, 0, 15, 3, 3, 11]
    with warnings.catch_warnings():
        # The fixture's images differ in size; asked for directly, nothing stacks them.
        warnings.simplefilter("error", fastdata.MixedSizeWarning)
        batch = ds.__getitems__(idx)
    assert len(batch) == len(idx)
    for i, (img, label) in zip(idx, batch):
        one, one_label = ds[i]
        assert torch.equal(img, one) and label == one_label == tree.samples[i].label
    assert ds.__getitems__([]) == []


def test_two_datasets_on_one_path(shared):
    tree, out, _ = shared
    a = LMDBDataset(out, decode=Decode(output="bytes"))
    # The same folder, spelled differently.
    b = LMDBDataset(str(out) + "/", decode=Decode(output="bytes"))
    c = fastdata.open_dataset(out, decode=Decode(output="numpy"))
    assert a[0] == b[0] == (tree.samples[0].data, tree.samples[0].label)
    assert c[1][1] == tree.samples[1].label
    a.reader.close()  # closing one must not break the others
    assert b[3] == (tree.samples[3].data, tree.samples[3].label)
    assert_pixels(c[2][0], tree.samples[2].data)
    b.reader.close()
    assert a[4][0] == tree.samples[4].data  # a closed reader reopens on use
    c.reader.close()
    a.reader.close()


def test_pickle_small_and_usable(shared):
    tree, out, _ = shared
    ds = LMDBDataset(out, decode=Decode(output="bytes"))
    _ = ds[0], ds.targets, ds.keys  # load everything that could bloat the pickle
    blob = pickle.dumps(ds)
    assert len(blob) < 10_000
    clone = pickle.loads(blob)
    assert len(clone) == len(ds)
    assert [clone[i] for i in range(len(clone))] == [(s.data, s.label) for s in tree.samples]
    assert clone.targets == tree.labels and clone.keys == tree.keys
    assert ds[1] == clone[1]


def test_same_dataset_through_a_symlink(shared, tmp_path):
    tree, out, _ = shared
    link = tmp_path / "alias.lmdb"
    os.symlink(out, link)
    a = LMDBDataset(out, decode=Decode(output="bytes"))
    b = LMDBDataset(link, decode=Decode(output="bytes"))
    assert a[0] == b[0] == (tree.samples[0].data, tree.samples[0].label)


# -- bad input and damaged data -------------------------------------------------------------


def _plain_env_without_manifest(path):
    env = lmdb.open(os.fspath(path), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"0000000000", b"hello")
        txn.put(b"other", b"value")
    env.close()


@pytest.mark.parametrize("name", ["plain.lmdb", "plain_env"])
def test_not_a_fastdata_lmdb(tmp_path, name):
    path = tmp_path / name
    _plain_env_without_manifest(path)
    with pytest.raises(ManifestError) as info:
        fastdata.open_dataset(path)
    assert str(path) in str(info.value)
    assert "manifest" in str(info.value)


def test_missing_and_foreign_paths(tmp_path):
    with pytest.raises(ManifestError, match="no such"):
        fastdata.open_dataset(tmp_path / "missing.lmdb")
    with pytest.raises(UnknownFormatError):
        fastdata.open_dataset(tmp_path / "missing.whatever")
    junk = tmp_path / "junk.lmdb"
    junk.write_bytes(b"this is not an lmdb file at all" * 100)
    with pytest.raises(FastDataError) as info:
        fastdata.open_dataset(junk)
    assert str(junk) in str(info.value)
    empty_dir = tmp_path / "empty.lmdb"
    empty_dir.mkdir()
    with pytest.raises(FastDataError):
        fastdata.open_dataset(empty_dir)


def test_manifest_from_newer_version(packed):
    out = packed(".lmdb")
    manifest = json.loads(lmdb_get(out, b"__manifest__"))
    manifest["version"] = 999
    lmdb_put(out, {b"__manifest__": json.dumps(manifest).encode()})
    with pytest.raises(ManifestError, match="newer") as info:
        fastdata.open_dataset(out)
    assert str(out) in str(info.value)
    assert "999" in str(info.value)


def test_manifest_not_json(packed):
    out = packed(".lmdb")
    lmdb_put(out, {b"__manifest__": b"{not json"})
    with pytest.raises(ManifestError, match="JSON"):
        fastdata.open_dataset(out)


def test_corrupted_record_fails_crc(packed, image_tree):
    out = packed(".lmdb")
    bad = 2
    value = bytearray(image_tree.samples[bad].data)
    value[len(value) // 2] ^= 0xFF
    lmdb_put(out, {f"{bad:010d}".encode(): bytes(value)})

    ds = LMDBDataset(out)
    assert ds[bad - 1][1] == image_tree.samples[bad - 1].label
    with pytest.raises(CorruptDataError) as info:
        ds[bad]
    err = info.value
    assert err.key == image_tree.samples[bad].key
    assert (err.record, err.offset) == (bad, None)  # a record index, not a byte offset
    assert err.path == str(out)
    assert image_tree.samples[bad].key in str(err) and f"record {bad}" in str(err)
    # The record is named once, as a record: not "offset 2: record 2".
    assert str(err).count(f"record {bad}") == 1 and "offset" not in str(err)
    with pytest.raises(CorruptDataError):
        ds.__getitems__(list(range(len(ds))))
    # The errors survive pickling (they cross DataLoader worker boundaries).
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), again.key, again.record, again.offset, str(again)) == (
        CorruptDataError, err.key, err.record, err.offset, str(err))

    # Without verification the damaged bytes come through unchecked.
    raw = LMDBDataset(fastdata.DatasetRef(out, verify=False), decode=Decode(output="bytes"))
    assert raw[bad][0] == bytes(value)
    # read_many(check=) overrides the reader's own setting, either way.
    assert ds.reader.read_many([bad], check=False) == [bytes(value)]
    with pytest.raises(CorruptDataError):
        raw.reader.read_many([bad], check=True)

    skip = LMDBDataset(out, decode=Decode(output="bytes"), on_error="skip")
    with pytest.warns(RuntimeWarning, match="skipping corrupt record"):
        batch = skip.__getitems__(list(range(len(skip))))
    assert batch == [(s.data, s.label) for i, s in enumerate(image_tree.samples) if i != bad]
    assert skip.skipped == 1
    with pytest.warns(RuntimeWarning):
        # __getitem__ moves on to the next record.
        assert skip[bad] == (image_tree.samples[bad + 1].data, image_tree.samples[bad + 1].label)
    assert skip.skipped == 2

    # Decoded batches check the CRC32s in their decode threads: the same errors.
    threaded = LMDBDataset(out, decode=Decode(size=(8, 8)), decode_threads=2)
    with pytest.raises(CorruptDataError) as info:
        threaded.__getitems__(list(range(len(threaded))))
    assert (info.value.record, info.value.key) == (bad, image_tree.samples[bad].key)
    skip_threads = LMDBDataset(out, decode=Decode(size=(8, 8)), decode_threads=2, on_error="skip")
    with pytest.warns(RuntimeWarning, match=f"skipping corrupt record {bad} "):
        batch = skip_threads.__getitems__(list(range(len(skip_threads))))
    assert [label for _, label in batch] == [
        s.label for i, s in enumerate(image_tree.samples) if i != bad]
    assert all(tuple(image.shape) == (3, 8, 8) for image, _ in batch)
    assert skip_threads.skipped == 1


def test_undecodable_payload_with_matching_crc(packed, image_tree):
    out = packed(".lmdb")
    bad = 4
    garbage = b"definitely not an image" * 3
    crcs = np.frombuffer(lmdb_get(out, b"__crc32__"), dtype="<u4").copy()
    crcs[bad] = zlib.crc32(garbage)
    # The CRC32 array is under a CRC-32 per piece, and both under a SHA-256 in the
    # manifest: record the new ones too, as a pack of these bytes would have.
    sums = np.asarray([zlib.crc32(crcs.tobytes())], dtype="<u4").tobytes()
    manifest = json.loads(lmdb_get(out, b"__manifest__"))
    digests = manifest["checksums"]["metadata_sha256"]
    digests["__crc32__"] = hashlib.sha256(crcs.tobytes()).hexdigest()
    digests["__crc32_pieces__"] = hashlib.sha256(sums).hexdigest()
    lmdb_put(out, {f"{bad:010d}".encode(): garbage, b"__crc32__": crcs.tobytes(),
                   b"__crc32__/0000000000": crcs.tobytes(), b"__crc32_pieces__": sums,
                   b"__manifest__": json.dumps(manifest).encode()})

    ds = LMDBDataset(out)
    with pytest.raises(DecodeError) as info:
        ds[bad]
    assert info.value.key == image_tree.samples[bad].key
    assert info.value.record == bad
    assert str(out) in str(info.value)
    # Pillow's "cannot identify image file <_io.BytesIO object at 0x...>" in words.
    assert "not an image Pillow can identify" in str(info.value)
    assert " at 0x" not in str(info.value) and "BytesIO" not in str(info.value)
    as_bytes = LMDBDataset(out, decode=Decode(output="bytes"))
    assert as_bytes[bad] == (garbage, image_tree.samples[bad].label)
    with pytest.raises(DecodeError):
        LMDBDataset(out, decode=Decode(output="pil"))[bad]

    skip = LMDBDataset(out, decode=Decode(output="numpy"), on_error="skip")
    with pytest.warns(RuntimeWarning, match="undecodable"):
        batch = skip.__getitems__([bad - 1, bad, bad + 1])
    assert [lbl for _, lbl in batch] == [image_tree.samples[bad - 1].label,
                                         image_tree.samples[bad + 1].label]
    assert skip.skipped == 1

    result = verify_dataset(out, decode=True, progress=False)
    assert not result.ok
    assert [(p["index"], p["key"]) for p in result.problems] == [
        (bad, image_tree.samples[bad].key)]
    assert result.problems[0]["reason"] == "cannot be decoded: not an image Pillow can identify"
    assert verify_dataset(out, progress=False).ok  # the CRC alone is fine


_OPEN_ALL = """
    import sys
    import fastdata
    from fastdata.errors import FastDataError
    try:
        with fastdata.formats.open_reader(sys.argv[1]) as reader:
            for _ in reader:
                pass
        print("NO-ERROR")
    except FastDataError as exc:
        print(type(exc).__name__, exc)
    """


def test_truncated_data_file(packed):
    out = packed(".lmdb")
    data = out / "data.mdb"
    original = data.read_bytes()
    size = len(original)
    assert size > 3 * 4096
    # Each cut is read in a fresh process: a crash (SIGBUS) must not take the
    # test run down, and must show up as a failure.
    for cut in (size // 2, size - 1, size - 4096, 8192, 4096, 100, 0):
        data.write_bytes(original[:cut])
        proc = run_python(_OPEN_ALL, str(out), timeout=60)
        assert proc.returncode == 0, (cut, proc.returncode, proc.stderr[-2000:])
        name, _, message = proc.stdout.strip().partition(" ")
        assert name in ("CorruptDataError", "ManifestError"), (cut, proc.stdout)
        assert str(out) in message
        if cut >= 2 * 4096:  # both meta pages survive: the size check must catch it
            assert name == "CorruptDataError" and "truncated" in message, (cut, message)


@pytest.mark.slow
def test_reopen_after_failed_open_of_truncated_file_does_not_crash(packed):
    out = packed(".lmdb")
    data = out / "data.mdb"
    code = """
        import os, sys
        import fastdata
        from fastdata.errors import FastDataError
        path, data = sys.argv[1], sys.argv[2]
        for cut in (os.path.getsize(data) // 2, 4096):
            os.truncate(data, cut)
            try:
                fastdata.formats.open_reader(path)
                print("NO-ERROR")
            except FastDataError as exc:
                print(type(exc).__name__)
        """
    proc = run_python(code, str(out), str(data), timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert proc.stdout.split() == ["CorruptDataError", "ManifestError"]


def test_truncated_data_file_in_process(packed):
    out = packed(".lmdb")
    data = out / "data.mdb"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    with pytest.raises(CorruptDataError, match="truncated") as info:
        LMDBDataset(out)
    assert info.value.path == str(data)
    with pytest.raises(CorruptDataError):
        verify_dataset(out, progress=False)


def test_verify_dataset(packed, image_tree):
    out = packed(".lmdb")
    ok = verify_dataset(out, progress=False)
    assert ok.ok and ok.problems == []
    assert ok.count == ok.checked == len(image_tree.samples)
    assert ok.format == "lmdb" and ok.path == str(out)
    assert ok.to_dict()["ok"] is True
    assert verify_dataset(out, decode=True, progress=False).ok

    bad = 7
    value = bytearray(image_tree.samples[bad].data)
    value[-3] ^= 0x55
    lmdb_put(out, {f"{bad:010d}".encode(): bytes(value)})
    result = verify_dataset(out, progress=False)
    assert not result.ok
    assert result.checked == len(image_tree.samples)
    assert len(result.problems) == 1
    problem = result.problems[0]
    assert problem["index"] == bad and problem["key"] == image_tree.samples[bad].key
    assert "CRC32" in problem["reason"]


def test_missing_record_key(packed, image_tree):
    out = packed(".lmdb")
    env = lmdb.open(str(out), subdir=True)
    with env.begin(write=True) as txn:
        txn.delete(b"0000000003")
    env.close()
    ds = LMDBDataset(out, decode=Decode(output="bytes"))
    with pytest.raises(CorruptDataError, match="missing") as info:
        ds[3]
    assert info.value.record == 3
    assert ds[4] == (image_tree.samples[4].data, image_tree.samples[4].label)
    result = verify_dataset(out, progress=False)
    assert not result.ok and result.problems[0]["index"] == 3


# -- known defects --------------------------------------------------------------------------


def test_reopen_after_failed_open_and_repack(tmp_path, image_tree):
    path = tmp_path / "later.lmdb"
    _plain_env_without_manifest(path)
    with pytest.raises(ManifestError):
        fastdata.open_dataset(path)
    fastdata.pack(image_tree.root, path, options=PackOptions(overwrite=True), progress=False)
    assert len(fastdata.open_dataset(path)) == len(image_tree.samples)


def test_new_dataset_after_overwrite_sees_new_data(tmp_path, image_tree):
    path = tmp_path / "re.lmdb"
    fastdata.pack(image_tree.root, path, progress=False)
    old = LMDBDataset(path, decode=Decode(output="bytes"))
    assert len(old) == len(image_tree.samples)
    small = build_tree(tmp_path / "small", ["a/x.png", "b/y.png"])
    fastdata.pack(small.root, path, options=PackOptions(overwrite=True), progress=False)
    new = LMDBDataset(path, decode=Decode(output="bytes"))
    assert len(new) == 2
    assert [new[i] for i in range(2)] == [(s.data, s.label) for s in small.samples]


def test_reopen_after_overwrite_when_closed(tmp_path, image_tree):
    # The supported way today: close the old dataset's reader first.
    path = tmp_path / "re.lmdb"
    fastdata.pack(image_tree.root, path, progress=False)
    old = LMDBDataset(path, decode=Decode(output="bytes"))
    assert len(old) == len(image_tree.samples)
    old.reader.close()
    small = build_tree(tmp_path / "small", ["a/x.png", "b/y.png"])
    fastdata.pack(small.root, path, options=PackOptions(overwrite=True), progress=False)
    new = LMDBDataset(path, decode=Decode(output="bytes"))
    assert [new[i] for i in range(len(new))] == [(s.data, s.label) for s in small.samples]


def _pgm16(width=8, height=8) -> tuple[bytes, np.ndarray]:
    values = (np.arange(width * height, dtype=np.uint32).reshape(height, width) * 1000
              + 500).astype(np.uint16)
    return f"P5\n{width} {height}\n65535\n".encode() + values.astype(">u2").tobytes(), values


@pytest.mark.parametrize("output", ["numpy", "pil"])
def test_16bit_pgm_is_scaled_not_blacked_out(tmp_path, output):
    # Pillow opens a 16-bit PGM as mode "I" (values 0..65535); it must still be
    # scaled by >> 8 as decode.py promises, not shifted to black.
    data, values = _pgm16()
    root = tmp_path / "src"
    (root / "k").mkdir(parents=True)
    (root / "k" / "deep.pgm").write_bytes(data)
    out = tmp_path / "pgm.lmdb"
    fastdata.pack(root, out, progress=False)
    img, _ = LMDBDataset(out, decode=Decode(output=output))[0]
    arr = np.asarray(img)
    assert arr.shape == (8, 8, 3)
    for c in range(3):
        assert np.array_equal(arr[..., c], (values >> 8).astype(np.uint8))


@pytest.mark.parametrize("output", ["numpy", "pil"])
def test_16bit_png_is_scaled(tmp_path, output):
    _, values = _pgm16()
    root = tmp_path / "src"
    (root / "k").mkdir(parents=True)
    Image.fromarray(values).save(root / "k" / "deep.png")
    out = tmp_path / "png16.lmdb"
    fastdata.pack(root, out, progress=False)
    img, _ = LMDBDataset(out, decode=Decode(output=output))[0]
    arr = np.asarray(img)
    assert arr.shape == (8, 8, 3)
    for c in range(3):
        assert np.array_equal(arr[..., c], (values >> 8).astype(np.uint8))

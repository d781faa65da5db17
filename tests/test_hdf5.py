"""The HDF5 container: packing, the documented schema (read with plain h5py), the
reader's batched reads, the Dataset under DataLoader workers, and damaged files."""

from __future__ import annotations

import json
import os
import pickle
import zlib

import h5py
import numpy as np
import pytest
import torch
from conftest import (
    DEFAULT_CLASSES,
    assert_pixels,
    build_tree,
    expected_chw,
    run_python,
    uniform_spec,
)
from torch.utils.data import DataLoader

import fastdata
from fastdata import Decode
from fastdata.errors import CorruptDataError, ManifestError
from fastdata.loaders.datasets import HDF5Dataset
from fastdata.ops.verify import verify_dataset
from fastdata.formats.hdf5.reader import HDF5Reader
from fastdata.formats.hdf5.schema import (
    CRC32,
    KEYS,
    LABELS,
    MANIFEST,
    OFFSETS,
    PAYLOAD,
    SCHEMA,
    SCHEMA_ATTR,
    SCHEMA_FULL,
)
from fastdata.formats.hdf5.writer import HDF5Writer
from fastdata.packers.pack import PackOptions
from fastdata.records import MANIFEST_VERSION, Manifest, Record

#: Small chunks and write buffer, so a few KB of test images take the chunked,
#: resizable path that real datasets take.
CHUNKED = {"chunk_bytes": 1024, "flush_bytes": 4096}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    base = tmp_path_factory.mktemp("hdf5_shared")
    tree = build_tree(base / "src")
    small = base / "small.h5"
    chunked = base / "chunked.hdf5"
    fastdata.pack(tree.root, small, progress=False)
    fastdata.pack(tree.root, chunked, options=PackOptions(writer_options=CHUNKED),
                  progress=False)
    return tree, small, chunked


@pytest.fixture(scope="module")
def uniform(tmp_path_factory):
    """Same-size lossless images, so the default collate can stack them."""
    base = tmp_path_factory.mktemp("hdf5_uniform")
    tree = build_tree(base / "src", uniform_spec(per_class=8, exts=(".png", ".bmp", ".ppm")),
                      size=(12, 10))
    out = base / "u.h5"
    fastdata.pack(tree.root, out, options=PackOptions(writer_options=CHUNKED), progress=False)
    return tree, out


def _both(shared):
    tree, small, chunked = shared
    return tree, (small, chunked)


# -- packing and reading back ---------------------------------------------------------


def test_round_trip_bit_exact(shared):
    tree, outs = _both(shared)
    for out in outs:
        with HDF5Reader(out) as reader:
            assert len(reader) == len(tree.samples)
            assert reader.keys == tree.keys
            assert reader.labels.tolist() == tree.labels
            assert reader.labels.dtype == np.int64
            assert reader.classes == tree.classes == DEFAULT_CLASSES
            for i, sample in enumerate(tree.samples):
                assert reader.read(i) == sample.data, sample.key
            assert reader.read(-1) == tree.samples[-1].data
            assert [(i, d, lbl) for i, d, lbl in reader] == [
                (i, s.data, s.label) for i, s in enumerate(tree.samples)]
            with pytest.raises(IndexError):
                reader.read(len(tree.samples))


def test_layouts_and_manifest(shared):
    tree, small, chunked = shared
    for out, layout in ((small, "contiguous"), (chunked, "chunked")):
        m = fastdata.formats.read_manifest(out)
        assert m.format == "hdf5" and m.count == len(tree.samples)
        assert m.extra["layout"] == layout and m.extra["schema"] == SCHEMA_FULL
        # The manifest states the exact size of the file it lives in.
        assert m.bytes["on_disk"] == os.path.getsize(out)
        assert m.shards == [{"path": out.name, "count": len(tree.samples),
                             "bytes": os.path.getsize(out)}]
        assert m.bytes["payload"] == sum(len(s.data) for s in tree.samples)
    with h5py.File(chunked) as f:
        assert f[PAYLOAD].chunks == (1024,) and f[PAYLOAD].maxshape == (None,)
    with h5py.File(small) as f:
        assert f[PAYLOAD].chunks is None


def test_open_reader_and_dataset_pick_hdf5(shared):
    tree, small, _ = shared
    with fastdata.formats.open_reader(small) as reader:
        assert isinstance(reader, HDF5Reader)
    ds = fastdata.open_dataset(small, decode=Decode(output="bytes"))
    assert type(ds) is HDF5Dataset
    assert ds.classes == DEFAULT_CLASSES and ds.targets == tree.labels and ds.keys == tree.keys
    assert [ds[i] for i in range(len(ds))] == [(s.data, s.label) for s in tree.samples]


def test_plain_h5py_reads_the_schema(shared):
    tree, outs = _both(shared)
    for out in outs:
        reader = HDF5Reader(out)  # open in this process too: plain h5py must still work
        with h5py.File(out, "r") as f:
            assert f.attrs[SCHEMA_ATTR] == SCHEMA
            off = f[OFFSETS][()]
            assert off.dtype == np.dtype("<i8") and off.shape == (len(tree.samples) + 1,)
            assert off[0] == 0 and off[-1] == f[PAYLOAD].shape[0]
            assert f[PAYLOAD].dtype == np.uint8 and f[PAYLOAD].ndim == 1
            for i, s in enumerate(tree.samples):
                assert f[PAYLOAD][off[i]:off[i + 1]].tobytes() == s.data
            assert f[LABELS].dtype == np.dtype("<i8")
            assert f[LABELS][()].tolist() == tree.labels
            assert f[CRC32].dtype == np.dtype("<u4")
            assert f[CRC32][()].tolist() == [zlib.crc32(s.data) for s in tree.samples]
            assert f[KEYS].asstr()[()].tolist() == tree.keys
            manifest = json.loads(f[MANIFEST][()])
            assert manifest["kind"] == "fastdata-manifest" and manifest["format"] == "hdf5"
            assert manifest["classes"] == DEFAULT_CLASSES
        assert reader.read(3) == tree.samples[3].data
        reader.close()


def test_read_many_random_order_with_duplicates(shared):
    tree, outs = _both(shared)
    rng = np.random.default_rng(7)
    n = len(tree.samples)
    for out in outs:
        for gap in (0, 64 << 10):
            reader = HDF5Reader(out, merge_gap=gap)
            for _ in range(20):
                idx = rng.integers(-n, n, size=int(rng.integers(1, 3 * n))).tolist()
                idx += idx[:3]  # duplicates for sure
                assert reader.read_many(idx) == [reader.read(i) for i in idx]
                assert reader.read_many(idx) == [tree.samples[i].data for i in idx]
            assert reader.read_many([]) == []
            with pytest.raises(IndexError):
                reader.read_many([0, n])


def test_many_runs_read_in_slices(shared, monkeypatch):
    from fastdata.formats.hdf5 import runs

    tree, _, chunked = shared
    monkeypatch.setattr(runs, "RUNS_PER_READ", 3)
    reader = HDF5Reader(chunked, merge_gap=0)
    idx = [15, 0, 3, 3, 9, 1, 12, 5, 7, 14, 2, 11]
    assert reader.read_many(idx) == [tree.samples[i].data for i in idx]


def test_big_records_and_small_blocks(tmp_path):
    # Records larger than the sequential block and than a chunk, some empty.
    rng = np.random.default_rng(3)
    payloads = [rng.integers(0, 256, int(size), dtype=np.uint8).tobytes()
                for size in (0, 5000, 1, 0, 3000, 70000, 10, 0)]
    out = tmp_path / "big.h5"
    _write_records(out, payloads, chunk_bytes=4096, flush_bytes=8192)
    reader = HDF5Reader(out, block_bytes=4000, merge_gap=0)
    assert [d for _, d, _ in reader] == payloads
    order = [7, 5, 0, 5, 2, 3, 1, 6, 4]
    assert reader.read_many(order) == [payloads[i] for i in order]
    assert reader.read_many([0, 3]) == [b"", b""]
    assert [reader.read(i) for i in range(len(payloads))] == payloads


def test_manifest_larger_than_an_attribute_can_hold(tmp_path):
    # HDF5 attributes in compact storage stop at 64 KiB; the manifest is a dataset.
    classes = [f"class_{i:05d}_" + "x" * 40 for i in range(3000)]
    out = tmp_path / "many.h5"
    _write_records(out, [b"abc", b"defg"], classes=classes)
    reader = HDF5Reader(out)
    assert reader.classes == classes
    assert len(reader.manifest.to_json()) > 100_000
    assert reader.read_many([1, 0]) == [b"defg", b"abc"]


def test_writer_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="chunk_bytes"):
        HDF5Writer(tmp_path / "x.h5", chunk_bytes=0)
    with pytest.raises(TypeError):
        HDF5Writer(tmp_path / "x.h5", shard_size=3)
    assert not os.listdir(tmp_path)


def test_aborted_write_leaves_nothing(tmp_path):
    out = tmp_path / "gone.h5"
    with pytest.raises(RuntimeError):
        with HDF5Writer(out) as writer:
            writer.write(Record(0, "a/x.png", 0, b"123", "png"))
            raise RuntimeError("stop")
    assert os.listdir(tmp_path) == []


# -- the Dataset under DataLoader workers ----------------------------------------------


def _expected_batches(tree):
    return sorted((expected_chw(s.data).tobytes(), s.label) for s in tree.samples)


def _loaded(loader):
    got = []
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 10, 12)
        got += [(img.numpy().tobytes(), int(lbl)) for img, lbl in zip(images, labels)]
    return sorted(got)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_two_workers(uniform, context):
    tree, out = uniform
    ds = fastdata.open_dataset(out)
    assert isinstance(ds, HDF5Dataset)
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=2,
                        multiprocessing_context=context,
                        generator=torch.Generator().manual_seed(0))
    assert _loaded(loader) == _expected_batches(tree)


def test_dataloader_fork_after_parent_reads(uniform):
    tree, out = uniform
    ds = HDF5Dataset(out)
    # The parent opens the file and reads; forked workers must not reuse its handle.
    first, label = ds[0]
    assert_pixels(first.numpy(), tree.samples[0].data, chw=True)
    parent_file = ds.reader._file
    assert parent_file is not None
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    for _ in range(2):  # a second epoch forks new workers from the same parent state
        assert _loaded(loader) == _expected_batches(tree)
    # ... and the parent's handle is untouched and still works.
    assert ds.reader._file is parent_file
    assert ds.__getitems__([3, 1])[1][1] == tree.samples[1].label


def test_fork_child_opens_its_own_handle(shared):
    import multiprocessing as mp

    from fastdata.formats.hdf5 import reader as hdf5_loader

    tree, _, chunked = shared
    reader = HDF5Reader(chunked)
    assert reader.read(1) == tree.samples[1].data
    parent_file = reader._file
    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def child():
        ok = reader.read_many([2, 0]) == [tree.samples[2].data, tree.samples[0].data]
        queue.put((ok, reader._file is not parent_file,
                   any(f is parent_file for f, _ in hdf5_loader._INHERITED),
                   bool(parent_file.id.valid)))

    proc = ctx.Process(target=child)
    proc.start()
    result = queue.get(timeout=60)
    proc.join(60)
    # Read fine, with a new handle; the inherited one kept (not closed), unused.
    assert result == (True, True, True, True)
    assert proc.exitcode == 0
    assert reader._file is parent_file and reader.read(3) == tree.samples[3].data


def test_pickle_small_and_usable(shared):
    tree, small, _ = shared
    ds = HDF5Dataset(small, decode=Decode(output="bytes"))
    _ = ds[0], ds.targets, ds.keys
    blob = pickle.dumps(ds)
    assert len(blob) < 10_000
    clone = pickle.loads(blob)
    assert [clone[i] for i in range(len(clone))] == [(s.data, s.label) for s in tree.samples]
    assert clone.targets == tree.labels and clone.keys == tree.keys


def test_several_readers_of_one_file(shared, tmp_path):
    tree, small, _ = shared
    link = tmp_path / "alias.h5"
    os.symlink(small, link)
    a = HDF5Dataset(small, decode=Decode(output="bytes"))
    b = HDF5Dataset(link, decode=Decode(output="bytes"))
    c = fastdata.open_dataset(small, decode=Decode(output="numpy"))
    assert a[0] == b[0] == (tree.samples[0].data, tree.samples[0].label)
    a.reader.close()  # closing one must not break the others
    assert b[3] == (tree.samples[3].data, tree.samples[3].label)
    assert_pixels(c[2][0], tree.samples[2].data)
    assert a[4][0] == tree.samples[4].data  # a closed reader reopens on use


def test_overwrite_while_open_sees_new_data(tmp_path, image_tree):
    path = tmp_path / "re.h5"
    fastdata.pack(image_tree.root, path, progress=False)
    old = HDF5Dataset(path, decode=Decode(output="bytes"))
    assert len(old) == len(image_tree.samples)
    small = build_tree(tmp_path / "small", ["a/x.png", "b/y.png"])
    fastdata.pack(small.root, path, options=PackOptions(overwrite=True), progress=False)
    new = HDF5Dataset(path, decode=Decode(output="bytes"))
    assert [new[i] for i in range(len(new))] == [(s.data, s.label) for s in small.samples]
    assert old[1] == (image_tree.samples[1].data, image_tree.samples[1].label)


# -- files that are not (complete) fastdata HDF5 files --------------------------------------


def test_plain_h5_file_is_not_a_dataset(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["data"] = np.arange(10)
    for opener in (HDF5Reader, fastdata.open_dataset):
        with pytest.raises(ManifestError, match="manifest") as info:
            opener(path)
        assert info.value.path == str(path)
        # The refused file is not left open (HDF5 would refuse a writer then).
        with h5py.File(path, "r+") as f:
            f.attrs["touched"] = 1
    # HDF5 signature without an extension: detected, then refused the same way.
    bare = tmp_path / "plain"
    os.rename(path, bare)
    with pytest.raises(ManifestError):
        fastdata.formats.open_reader(bare)


def test_other_files_with_an_h5_name(tmp_path):
    text = tmp_path / "notes.h5"
    text.write_text("hello, not hdf5\n" * 10)
    with pytest.raises(ManifestError, match="not an HDF5 file") as info:
        HDF5Reader(text)
    assert info.value.path == str(text)
    with pytest.raises(ManifestError, match="no such"):
        HDF5Reader(tmp_path / "missing.h5")
    (tmp_path / "dir.h5").mkdir()
    with pytest.raises(ManifestError, match="folder"):
        HDF5Reader(tmp_path / "dir.h5")
    with h5py.File(tmp_path / "odd.h5", "w") as f:  # a 'manifest' that is no manifest
        f[MANIFEST] = np.arange(3)
    with pytest.raises(ManifestError):
        HDF5Reader(tmp_path / "odd.h5")


def test_newer_manifest_or_schema(packed):
    out = packed(".h5")
    with h5py.File(out, "r+") as f:
        data = json.loads(f[MANIFEST][()])
        data["version"] = MANIFEST_VERSION + 1
        del f[MANIFEST]
        f[MANIFEST] = json.dumps(data)
    with pytest.raises(ManifestError, match="newer") as info:
        HDF5Reader(out)
    assert info.value.path == str(out)

    out2 = packed(".h5", name="schema")
    with h5py.File(out2, "r+") as f:
        f.attrs[SCHEMA_ATTR] = "fastdata-hdf5-2"
    with pytest.raises(ManifestError, match="newer"):
        HDF5Reader(out2)


def test_manifest_removed(packed):
    out = packed(".h5")
    with h5py.File(out, "r+") as f:
        del f[MANIFEST]
    with pytest.raises(ManifestError, match="did not finish"):
        fastdata.open_dataset(out)


def test_repack_after_failed_open(tmp_path, image_tree):
    path = tmp_path / "later.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(ManifestError):
        fastdata.open_dataset(path)
    fastdata.pack(image_tree.root, path, options=PackOptions(overwrite=True), progress=False)
    assert len(fastdata.open_dataset(path)) == len(image_tree.samples)


def test_missing_or_inconsistent_arrays(packed):
    out = packed(".h5")
    with h5py.File(out, "r+") as f:
        del f[CRC32]
    with pytest.raises(CorruptDataError, match="crc32"):
        HDF5Reader(out)
    out2 = packed(".h5", name="offsets")
    with h5py.File(out2, "r+") as f:
        f[OFFSETS][-1] = 10**9
    # The offsets are checked by piece: the file opens, its last piece fails when read.
    reader = HDF5Reader(out2)
    with pytest.raises(CorruptDataError, match="offsets") as info:
        reader.read(len(reader) - 1)
    assert "fail their CRC-32" in str(info.value) and info.value.path == str(out2)
    reader.close()


def test_truncated_file(packed):
    out = packed(".h5", writer_options=CHUNKED)
    # In a fresh process: a crash must not take the test run down, nor a hang.
    code = """
        import os, sys
        import fastdata
        from fastdata.errors import FastDataError
        path = sys.argv[1]
        original = open(path, "rb").read()
        size = len(original)
        for cut in (size // 2, size - 1, size - 1000, 2048, 100, 4, 0):
            with open(path, "wb") as f:
                f.write(original[:cut])
            try:
                with fastdata.formats.open_reader(path) as r:
                    for _ in r:
                        pass
                print(cut, "NO-ERROR")
            except FastDataError as e:
                print(cut, type(e).__name__, e)
        """
    proc = run_python(code, str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 7, proc.stdout
    for line in lines:
        cut, kind, message = line.split(" ", 2)
        assert kind == "CorruptDataError", line
        assert "truncated" in message and str(out) in message, line


def test_truncated_file_in_process(packed):
    out = packed(".h5")
    with open(out, "r+b") as f:
        f.truncate(out.stat().st_size // 2)
    with pytest.raises(CorruptDataError, match="truncated") as info:
        HDF5Dataset(out)
    assert info.value.path == str(out)
    with pytest.raises(CorruptDataError):
        verify_dataset(out, progress=False)


def _flip_payload_byte(out, index: int, at: int = 10) -> None:
    """Damage one byte of record ``index`` with plain h5py."""
    with h5py.File(out, "r+") as f:
        pos = int(f[OFFSETS][index]) + at
        f[PAYLOAD][pos] = f[PAYLOAD][pos] ^ 0x5A


@pytest.mark.parametrize("options", [{}, CHUNKED], ids=["contiguous", "chunked"])
def test_corrupted_payload_byte(packed, image_tree, options):
    out = packed(".h5", writer_options=options)
    bad = 6
    _flip_payload_byte(out, bad)
    ds = HDF5Dataset(out, decode=Decode(output="bytes"))
    with pytest.raises(CorruptDataError, match="CRC32") as info:
        ds[bad]
    assert info.value.record == bad and info.value.key == image_tree.samples[bad].key
    assert info.value.path == str(out)
    with pytest.raises(CorruptDataError):
        ds.__getitems__([0, bad, 2])

    skip = HDF5Dataset(out, decode=Decode(output="bytes"), on_error="skip")
    with pytest.warns(RuntimeWarning, match="skipping"):
        batch = skip.__getitems__([bad - 1, bad, bad + 1])
    assert batch == [(image_tree.samples[i].data, image_tree.samples[i].label)
                     for i in (bad - 1, bad + 1)]
    assert skip.skipped == 1
    with pytest.warns(RuntimeWarning):
        assert skip[bad] == (image_tree.samples[bad + 1].data, image_tree.samples[bad + 1].label)

    result = verify_dataset(out, progress=False)
    assert not result.ok and result.checked == len(image_tree.samples)
    assert [(p["index"], p["key"]) for p in result.problems] == [
        (bad, image_tree.samples[bad].key)]


def test_read_error_is_corrupt_data(shared, monkeypatch):
    # An HDF5 read failure (damaged chunk index, I/O error) names record and file.
    tree, _, chunked = shared
    reader = HDF5Reader(chunked)
    real = reader._payload

    class FailingId:
        def get_space(self):
            return real.id.get_space()

        def read(self, *args):
            raise OSError("Can't read data (simulated)")

    class Failing:
        id = FailingId()

        def __getitem__(self, item):
            raise OSError("Can't read data (simulated)")

    monkeypatch.setattr(reader, "_handle", (reader._file, Failing()))
    with pytest.raises(CorruptDataError, match="simulated") as info:
        reader.read_many([4, 2])
    assert info.value.record == 2 and info.value.key == tree.samples[2].key
    assert info.value.path == str(chunked)
    with pytest.raises(CorruptDataError, match="record 4") as info:
        reader.read(4)
    assert info.value.record == 4
    with pytest.raises(CorruptDataError):
        list(reader)


# -- helpers --------------------------------------------------------------------------------


def _write_records(out, payloads, *, classes=("a",), **options) -> Manifest:
    manifest = Manifest(
        format="hdf5", count=len(payloads), classes=list(classes),
        class_counts=[len(payloads)] + [0] * (len(classes) - 1),
        encoding={"storage": "keep", "formats": {"raw": len(payloads)}, "shape": None},
        bytes={"source": 0, "payload": sum(map(len, payloads))}, checksums={}, shards=[],
        source={}, pack_options={}, created_at="2024-01-01T00:00:00+00:00",
        fastdata_version=fastdata.__version__)
    with HDF5Writer(out, **options) as writer:
        for i, data in enumerate(payloads):
            writer.write(Record(i, f"a/{i}.bin", 0, data, "raw"))
        return writer.finish(manifest)


"""``fastdata convert`` and ``DatasetSource``: a packed dataset (any format, or
another tool's tars and TFRecords) written again in another format, its
records, labels, keys, classes and metadata carried over bit for bit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import optional
import pytest
from click.testing import CliRunner
from conftest import build_tree, make_image_bytes, uniform_spec

import fastdata
from fastdata import Decode
from fastdata.cli import main
from fastdata.formats import open_reader
from fastdata.packers.options import PackOptions
from fastdata.packers.preprocess import Preprocess
from fastdata.packers.shuffle import shuffle_order
from fastdata.packers.source import SourceEntry
from fastdata.packers.sources.dataset import DatasetSource
from fastdata.packers.sources.dispatch import open_source, source_kind

CLASSES = ["cat", "dog", "eel", "fox"]  # "fox" has no records: its label stays
EXTS = (".png", ".jpg", ".bmp", ".webp", ".ppm")


def _entries() -> list[SourceEntry]:
    """Twelve records of mixed encodings; keys with folders, dots and non-ASCII;
    metadata on most (nested, Unicode, an empty dict) and none on some."""
    entries = []
    for i in range(12):
        ext = EXTS[i % len(EXTS)]
        key = [f"{CLASSES[i % 3]}/img{i:02d}{ext}", f"{CLASSES[i % 3]}/x.y{i}{ext}",
               f"{CLASSES[i % 3]}/sub/ünï{i}{ext}"][i % 3]
        meta = [None, {"caption": f"ünï {i}", "boxes": [[i, 2, 3.5, 4]] * (i % 3)},
                {}, {"w": i / 7, "nested": {"k": [True, None]}}][i % 4]
        entries.append(SourceEntry(key, i % 3, data=make_image_bytes(ext, name=key),
                                   metadata=meta))
    return entries


class _Listed:
    """A Source of the given entries."""

    def __init__(self, entries, classes=CLASSES):
        self.entries, self.classes = entries, classes

    def __len__(self):
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def describe(self):
        return {"root": None, "files": len(self.entries)}

    def warnings(self):
        return []


#: Every format, tar and TFRecord also sharded: (output name, shard size).
VARIANTS = {"lmdb": ("d.lmdb", None), "hdf5": ("d.h5", None), "tar": ("d.tar", None),
            "tar-sharded": ("d-%06d.tar", 5), "tfrecord": ("d.tfrecord", None),
            "tfrecord-sharded": ("d-%05d.tfrecord", 5)}


def _pack(source, out, shard_size=None, **options):
    return fastdata.pack(source, out, options=PackOptions(shard_size=shard_size, workers=1,
                                                          **options), progress=False)


def _convert(source, out, shard_size=None, **kwargs):
    options = kwargs.pop("options", {})
    return fastdata.convert(source, out, options=PackOptions(shard_size=shard_size, workers=1,
                                                             **options),
                            progress=False, **kwargs)


def _contents(path) -> dict:
    """Everything a conversion must keep, read with the format's reader."""
    with open_reader(path) as reader:
        n = len(reader)
        manifest = reader.manifest
        return {"keys": list(reader.keys), "labels": reader.labels.tolist(),
                "payloads": reader.read_many(range(n)),
                "metadata": reader.metadata_bytes_many(range(n)),
                "classes": manifest.classes, "class_counts": manifest.class_counts,
                "raw_shape": manifest.raw_shape}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same records packed into every variant: {variant: path to open}."""
    base = tmp_path_factory.mktemp("convert-sources")
    made = {}
    for variant, (name, shard_size) in VARIANTS.items():
        out = base / variant / name
        _pack(_Listed(_entries()), out, shard_size)
        made[variant] = str(out)  # a shard pattern for the sharded ones
    return made


@pytest.fixture(scope="module")
def expected(sources):
    return _contents(sources["lmdb"])


def test_the_source_datasets_hold_what_was_packed(sources, expected):
    entries = _entries()
    assert expected["keys"] == [e.key for e in entries]
    assert expected["payloads"] == [e.data for e in entries]
    assert expected["classes"] == CLASSES and expected["class_counts"] == [4, 4, 4, 0]
    assert [m is None for m in expected["metadata"]] == [e.metadata is None for e in entries]
    for variant, path in sources.items():
        assert _contents(path) == expected, variant


@pytest.mark.parametrize("target", VARIANTS)
@pytest.mark.parametrize("origin", VARIANTS)
def test_convert_keeps_records_labels_keys_classes_and_metadata(origin, target, sources,
                                                                expected, tmp_path):
    name, shard_size = VARIANTS[target]
    summary = _convert(sources[origin], tmp_path / name, shard_size)
    assert summary.format == target.split("-")[0] and summary.records == 12
    assert not summary.skipped and not summary.warnings
    assert _contents(summary.output) == expected
    if shard_size:
        assert len(open_reader(summary.output).manifest.shards) == 3


def test_manifest_says_what_it_was_converted_from(sources, tmp_path):
    with open_reader(sources["hdf5"]) as reader:
        origin = reader.manifest
    summary = _convert(sources["hdf5"], tmp_path / "c.lmdb")
    source = open_reader(summary.output).manifest.source
    name = os.path.basename(sources["hdf5"])   # a name: the machine's folders stay here
    assert source["kind"] == "dataset" and source["root"] == name
    assert source["converted_from"] == {
        "path": name, "format": "hdf5", "count": 12,
        "fingerprint": origin.source["fingerprint"], "created_at": origin.created_at}
    kept = _convert(sources["hdf5"], tmp_path / "k.lmdb", options={"keep_source_path": True})
    source = open_reader(kept.output).manifest.source
    assert source["root"] == source["converted_from"]["path"] == sources["hdf5"]


def test_a_dataset_path_is_a_pack_source(sources, tmp_path):
    assert source_kind(sources["lmdb"]) == "dataset"
    assert source_kind(sources["tar-sharded"]) == "dataset"  # a shard pattern
    assert isinstance(open_source(sources["hdf5"]), DatasetSource)
    summary = fastdata.pack(sources["lmdb"], tmp_path / "out.tar",
                            options=PackOptions(workers=2), progress=False)
    assert _contents(summary.output) == _contents(sources["lmdb"])


def test_an_image_folder_named_like_a_dataset_is_an_image_folder(tmp_path):
    tree = build_tree(tmp_path / "photos.tar", uniform_spec(per_class=1))
    assert source_kind(tree.root) == "folder"
    assert _pack(tree.root, tmp_path / "photos.lmdb").records == 3


def test_shuffle_reads_the_dataset_by_index(sources, expected, tmp_path):
    summary = _convert(sources["tar-sharded"], tmp_path / "s.h5", options={"shuffle": 3})
    got = _contents(summary.output)
    order = shuffle_order(12, 3)
    for field in ("keys", "labels", "payloads", "metadata"):
        assert got[field] == [expected[field][i] for i in order], field


def test_batches_are_bounded(sources, monkeypatch):
    import fastdata.packers.sources.dataset as dataset

    monkeypatch.setattr(dataset, "MAX_BATCH", 5)
    src = DatasetSource(sources["lmdb"])
    sizes = []
    real = src.reader.read_many
    monkeypatch.setattr(src.reader, "read_many", lambda idx: sizes.append(len(idx)) or real(idx))
    assert [e.key for e in src] == [e.key for e in _entries()]
    assert sizes == [5, 5, 2]


def test_resize_reencodes(sources, expected, tmp_path):
    summary = _convert(sources["tfrecord"], tmp_path / "small.lmdb",
                       options={"preprocess": Preprocess(resize=6)})
    got = _contents(summary.output)
    for field in ("keys", "labels", "metadata", "classes"):
        assert got[field] == expected[field], field
    ds = fastdata.open_dataset(summary.output, decode=Decode(output="numpy"))
    for i, data in enumerate(got["payloads"]):
        assert data != expected["payloads"][i]
        assert data[:2] == b"\xff\xd8" if expected["payloads"][i][:2] == b"\xff\xd8" \
            else data[:4] == b"\x89PNG"
        assert min(ds[i][0].shape[:2]) == 6


# -- raw datasets ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw_lmdb(tmp_path_factory):
    tree = build_tree(tmp_path_factory.mktemp("raw") / "src", uniform_spec(per_class=3),
                      size=(12, 10))
    out = tree.root.parent / "raw.lmdb"
    _pack(tree.root, out, preprocess=Preprocess(encoding="raw"))
    return str(out)


@pytest.mark.parametrize("target", ["tar-sharded", "tfrecord", "hdf5"])
def test_raw_dataset_converts_raw_and_bit_exact(raw_lmdb, target, tmp_path):
    name, shard_size = VARIANTS[target]
    summary = _convert(raw_lmdb, tmp_path / name, shard_size)
    got, want = _contents(summary.output), _contents(raw_lmdb)
    assert got == want and got["raw_shape"] == (10, 12, 3)
    manifest = open_reader(summary.output).manifest
    assert manifest.encoding["storage"] == "raw" and manifest.encoding["formats"] == {"raw": 9}
    a = fastdata.open_dataset(raw_lmdb, decode=Decode(output="numpy"))
    b = fastdata.open_dataset(summary.output, decode=Decode(output="numpy"))
    assert all(np.array_equal(a[i][0], b[i][0]) for i in range(len(a)))


def test_raw_dataset_preprocessed(raw_lmdb, tmp_path):
    pixels = fastdata.open_dataset(raw_lmdb, decode=Decode(output="numpy"))
    png = _convert(raw_lmdb, tmp_path / "png.h5", options={"preprocess": Preprocess(
        encoding="png")})
    as_png = fastdata.open_dataset(png.output, decode=Decode(output="numpy"))
    assert png.encodings == {"png": 9}
    assert all(np.array_equal(pixels[i][0], as_png[i][0]) for i in range(9))  # lossless
    small = _convert(raw_lmdb, tmp_path / "small.lmdb",
                     options={"preprocess": Preprocess(resize=(4, 6))})
    assert open_reader(small.output).manifest.raw_shape == (4, 6, 3)  # "keep": raw stays raw


# -- other tools' data -------------------------------------------------------------------


def test_webdataset_tar_converts(tmp_path):
    import webdataset as wds

    path = tmp_path / "theirs.tar"
    samples = []
    with wds.TarWriter(str(path)) as sink:
        for i in range(7):
            png = make_image_bytes(".png", size=(8, 8), name=f"w{i}")
            sample = {"__key__": f"s{i:03d}", "png": png, "cls": i % 3}
            if i % 2:
                sample["json"] = {"caption": f"ünï {i}"}
            sink.write(sample)
            samples.append(sample)
    summary = _convert(str(path), tmp_path / "theirs.lmdb")
    got = _contents(summary.output)
    assert got["keys"] == [s["__key__"] for s in samples]
    assert got["labels"] == [s["cls"] for s in samples]
    assert got["payloads"] == [s["png"] for s in samples]
    assert got["classes"] == ["0", "1", "2"]
    ds = fastdata.open_dataset(summary.output)
    assert [ds.metadata(i) for i in range(7)] == [s.get("json", {}) for s in samples]
    assert got["metadata"][0] is None
    origin = open_reader(summary.output).manifest.source["converted_from"]
    assert origin["foreign"] is True and origin["format"] == "tar"


@pytest.mark.parametrize("feature_keys", [None, {"image": "img", "label": "class_id"}])
def test_tfrecord_package_file_converts(tmp_path, feature_keys):
    tfrecord = optional.require("tfrecord")
    image, label = ("image/encoded", "image/class/label") if feature_keys is None else \
        (feature_keys["image"], feature_keys["label"])
    path = tmp_path / "theirs.tfrecord"
    writer = tfrecord.TFRecordWriter(str(path))
    images = [make_image_bytes(".jpg", name=f"t{i}") for i in range(6)]
    for i, data in enumerate(images):
        writer.write({image: (data, "byte"), label: (i % 2 + 1, "int")})
    writer.close()
    options = {"feature_keys": feature_keys} if feature_keys else None
    summary = _convert(str(path), tmp_path / "theirs.lmdb", reader_settings=options)
    got = _contents(summary.output)
    assert got["payloads"] == images
    assert got["labels"] == [i % 2 + 1 for i in range(6)]
    assert got["classes"] == ["0", "1", "2"] and got["class_counts"] == [0, 3, 3]
    assert len(set(got["keys"])) == 6


# -- the command -------------------------------------------------------------------------


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_error_line(result, *words):
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_cli_converts(sources, expected, tmp_path):
    result = _cli("convert", sources["hdf5"], tmp_path / "c-%06d.tar", "--shard-size", 4,
                  "--no-progress")
    assert result.exit_code == 0, result.output
    assert "converted 12 images in 4 classes from" in result.stdout
    assert _contents(tmp_path / "c.tar.fastdata.json") == expected
    assert "--shard-size" in _cli("convert", "--help").stdout


def test_cli_refuses_in_as_out(sources, tmp_path):
    for origin, out in (("lmdb", sources["lmdb"]), ("hdf5", sources["hdf5"]),
                        ("tar-sharded", sources["tar-sharded"].replace("-%06d", ""))):
        before = _contents(sources[origin])
        _one_error_line(_cli("convert", sources[origin], out, "--overwrite"),
                        "write over the dataset being read")
        assert _contents(sources[origin]) == before


def test_other_names_beside_the_input_are_fine(sources):
    folder = os.path.dirname(sources["tar"])
    for out in ("d2.tar", "d.tfrecord", "e-%06d.tar"):
        summary = _convert(sources["tar"], os.path.join(folder, out))
        assert summary.records == 12


def test_cli_refuses_unreadable_input(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    folder = build_tree(tmp_path / "images", uniform_spec(per_class=1)).root
    _one_error_line(_cli("convert", tmp_path / "missing.lmdb", tmp_path / "o.tar"),
                    "missing.lmdb")
    _one_error_line(_cli("convert", tmp_path / "notes.txt", tmp_path / "o.tar"),
                    "notes.txt", "not a recognised")
    _one_error_line(_cli("convert", folder, tmp_path / "o.tar"), "fastdata pack")
    assert not any(p.name.startswith("o.") for p in tmp_path.iterdir())


def test_a_damaged_record_stops_the_conversion(tmp_path):
    import h5py

    src = _pack(_Listed(_entries()), tmp_path / "src.h5").output
    with h5py.File(src, "r+") as f:
        at = int(f["offsets"][3]) + 5
        f["payload"][at] = f["payload"][at] ^ 0xFF
    _one_error_line(_cli("convert", src, tmp_path / "out.lmdb"), "record 3", "CRC32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.h5"]


#: A convert that SIGKILLs itself once its second shard is journaled.
_KILLED = r"""
import os, signal, sys
import fastdata
import fastdata.packers.journal as journal
from fastdata.packers.options import PackOptions

real = journal.PackJournal.record
calls = [0]
def record(*args, **kwargs):
    real(*args, **kwargs)
    calls[0] += 1
    if calls[0] == 2:
        os.kill(os.getpid(), signal.SIGKILL)
journal.PackJournal.record = record
fastdata.convert(sys.argv[1], sys.argv[2], options=PackOptions(shard_size=4, workers=1),
                 progress=False)
"""


def test_resume_after_a_kill(sources, tmp_path):
    (tmp_path / "ref").mkdir()
    (tmp_path / "cut").mkdir()
    reference = _convert(sources["lmdb"], tmp_path / "ref" / "o-%06d.tar", 4)
    out = tmp_path / "cut" / "o-%06d.tar"
    proc = subprocess.run([sys.executable, "-c", _KILLED, sources["lmdb"], str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (tmp_path / "cut" / "o.tar.fastdata.json").exists()
    result = _cli("convert", sources["lmdb"], out, "--shard-size", 4, "--resume",
                  "--workers", 1, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr, result.stderr

    def files(folder):
        return {p.name: p.read_bytes() for p in folder.iterdir()
                if not p.name.startswith(".")
                and not p.name.endswith(("fastdata.json", "report.json"))}  # they name paths

    assert files(tmp_path / "cut") == files(tmp_path / "ref")
    assert _contents(out) == _contents(reference.output)

"""Per-sample metadata (``SourceEntry.metadata``): stored by every format in
its own idiom, read back by ``reader.metadata(i)`` / ``ds.metadata(i)``, handed
out as a third sample field with ``with_metadata=True`` and batched as a list
of dicts by ``fastdata.collate``; kept by a resumed pack, checked by
``verify``, readable by webdataset and from webdataset's own ``.json`` members.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import optional
import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

import fastdata
from fastdata.cli import main
from fastdata.formats import open_reader
from fastdata.loaders.collate import Batch
from fastdata.ops.verify import verify_dataset
from fastdata.packers.plan import ResumeRefused
from fastdata.packers.source import SourceEntry
from conftest import TESTS_DIR, build_tree, lmdb_get, lmdb_put, make_image_bytes, uniform_spec

pytestmark = [pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore:.*shardshuffle.*:UserWarning")]

CLASSES = ["cat", "dog", "eel"]
COUNT = 30


def metadata_for(i: int, variant: str = "") -> dict | None:
    """Entry i's metadata: none, an empty dict, or nested JSON values and unicode."""
    if i % 5 == 0:
        return None
    if i % 5 == 1:
        return {}
    return {"id": i, "caption": f"photo №{i}: ünïcødé 猫 🐈{variant}",
            "boxes": [[0.5 * i, 1, 2.25, 3.0]] * (i % 3),
            "labels": ["cat", "dog", "ü"][: i % 4],
            "nested": {"weight": i / 7, "ok": bool(i % 2), "none": None,
                       "deep": [{"a": [1, [2, {"b": "c"}]]}]},
            "big": 2**53 + i, "neg": -i}


def expected(i: int) -> dict:
    return metadata_for(i) or {}


class MetaSource:
    """A Source whose entries are image files with metadata (some without)."""

    classes = CLASSES

    def __init__(self, root, variant: str = "", bad: dict | None = None) -> None:
        self.root = os.fspath(root)
        self.entries = []
        for i in range(COUNT):
            label = i % len(CLASSES)
            key = f"{CLASSES[label]}/img{i:03d}.png"
            meta = (bad or {}).get(i, metadata_for(i, variant))
            self.entries.append(SourceEntry(key, label, path=os.path.join(self.root, key),
                                            metadata=meta))

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def describe(self) -> dict:
        return {"root": self.root, "files": len(self.entries), "ignored": 0}

    def warnings(self) -> list[str]:
        return []


def write_images(root: Path) -> Path:
    for i in range(COUNT):
        path = root / CLASSES[i % len(CLASSES)] / f"img{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(make_image_bytes(".png", size=(16, 16), name=f"m{i}"))
    return root


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return write_images(tmp_path_factory.mktemp("meta") / "src")


#: name -> (output name, pack options)
VARIANTS = {
    "lmdb": ("out.lmdb", {}),
    "hdf5": ("out.h5", {}),
    "tar": ("out.tar", {}),
    "tar-sharded": ("out-%06d.tar", {"shard_size": 4}),
    "tar-bytes": ("out-%06d.tar", {"shard_size": "8KB"}),
    "tfrecord": ("out.tfrecord", {}),
    "tfrecord-sharded": ("out-%05d.tfrecord", {"shard_size": 4}),
}


def pack_variant(images, folder: Path, variant: str, source=None, **options):
    name, base = VARIANTS[variant]
    return fastdata.pack(source or MetaSource(images), folder / name,
                         options=fastdata.PackOptions(workers=1, **base, **options),
                         progress=False)


@pytest.fixture(scope="module")
def packs(images, tmp_path_factory) -> dict[str, str]:
    """Every variant packed once: variant -> the path to open."""
    return {v: pack_variant(images, tmp_path_factory.mktemp(v), v).output for v in VARIANTS}


# -- what goes in comes out ---------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_metadata_round_trip(packs, variant):
    ds = fastdata.open_dataset(packs[variant])
    assert ds.has_metadata
    assert [ds.metadata(i) for i in range(len(ds))] == [expected(i) for i in range(COUNT)]
    assert ds.metadata(-1) == expected(COUNT - 1)
    meta = ds.manifest.extra["metadata"]
    assert meta["records"] == sum(metadata_for(i) is not None for i in range(COUNT))
    image, label, metadata = fastdata.open_dataset(packs[variant], with_metadata=True)[7]
    assert image.shape == (3, 16, 16) and label == 7 % 3 and metadata == expected(7)
    assert len(ds[7]) == 2  # without with_metadata the sample is as before
    result = verify_dataset(packs[variant])
    assert result.ok, result.problems


def test_byte_shard_size_counts_metadata(packs):
    """A byte shard_size cuts shards with the .json members counted."""
    manifest = json.loads(Path(packs["tar-bytes"]).read_text())
    assert len(manifest["shards"]) > 1
    # (each shard ends with the tar's two zero blocks, which the cut does not count)
    assert all(s["bytes"] - 1024 <= 8000 for s in manifest["shards"])


@pytest.mark.parametrize("variant", ["lmdb", "hdf5", "tar-sharded", "tfrecord-sharded"])
def test_with_metadata_through_a_dataloader(packs, variant):
    ds = fastdata.open_dataset(packs[variant], with_metadata=True,
                               order=fastdata.Order(batch_size=8))
    batches = list(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=fastdata.collate))
    got = []
    for images, labels, metadata in batches:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 16, 16)
        assert isinstance(metadata, list) and len(metadata) == len(labels)
        got += metadata
    assert got == [expected(i) for i in range(COUNT)]
    # fastdata.loader gives the same batches, metadata as lists
    loader = fastdata.loader(ds, num_workers=0, device="cpu")
    assert [m for _, _, batch in loader for m in batch] == got


@pytest.mark.parametrize("variant", ["tar-sharded", "tfrecord-sharded"])
def test_streaming_with_metadata(packs, variant):
    ds = fastdata.ShardedIterableDataset(packs[variant], with_metadata=True,
                                         order=fastdata.Order(batch_size=4))
    got, labels = [], []
    for images, batch_labels, metadata in DataLoader(ds, batch_size=4, num_workers=2,
                                                     collate_fn=fastdata.collate):
        assert images.shape[1:] == (3, 16, 16)
        got += metadata
        labels += batch_labels.tolist()
    assert got == [expected(i) for i in range(COUNT)]
    assert labels == [i % 3 for i in range(COUNT)]
    assert ds.metadata(3) == expected(3)


def test_collate_keeps_dicts_as_lists():
    image = torch.zeros(3, 2, 2, dtype=torch.uint8)
    batch = [(image, 1, {"boxes": [[1, 2]]}), (image, 2, {"boxes": [[1, 2], [3, 4]]})]
    images, labels, metadata = fastdata.collate(batch)
    assert images.shape == (2, 3, 2, 2) and labels.tolist() == [1, 2]
    assert metadata == [{"boxes": [[1, 2]]}, {"boxes": [[1, 2], [3, 4]]}]
    stacked = Batch(torch.zeros(2, 3, 2, 2, dtype=torch.uint8), torch.tensor([1, 2]),
                    [{"a": 1}, {}])
    assert stacked[1][2] == {}
    assert fastdata.collate(stacked)[2] == [{"a": 1}, {}]
    assert fastdata.collate([(image, 1), (image, 2)])[1].tolist() == [1, 2]  # as before


# -- datasets without metadata stay as they were ------------------------------------------


@pytest.mark.parametrize("fmt", [".lmdb", ".h5", ".tar", ".tfrecord"])
def test_dataset_without_metadata_is_unchanged(tmp_path, fmt):
    tree = build_tree(tmp_path / "src", uniform_spec(per_class=2), size=(8, 8))
    summary = fastdata.pack(tree.root, tmp_path / "out" / f"out{fmt}",
                            options=fastdata.PackOptions(workers=1), progress=False)
    ds = fastdata.open_dataset(summary.output, with_metadata=True)
    assert not ds.has_metadata and "metadata" not in ds.manifest.extra
    assert ds.metadata(0) == {} and ds[0][2] == {}
    ds.close()  # lmdb opens a file once per process
    names = os.listdir(tmp_path / "out")
    assert not any("metadata" in n for n in names)
    if fmt == ".lmdb":
        import lmdb

        env = lmdb.open(summary.output, readonly=True, lock=False)
        with env.begin() as txn:
            assert not any(k.endswith(b".json") or b"metadata" in k
                           for k, _ in txn.cursor())
        env.close()
    if fmt == ".h5":
        import h5py

        with h5py.File(summary.output) as f:
            assert not any(name.startswith("metadata") for name in f)
    if fmt == ".tar":
        import tarfile

        with tarfile.open(tmp_path / "out" / "out.tar") as tar:
            assert not any(m.name.endswith(".json") for m in tar.getmembers())


# -- metadata that JSON cannot hold -------------------------------------------------------


def test_metadata_json_cannot_hold_is_skipped(images, tmp_path):
    bad = {2: {"raw": b"\x00"}, 3: {"nan": float("nan")}, 4: ["not", "a", "dict"],
           7: {"set": {1, 2}}}
    summary = fastdata.pack(MetaSource(images, bad=bad), tmp_path / "out.lmdb",
                            options=fastdata.PackOptions(workers=1), progress=False)
    reasons = {s.key: s.reason for s in summary.skipped}
    assert sorted(reasons) == sorted(MetaSource(images).entries[i].key for i in bad)
    assert "bytes is not JSON serializable" in reasons["eel/img002.png"]
    assert "NaN" in reasons["cat/img003.png"] or "nan" in reasons["cat/img003.png"]
    assert "must be a dict" in reasons["dog/img004.png"]
    ds = fastdata.open_dataset(summary.output)
    kept = [i for i in range(COUNT) if i not in bad]
    assert [ds.metadata(k) for k in range(len(ds))] == [expected(i) for i in kept]
    report = json.loads(Path(summary.report).read_text())
    assert any("JSON" in s["reason"] for s in report["skipped"])


def test_metadata_json_cannot_hold_stops_a_strict_pack(images, tmp_path):
    with pytest.raises(fastdata.BadImageError, match="metadata cannot be stored as JSON"):
        fastdata.pack(MetaSource(images, bad={5: {"raw": b"x"}}), tmp_path / "out.h5",
                      options=fastdata.PackOptions(workers=1, strict=True), progress=False)
    assert not (tmp_path / "out.h5").exists()


def test_a_format_without_metadata_support_refuses_it(images, tmp_path):
    """The test suite's toy format stores no metadata: refused, never dropped."""
    with pytest.raises(fastdata.FastDataError, match="does not store per-sample metadata"):
        fastdata.pack(MetaSource(images), tmp_path / "out.toyfmt",
                      options=fastdata.PackOptions(workers=1), progress=False)
    assert not (tmp_path / "out.toyfmt").exists()


# -- resume ---------------------------------------------------------------------------

#: The child: pack MetaSource(IMAGES) into OUT, dying by SIGKILL at the Nth call
#: of a function on the pack's path (see tests/test_pack_resume.py).
_KILLED_PACK = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import fastdata, fastdata.packers.plan as plan
import fastdata.formats.writer as writer, fastdata.packers.journal as journal
from test_metadata import MetaSource, VARIANTS

images, out, variant, point, nth = sys.argv[2:6] + [int(sys.argv[6])]
plan.SINGLE_FILE_PIECE_ENTRIES = 4
owner, name, after = {"mid-piece": (writer.Writer, "write", False),
                      "unjournaled": (journal.PackJournal, "record", False),
                      "between-pieces": (journal.PackJournal, "record", True)}[point]
original, calls = getattr(owner, name), [0]
def killing(*args, **kwargs):
    calls[0] += 1
    if calls[0] == nth and not after:
        os.kill(os.getpid(), signal.SIGKILL)
    result = original(*args, **kwargs)
    if calls[0] == nth:
        os.kill(os.getpid(), signal.SIGKILL)
    return result
setattr(owner, name, killing)
fastdata.pack(MetaSource(images), out,
              options=fastdata.PackOptions(workers=1, **VARIANTS[variant][1]), progress=False)
"""


def _killed_pack(images, out: Path, variant: str, point: str, nth: int) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILLED_PACK, TESTS_DIR, str(images),
                           str(out), variant, point, str(nth)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)


def _contents(path: str) -> tuple:
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
    manifest = ds.manifest.to_dict()
    manifest.pop("created_at")
    return ([ds[i] for i in range(len(ds))], ds.keys,
            [ds.metadata(i) for i in range(len(ds))], manifest)


@pytest.mark.parametrize("point,nth", [("mid-piece", 10), ("unjournaled", 3),
                                       ("between-pieces", 3)])
@pytest.mark.parametrize("variant", ["lmdb", "hdf5", "tar-sharded", "tfrecord-sharded"])
def test_resumed_pack_gives_the_same_metadata(images, tmp_path, monkeypatch, variant, point,
                                              nth):
    monkeypatch.setattr(fastdata.packers.plan, "SINGLE_FILE_PIECE_ENTRIES", 4)
    name = VARIANTS[variant][0]
    _killed_pack(images, tmp_path / "killed" / name, variant, point, nth)
    resumed = pack_variant(images, tmp_path / "killed", variant, resume=True)
    reference = pack_variant(images, tmp_path / "whole", variant)
    got = _contents(resumed.output)
    assert got[2] == [expected(i) for i in range(COUNT)]
    assert got == _contents(reference.output)
    assert verify_dataset(resumed.output).ok
    if variant.startswith(("tar", "tfrecord")):  # byte for byte, the manifest apart
        files = {n for n in os.listdir(tmp_path / "whole") if not n.endswith("fastdata.json")}
        assert {n for n in os.listdir(tmp_path / "killed")
                if not n.startswith(".") and not n.endswith("fastdata.json")} == files
        for n in files:
            assert (tmp_path / "killed" / n).read_bytes() == (tmp_path / "whole" / n).read_bytes()


def test_resume_refuses_changed_metadata(images, tmp_path):
    _killed_pack(images, tmp_path / "out.h5", "hdf5", "between-pieces", 2)
    with pytest.raises(ResumeRefused, match="modified"):
        fastdata.pack(MetaSource(images, variant="!"), tmp_path / "out.h5",
                      options=fastdata.PackOptions(workers=1, resume=True), progress=False)


# -- damage ---------------------------------------------------------------------------


def _damage_metadata(path: str, variant: str, index: int) -> None:
    """Change one byte of record ``index``'s stored metadata JSON, keeping its length."""
    if variant == "lmdb":
        key = b"%010d.json" % index
        value = bytearray(lmdb_get(path, key))
        value[-2] ^= 1
        lmdb_put(path, {key: bytes(value)})
    elif variant == "hdf5":
        import h5py

        with h5py.File(path, "r+") as f:
            end = int(f["metadata_offsets"][index + 1])
            f["metadata"][end - 2] ^= 1
    else:
        rows = np.load(path.replace(".fastdata.json", ".fastdata.metadata.npy"))
        manifest = json.loads(Path(path).read_text())
        shard = Path(path).parent / manifest["shards"][int(rows["shard"][index])]["path"]
        data = bytearray(shard.read_bytes())
        data[int(rows["offset"][index]) + int(rows["size"][index]) - 2] ^= 1
        shard.write_bytes(bytes(data))


@pytest.mark.parametrize("variant", ["lmdb", "hdf5", "tar-sharded", "tfrecord-sharded"])
def test_damaged_metadata_is_reported(images, tmp_path, variant):
    out = pack_variant(images, tmp_path, variant).output
    _damage_metadata(out, variant, 7)
    ds = fastdata.open_dataset(out)
    with pytest.raises(fastdata.CorruptDataError, match="metadata of record 7"):
        ds.metadata(7)
    assert ds.metadata(8) == expected(8)
    result = verify_dataset(out)
    assert any(p["index"] == 7 and "metadata" in p["reason"] for p in result.problems), \
        result.problems
    skipping = fastdata.open_dataset(out, with_metadata=True, on_error="skip")
    with pytest.warns(RuntimeWarning, match="record 7"):
        batch = skipping.__getitems__([6, 7, 8])
    assert [m for _, _, m in batch] == [expected(6), expected(8)]


# -- the ecosystem's tools ----------------------------------------------------------------


def test_webdataset_reads_our_metadata(packs):
    import webdataset as wds

    manifest = json.loads(Path(packs["tar-sharded"]).read_text())
    urls = [str(Path(packs["tar-sharded"]).parent / s["path"]) for s in manifest["shards"]]
    samples = list(wds.WebDataset(urls, shardshuffle=False).decode())
    assert len(samples) == COUNT
    for i, sample in enumerate(samples):
        if metadata_for(i) is None:
            assert "json" not in sample
        else:
            assert sample["json"] == metadata_for(i)
    tuples = wds.WebDataset(urls, shardshuffle=False).decode().to_tuple(
        "png", "cls", "json", missing_is_error=False)
    assert [(cls, meta) for _, cls, meta in tuples] == [
        (i % 3, metadata_for(i)) for i in range(COUNT)]


def test_we_read_webdataset_json_members(tmp_path):
    import webdataset as wds

    folder = tmp_path / "wds"
    folder.mkdir()
    metas = [{"caption": f"ünï {i}", "boxes": [[i, 2]] * i} for i in range(5)]
    with wds.ShardWriter(str(folder / "wds-%06d.tar"), maxcount=3, verbose=0) as sink:
        for i, meta in enumerate(metas):
            sample = {"__key__": f"s{i:03d}", "cls": i % 2,
                      "png": make_image_bytes(".png", size=(8, 8), name=f"w{i}")}
            if i != 2:
                sample["json"] = meta
            sink.write(sample)
    paths = sorted(str(p) for p in folder.glob("wds-*.tar"))
    reader = open_reader(paths)
    assert reader.has_metadata
    want = [m if i != 2 else {} for i, m in enumerate(metas)]
    assert [reader.metadata(i) for i in range(5)] == want
    ds = fastdata.TarDataset(paths, with_metadata=True)
    assert [ds[i][2] for i in range(5)] == want
    stream = fastdata.ShardedIterableDataset(paths, with_metadata=True)
    assert [m for _, _, m in stream] == want


def test_tfrecord_package_reads_the_metadata_feature(packs):
    example_pb2 = optional.require("tfrecord").example_pb2
    manifest = json.loads(Path(packs["tfrecord"]).read_text())
    data = (Path(packs["tfrecord"]).parent / manifest["shards"][0]["path"]).read_bytes()
    pos, found = 0, []
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 8], "little")
        example = example_pb2.Example()
        example.ParseFromString(data[pos + 12:pos + 12 + length])
        feature = example.features.feature.get("fastdata/metadata")
        found.append(json.loads(feature.bytes_list.value[0]) if feature else None)
        pos += 16 + length
    assert found == [metadata_for(i) for i in range(COUNT)]


# -- info and overwrite ---------------------------------------------------------------


def test_info_says_whether_there_is_metadata(packs, tmp_path):
    result = CliRunner().invoke(main, ["info", packs["lmdb"]])
    assert result.exit_code == 0, result.output
    assert "metadata   24 of 30 records" in result.output
    tree = build_tree(tmp_path / "src", uniform_spec(per_class=1), size=(8, 8))
    plain = fastdata.pack(tree.root, tmp_path / "plain.h5", progress=False).output
    assert "metadata   none" in CliRunner().invoke(main, ["info", plain]).output


def test_overwrite_without_metadata_removes_the_metadata_index(images, tmp_path):
    out = pack_variant(images, tmp_path, "tar-sharded").output
    assert os.path.exists(out.replace(".fastdata.json", ".fastdata.metadata.npy"))
    tree = build_tree(tmp_path / "src", uniform_spec(per_class=2), size=(8, 8))
    fastdata.pack(tree.root, tmp_path / "out-%06d.tar",
                  options=fastdata.PackOptions(shard_size=4, overwrite=True), progress=False)
    assert not os.path.exists(out.replace(".fastdata.json", ".fastdata.metadata.npy"))
    ds = fastdata.open_dataset(out)
    assert not ds.has_metadata and len(ds) == 6

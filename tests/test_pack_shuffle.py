"""Pack-time shuffling: ``pack(..., PackOptions(shuffle=SEED))`` and ``--shuffle SEED``.

The records are written in the order ``Generator(PCG64(seed)).permutation(n)``
over the source's entries; labels, keys and payloads travel together; the same
seed gives the same files whatever the worker count; the manifest records the
seed. Every registered format is covered, as in test_contract.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import build_tree, uniform_spec
from test_golden import _hdf5_digest, _lmdb_digest, _manifest_digest
from torch.utils.data import IterableDataset
from worker_pids import PreparedIn, assert_other_processes, assert_this_process

import fastdata
from fastdata.cli import main
from fastdata.errors import FastDataError
from fastdata.formats import FORMATS, detect_format, read_manifest
from fastdata.packers.pack import PackOptions
from fastdata.packers.shuffle import shuffle_order
from fastdata.packers.source import ImageFolderSource, SourceEntry

CLASSES = ("ant", "bee", "cat", "dog")
#: 56 images: enough for three pack workers (pack() gives each at least 16).
SPEC = uniform_spec(classes=CLASSES, per_class=14)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_tree(tmp_path_factory.mktemp("shuffle-src") / "src", SPEC, size=(12, 10))


def _pack(tree, folder: Path, fmt: str, **options) -> Path:
    spec = FORMATS[fmt]
    if spec.sharded:
        options.setdefault("shard_size", 10)
    out = folder / f"out{spec.extensions[0]}"
    folder.mkdir(parents=True, exist_ok=True)
    fastdata.pack(tree.root, out, options=PackOptions(format=fmt, **options), progress=False)
    return out


def _records(out: Path) -> list[tuple[str, int, bytes]]:
    """(key, label, stored bytes) per record, in record order."""
    ds = fastdata.open_dataset(out, decode=fastdata.Decode(output="bytes"))
    items = list(ds) if isinstance(ds, IterableDataset) else [ds[i] for i in range(len(ds))]
    return [(key, target, bytes(img)) for key, target, (img, _) in
            zip(ds.keys, ds.targets, items, strict=True)]


def _digest(out: Path) -> dict:
    """Everything a pack wrote except the time and version in its manifest."""
    name = detect_format(out).name
    if name == "lmdb":
        return _lmdb_digest(out)
    if name == "hdf5":
        return _hdf5_digest(out)
    files = {str(p.relative_to(out.parent)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(out.parent.rglob("*")) if p.is_file()
             and not p.name.endswith(("manifest.json", ".fastdata.json", ".report.json"))}
    return {"files": files, "manifest": _manifest_digest(read_manifest(out).to_dict())}


def test_the_permutation_is_numpys_pcg64_and_pinned():
    assert shuffle_order(10, 0) == [4, 6, 2, 7, 3, 5, 9, 0, 8, 1]
    for n, seed in ((1, 3), (57, 0), (1000, 2**70)):
        assert shuffle_order(n, seed) == np.random.Generator(
            np.random.PCG64(seed)).permutation(n).tolist()
    assert shuffle_order(0, 5) == []


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_records_follow_the_permutation_with_their_labels_and_keys(tree, tmp_path, fmt):
    out = _pack(tree, tmp_path, fmt, shuffle=11)
    order = shuffle_order(len(tree.samples), 11)
    assert sorted(order) == list(range(len(tree.samples)))
    expected = [tree.samples[i] for i in order]
    records = _records(out)
    assert [(k, lbl, data) for k, lbl, data in records] == [
        (s.key, s.label, s.data) for s in expected]
    for key, label, data in records:  # against the file itself, not only our list
        assert (tree.root / key).read_bytes() == data
        assert key.split("/")[0] == CLASSES[label]
    m = read_manifest(out)
    assert m.pack_options["shuffle"] == 11
    assert m.class_counts == tree.class_counts and m.count == len(tree.samples)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_same_seed_same_files_whatever_the_workers(tree, tmp_path, fmt):
    logs = {n: str(tmp_path / f"prepared-{n}.pids") for n in (1, 3)}
    one = _pack(tree, tmp_path / "w1", fmt, shuffle=3, workers=1,
                preprocess=PreparedIn(log=logs[1]))
    three = _pack(tree, tmp_path / "w3", fmt, shuffle=3, workers=3,
                  preprocess=PreparedIn(log=logs[3], meet=3))
    assert_this_process(logs[1])              # 1 worker: the images prepared here
    assert_other_processes(logs[3], count=3)  # 3: by 3 worker processes, none here
    assert _digest(one) == _digest(three)
    other = _pack(tree, tmp_path / "s4", fmt, shuffle=4, workers=3)
    keys = [k for k, _, _ in _records(other)]
    assert keys != [k for k, _, _ in _records(three)]
    assert keys != tree.keys and sorted(keys) == sorted(tree.keys)


def test_unshuffled_by_default_and_recorded_as_null(tree, tmp_path):
    out = _pack(tree, tmp_path, "lmdb")
    assert read_manifest(out).pack_options["shuffle"] is None
    assert [k for k, _, _ in _records(out)] == tree.keys


def test_shuffled_shards_mix_the_classes(tree, tmp_path):
    plain = _pack(tree, tmp_path / "plain", "tar", shard_size=14)
    mixed = _pack(tree, tmp_path / "mixed", "tar", shard_size=14, shuffle=0)

    def classes_per_shard(out):
        labels = fastdata.open_dataset(out).targets
        return [len(set(labels[i:i + 14])) for i in range(0, len(labels), 14)]

    assert classes_per_shard(plain) == [1, 1, 1, 1]
    assert min(classes_per_shard(mixed)) >= 3


def test_the_permutation_is_over_entries_before_checks(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(per_class=5))
    bad = tree.samples[6].key
    (tree.root / bad).write_bytes(b"\x00 not an image")
    summary = fastdata.pack(tree.root, tmp_path / "out.h5", options=PackOptions(shuffle=9),
                            progress=False)
    assert [s.key for s in summary.skipped] == [bad]
    order = shuffle_order(len(tree.samples), 9)
    expected = [tree.keys[i] for i in order if tree.keys[i] != bad]
    assert fastdata.open_dataset(tmp_path / "out.h5").keys == expected


class _MemorySource:
    """A Source of images in memory; ``indexed`` adds ``src[i]``."""

    def __init__(self, items, classes):
        self.items = items
        self.classes = classes
        self.iterations = 0

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        self.iterations += 1
        return (SourceEntry(k, lbl, data=d) for k, lbl, d in self.items)

    def describe(self):
        return {"root": None, "files": len(self.items), "kind": "memory"}

    def warnings(self):
        return []


class _IndexedMemorySource(_MemorySource):
    def __getitem__(self, i):
        k, lbl, d = self.items[i]
        return SourceEntry(k, lbl, data=d)


@pytest.mark.parametrize("source_cls", [_MemorySource, _IndexedMemorySource])
def test_any_source_is_shuffled(tree, tmp_path, source_cls):
    items = [(f"mem/{i:03d}", s.label, s.data) for i, s in enumerate(tree.samples)]
    src = source_cls(items, list(CLASSES))
    fastdata.pack(src, tmp_path / "mem.lmdb", options=PackOptions(shuffle=5), progress=False)
    order = shuffle_order(len(items), 5)
    assert _records(tmp_path / "mem.lmdb") == [items[i] for i in order]
    assert read_manifest(tmp_path / "mem.lmdb").source["kind"] == "memory"


def test_an_image_folder_source_and_its_subset_are_shuffled(tree, tmp_path):
    sub = ImageFolderSource(tree.root).subset(range(0, len(tree.samples), 2))
    fastdata.pack(sub, tmp_path / "sub.h5", options=PackOptions(shuffle=1), progress=False)
    picked = tree.keys[::2]
    assert fastdata.open_dataset(tmp_path / "sub.h5").keys == [
        picked[i] for i in shuffle_order(len(picked), 1)]


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3", [1]])
def test_a_bad_seed_is_refused_before_anything_is_written(tree, tmp_path, seed):
    out = tmp_path / "bad.lmdb"
    with pytest.raises(FastDataError, match=r"shuffle=.* is not a seed: give a whole number"):
        fastdata.pack(tree.root, out, options=PackOptions(shuffle=seed), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_numpy_integer_seed_is_recorded_as_a_plain_int(tree, tmp_path):
    out = _pack(tree, tmp_path, "hdf5", shuffle=np.int64(11))
    assert read_manifest(out).pack_options["shuffle"] == 11
    assert fastdata.open_dataset(out).keys == [tree.keys[i] for i in shuffle_order(56, 11)]


# -- the command line -------------------------------------------------------------------


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_shuffle_matches_the_api_and_info_shows_it(tree, tmp_path):
    result = _invoke("pack", tree.root, tmp_path / "cli.tar", "--shuffle", "11",
                     "--shard-size", "20", "--workers", "2")
    assert result.exit_code == 0, result.output
    assert "order: shuffled with seed 11" in result.stdout
    api = _pack(tree, tmp_path / "api", "tar", shuffle=11, shard_size=20)
    assert _records(tmp_path / "cli.tar") == _records(api)
    info = _invoke("info", tmp_path / "cli.tar")
    assert info.exit_code == 0, info.output
    assert re.search(r"^  order +shuffled at pack time \(seed 11\)$", info.stdout, re.M)
    assert re.search(r"^  options .*shuffle=11", info.stdout, re.M)
    as_json = json.loads(_invoke("info", tmp_path / "cli.tar", "--json").stdout)
    assert as_json["pack_options"]["shuffle"] == 11


def test_info_says_source_order_when_not_shuffled(tree, tmp_path):
    out = _pack(tree, tmp_path, "lmdb")
    info = _invoke("info", out)
    assert re.search(r"^  order +source order$", info.stdout, re.M), info.stdout


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "", "1e3"])
def test_cli_bad_seed_is_one_error_line(tree, tmp_path, value):
    out = tmp_path / "bad.lmdb"
    result = _invoke("pack", tree.root, out, "--shuffle", value)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --shuffle "), result.stderr
    assert "is not a seed: give a whole number" in lines[0]
    assert "Traceback" not in result.output and not out.exists()


def test_cli_help_explains_when_to_shuffle():
    text = re.sub(r"\s+", " ", _invoke("pack", "--help").stdout)
    assert "--shuffle SEED" in text
    assert "shuffle window" in text and "webdataset" in text

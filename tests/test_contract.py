"""One contract, every registered container format.

Parametrized over ``fastdata.formats.FORMATS``: a new format is covered as soon
as it is registered, without new test code — including ``toyformat``, which the
test suite registers itself (see conftest). A registered format whose code
cannot be imported fails the tests, it is never skipped.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
from collections import Counter

import pytest
from conftest import TESTS_DIR, build_tree, largest_data_file, run_python, truncate_to_half
from torch.utils.data import DataLoader, IterableDataset

import fastdata
from fastdata import Decode
from fastdata.formats import FORMATS, detect_format


def _resolve(spec):
    """(writer, reader, dataset) classes. A registered format that cannot be
    imported fails here: a typo in a FormatSpec must not skip the contract."""
    from fastdata.loaders.datasets import dataset_class

    return spec.load_writer(), spec.load_reader(), dataset_class(spec)


@pytest.fixture(scope="module", params=sorted(FORMATS), ids=lambda name: name)
def contract(request, tmp_path_factory):
    spec = FORMATS[request.param]
    writer_cls, reader_cls, dataset_cls = _resolve(spec)
    base = tmp_path_factory.mktemp(f"contract-{spec.name}")
    tree = build_tree(base / "src")
    out = base / f"out{spec.extensions[0]}"
    summary = fastdata.pack(tree.root, out, progress=False)
    return spec, tree, out, summary, reader_cls, dataset_cls


def _items(ds) -> list:
    if isinstance(ds, IterableDataset):
        return list(ds)
    return [ds[i] for i in range(len(ds))]


def _as_list(batch):
    return batch


def test_pack_summary_and_manifest(contract):
    spec, tree, out, summary, _, _ = contract
    assert summary.format == spec.name
    assert summary.records == len(tree.samples)
    assert summary.classes == len(tree.classes)
    assert summary.skipped == []
    assert os.path.exists(out)
    m = fastdata.formats.read_manifest(out)
    assert m.format == spec.name
    assert m.count == len(tree.samples)
    assert m.classes == tree.classes
    assert m.class_counts == tree.class_counts
    assert m.checksums["payload_sha256"] == hashlib.sha256(b"".join(tree.payloads)).hexdigest()
    assert m.shards, "the manifest lists the files of the dataset"


def test_detect_and_open(contract):
    spec, _, out, _, reader_cls, dataset_cls = contract
    assert detect_format(out) is spec
    ds = fastdata.open_dataset(out)
    assert type(ds) is dataset_cls
    with fastdata.formats.open_reader(out) as reader:
        assert isinstance(reader, reader_cls)


def test_round_trip_bytes(contract):
    _, tree, out, _, _, _ = contract
    ds = fastdata.open_dataset(out, decode=Decode(output="bytes"))
    assert len(ds) == len(tree.samples)
    assert ds.classes == tree.classes
    assert ds.class_to_idx == {c: i for i, c in enumerate(tree.classes)}
    items = _items(ds)
    assert [(bytes(img), label) for img, label in items] == [
        (s.data, s.label) for s in tree.samples]


def test_reader_contract(contract):
    _, tree, out, _, _, _ = contract
    with fastdata.formats.open_reader(out) as reader:
        assert len(reader) == len(tree.samples)
        assert reader.classes == tree.classes
        assert list(reader.labels) == tree.labels
        assert reader.keys == tree.keys
        assert [(i, bytes(d), lbl) for i, d, lbl in reader] == [
            (i, s.data, s.label) for i, s in enumerate(tree.samples)]
        order = list(range(len(tree.samples)))
        random.Random(0).shuffle(order)
        for i in order:
            assert reader.read(i) == tree.samples[i].data, i
        assert reader.read(-1) == tree.samples[-1].data
        assert reader.read_many(order[:5]) == [tree.samples[i].data for i in order[:5]]
        with pytest.raises(IndexError):
            reader.read(len(tree.samples))


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork here")
def test_dataloader_two_workers(contract):
    _, tree, out, _, _, _ = contract
    ds = fastdata.open_dataset(out, decode=Decode(output="bytes"))
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                        collate_fn=_as_list, timeout=120)
    got = Counter((bytes(img), label) for batch in loader for img, label in batch)
    assert got == Counter((s.data, s.label) for s in tree.samples)


_READ_EVERYTHING = """
    import sys
    sys.path.insert(0, sys.argv[2])
    import toyformat
    toyformat.register()
    import fastdata
    from fastdata.errors import FastDataError
    from torch.utils.data import IterableDataset

    path = sys.argv[1]

    def dataset():
        ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
        if isinstance(ds, IterableDataset):
            for _ in ds:
                pass
        else:
            for i in range(len(ds)):
                ds[i]

    def reader():
        with fastdata.formats.open_reader(path) as r:
            for _ in r:
                pass

    def verify():
        from fastdata.formats.verify import verify_dataset
        if not verify_dataset(path, progress=False).ok:
            raise FastDataError("verify reported damage")

    for name, fn in (("dataset", dataset), ("reader", reader), ("verify", verify)):
        try:
            fn()
            print(name, "NO-ERROR", flush=True)
        except FastDataError as exc:
            print(name, "OK", type(exc).__name__, flush=True)
    """


@pytest.fixture(params=sorted(FORMATS), ids=lambda name: name)
def fresh_pack(request, tmp_path):
    spec = FORMATS[request.param]
    _resolve(spec)
    tree = build_tree(tmp_path / "src")
    out = tmp_path / f"out{spec.extensions[0]}"
    fastdata.pack(tree.root, out, progress=False)
    return spec, out


@pytest.mark.slow
def test_truncated_data_file_raises(fresh_pack):
    spec, out = fresh_pack
    victim = largest_data_file(out, fastdata.formats.read_manifest(out))
    truncate_to_half(victim)
    # In a fresh process: a crash shows up as a signal exit, a hang as a timeout.
    proc = run_python(_READ_EVERYTHING, str(out), TESTS_DIR, timeout=120)
    assert proc.returncode == 0, (spec.name, victim, proc.returncode, proc.stderr[-3000:])
    results = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert set(results) == {"dataset", "reader", "verify"}, proc.stdout
    for name, outcome in results.items():
        assert outcome.startswith("OK"), (spec.name, victim.name, name, outcome)


def test_the_toy_format_is_registered_from_the_tests():
    # The contract above ran over it: a format needs no change inside fastdata.
    assert "toy" in FORMATS and FORMATS["toy"].writer.startswith("toyformat:")


def test_a_broken_registry_entry_fails_instead_of_skipping():
    from dataclasses import replace

    broken = replace(FORMATS["toy"], name="broken", extensions=(".brk",),
                     reader="toyformat:NoSuchReader")
    with pytest.raises(AttributeError):
        _resolve(broken)


def test_a_format_names_no_layer_above_it():
    """The torch Dataset and the DALI reader of a format come from those layers'
    own registries, not from the format's registry entry."""
    from fastdata.dali.readers import DALI_READERS, dali_reader
    from fastdata.formats import FORMATS
    from fastdata.loaders.datasets import DATASET_CLASSES, dataset_class

    assert dataset_class(FORMATS["tar"]) is DATASET_CLASSES["tar"]
    assert dali_reader(FORMATS["tfrecord"]) is DALI_READERS["tfrecord"]

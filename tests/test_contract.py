"""One contract, every registered container format.

Parametrized over ``fastdata.formats.FORMATS``: a new format is covered as soon
as it is registered, without new test code — including ``toyformat``, which the
test suite registers itself (see conftest). A registered format whose code
cannot be imported fails the tests, it is never skipped. The toy format's own
tests show the rest a format brings from its folder: a writer option on the
command line and a pack to an S3 URL that its writer's upload hooks direct.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
from collections import Counter

import optional
import pytest
import toyformat
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
        from fastdata.ops.verify import verify_dataset
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
    """The formats' registry entries name no torch Dataset and no DALI adapter:
    those layers register theirs (the toy format its Dataset class)."""
    import dataclasses

    from fastdata.dali.readers import DALI_READERS, dali_reader
    from fastdata.formats import FORMATS, FormatSpec
    from fastdata.loaders.datasets import DATASET_CLASSES, dataset_class

    fields = {f.name for f in dataclasses.fields(FormatSpec)}
    assert not fields & {"dataset", "dali"}
    with pytest.raises(TypeError):
        FormatSpec(name="old", extensions=(".old",), writer="w:W", reader="r:R", help="",
                   dataset="fastdata.loaders.datasets:PackedDataset")
    assert dataset_class(FORMATS["tar"]) is DATASET_CLASSES["tar"]
    assert dataset_class(FORMATS["toy"]) is toyformat.ToyDataset
    assert dali_reader(FORMATS["tfrecord"]) is DALI_READERS["tfrecord"]
    assert dali_reader(FORMATS["toy"]) is None  # DALI reads it through fastdata's reader


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_declared_writer_option_is_a_keyword_of_the_writer(name):
    import inspect

    spec = FORMATS[name]
    params = inspect.signature(spec.load_writer().__init__).parameters
    for option in spec.options:
        assert option.name in params, (name, option.name)
        assert params[option.name].kind is inspect.Parameter.KEYWORD_ONLY


def test_writer_options_of_one_name_take_one_type():
    from fastdata.formats import FormatSpec, WriterOption, register_format

    clash = FormatSpec(name="clash", extensions=(".clash",), writer="w:W", reader="r:R",
                       help="", options=(WriterOption("split", help="", type=int),))
    with pytest.raises(ValueError, match="'split' takes int, but format 'tar''s takes str"):
        register_format(clash)
    assert "clash" not in FORMATS


def _invoke(*args):
    from click.testing import CliRunner

    from fastdata.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def _toy_records(path) -> list[tuple[str, bytes, int]]:
    with fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes")) as ds:
        return [(ds.keys[i], bytes(img), label) for i, (img, label) in enumerate(_items(ds))]


def _tree_records(tree) -> list[tuple[str, bytes, int]]:
    return [(s.key, s.data, s.label) for s in tree.samples]


def test_the_toy_format_s_writer_option_is_on_the_command_line(tmp_path):
    """--align comes from the toy format's FormatSpec: pack and convert show it
    (as the toy's only), pass it to the toy writer, and refuse it for another
    format, as they refuse tar's --split for a toy output."""
    import json

    for command in ("pack", "convert"):
        shown = _invoke(command, "--help")
        assert shown.exit_code == 0, shown.output
        assert "--align N" in shown.output and "toy only: start each payload" in shown.output
    tree = build_tree(tmp_path / "src")
    out = tmp_path / "out.toyfmt"
    result = _invoke("pack", tree.root, out, "--align", "64", "--workers", "1",
                     "--no-progress")
    assert result.exit_code == 0, result.output
    meta = json.loads((out / toyformat.META).read_text())
    assert meta["starts"][1:] and all(start % 64 == 0 for start in meta["starts"])
    assert _toy_records(out) == _tree_records(tree)
    assert fastdata.formats.read_manifest(out).pack_options["align"] == 64
    converted = _invoke("convert", out, tmp_path / "again.toyfmt", "--align", "8",
                        "--no-progress")
    assert converted.exit_code == 0, converted.output
    assert _toy_records(tmp_path / "again.toyfmt") == _tree_records(tree)
    for args, refusal in (
            ((tmp_path / "x.lmdb", "--align", "8"),
             "--align: not an option of lmdb outputs, only of toy"),
            ((tmp_path / "y.toyfmt", "--split", "train"),
             "--split: not an option of toy outputs, only of tar")):
        refused = _invoke("pack", tree.root, *args, "--no-progress")
        assert refused.exit_code == 1 and refusal in refused.output, refused.output
        assert not os.path.exists(args[0])


def test_the_toy_format_uploads_as_its_writer_says(tmp_path, s3_server, s3_env, monkeypatch):
    """A pack to an S3 URL asks the toy writer what the format is at a URL: its
    manifest says a dataset is there (a second pack is refused without
    --overwrite), goes up after the data, and an overwrite takes it down first."""
    import re

    optional.require("obstore")
    monkeypatch.setenv("FASTDATA_STAGING_DIR", str(tmp_path / "staging"))
    s3_server.make_bucket("toyup")
    tree = build_tree(tmp_path / "src")
    url = "s3://toyup/x/out.toyfmt"
    names = (toyformat.PAYLOAD, toyformat.META, toyformat.MANIFEST)

    def changes() -> list[str]:
        """The bucket's changes in order: the toy files put, "delete" for a delete."""
        log = s3_server.log_path.read_text(errors="replace")
        return ["delete" if name is None else name for name in (
            m.group(1) for m in re.finditer(
                r'"(?:PUT /toyup/x/out\.toyfmt/([^ ?]+)|POST /toyup\?delete|DELETE /toyup/)',
                log))]

    def fetched(into) -> list[tuple[str, bytes, int]]:
        into.mkdir()
        for name in names:
            (into / name).write_bytes(s3_server.get(f"{url}/{name}"))
        return _toy_records(into)

    result = _invoke("pack", tree.root, url, "--align", "16", "--workers", "1", "--no-progress")
    assert result.exit_code == 0, result.output
    assert changes() == [toyformat.PAYLOAD, toyformat.META, toyformat.MANIFEST]
    assert fetched(tmp_path / "first.toyfmt") == _tree_records(tree)
    again = _invoke("pack", tree.root, url, "--workers", "1", "--no-progress")
    assert again.exit_code == 1 and "a dataset exists at this URL" in again.output
    over = _invoke("pack", tree.root, url, "--overwrite", "--workers", "1", "--no-progress")
    assert over.exit_code == 0, over.output
    # The old manifest went first (nothing else to delete: the new files replace theirs).
    assert changes()[3:] == ["delete", toyformat.PAYLOAD, toyformat.META, toyformat.MANIFEST]
    assert fetched(tmp_path / "second.toyfmt") == _tree_records(tree)
    assert not os.listdir(tmp_path / "staging")

"""One API, said once: every read option has one spelling, an old one gets
Python's TypeError plus a line naming the new one, and public callables list
their parameters (no ``**kwargs``)."""

from __future__ import annotations

import inspect

import optional
import pytest
import torch

import fastdata
import fastdata.dali
from fastdata import Decode, Order


def _public_callables():
    """Every public function, class and method of ``fastdata`` and
    ``fastdata.dali`` (not protocols or warnings, whose signatures are Python's)."""
    seen = {}
    for module in (fastdata, fastdata.dali):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value):
                seen[f"{module.__name__}.{name}"] = value
            elif inspect.isclass(value) and not issubclass(value, BaseException) and \
                    not getattr(value, "_is_protocol", False):
                seen[f"{module.__name__}.{name}"] = value
                for attr, member in vars(value).items():
                    if inspect.isfunction(member) and not attr.startswith("_"):
                        seen[f"{module.__name__}.{name}.{attr}"] = member
    return sorted(seen.items())


@pytest.mark.parametrize("name,value", _public_callables(), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_no_public_callable_takes_arbitrary_keywords(name, value):
    signature = inspect.signature(value)
    loose = [p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
    assert not loose, f"{name}{signature} takes **{loose[0]}"


@pytest.fixture
def lmdb_path(packed):
    return packed(".lmdb")


@pytest.fixture
def tar_manifest(packed):
    return packed(".tar", shard_size=5)


@pytest.mark.parametrize("old,new", [
    ("size", "decode=fastdata.Decode(size=...)"),
    ("output", "decode=fastdata.Decode(output=...)"),
    ("shuffle", "order=fastdata.Order(shuffle=...)"),
    ("seed", "order=fastdata.Order(seed=...)"),
    ("shuffle_block", "order=fastdata.Order(block=...)"),
    ("shard_id", "order=fastdata.Order(rank=...)"),
])
def test_an_old_read_keyword_is_a_type_error_naming_its_new_spelling(lmdb_path, old, new):
    with pytest.raises(TypeError) as caught:
        fastdata.open_dataset(lmdb_path, **{old: 1})
    assert str(caught.value) == (f"open_dataset() got an unexpected keyword argument {old!r}\n"
                                 f"  pass {new} instead")


@pytest.mark.parametrize("call", [
    lambda p: fastdata.PackedDataset(p, crop=8),
    lambda p: fastdata.LMDBDataset(p, decoder="pil"),
    lambda p: fastdata.EpochBatches(fastdata.open_dataset(p), batch_size=4),
    lambda p: fastdata.loader(fastdata.open_dataset(p), shuffle=True),
    lambda p: fastdata.loader(fastdata.open_dataset(p), background=1),
    lambda p: fastdata.CUDAPrefetcher([], "cpu", background=1),
    lambda p: fastdata.mix({"a": {"path": p, "weight": 1}}, seed=3),
], ids=["PackedDataset", "LMDBDataset", "EpochBatches", "loader-order", "loader-run-ahead",
        "CUDAPrefetcher", "mix"])
def test_every_way_of_reading_names_the_new_spelling(lmdb_path, call):
    with pytest.raises(TypeError, match=r"unexpected keyword argument .*\n  pass "
                                        r"(decode=|order=|run_ahead=)"):
        call(lmdb_path)


def test_dali_takes_decode_and_order_only(lmdb_path):
    optional.skip_if_missing("dali")
    with pytest.raises(TypeError, match=r"'prefetch'\n  pass run_ahead= instead"):
        fastdata.dali.DALILoader(lmdb_path, prefetch=2)
    with pytest.raises(TypeError, match=r"'num_shards'\n  pass order=fastdata.Order"
                                        r"\(world_size=\.\.\.\) instead"):
        fastdata.dali.build_pipeline(lmdb_path, num_shards=2)


def test_a_keyword_nobody_ever_took_is_pythons_plain_type_error(lmdb_path):
    with pytest.raises(TypeError) as caught:
        fastdata.open_dataset(lmdb_path, colour=True)
    assert "pass" not in str(caught.value)
    assert "unexpected keyword argument 'colour'" in str(caught.value)


def test_reader_settings_go_to_the_formats_reader_by_name(lmdb_path, tar_manifest):
    ds = fastdata.open_dataset(fastdata.DatasetRef(lmdb_path,
                                                   reader_settings={"readahead": True}))
    assert ds.reader.readahead is True
    with pytest.raises(TypeError, match=r"the lmdb reader has no setting 'chunk_size' "
                                        r"\(its settings: readahead\)"):
        fastdata.open_dataset(fastdata.DatasetRef(lmdb_path, reader_settings={"chunk_size": 1}))
    with pytest.raises(TypeError, match=r"the tar reader has no setting 'readahead' "
                                        r"\(its settings: none\)"):
        fastdata.open_dataset(fastdata.DatasetRef(tar_manifest,
                                                  reader_settings={"readahead": True}),
                              streaming=True)


@pytest.mark.parametrize("streaming,option,value", [
    (True, "cache", "ram"), (True, "decode_threads", 2), (False, "read_ahead", 2),
    (False, "remote_read", "ranges"), (False, "samples_per_epoch", 10)])
def test_an_option_of_another_way_of_reading_is_refused_by_name(tar_manifest, streaming,
                                                                option, value):
    with pytest.raises(ValueError, match=f"^{option}= is not an option of "):
        fastdata.open_dataset(tar_manifest, streaming=streaming, **{option: value})


def test_loader_reads_a_dataset_opened_without_order_in_its_own_order(lmdb_path):
    ds = fastdata.open_dataset(lmdb_path, decode=Decode(output="tensor"))
    batches = list(fastdata.loader(ds, num_workers=0, device="cpu").loader.batch_sampler)
    assert [i for batch in batches for i in batch] == list(range(len(ds)))
    shuffled = fastdata.open_dataset(lmdb_path, order=Order(shuffle=True, seed=1))
    loaded = list(fastdata.loader(shuffled, num_workers=0, device="cpu").loader.batch_sampler)
    assert [i for batch in loaded for i in batch] == \
        [i for batch in fastdata.EpochBatches(shuffled) for i in batch]
    assert sorted(i for batch in loaded for i in batch) == list(range(len(ds)))
    assert [i for batch in loaded for i in batch] != list(range(len(ds)))


def test_the_order_is_given_once(lmdb_path):
    ds = fastdata.open_dataset(lmdb_path, order=Order(batch_size=4))
    with pytest.raises(ValueError, match=r"opened with its order: give order= where it is "
                                         r"opened"):
        fastdata.loader(ds, order=Order(batch_size=8))
    # A torch Dataset fastdata did not open takes its order from loader().
    plain = torch.utils.data.TensorDataset(torch.arange(10))
    batches = fastdata.loader(plain, order=Order(batch_size=4), num_workers=0, device="cpu")
    assert [len(b[0]) for b in batches] == [4, 4, 2]


def test_one_spelling_of_run_ahead(lmdb_path):
    ds = fastdata.open_dataset(lmdb_path)
    made = fastdata.loader(ds, num_workers=0, run_ahead=3, device="cpu")
    assert made.run_ahead == 3 and made.choice.run_ahead == 3
    assert "run_ahead" in inspect.signature(fastdata.CUDAPrefetcher).parameters
    assert "run_ahead" in inspect.signature(fastdata.dali.build_pipeline).parameters
    assert "run_ahead" in inspect.signature(fastdata.dali.DALILoader).parameters


def test_dali_options_read_decode_and_order_directly():
    from fastdata.dali.options import DALIOptions

    options = DALIOptions(decode=Decode(size=(8, 6)), order=Order(batch_size=5, window=7))
    assert options.batch_size == 5 and options.reader_window == 7 and options.size_hw == (8, 6)
    assert DALIOptions().reader_window == 1024 and DALIOptions().batch_size == 64
    with pytest.raises(ValueError, match=r"Decode\(output='numpy'\) is for the torch"):
        DALIOptions(decode=Decode(output="numpy"))
    with pytest.raises(TypeError, match="order must be a fastdata.Order"):
        DALIOptions(order={"batch_size": 4})

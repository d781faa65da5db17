"""``fastdata.DatasetRef``: a dataset's path, version, verify, allow_outside and
reader settings as one value, taken by every entry point (open_dataset, the
Dataset classes, streams, mix per source, DALI, open_reader, verify); the old
keywords point to it; a mixture's resume state records each source's
version and refuses another.

Every image is generated at test time; what a version holds is the count
and keys of the sources appended to it.
"""

from __future__ import annotations

import json

import optional
import pytest
from conftest import build_tree, uniform_spec

import fastdata
from fastdata import DatasetRef, Decode, Order

BYTES = Decode(output="bytes")


@pytest.fixture(scope="module")
def changed(tmp_path_factory):
    """An LMDB and a tar dataset of 8 images each, then 4 more appended:
    version 1 holds 8 records, version 2 holds 12."""
    root = tmp_path_factory.mktemp("ref")
    first = build_tree(root / "first", uniform_spec(("cat", "dog"), 4), size=(12, 12))
    more = build_tree(root / "more", tuple(f"{c}/more{i}.png" for c in ("cat", "eel")
                                           for i in range(2)), size=(12, 12))
    out = {}
    for fmt, name, shard in (("lmdb", "d.lmdb", None), ("tar", "d-%06d.tar", 3)):
        options = fastdata.PackOptions(workers=1, shard_size=shard)
        path = fastdata.pack(first.root, root / fmt / name, options=options,
                             progress=False).output
        fastdata.append(more.root, path, options=options, progress=False)
        out[fmt] = path
    return out


def test_every_entry_point_reads_the_version_a_ref_names(changed):
    lmdb, tar = changed["lmdb"], changed["tar"]
    v1, v2 = DatasetRef(lmdb, version=1), DatasetRef(tar, version=1)
    assert len(fastdata.open_dataset(lmdb)) == 12
    assert len(fastdata.open_dataset(v1)) == 8
    assert len(fastdata.LMDBDataset(v1)) == 8
    assert len(fastdata.PackedDataset(v1)) == 8
    assert len(fastdata.TarDataset(v2)) == 8
    assert len(list(fastdata.open_dataset(v2, streaming=True, decode=BYTES))) == 8
    assert len(list(fastdata.ShardedIterableDataset(v2, decode=BYTES))) == 8
    with fastdata.open_reader(v1) as reader:
        assert len(reader) == 8 and reader.version == 1
    with fastdata.open_reader(tar) as reader:
        assert len(reader) == 12 and reader.version == 2
    mixed = fastdata.mix({"a": {"path": v1, "weight": 1},
                          "b": {"path": tar, "version": 1, "weight": 1}},
                         samples_per_epoch=16, decode=BYTES)
    assert [len(ds) for ds in mixed.sources.values()] == [8, 8]
    from fastdata.ops.verify import verify_dataset

    assert verify_dataset(v2, progress=False).count == 8


def test_a_ref_carries_verify_and_reader_settings(changed):
    quiet = DatasetRef(changed["lmdb"], verify=False, reader_settings={"readahead": True})
    ds = fastdata.open_dataset(quiet)
    assert ds.reader.verify is False
    assert all(part.readahead for part in ds.reader.parts)
    with pytest.raises(TypeError, match="no setting 'chunk_size'"):
        fastdata.open_dataset(DatasetRef(changed["lmdb"], reader_settings={"chunk_size": 1}))


@pytest.mark.parametrize("keyword, value", [("version", 1), ("verify", False),
                                            ("allow_outside", True),
                                            ("reader_settings", {"readahead": True})])
def test_the_old_keywords_say_where_they_went(changed, keyword, value):
    for opening in (fastdata.open_dataset, fastdata.LMDBDataset):
        with pytest.raises(TypeError, match=rf"pass path=fastdata\.DatasetRef\(path, "
                                            rf"{keyword}=\.\.\.\) instead"):
            opening(changed["lmdb"], **{keyword: value})


def test_a_ref_is_checked_when_made():
    with pytest.raises(TypeError, match="version"):
        DatasetRef("d.lmdb", version=0)
    with pytest.raises(TypeError, match="version"):
        DatasetRef("d.lmdb", version=True)
    with pytest.raises(TypeError, match="True or False"):
        DatasetRef("d.lmdb", verify="no")
    with pytest.raises(TypeError, match="mapping"):
        DatasetRef("d.lmdb", reader_settings=["readahead"])
    with pytest.raises(ValueError, match="given twice"):
        fastdata.open_reader(DatasetRef("d.lmdb", version=2), version=3)
    assert DatasetRef.of(DatasetRef("d.lmdb", version=2), version=2).version == 2


def test_a_mixtures_state_records_each_sources_version(changed, tmp_path):
    order = Order(shuffle=True, seed=5, batch_size=4)

    def mixed(version=None):
        tar = {"path": changed["tar"], "weight": 1}
        if version is not None:
            tar["version"] = version
        return fastdata.mix({"pets": {"path": changed["lmdb"], "weight": 1}, "zoo": tar},
                            samples_per_epoch=16, decode=BYTES, order=order)

    ds = mixed()
    batches = fastdata.EpochBatches(ds)
    full = [list(b) for b in batches]
    taken = fastdata.EpochBatches(mixed())
    it = iter(taken)
    next(it)
    state = json.loads(json.dumps(taken.state_dict()))
    recorded = json.dumps(state)
    assert '"zoo": {"version": 2, "sha256": "' in recorded  # each source's version
    assert '"pets": {"version": 2, "sha256": "' in recorded

    with pytest.raises(ValueError, match="mixture source 'zoo'.*version 2 of it; this "
                                         "reads version 1"):
        fastdata.EpochBatches(mixed(version=1)).load_state_dict(state)
    again = fastdata.EpochBatches(mixed(version=2))
    again.load_state_dict(state)
    assert [list(b) for b in again] == full[1:]  # the rest of the epoch, exactly


@optional.skip_unless("dali")
def test_dali_reads_the_version_a_ref_names(changed):
    from fastdata.dali import DALILoader

    loader = DALILoader(DatasetRef(changed["tar"], version=1), device="cpu",
                        decode=Decode(size=(12, 12)), order=Order(batch_size=4),
                        reader="external")
    labels = [int(y) for _, ys in loader for y in ys.reshape(-1)]
    assert len(labels) == 8
    current = DALILoader(changed["tar"], device="cpu", decode=Decode(size=(12, 12)),
                         order=Order(batch_size=4), reader="external")
    assert sum(int(ys.numel()) for _, ys in current) == 12

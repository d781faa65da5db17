"""DALI pipelines over datasets at URLs (moto's S3 server on 127.0.0.1), CPU-only.

DALI's own readers (TFRecord, webdataset) read local files: a remote dataset's
shards (and TFRecord ``.idx`` files) are downloaded into the shared cache
first; the external source (LMDB, HDF5, ``reader="external"``) reads through
fastdata's readers, which open URLs themselves. Each pipeline over the URL must
give what the same pipeline gives over the local copy.
"""

from __future__ import annotations

import optional
import pytest
import torch

import fastdata
from fastdata import Decode, Order
from fastdata.errors import FastDataError

from test_dali import (BATCH, FORMATS, IMAGE_TOLERANCE, MEAN_TOLERANCE, N, SIZE, diff,
                       make_tree, nearest, needs_dali, one_epoch, pack, reference)

optional.require("obstore")
pytestmark = needs_dali

#: format -> the name a dataset is opened by, below its folder.
NAMES = {"lmdb": "ds_lmdb.lmdb", "hdf5": "ds_hdf5.h5",
         "tfrecord": "ds_tfrecord.tfrecord.fastdata.json", "tar": "ds_tar.tar.fastdata.json"}
NATIVE = {"tfrecord": "tfrecord", "tar": "webdataset", "lmdb": "external"}


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    """Every format packed into one local folder and uploaded below ``s3://dali/d``:
    format -> (local path, URL)."""
    tree = make_tree(tmp_path_factory.mktemp("dali-remote") / "src")
    out = tmp_path_factory.mktemp("dali-remote-packed")
    for name, (ext, opts) in FORMATS.items():
        pack(tree, out / f"ds_{name}{ext}", **opts)
    s3_server.upload_dir(out, "s3://dali/d")
    return {fmt: (str(out / name), f"s3://dali/d/{name}") for fmt, name in NAMES.items()}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Downloads and generated DALI indexes go here, never into the user's cache."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(folder))
    monkeypatch.delenv("FASTDATA_CACHE_LIMIT", raising=False)
    return folder


def _loader(path, **options):
    from fastdata.dali import DALILoader

    return DALILoader(path, decode=Decode(size=SIZE), order=Order(batch_size=BATCH),
                      device="cpu", **options)


def _cached(cache, suffix: str) -> list[str]:
    return sorted(p.name for p in (cache / "objects").glob(f"*{suffix}"))


@pytest.mark.parametrize("fmt", list(NATIVE))
def test_url_gives_the_local_pipeline(fmt, packed, s3_env, cache):
    local, url = packed[fmt]
    remote = _loader(url)
    assert remote.plan.reader == NATIVE[fmt] and remote.plan.path == url
    ref, targets = reference(local)
    images, labels, sizes = one_epoch(remote)
    assert sizes == [5, 5, 5, 5, 4] and labels.tolist() == targets
    if fmt == "tfrecord":  # every shard and its tfrecord2idx file, downloaded
        assert len(_cached(cache, ".tfrecord")) == len(_cached(cache, ".tfrecord.idx")) == 3
        assert not (cache / "dali-index").exists()  # no index generated
    elif fmt == "tar":  # every shard downloaded, its DALI index generated from the copy
        assert len(_cached(cache, ".tar")) == 3
        assert len(list((cache / "dali-index").glob("*.wds.idx"))) == 3
    per_image = diff(images, ref)
    assert float(per_image.mean()) <= MEAN_TOLERANCE, per_image
    assert float(per_image.max()) <= IMAGE_TOLERANCE, per_image
    # The same bytes through the same reader and decoder: the local pipeline's pixels.
    same, same_labels, _ = one_epoch(_loader(local))
    assert same_labels.tolist() == targets and torch.equal(images, same)
    assert remote.classes == ["class_00", "class_01", "class_02"]


def test_tar_index_of_cached_shards_is_reused(packed, s3_env, cache):
    _, url = packed["tar"]
    first = one_epoch(_loader(url))[1].tolist()
    written = sorted((cache / "dali-index").glob("*.wds.idx"))
    stamps = [p.stat().st_mtime_ns for p in written]
    assert one_epoch(_loader(url))[1].tolist() == first
    # Using a cached copy touches it; its DALI index is still the same one.
    assert sorted((cache / "dali-index").glob("*.wds.idx")) == written
    assert [p.stat().st_mtime_ns for p in written] == stamps


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_parallel_external_source_over_a_url(fmt, packed, s3_env, cache):
    local, url = packed[fmt]
    images, labels, sizes = one_epoch(_loader(url, py_workers=2))
    plain, plain_labels, _ = one_epoch(_loader(local))
    assert sizes == [5, 5, 5, 5, 4]
    assert labels.tolist() == plain_labels.tolist() and torch.equal(images, plain)


def test_external_source_reads_remote_shards_by_range(packed, s3_env, cache):
    local, url = packed["tfrecord"]
    remote = _loader(url, reader="external", py_workers=2)
    assert remote.plan.reader == "external"
    images, labels, _ = one_epoch(remote)
    plain, plain_labels, _ = one_epoch(_loader(local))
    assert labels.tolist() == plain_labels.tolist() and torch.equal(images, plain)
    assert not _cached(cache, ".tfrecord")  # nothing downloaded whole


def test_tar_shards_of_another_tool_at_urls(packed, s3_env, cache):
    """Shard URLs without a manifest: scanned (so downloaded) on open, then read by DALI."""
    local, _ = packed["tar"]
    urls = [f"s3://dali/d/ds_tar-{i:06d}.tar" for i in range(3)]
    remote = _loader(urls)
    assert remote.plan.reader == "webdataset"
    images, labels, _ = one_epoch(remote)
    ref, targets = reference(local)
    assert nearest(images, ref) == list(range(N))  # every record, in the stored order
    assert labels.tolist() == targets


@pytest.mark.parametrize("fmt", ["tfrecord", "tar"])
def test_cache_smaller_than_the_dataset(fmt, packed, s3_env, cache, monkeypatch):
    local, url = packed[fmt]
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", "1000")
    with pytest.raises(FastDataError, match="FASTDATA_CACHE_LIMIT"):
        _loader(url, reader="dali")
    with pytest.warns(UserWarning, match="FASTDATA_CACHE_LIMIT"):
        remote = _loader(url)
    assert remote.plan.reader == "external"
    images, labels, _ = one_epoch(remote)
    ref, targets = reference(local)
    assert nearest(images, ref) == list(range(N))  # every record, in the stored order
    assert labels.tolist() == targets
    assert not _cached(cache, fmt)


def test_build_pipeline_over_a_url(packed, s3_env, cache):
    from fastdata.dali import build_pipeline

    local, url = packed["tar"]
    pipe = build_pipeline(url, decode=Decode(size=SIZE), order=Order(batch_size=N),
                          device="cpu", reader="dali")
    images, labels = pipe.run()
    assert images.as_array().shape == (N, 3, *SIZE)
    assert labels.as_array().tolist() == fastdata.open_dataset(local).targets

"""gs:// and az:// against their emulators on 127.0.0.1 (emulators.py): Azurite
for Azure Blob, gcp-storage-emulator for Google Cloud Storage, each started by
the tests and skipped when not installed.

Azure is tested end to end: datasets packed straight to az:// read back record
for record like a local pack, map-style and streamed, set up by account, key
and endpoint or by the emulator switch. gcp-storage-emulator does not serve
the XML API that obstore's GCS client speaks (see emulators.py), so for gs://
only what it can answer is tested here: that the endpoint settings send the
requests to it and that a missing object is one clear line.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import optional
import pytest
from conftest import build_tree, no_hang, uniform_spec
from torch.utils.data import DataLoader

import fastdata
from fastdata import Decode, Order, storage
from fastdata.errors import FastDataError, StorageError

optional.require("obstore")

#: (format, output name as packed, name to open it by)
FORMATS = [("tar", "d-%06d.tar", "d.tar.fastdata.json"), ("lmdb", "d.lmdb", "d.lmdb")]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_tree(tmp_path_factory.mktemp("cloud") / "src",
                      uniform_spec(("cat", "dog", "eel"), 4), size=(8, 8))


@pytest.fixture(scope="module")
def local_records(tree, tmp_path_factory):
    """Each format's records as packed to the local disk, for comparison."""
    folder = tmp_path_factory.mktemp("local")
    records = {}
    for fmt, out, name in FORMATS:
        _pack(tree.root, folder / out)
        records[fmt] = _records(folder / name)
    return records


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))


def _pack(src, out):
    options = {"workers": 1, "shard_size": 4} if "%" in os.fspath(out) else {"workers": 1}
    return fastdata.pack(src, out, options=fastdata.PackOptions(**options), progress=False)


def _records(path) -> list[tuple[str, bytes, int]]:
    with fastdata.open_dataset(path, decode=Decode(output="bytes")) as ds:
        return [(ds.keys[i], *ds[i]) for i in range(len(ds))]


# -- Azure Blob (Azurite) -----------------------------------------------------------------

@pytest.mark.parametrize("fmt,out,name", FORMATS, ids=[f[0] for f in FORMATS])
def test_pack_straight_to_azure_gives_the_local_records(tree, local_records, azure_env,
                                                        fmt, out, name):
    container = azure_env.make_container(f"pack-{fmt}")
    summary = _pack(tree.root, f"{container}/x/{out}")
    assert all(f.startswith(f"{container}/x/") for f in summary.files)
    assert _records(f"{container}/x/{name}") == local_records[fmt]


def test_streaming_from_azure_with_two_workers_sees_every_sample_once(tree, azure_env):
    container = azure_env.make_container("stream")
    _pack(tree.root, f"{container}/d-%06d.tar")
    ds = fastdata.ShardedIterableDataset(f"{container}/d.tar.fastdata.json",
                                         decode=Decode(output="bytes"),
                                         order=Order(shuffle=True, batch_size=4))
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                        collate_fn=lambda b: [bytes(x) for x, _ in b])
    with no_hang(60):
        seen = [x for batch in loader for x in batch]
    assert Counter(seen) == Counter(tree.payloads)


def test_missing_azure_object_is_one_line_naming_the_url(azure_env):
    container = azure_env.make_container("missing")
    url = f"{container}/nope/d.tar.fastdata.json"
    with pytest.raises(FastDataError) as err:
        fastdata.open_dataset(url)
    assert str(err.value) == f"{url}: no such object"


def test_azure_emulator_switch_finds_azurite_on_its_port(tree, local_records, azure_env,
                                                          monkeypatch):
    container = azure_env.make_container("switch")
    _pack(tree.root, f"{container}/d.lmdb")
    for name in azure_env.env:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", azure_env.endpoint)
    assert _records(f"{container}/d.lmdb") == local_records["lmdb"]


def test_azure_endpoint_by_any_of_its_names_allows_http(azure_env, monkeypatch):
    container = azure_env.make_container("names")
    storage.upload_bytes(b"abc", f"{container}/x")
    monkeypatch.delenv("AZURE_STORAGE_ENDPOINT")
    monkeypatch.setenv("AZURE_ENDPOINT", azure_env.account_url)
    assert storage.open_remote(f"{container}/x").read() == b"abc"
    monkeypatch.delenv("AZURE_ENDPOINT")
    options = {"azure_storage_endpoint": azure_env.account_url}
    assert storage.open_remote(f"{container}/x", options).read() == b"abc"


# -- Google Cloud Storage (gcp-storage-emulator) ------------------------------------------

def test_missing_gcs_object_is_one_line_naming_the_url(gcs_env):
    bucket = gcs_env.make_bucket("missing")
    url = f"{bucket}/nope/d.tar.fastdata.json"
    with pytest.raises(FastDataError) as err:
        fastdata.open_dataset(url)
    assert str(err.value) == f"{url}: no such object"


def test_gcs_base_url_by_option_or_environment_reaches_the_emulator(gcs_env, monkeypatch):
    bucket = gcs_env.make_bucket("option")
    monkeypatch.delenv("GOOGLE_SERVICE_ACCOUNT_KEY")
    for name in ("endpoint", "base_url"):
        options = {name: gcs_env.endpoint, "bearer_token": "unused-by-the-emulator"}
        with pytest.raises(StorageError) as err:
            storage.open_remote(f"{bucket}/nope", options).read()
        assert str(err.value) == f"{bucket}/nope: no such object"
    monkeypatch.setenv("GOOGLE_BASE_URL", gcs_env.endpoint)
    monkeypatch.setenv("GOOGLE_BEARER_TOKEN", "unused-by-the-emulator")
    with pytest.raises(StorageError) as err:
        storage.open_remote(f"{bucket}/nope").read()
    assert str(err.value) == f"{bucket}/nope: no such object"


@pytest.mark.parametrize("given_as", ["key", "file"])
def test_gcs_endpoint_of_the_service_account_key_is_named_in_errors(gcs_env, monkeypatch,
                                                                     tmp_path, given_as,
                                                                     refused_port):
    endpoint = f"http://127.0.0.1:{refused_port}"
    key = json.dumps({**gcs_env.service_account_key(), "gcs_base_url": endpoint})
    monkeypatch.delenv("GOOGLE_SERVICE_ACCOUNT_KEY")
    if given_as == "key":
        monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT_KEY", key)
    else:
        (tmp_path / "key.json").write_text(key)
        monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(tmp_path / "key.json"))
    with pytest.raises(StorageError) as err:
        storage.open_remote("gs://bkt/x.tar", {"max_retries": 0}).read()
    assert str(err.value) == (f"gs://bkt/x.tar: cannot reach the endpoint {endpoint} "
                              "(connection refused, after retries)")

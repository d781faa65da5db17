"""Datasets at URLs: opened, streamed, verified and packed over real servers on
127.0.0.1 (moto's S3 server in its own process, an HTTP server honouring
Range), compared record for record with the same dataset on local disk."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import optional
import pytest
from click.testing import CliRunner
from torch.utils.data import DataLoader

import fastdata
from fastdata.cli import main
from fastdata.errors import FastDataError

from conftest import build_tree, no_hang, uniform_spec

optional.require("obstore")

#: (format, output name as packed, name to open it by)
FORMATS = [
    ("lmdb", "d.lmdb", "d.lmdb"),
    ("hdf5", "d.h5", "d.h5"),
    ("tfrecord", "d-%05d.tfrecord", "d.tfrecord.fastdata.json"),
    ("tar", "d-%06d.tar", "d.tar.fastdata.json"),
]
IDS = [f[0] for f in FORMATS]
BYTES = fastdata.Decode(output="bytes")  # the stored payloads


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_tree(tmp_path_factory.mktemp("remote") / "src",
                      uniform_spec(("cat", "dog", "eel"), 5), size=(8, 8))


def _pack(src, out, **options):
    options = {"workers": 1, **options}
    if "%" in os.fspath(out):
        options.setdefault("shard_size", 4)
    return fastdata.pack(src, out, options=fastdata.PackOptions(**options), progress=False)


def _records(path) -> list[tuple[str, bytes, int]]:
    with fastdata.open_dataset(path, decode=BYTES) as ds:
        return [(ds.keys[i], *ds[i]) for i in range(len(ds))]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(folder))
    return folder


@pytest.mark.parametrize("fmt,out,name", FORMATS, ids=IDS)
def test_uploaded_with_plain_s3_tools_opens_by_url(tree, tmp_path, s3_server, s3_env, cache,
                                                  fmt, out, name):
    local = tmp_path / "local"
    _pack(tree.root, local / out)
    bucket = f"up-{fmt}"
    s3_server.make_bucket(bucket)
    s3_server.upload_dir(local, f"s3://{bucket}/data")
    url = f"s3://{bucket}/data/{name}"
    assert _records(url) == _records(local / name)
    assert fastdata.formats.read_manifest(url).count == len(tree.samples)


@pytest.mark.parametrize("fmt,out,name", FORMATS, ids=IDS)
def test_pack_straight_to_s3_gives_the_local_records(tree, tmp_path, s3_server, s3_env, cache,
                                                    fmt, out, name):
    bucket = f"pack-{fmt}"
    s3_server.make_bucket(bucket)
    summary = _pack(tree.root, f"s3://{bucket}/x/{out}")
    assert summary.output.startswith(f"s3://{bucket}/x/")
    assert all(f.startswith(f"s3://{bucket}/x/") for f in summary.files)
    assert summary.files[-1].endswith(".fastdata.json") or fmt in ("lmdb", "hdf5")
    _pack(tree.root, tmp_path / "local" / out)
    assert _records(f"s3://{bucket}/x/{name}") == _records(tmp_path / "local" / name)
    # A second pack to the same URL is refused unless it may overwrite.
    with pytest.raises(fastdata.OutputExistsError):
        _pack(tree.root, f"s3://{bucket}/x/{out}")
    _pack(tree.root, f"s3://{bucket}/x/{out}", overwrite=True)
    # Nothing is left in the staging folder.
    assert not [n for n in os.listdir(cache) if n.startswith(".fastdata-upload-")]


def test_streaming_from_s3_with_two_workers_sees_every_sample_once(tree, s3_server, s3_env,
                                                                   cache):
    s3_server.make_bucket("stream")
    _pack(tree.root, "s3://stream/d-%06d.tar")
    ds = fastdata.ShardedIterableDataset("s3://stream/d.tar.fastdata.json", decode=BYTES,
                                         order=fastdata.Order(shuffle=True, batch_size=4))
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                        collate_fn=lambda b: [bytes(x) for x, _ in b])
    with no_hang(120):
        seen = [x for batch in loader for x in batch]
    assert Counter(seen) == Counter(tree.payloads)


def test_map_style_dataloader_over_s3_shards(tree, s3_server, s3_env, cache):
    s3_server.make_bucket("mapstyle")
    _pack(tree.root, "s3://mapstyle/d-%05d.tfrecord")
    ds = fastdata.open_dataset("s3://mapstyle/d.tfrecord.fastdata.json", decode=BYTES)
    loader = DataLoader(ds, batch_size=5, num_workers=2, shuffle=True,
                        multiprocessing_context="fork",
                        collate_fn=lambda b: [(bytes(x), y) for x, y in b])
    with no_hang(120):
        got = [s for batch in loader for s in batch]
    assert Counter(got) == Counter(zip(tree.payloads, tree.labels))


def test_http_dataset_opens_and_streams(tree, tmp_path, http_server, cache):
    _pack(tree.root, http_server.root / "d-%06d.tar")
    url = f"{http_server.url}/d.tar.fastdata.json"
    assert _records(url) == _records(http_server.root / "d.tar.fastdata.json")
    stream = fastdata.ShardedIterableDataset(url, decode=BYTES)
    assert Counter(bytes(x) for x, _ in stream) == Counter(tree.payloads)


def test_info_and_verify_by_url(tree, s3_server, s3_env, cache):
    s3_server.make_bucket("cli")
    _pack(tree.root, "s3://cli/d-%06d.tar")
    runner = CliRunner()
    info = runner.invoke(main, ["info", "s3://cli/d.tar.fastdata.json"])
    assert info.exit_code == 0, info.output
    assert info.output.startswith("s3://cli/d.tar.fastdata.json\n")
    verify = runner.invoke(main, ["verify", "s3://cli/d.tar.fastdata.json"])
    assert verify.exit_code == 0, verify.output


def test_verify_of_tfrecords_at_a_url_checks_their_idx_files(tree, http_server, cache,
                                                              monkeypatch):
    from fastdata.ops.verify import verify_dataset

    _pack(tree.root, http_server.root / "d-%05d.tfrecord")
    url = f"{http_server.url}/d.tfrecord.fastdata.json"
    assert verify_dataset(url, progress=False).ok
    idx = sorted(http_server.root.glob("*.tfrecord.idx"))[1]
    idx.write_text("0 1\n")
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(cache / "fresh"))  # no copy of the old one
    problems = verify_dataset(url, progress=False).problems
    assert [p["path"] for p in problems] == [f"{http_server.url}/{idx.name}"]


def test_opening_a_dataset_at_a_url_asks_for_each_file_once(tree, tmp_path, cache):
    """The manifest is fetched once for the format's detection and the reader,
    a shard's size is the manifest's (no HEAD request), and the version
    pointer is asked for once (a dataset never changed has none)."""
    import functools
    import http.server
    import threading

    from servers import RangeHandler

    asked = Counter()

    class Counting(RangeHandler):
        def _send(self, body: bool) -> None:
            asked[(self.command, self.path)] += 1
            super()._send(body)

    _pack(tree.root, tmp_path / "www" / "d-%06d.tar")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Counting, directory=str(tmp_path / "www")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/d.tar.fastdata.json"
        with fastdata.open_dataset(url, decode=BYTES) as ds:
            assert ds[0] == _records(tmp_path / "www" / "d.tar.fastdata.json")[0][1:]
    finally:
        server.shutdown()
        server.server_close()
    assert asked == Counter({("GET", "/d.tar.fastdata.json"): 1,
                             ("GET", "/d.tar.fastdata.index.npy"): 1,
                             ("GET", "/d.tar.fastdata.index-crc.npy"): 1,
                             ("GET", "/d-000000.tar"): 1,
                             ("GET", "/d.tar.versions/HEAD"): 1})


def test_missing_object_is_one_clear_line(s3_server, s3_env, cache):
    s3_server.make_bucket("empty")
    result = CliRunner().invoke(main, ["info", "s3://empty/nothing.tar.fastdata.json"])
    assert result.exit_code == 1
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "s3://empty/nothing.tar.fastdata.json" in lines[0]
    with pytest.raises(FastDataError):
        fastdata.open_dataset("s3://empty/x.lmdb")


def test_no_secrets_in_errors(s3_server, s3_env, cache, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-VALUE-xyz")
    code = ("import fastdata\n"
            "try:\n    fastdata.open_dataset('s3://no-such-bucket-xyz/d.tar.fastdata.json')\n"
            "except fastdata.FastDataError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert "s3cr3t" not in out.stdout + out.stderr
    assert "no-such-bucket-xyz" in out.stdout


def test_server_stopped_mid_epoch_is_a_clear_error_not_a_hang(tree, s3_server_fresh, cache,
                                                             monkeypatch):
    for name, value in s3_server_fresh.env.items():
        monkeypatch.setenv(name, value)
    s3_server_fresh.make_bucket("stops")
    _pack(tree.root, "s3://stops/d-%06d.tar")
    ds = fastdata.ShardedIterableDataset("s3://stops/d.tar.fastdata.json", decode=BYTES,
                                         read_ahead=0)
    ds.reader.read(0)  # open while the server is up
    s3_server_fresh.stop()
    with no_hang(90), pytest.raises(fastdata.StorageError) as info:
        list(ds)
    assert "cannot reach the endpoint" in str(info.value) and "s3://stops/" in str(info.value)


def test_streaming_whole_shards_through_the_cache(tree, s3_server, s3_env, cache):
    s3_server.make_bucket("wholeshards")
    _pack(tree.root, "s3://wholeshards/d-%06d.tar")
    ds = fastdata.ShardedIterableDataset("s3://wholeshards/d.tar.fastdata.json",
                                         decode=BYTES,
                                         order=fastdata.Order(shuffle=True, batch_size=4),
                                         remote_read="shards")
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                        collate_fn=lambda b: [bytes(x) for x, _ in b])
    with no_hang(120):
        seen = [x for batch in loader for x in batch]
    assert Counter(seen) == Counter(tree.payloads)
    # Each copy is dropped after its last use (tests/test_read_ahead.py counts
    # the downloads themselves at an HTTP server's request log).
    assert [n for n in os.listdir(cache / "objects") if n.endswith(".tar")] == []
    assert all(s3_server.requests("GET", url) >= 1 for url in ds.reader.shard_paths)
    with pytest.raises(ValueError, match="remote_read"):
        fastdata.ShardedIterableDataset("s3://wholeshards/d.tar.fastdata.json",
                                        remote_read="all")


def test_bench_measures_a_url_next_to_the_local_copy(tree, tmp_path, s3_server, s3_env, cache):
    s3_server.make_bucket("benchrows")
    summary = _pack(tree.root, "s3://benchrows/d-%06d.tar")
    assert summary.seconds > 0 and summary.output == "s3://benchrows/d.tar.fastdata.json"
    local = _pack(tree.root, tmp_path / "local" / "d-%06d.tar").output
    result = CliRunner().invoke(main, ["bench", summary.output, local, "--workers", "0",
                                       "--epochs", "1", "--size", "8", "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    rows = [ln.split()[:3] for ln in result.output.splitlines() if ln.startswith("tar ")]
    assert ["tar", "s3:d.tar", "0"] in rows and ["tar", "d.tar", "0"] in rows


class _SlowSource:
    """A Source that hands out its entries slowly, so a pack lasts a while."""

    def __init__(self, root, delay: float) -> None:
        self.inner = fastdata.ImageFolderSource(root)
        self.classes = self.inner.classes
        self.delay = delay
        self.yielded = 0
        self.passes = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        import time

        # The first pass is the pack's plan (a scan); the images are read on
        # the second, slowly, as from a slow disk.
        self.passes += 1
        for entry in self.inner:
            if self.passes > 1:
                time.sleep(self.delay)
                self.yielded += 1
            yield entry

    def describe(self):
        return self.inner.describe()

    def warnings(self):
        return self.inner.warnings()


def test_shards_are_uploaded_while_the_pack_goes_on(tree, s3_server, s3_env, cache):
    import threading
    import time

    from fastdata.storage import exists

    s3_server.make_bucket("early")
    source = _SlowSource(tree.root, 0.15)
    thread = threading.Thread(target=lambda: _pack(source, "s3://early/d-%06d.tar",
                                                   shard_size=3))
    thread.start()
    seen_after = None  # entries the source had handed out when shard 0 was there
    while thread.is_alive() and seen_after is None:
        if exists("s3://early/d-000000.tar"):
            seen_after = source.yielded
        time.sleep(0.05)
    thread.join()
    assert seen_after is not None and seen_after < len(source), \
        "the first shard was uploaded only after the whole source was read"
    assert _records("s3://early/d.tar.fastdata.json") == _records_of_tree(tree)


def _records_of_tree(tree) -> list[tuple[str, bytes, int]]:
    return [(s.key, s.data, s.label) for s in tree.samples]


@pytest.mark.parametrize("fmt,out,name", [FORMATS[2], FORMATS[3]], ids=["tfrecord", "tar"])
def test_overwrite_at_a_url_leaves_only_the_new_dataset(tree, tmp_path, s3_server, s3_env,
                                                       cache, fmt, out, name):
    from fastdata.storage import list_names

    bucket = f"over-{fmt}"
    s3_server.make_bucket(bucket)
    _pack(tree.root, f"s3://{bucket}/x/{out}", shard_size=3)       # 5 shards
    summary = _pack(tree.root, f"s3://{bucket}/x/{out}", shard_size=8, overwrite=True)
    left = list_names(f"s3://{bucket}/x")
    assert sorted(left) == sorted(f.rsplit("/", 1)[-1] for f in summary.files)
    _pack(tree.root, tmp_path / "local" / out, shard_size=8)
    assert _records(f"s3://{bucket}/x/{name}") == _records(tmp_path / "local" / name)


def test_overwrite_at_a_url_deletes_only_its_own_objects(tree, s3_server, s3_env, cache):
    """An old manifest at the URL that names other objects (another prefix
    through '..', a name not of this output's naming) gets none of them deleted."""
    import json

    bucket = "over-hostile"
    s3_server.make_bucket(bucket)
    _pack(tree.root, f"s3://{bucket}/x/d-%06d.tar", shard_size=8)
    s3_server.put(f"s3://{bucket}/keep/precious.tar", b"mine")
    s3_server.put(f"s3://{bucket}/x/precious.tar", b"mine too")
    manifest_url = f"s3://{bucket}/x/d.tar.fastdata.json"
    manifest = json.loads(s3_server.get(manifest_url))
    manifest["shards"][0]["path"] = "../keep/precious.tar"
    manifest["shards"][1]["path"] = "precious.tar"
    manifest["extra"]["keys"] = "../keep/precious.tar"
    s3_server.put(manifest_url, json.dumps(manifest).encode())
    _pack(tree.root, f"s3://{bucket}/x/d-%06d.tar", shard_size=8, overwrite=True)
    assert s3_server.get(f"s3://{bucket}/keep/precious.tar") == b"mine"
    assert s3_server.get(f"s3://{bucket}/x/precious.tar") == b"mine too"
    assert _records(manifest_url) == _records_of_tree(tree)


def test_reopening_a_remote_dataset_does_not_leak_descriptors(tree, s3_server, s3_env, cache):
    s3_server.make_bucket("fds")
    _pack(tree.root, "s3://fds/d.lmdb")
    fastdata.open_dataset("s3://fds/d.lmdb").close()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        with fastdata.open_dataset("s3://fds/d.lmdb") as ds:
            ds[0]
    assert len(os.listdir("/proc/self/fd")) - before < 5

"""fastdata.storage against real servers: moto's S3 server and a Range-honouring
HTTP server, both across a socket (see servers.py), and the local disk."""

from __future__ import annotations

import os
import time

import optional
import pytest
from conftest import no_hang

from fastdata import storage
from fastdata.errors import FastDataError, StorageError

optional.require("obstore")

PAYLOAD = bytes(range(256)) * 4000          # ~1 MB, every offset distinguishable


@pytest.fixture
def s3_object(s3_env):
    """An object of PAYLOAD bytes on the session moto server."""
    s3_env.make_bucket("bkt")
    url = "s3://bkt/data/obj.bin"
    s3_env.put(url, PAYLOAD)
    return url


# -- URLs and paths -------------------------------------------------------------------

def test_urls_and_local_paths(tmp_path):
    assert storage.is_url("s3://b/x") and storage.is_url("https://h/x") and storage.is_url("gs://b")
    assert storage.is_url("az://c/x") and storage.is_url("abfs://c@acct.dfs.core.windows.net/x")
    assert not storage.is_url("/data/x.tar") and not storage.is_url("file:///data/x.tar")
    assert storage.local_path("file:///data/x.tar") == "/data/x.tar"
    assert storage.local_path("rel/x.tar") == "rel/x.tar"
    assert storage.local_path("s3://b/x") is None
    assert storage.join("s3://b/dir", "x.tar") == "s3://b/dir/x.tar"
    assert storage.join("s3://b", "x.tar") == "s3://b/x.tar"
    assert storage.dirname("s3://b/dir/x.tar") == "s3://b/dir"
    assert storage.basename("https://h:8/dir/x.tar") == "x.tar"
    assert storage.join(str(tmp_path), "x") == os.path.join(str(tmp_path), "x")


def test_local_paths_and_file_urls_read_like_objects(tmp_path):
    path = tmp_path / "obj.bin"
    path.write_bytes(PAYLOAD)
    for url in (str(path), f"file://{path}"):
        obj = storage.open_remote(url)
        assert obj.size() == len(PAYLOAD) and obj.read() == PAYLOAD
        assert obj.read_ranges([(5, 3), (1000, 10)]) == [PAYLOAD[5:8], PAYLOAD[1000:1010]]
        assert storage.exists(url) and storage.list_names(str(tmp_path)) == ["obj.bin"]
    with pytest.raises(StorageError, match="no such file"):
        storage.open_remote(str(tmp_path / "missing")).read()


# -- S3 -------------------------------------------------------------------------------

def test_s3_reads(s3_object, tmp_path):
    obj = storage.open_remote(s3_object)
    assert obj.size() == len(PAYLOAD)
    assert obj.read() == PAYLOAD
    assert obj.read_range(1000, 40) == PAYLOAD[1000:1040]
    ranges = [(i * 4001, 4000) for i in range(100)] + [(len(PAYLOAD) - 7, 7)]
    assert obj.read_ranges(ranges) == [PAYLOAD[s:s + n] for s, n in ranges]
    obj.download(str(tmp_path / "copy.bin"))
    assert (tmp_path / "copy.bin").read_bytes() == PAYLOAD
    assert os.listdir(tmp_path) == ["copy.bin"]          # no partial left behind


def test_s3_write_list_delete(s3_env, tmp_path):
    s3_env.make_bucket("writes")
    storage.upload_bytes(b"hello", "s3://writes/shards/a-000000.tar")
    assert s3_env.get("s3://writes/shards/a-000000.tar") == b"hello"
    big = os.urandom(12 << 20)                # > 5 MB chunks: a multipart upload
    (tmp_path / "big.bin").write_bytes(big)
    storage.upload_file(str(tmp_path / "big.bin"), "s3://writes/shards/a-000001.tar")
    assert s3_env.get("s3://writes/shards/a-000001.tar") == big
    assert s3_env.requests("POST", "s3://writes/shards/a-000001.tar") >= 2  # create + complete
    storage.upload_bytes(b"x", "s3://writes/shards/sub/deeper.tar")
    assert storage.list_names("s3://writes/shards") == ["a-000000.tar", "a-000001.tar"]
    assert storage.list_names("s3://writes/shards/") == ["a-000000.tar", "a-000001.tar"]
    assert storage.exists("s3://writes/shards/a-000000.tar")
    storage.delete("s3://writes/shards/a-000000.tar")
    assert not storage.exists("s3://writes/shards/a-000000.tar")


def test_storage_options_override_the_environment(s3_server, monkeypatch):
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    s3_server.make_bucket("opts")
    s3_server.put("s3://opts/x", b"abc")
    options = {"endpoint": s3_server.endpoint, "access_key_id": "testing",
               "secret_access_key": "testing", "region": "us-east-1"}
    assert storage.open_remote("s3://opts/x", options).read() == b"abc"


# -- error lines ----------------------------------------------------------------------

def test_missing_object_and_bucket(s3_object):
    with pytest.raises(StorageError) as err:
        storage.open_remote("s3://bkt/data/nope.tar").read()
    assert str(err.value) == "s3://bkt/data/nope.tar: no such object"
    with pytest.raises(StorageError, match="no such bucket 'nobucket'"):
        storage.open_remote("s3://nobucket/x.tar").read()
    assert not storage.exists("s3://bkt/data/nope.tar")


def test_wrong_endpoint_fails_fast_with_one_line(s3_env, monkeypatch, refused_port):
    endpoint = f"http://127.0.0.1:{refused_port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    with no_hang(60), pytest.raises(StorageError) as err:
        storage.open_remote("s3://bkt/x.tar").read()
    assert str(err.value) == (f"s3://bkt/x.tar: cannot reach the endpoint {endpoint} "
                              "(connection refused, after retries)")


def test_denied_credentials(s3_server_auth, monkeypatch):
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    for name, value in {**s3_server_auth.env, "AWS_SECRET_ACCESS_KEY": secret}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StorageError) as err:
        storage.open_remote("s3://bkt/x.tar").read()
    assert str(err.value) == ("s3://bkt/x.tar: access denied "
                              "(check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE)")
    with pytest.raises(StorageError) as err:
        storage.upload_bytes(b"x", "s3://bkt/y.tar", {"secret_access_key": secret + "2"})
    assert "access denied" in str(err.value) and secret not in str(err.value)


def test_secrets_never_appear_in_error_text(s3_env, monkeypatch, refused_port):
    secret = "topsecret-value-123456"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    options = {"endpoint": f"http://127.0.0.1:{refused_port}", "secret_access_key": secret,
               "session_token": "tok-abcdef-987", "max_retries": 0}
    with pytest.raises(StorageError) as err:
        storage.open_remote("s3://bkt/x.tar?X-Amz-Signature=deadbeef", options).read()
    text = repr(err.value) + str(err.value) + str(err.value.__cause__ or "")
    assert "cannot reach the endpoint" in text
    for leaked in (secret, "tok-abcdef-987", "deadbeef"):
        assert leaked not in text


def test_unknown_storage_option_is_one_line(s3_env):
    with pytest.raises(StorageError, match="unknown storage option"):
        storage.open_remote("s3://bkt/x", {"no_such_option": "1"}).read()


def test_server_stopped_mid_read_fails_within_bounded_time(s3_server_fresh, monkeypatch, tmp_path):
    for name, value in s3_server_fresh.env.items():
        monkeypatch.setenv(name, value)
    s3_server_fresh.make_bucket("gone")
    s3_server_fresh.put("s3://gone/x.bin", PAYLOAD)
    obj = storage.open_remote("s3://gone/x.bin")
    assert obj.read_range(0, 10) == PAYLOAD[:10]       # the connection pool is warm
    s3_server_fresh.stop()
    with no_hang(60), pytest.raises(StorageError, match="cannot reach the endpoint"):
        obj.read_ranges([(0, 10), (500_000, 10)])
    with no_hang(60), pytest.raises(StorageError, match="cannot reach the endpoint"):
        obj.download(str(tmp_path / "x.bin"))
    assert os.listdir(tmp_path) == []                  # no half-written file, no partial


# -- HTTP -----------------------------------------------------------------------------

def test_http_reads(http_server, tmp_path):
    (http_server.root / "obj.bin").write_bytes(PAYLOAD)
    url = f"{http_server.url}/obj.bin"
    obj = storage.open_remote(url)
    assert obj.size() == len(PAYLOAD) and obj.read() == PAYLOAD
    assert obj.read_ranges([(7, 9), (300_000, 5000)]) == [PAYLOAD[7:16], PAYLOAD[300_000:305_000]]
    assert storage.exists(url) and not storage.exists(f"{http_server.url}/nope.bin")
    with pytest.raises(StorageError, match="no such object"):
        storage.open_remote(f"{http_server.url}/nope.bin").read()
    with pytest.raises(StorageError, match="cannot list over HTTP"):
        storage.list_names(http_server.url + "/")
    with pytest.raises(StorageError, match="outside the object"):
        obj.read_range(len(PAYLOAD) - 2, 5)


def test_http_connection_dropped_mid_download_leaves_nothing(http_server, tmp_path):
    (http_server.root / "obj.bin").write_bytes(PAYLOAD)
    dest = tmp_path / "out" / "obj.bin"
    with no_hang(60), pytest.raises(StorageError) as err:
        storage.open_remote(f"{http_server.url}/truncate/obj.bin").download(str(dest))
    assert str(err.value).startswith(f"{http_server.url}/truncate/obj.bin: ")
    assert os.listdir(dest.parent) == []


# -- ShardCache -----------------------------------------------------------------------

def test_cache_downloads_once_across_racing_processes(s3_env, tmp_path):
    s3_env.make_bucket("race")
    data = os.urandom(6 << 20)
    s3_env.put("s3://race/shard-000000.tar", data)
    code = """
        import hashlib, os, sys, time
        from fastdata.storage import ShardCache
        while time.time() < float(sys.argv[2]):
            time.sleep(0.001)
        path = ShardCache(sys.argv[1]).local("s3://race/shard-000000.tar")
        print(path, os.stat(path).st_ino, hashlib.sha256(open(path, "rb").read()).hexdigest())
        """
    import hashlib
    import subprocess
    import sys
    import textwrap
    go = str(time.time() + 3)
    env = {**os.environ, **s3_env.env, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(tmp_path), go],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    lines = {o[0].strip() for o in outs}
    assert len(lines) == 1                      # one path, one inode, the right bytes
    assert lines.pop().split()[2] == hashlib.sha256(data).hexdigest()
    assert s3_env.requests("GET", "s3://race/shard-000000.tar") == 1


def test_cache_evicts_least_recently_used_within_its_limit(s3_env, tmp_path):
    s3_env.make_bucket("lru")
    urls = [f"s3://lru/s-{i}.tar" for i in range(4)]
    for url in urls:
        s3_env.put(url, os.urandom(100_000))
    cache = ShardCacheNoHold(str(tmp_path), limit="250kB")
    a = cache.local(urls[0])
    b = cache.local(urls[1])
    # The cache orders its copies by mtime, which local() sets to now on every
    # use. Times set far apart and far in the past (a before b) make the order
    # independent of the clock's and the file system's resolution.
    os.utime(a, (1_000_000, 1_000_000))
    os.utime(b, (2_000_000, 2_000_000))
    assert cache.local(urls[0]) == a           # a used again: b is now the oldest
    assert os.stat(a).st_mtime > 2_000_000     # the use touched a
    cache.local(urls[2])
    assert os.path.exists(a) and not os.path.exists(b)
    assert _cached_bytes(tmp_path) <= 250_000
    assert s3_env.requests("GET", urls[0]) == 1


def test_cache_never_evicts_an_object_in_use(s3_env, tmp_path):
    s3_env.make_bucket("inuse")
    urls = [f"s3://inuse/s-{i}.tar" for i in range(4)]
    for url in urls:
        s3_env.put(url, os.urandom(100_000))
    from fastdata.storage import ShardCache
    holder = ShardCache(str(tmp_path))           # keeps shared locks on what it returned
    held = holder.local(urls[0])
    other = ShardCache(str(tmp_path), limit=150_000)
    other.local(urls[1])
    other.local(urls[2])                         # over the limit, but urls[0] is in use
    assert os.path.exists(held)
    holder.release()
    other.release()
    other.local(urls[3])                         # the next download evicts it
    assert not os.path.exists(held)


def test_cache_limit_from_environment(monkeypatch, tmp_path):
    from fastdata.storage import ShardCache
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", "1GiB")
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path))
    cache = ShardCache()
    assert cache.limit == 2**30 and cache.cache_dir == str(tmp_path / "objects")
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", "lots")
    with pytest.raises(FastDataError, match="FASTDATA_CACHE_LIMIT='lots'"):
        ShardCache()


def _cached_bytes(folder) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
               if not n.endswith(".lock"))


def test_a_download_never_waits_behind_a_reader_of_the_copy(tmp_path):
    """A process that finds no copy must not wait for the exclusive lock: the
    process downloading it holds a shared lock on the copy from then on (a
    writer waiting behind it would wait for ever)."""
    import fcntl
    import threading
    from pathlib import Path

    cache = storage.ShardCache(str(tmp_path))
    url = "s3://never-fetched/x.tar"
    path = cache.path_for(url)
    other = os.open(path + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_SH)     # another process looking, then holding its copy
    got = []
    thread = threading.Thread(target=lambda: got.append(cache.local(url)), daemon=True)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive() and not got  # waiting for the copy, not downloading it
    Path(path).write_bytes(b"copy")       # the other process's download lands
    thread.join(10)
    assert got == [path]
    os.close(other)
    cache.release()


class ShardCacheNoHold(storage.ShardCache):
    """A cache that releases each object once returned (a reader that opened it)."""

    def local(self, url, storage_options=None, **kwargs):
        path = super().local(url, storage_options, **kwargs)
        self.release()
        return path



def test_aws_profile_from_a_credentials_file(s3_server, monkeypatch, tmp_path):
    optional.skip_if_missing("boto3")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    s3_server.make_bucket("prof")                 # boto3 first, before AWS_PROFILE is set
    s3_server.put("s3://prof/x", b"via profile")
    (tmp_path / "credentials").write_text(
        "[bench]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "bench")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    assert storage.open_remote("s3://prof/x").read() == b"via profile"


def test_a_local_listing_skips_files_removed_while_it_reads(tmp_path):
    """Writers' temporary files come and go while gc lists the history folder:
    a file removed between the folder read and its stat is left out, never an
    error (a FileNotFoundError here once failed a gc running beside appends)."""
    import threading

    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "a.bin").write_bytes(b"x")
    stop, errors, listings = threading.Event(), [], 0

    def churn():
        k = 0
        while not stop.is_set():
            path = tmp_path / f"t.partial-{k % 50:02d}"
            path.write_bytes(b"y")
            path.unlink()
            k += 1

    writer = threading.Thread(target=churn, daemon=True)
    writer.start()
    try:
        with no_hang(60):
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                try:
                    names = [n for n, *_ in storage.list_tree(str(tmp_path))]
                except OSError as exc:
                    errors.append(repr(exc))
                    break
                listings += 1
                assert "kept/a.bin" in names
    finally:
        stop.set()
        writer.join(10)
    assert errors == [] and listings > 10

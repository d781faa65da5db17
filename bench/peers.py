"""fastdata against other data-loading libraries, on the same images, in one run.

Rows, all measured by ``fastdata.bench.measure_loader`` with the same
output ((B, 3, S, S) uint8 images + B labels), batch size and DataLoader
worker counts, one warm-up epoch discarded, median of ``--epochs``:

* ``folder (PIL)``: the plain image folder, read as torchvision's ImageFolder
  does (the baseline of ``fastdata bench``);
* fastdata: LMDB and tar shards of the original bytes (decoder ``auto``), LMDB
  with the PIL decoder (the container alone, same decoder as the peers), and
  LMDB ``resize256`` (photos) / ``raw`` (tiny) pack-time variants;
* ``webdataset``: shards written by webdataset's own ``ShardWriter`` from the
  same files, read by its own pipeline (shard shuffle, buffer shuffle 1000,
  ``.decode("pil")``), then the baseline's PIL resize to (S, S) and tensor;
* ``litdata``: ``litdata.optimize`` of the original bytes, read by
  ``litdata.StreamingDataset`` + ``StreamingDataLoader``, PIL decode + resize;
* ``mosaicml-streaming``: ``MDSWriter`` of the original bytes, read by
  ``streaming.StreamingDataset``, PIL decode + resize.

A peer that is not installed, or fails to write or read, is a failed row with
the error line; the others still run. Nothing here is a dependency of fastdata:
install the peers yourself (``pip install webdataset litdata mosaicml-streaming``)
into the environment you run this script with.

    python bench/peers.py [--kinds photos,tiny] [--workers 0,2] [--epochs 3]
                          [--n-photos 512] [--n-tiny 10000] [--json FILE] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fastdata import bench as bm  # noqa: E402
from fastdata.demo import synthesize  # noqa: E402

# A loader for one worker count: (factory of one epoch's iterable, cleanup).
Opener = Callable[[int], tuple[Callable[[], Iterable], Callable[[], None]]]


@dataclass(frozen=True)
class Row:
    """One row: how to open it at a worker count, and what it stores."""

    name: str
    format: str
    variant: str
    label: str
    path: str | None
    count: int
    payload_bytes: int
    size_bytes: int | None
    pack_seconds: float | None
    open: Opener | None
    decoder: str
    error: str | None = None


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _du(path: str) -> int:
    """Bytes on disk under ``path`` (allocated blocks)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(dirpath, name))
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
    return total


class PILResize:
    """The baseline's per-sample work on an already opened or encoded image:
    RGB, PIL bilinear resize to (S, S), uint8 CHW tensor."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img):
        from PIL import Image

        if isinstance(img, (bytes, bytearray, memoryview)):
            img = Image.open(io.BytesIO(img))
        img = img.convert("RGB").resize((self.size, self.size), Image.Resampling.BILINEAR)
        return torch.from_numpy(np.array(img, copy=True)).permute(2, 0, 1)


# --------------------------------------------------------------------------- #
# fastdata and the baseline
# --------------------------------------------------------------------------- #


def fastdata_rows(src: str, work: str, size: int, batch_size: int, seed: int,
                  variants: Sequence[str]) -> list[Row]:
    opts = bm.BenchOptions(size=size, batch_size=batch_size, seed=seed)
    targets = bm.pack_targets(src, work, formats=("lmdb", "tar"),
                              variants=bm.parse_variants(["keep"], size), progress=False)
    extra = bm.pack_targets(src, os.path.join(work, "variants"), formats=("lmdb",),
                            variants=bm.parse_variants(list(variants), size), progress=False)
    targets += extra[1:]  # extra[0] is the baseline again
    rows = []
    for t in targets:
        decoders = ["pil"] if t.kind == "folder" else ["auto"]
        if t.name == "lmdb":
            decoders.append("pil")  # the container alone: the same decoder as the peers
        for decoder in decoders:
            name = t.name if decoder == "auto" or t.kind == "folder" else f"{t.name} (PIL decode)"
            rows.append(Row(name, t.format, t.variant, t.label, t.path, t.count,
                            t.payload_bytes, t.size_bytes, t.pack_seconds,
                            None if t.error
                            else _fastdata_opener(t, replace(opts, decoder=decoder)),
                            decoder, t.error))
    return rows


def _fastdata_opener(target: bm.Target, opts: bm.BenchOptions) -> Opener:
    def open_(workers: int):
        ds = bm.make_dataset(target, opts)
        # Non-persistent workers, like the peers' loaders below (a new loader per epoch).
        factory = bm.loader_factory(ds, batch_size=opts.batch_size, workers=workers,
                                    seed=opts.seed, persistent=False)
        return factory, lambda: (factory.close(), bm.close_dataset(ds))

    return open_


# --------------------------------------------------------------------------- #
# webdataset
# --------------------------------------------------------------------------- #


def _ext(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return "jpg" if ext in ("jpg", "jpeg") else ext


def webdataset_row(samples: Sequence[tuple[str, int]], work: str, size: int,
                   batch_size: int, payload: int) -> Row:
    name = "webdataset"
    try:
        import webdataset as wds
    except ImportError as exc:
        return _failed(name, f"not installed: {_error_line(exc)}")
    try:
        out = os.path.join(work, "wds")
        os.makedirs(out, exist_ok=True)
        shards = 8  # enough for every worker count to get whole shards
        started = time.perf_counter()
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"),
                             maxcount=math.ceil(len(samples) / shards), verbose=0) as sink:
            for i, (path, label) in enumerate(samples):
                with open(path, "rb") as f:
                    sink.write({"__key__": f"{i:08d}", _ext(path): f.read(), "cls": label})
        seconds = time.perf_counter() - started
        urls = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))
    except Exception as exc:  # a peer's failure is its row's result
        return _failed(name, f"write failed: {_error_line(exc)}")
    resize = PILResize(size)

    def open_(workers: int):
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
              .shuffle(1000)
              .decode("pil")
              .to_tuple("jpg;png", "cls")
              .map_tuple(resize, int))
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers,
                                             timeout=600 if workers else 0)
        return (lambda: loader), (lambda: None)

    return Row(name, "webdataset tar", "keep", "original bytes (ShardWriter)", out,
               len(samples), payload, _du(out), seconds, open_, "pil")


# --------------------------------------------------------------------------- #
# litdata
# --------------------------------------------------------------------------- #


def _lit_sample(item):
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


class _LitTransform:
    def __init__(self, size: int) -> None:
        self.resize = PILResize(size)

    def __call__(self, sample):
        return self.resize(sample["image"]), sample["label"]


def litdata_row(samples: Sequence[tuple[str, int]], work: str, size: int,
                batch_size: int, payload: int) -> Row:
    name = "litdata"
    try:
        import litdata
    except ImportError as exc:
        return _failed(name, f"not installed: {_error_line(exc)}")
    import multiprocessing as mp

    # optimize() sets the process-wide start method (to spawn unless told):
    # every later DataLoader would then start its workers by spawn. Keep ours.
    previous = mp.get_start_method(allow_none=True)
    try:
        out = os.path.join(work, "litdata")
        started = time.perf_counter()
        litdata.optimize(_lit_sample, list(samples), output_dir=out, chunk_bytes="64MB",
                         num_workers=len(os.sched_getaffinity(0)), verbose=False,
                         start_method=previous or mp.get_all_start_methods()[0])
        seconds = time.perf_counter() - started
    except BaseException as exc:  # litdata exits its workers with SystemExit on failure
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _failed(name, f"write failed: {_error_line(exc)}")
    finally:
        mp.set_start_method(previous, force=True)

    def open_(workers: int):
        ds = litdata.StreamingDataset(out, shuffle=True, transform=_LitTransform(size))
        loader = litdata.StreamingDataLoader(ds, batch_size=batch_size, num_workers=workers)
        return (lambda: loader), (lambda: None)

    return Row(name, "litdata chunks", "keep", "original bytes (optimize)", out, len(samples),
               payload, _du(out), seconds, open_, "pil")


# --------------------------------------------------------------------------- #
# mosaicml-streaming
# --------------------------------------------------------------------------- #


def _mds_dataset_class():
    if "MDSImages" in globals():
        return globals()["MDSImages"]
    from streaming import StreamingDataset

    class MDSImages(StreamingDataset):
        """Mosaic's StreamingDataset with the baseline's decode + resize."""

        def __init__(self, *args, size: int, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._resize = PILResize(size)

        def __getitem__(self, index):
            sample = super().__getitem__(index)
            return self._resize(sample["image"]), int(sample["label"])

    # A module-level name, so the class pickles by reference (spawned workers).
    MDSImages.__qualname__ = "MDSImages"
    globals()["MDSImages"] = MDSImages
    return MDSImages


def mosaic_row(samples: Sequence[tuple[str, int]], work: str, size: int,
               batch_size: int, payload: int) -> Row:
    name = "mosaicml-streaming"
    try:
        from streaming import MDSWriter
        from streaming.base.util import clean_stale_shared_memory

        dataset_class = _mds_dataset_class()
    except Exception as exc:  # ImportError, or its own imports failing
        return _failed(name, f"not installed or not importable: {_error_line(exc)}")
    try:
        out = os.path.join(work, "mds")
        started = time.perf_counter()
        with MDSWriter(out=out, columns={"image": "bytes", "label": "int"},
                       size_limit="64mb") as writer:
            for path, label in samples:
                with open(path, "rb") as f:
                    writer.write({"image": f.read(), "label": label})
        seconds = time.perf_counter() - started
    except Exception as exc:
        return _failed(name, f"write failed: {_error_line(exc)}")

    def open_(workers: int):
        # One dataset per worker count: its shared-memory state is sized for
        # the workers that first iterate it.
        clean_stale_shared_memory()
        ds = dataset_class(local=out, shuffle=True, batch_size=batch_size, size=size)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers,
                                             timeout=600 if workers else 0)
        return (lambda: loader), (lambda: None)

    return Row(name, "MDS shards", "keep", "original bytes (MDSWriter)", out, len(samples),
               payload, _du(out), seconds, open_, "pil")


def _failed(name: str, error: str) -> Row:
    return Row(name, name, "keep", "", None, 0, 0, None, None, None, "pil", error)


# --------------------------------------------------------------------------- #
# Measuring
# --------------------------------------------------------------------------- #


def measure_rows(rows: Sequence[Row], *, size: int, batch_size: int, workers: Sequence[int],
                 epochs: int, log: Callable[[str], None]) -> list[bm.Result]:
    """Every row at every worker count (worker counts outer, baseline first)."""
    results = []
    shape = (3, size, size)
    for w in workers:
        base_rate = None
        for row in rows:
            common = dict(name=row.name, format=row.format, variant=row.variant,
                          label=row.label, path=row.path, workers=w, cache="warm",
                          decoder=row.decoder, pack_seconds=row.pack_seconds,
                          size_bytes=row.size_bytes, payload_bytes=row.payload_bytes or None)
            if row.error is not None or row.open is None:
                result = bm.Result(status="failed", error=row.error or "no opener", **common)
            else:
                cleanup = None
                try:
                    factory, cleanup = row.open(w)
                    expected_b = min(batch_size, row.count)
                    m = bm.measure_loader(
                        factory, epochs=epochs, warmup=1, payload_bytes=row.payload_bytes,
                        expected_samples=row.count,
                        check=lambda b: bm.check_batch(b, sample_shape=shape,
                                                       batch_size=expected_b))
                    result = bm.Result(
                        status="ok", error=None, samples_per_s=m.samples_per_s,
                        mb_per_s=m.mb_per_s, cpu=m.cpu, other_cpu=m.other_cpu,
                        p50_ms=m.p50_ms, p99_ms=m.p99_ms,
                        first_batch_ms=m.first_batch_ms, samples=m.samples, batches=m.batches,
                        epoch_samples_per_s=list(m.epoch_samples_per_s),
                        epoch_seconds=list(m.epoch_seconds),
                        output_shape=list(m.output_shape) if m.output_shape else None,
                        output_dtype=m.output_dtype, **common)
                except Exception as exc:  # one library's failure is its row's result
                    result = bm.Result(status="failed", error=_error_line(exc), **common)
                finally:
                    if cleanup is not None:
                        try:
                            cleanup()
                        except Exception:  # cleanup only
                            pass
            if row.format == "folder" and result.ok and base_rate is None:
                base_rate = result.samples_per_s
            if result.ok and base_rate:
                result = replace(result, ratio=result.samples_per_s / base_rate)
            results.append(result)
            log(bm.describe_result(result))
    order = {r.name: i for i, r in enumerate(rows)}
    results.sort(key=lambda r: (order[r.name], list(workers).index(r.workers)))
    return results


def run_kind(kind: str, n: int, args, log: Callable[[str], None]) -> bm.BenchReport:
    size = 224 if kind == "photos" else 32
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"fastdata-peers-{kind}-") as tmp:
        src = os.path.join(tmp, kind)
        s = synthesize(src, kind=kind, n=n, seed=args.seed, progress=False)
        log(f"[{kind}] {s.images} images, {s.bytes / 1e6:.1f} MB, output {size}x{size}")
        variants = ["resize256"] if kind == "photos" else ["raw"]
        rows = fastdata_rows(src, os.path.join(tmp, "fastdata"), size, args.batch_size,
                             args.seed, variants)
        base = bm.folder_target(src)
        samples, payload = base.samples, base.payload_bytes
        for make in (webdataset_row, litdata_row, mosaic_row):
            row = make(samples, tmp, size, args.batch_size, payload)
            log(f"[{kind}] {row.name}: " + (f"written in {row.pack_seconds:.1f} s"
                                             if row.error is None else row.error))
            rows.append(row)
        results = measure_rows(rows, size=size, batch_size=args.batch_size,
                               workers=args.workers, epochs=args.epochs, log=log)
    options = {"kind": kind, "n": n, "size": size, "batch_size": args.batch_size,
               "workers": list(args.workers), "epochs": args.epochs, "warmup": 1,
               "decoder": "auto (fastdata rows; PIL for the rest)", "seed": args.seed}
    return bm.BenchReport(machine=bm.machine_info(), options=options, cache="warm",
                          cache_note=None, results=results,
                          seconds=time.perf_counter() - started,
                          created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="photos", help="photos, tiny or photos,tiny")
    parser.add_argument("--n-photos", type=int, default=512)
    parser.add_argument("--n-tiny", type=int, default=10000)
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the reports as JSON here")
    parser.add_argument("--plot", default=None,
                        help="write a bar chart per kind here (KIND is put before .png)")
    args = parser.parse_args(argv)
    args.workers = bm.parse_workers(args.workers)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    reports = {}
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        n = args.n_photos if kind == "photos" else args.n_tiny
        report = run_kind(kind, n, args, log)
        reports[kind] = report
        print(f"\n=== peers: {kind} ({n} images) ===")
        print(bm.format_table(report), flush=True)
        if args.plot:
            root, ext = os.path.splitext(args.plot)
            bm.write_plot(report, f"{root}-{kind}{ext or '.png'}")
    if args.json:
        import json

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({k: r.to_dict() for k, r in reports.items()}, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``fastdata bench``."""

from __future__ import annotations

import os
import sys

import click

from fastdata.cli.group import _handle_errors, _print_json, echo, main
from fastdata.decoding.decoder_registry import decoder_choices


@main.command(short_help="Measure loading speed: an image folder against every format.")
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--demo", type=click.Choice(["photos", "tiny"]), is_flag=False,
              flag_value="photos", default=None,
              help="No data needed: generate demo images (photos: 512 JPEGs in 8 classes; "
                   "tiny: 10,000 32x32 PNGs) in a temporary folder and benchmark them.")
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Keep the packed datasets here (default: a temporary folder, removed "
                   "afterwards). Existing bench outputs in it are replaced.")
@click.option("--formats", default=None, metavar="LIST",
              help="Formats to pack, comma-separated [default: every format].")
@click.option("--variants", default="keep", show_default=True, metavar="LIST",
              help="keep: original bytes; resizeN: shorter side N, re-encoded at pack time "
                   "(e.g. resize256); jpegQ: re-encoded as JPEG at quality Q (e.g. jpeg90); "
                   "raw: SxS pixels stored pre-decoded. A +restarts suffix (e.g. "
                   "jpeg90+restarts) packs JPEGs with a restart marker per MCU, which "
                   "--train's fused rows decode crop-only (keep+restarts needs "
                   "libjpeg-turbo 3.1).")
@click.option("--workers", default="0,2", show_default=True, metavar="LIST",
              help="DataLoader worker counts to sweep, e.g. 0,1,2,4.")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--size", type=int, default=None, metavar="S",
              help="Every row returns SxS images [default: 224; 32 for --demo tiny].")
@click.option("--decoder", type=click.Choice(decoder_choices()),
              default="auto", show_default=True,
              help="Decoder of the fastdata rows (the folder baseline always uses PIL).")
@click.option("--epochs", type=int, default=3, show_default=True,
              help="Measured epochs (after one warm-up epoch); the median is reported.")
@click.option("--limit", type=int, default=None, metavar="N",
              help="Use N samples (a seeded random selection, the same for every row).")
@click.option("--cache", "cache", type=click.Choice(["none", "ram"]), default="none",
              show_default=True,
              help="ram: fastdata rows read from the shared RAM cache (cache='ram'); with "
                   "--cold, epoch 1 fills it from a cold disk and later epochs read memory.")
@click.option("--persistent-workers/--no-persistent-workers", default=True, show_default=True,
              help="Keep DataLoader workers between epochs, as training does (start-up falls "
                   "in the warm-up epoch); --no-persistent-workers restarts them every epoch.")
@click.option("--cold", is_flag=True,
              help="Drop the page cache before every measured epoch (root on Linux); "
                   "otherwise say so and run warm.")
@click.option("--train", is_flag=True,
              help="Measure training pipelines instead of the evaluation rows: per packed "
                   "dataset, 'train unfused' (whole decode, then RandomResizedCrop to SxS "
                   "with flips) and 'train fused' (JPEGs decoded in the crop region only, "
                   "through TurboJPEG 3 when installed), new crops every epoch; the folder "
                   "baseline is not measured. The summary gives fused/unfused, best "
                   "against best, and which path ran.")
@click.option("--step-ms", "step_ms", multiple=True, metavar="MS[,MS...]",
              help="With --train: measure each training row again with a simulated model "
                   "step of MS milliseconds (a sleep) after each batch and report, from the "
                   "stall meter, the share of time spent waiting for data, the p95 "
                   "batch-ready latency and whether that step keeps the GPU fed "
                   "(repeatable, or a list such as 10,25).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Shuffling, --limit selection and --train crop seed.")
@click.option("--no-pack", is_flag=True,
              help="With one image folder: measure it as it is (the baseline) without packing.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=str),
              default=None, metavar="FILE",
              help="Write every figure, the machine and the options as JSON ('-': stdout).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=str),
              default=None, metavar="FILE.png", help="Draw a bar chart of samples/s per row.")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar (default: when stderr is a terminal).")
@_handle_errors
def bench(paths, demo, out_dir, formats, variants, workers, batch_size, size, decoder, epochs,
          limit, cache, persistent_workers, cold, train, step_ms, seed, no_pack, json_path,
          plot_path, progress):
    """Measure data-loading throughput: an image folder against every format.

    \b
    fastdata bench SRC_DIR        pack SRC_DIR into every format, then measure the
                                  folder (read as torchvision's ImageFolder does)
                                  and each packed dataset with the same settings
    fastdata bench PATH...        measure existing packed datasets / image folders,
                                  or mixture files (a JSON/YAML of sources and
                                  weights: fastdata.mix) beside their sources
    fastdata bench --demo [tiny]  the same on generated demo data
    fastdata bench ... --train    training rows (random crops, whole decode
                                  against fused crop decode) instead

    Every row returns the same batches ((B, 3, S, S) uint8 images, B labels)
    through a shuffled DataLoader; one warm-up epoch is discarded and the
    median of --epochs is reported, with samples/s, MB/s of stored data, the
    ratio to the folder baseline, pack time and size, CPU use and batch latency.
    A dataset at a URL adds a network line per row: requests and MB per
    epoch, time to first byte, one connection's rate, requests at once, and
    whether the row was decode-, network- or latency-bound.

    \b
    Examples:
      fastdata bench --demo --workers 0,2
      fastdata bench ./images --variants keep,resize256,raw --json bench.json --plot bench.png
      fastdata bench a.lmdb b.tar.fastdata.json mix.json --workers 0,2
      fastdata bench train.lmdb train-000000.tar --limit 5000
      fastdata bench --demo --train --formats lmdb --workers 0,1,2
      fastdata bench --demo --train --formats lmdb --variants jpeg90,jpeg90+restarts
      fastdata bench --demo tiny --train --formats lmdb --workers 0,2 --step-ms 10,25
    """
    import tempfile

    from fastdata import bench as bm

    if demo and paths:
        raise click.UsageError("give either --demo or PATHs, not both")
    if not demo and not paths:
        raise click.UsageError("give an image folder, packed datasets, or --demo")
    if size is None:
        size = 32 if demo == "tiny" else 224
    options = bm.BenchOptions(size=size, batch_size=batch_size, workers=bm.parse_workers(workers),
                              epochs=epochs, decoder=decoder, cold=cold, seed=seed, limit=limit,
                              ram_cache=cache == "ram", persistent_workers=persistent_workers,
                              train=train, step_ms=bm.parse_step_ms(step_ms))
    format_names = bm.parse_formats(formats)
    variant_list = bm.parse_variants(variants, size)

    def log(line: str) -> None:
        echo(line, err=True)

    with tempfile.TemporaryDirectory(prefix="fastdata-bench-") as tmp:
        work = os.path.abspath(out_dir) if out_dir else tmp
        if demo:
            paths = (_bench_demo(demo, work, limit, progress, log),)
        targets = None
        if len(paths) == 1 and not no_pack and _is_image_folder(paths[0]):
            # The baseline plus every format packed from it.
            targets = bm.pack_targets(paths[0], work, formats=format_names,
                                      variants=variant_list, limit=limit, seed=seed,
                                      progress=progress, log=log)
        if targets is None:
            targets = [bm.existing_target(p, limit=limit, seed=seed) for p in paths]
        if train:
            targets = bm.train_targets(targets)
        report = bm.run_bench(targets, options, progress=progress, log=log)
        table = bm.format_table(report)
    _bench_output(bm, report, table, json_path, plot_path, log)


def _bench_demo(demo: str, work: str, limit: int | None, progress, log) -> str:
    """Generate the demo images for ``bench --demo``; their folder."""
    from fastdata.demo import synthesize

    n = limit or (10000 if demo == "tiny" else 512)
    src = os.path.join(work, f"demo-{demo}")
    try:
        summary = synthesize(src, kind=demo, n=n, progress=progress, overwrite=True)
    except ValueError as exc:  # e.g. --limit below the demo's class count
        echo(f"error: {exc}", err=True)
        sys.exit(1)
    log(f"generated {summary.describe()} ({summary.bytes / 1e6:.1f} MB) in "
        f"{summary.seconds:.1f} s")
    return src


def _is_image_folder(path: str) -> bool:
    """A folder that is not a packed dataset (so: images to pack)."""
    from fastdata.errors import UnknownFormatError
    from fastdata.formats import detect_format

    if not os.path.isdir(path):
        return False
    try:
        detect_format(path)
    except UnknownFormatError:
        return True
    return False


def _bench_output(bm, report, table: str, json_path: str | None, plot_path: str | None,
                  log) -> None:
    """Print the table, write the JSON and plot; exit 1 when no row worked."""
    if json_path == "-":
        echo(table, err=True)
        _print_json(report.to_dict())
    else:
        echo(table)
        if json_path:
            bm.write_json(report, json_path)
            log(f"wrote {json_path}")
    if plot_path:
        bm.write_plot(report, plot_path)
        log(f"wrote {plot_path}")
    if not any(r.ok for r in report.results):
        sys.exit(1)

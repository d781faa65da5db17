"""The ``fastdata`` command line: pack, info, verify, synth."""

from __future__ import annotations

import functools
import json
import os
import re
import sys

import click

from fastdata import __version__
from fastdata.errors import FastDataError
from fastdata.formats import FORMATS, known_extensions, sharded_formats
from fastdata.loaders.decoder_registry import decoder_choices
from fastdata.machine import human_bytes

# Library errors name options as the Python API spells them ("overwrite=True",
# "resize="); on the command line the same option is a flag.
_FLAG_PHRASES = (
    ("overwrite=True", "--overwrite"),
    ("strict=True", "--strict"),
    ("center_crop=True", "--center-crop"),
    ("resize=(h, w)", "--resize HxW"),
    ("resize=N", "--resize N"),
    ("encoding='raw'", "--encoding raw"),
)
_FLAG_NAMES = re.compile(r"\b(shard_size|max_size|center_crop|quality|workers|resize|format)=\s?")


def cli_terms(message: str) -> str:
    """A library message with its Python option names turned into CLI flags."""
    for api, flag in _FLAG_PHRASES:
        message = message.replace(api, flag)
    return _FLAG_NAMES.sub(lambda m: "--" + m.group(1).replace("_", "-") + " ", message)


def _handle_errors(func):
    """One-line errors and clean exits instead of tracebacks."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except FastDataError as exc:
            click.echo(f"error: {cli_terms(str(exc))}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted: nothing was written (partial output removed)", err=True)
            sys.exit(130)

    return wrapper


def _print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fastdata")
def main() -> None:
    """Pack image folders into fast containers and feed them to PyTorch.

    \b
    Try it on built-in demo data:
      fastdata bench --demo               # every format against a plain image folder
      fastdata synth demo                 # a folder of photo-like JPEGs in 8 classes
      fastdata pack demo demo.lmdb        # pack it (format from the extension)
      fastdata info demo.lmdb             # what is inside

    Then in Python: ds = fastdata.open_dataset("demo.lmdb").
    """


@main.command()
@click.argument("source", type=click.Path(file_okay=True, dir_okay=True, path_type=str))
@click.argument("output", type=click.Path(path_type=str))
@click.option("--format", "format_", metavar="NAME",
              help="Container format: " + "; ".join(f"{s.name}: {s.help}" for s in FORMATS.values())
                   + ". Default: chosen from OUTPUT's extension ("
                   + ", ".join(known_extensions()) + ").")
@click.option("--shard-size", metavar="N|SIZE", default=None,
              help="/".join(sharded_formats()) + " only: roll a new shard every N records (10000) "
                   "or SIZE bytes (256MB). OUTPUT may be a pattern: out-%06d.tar or "
                   "out-{000000..000099}.tar.")
@click.option("--resize", metavar="SHORT|HxW", default=None,
              help="Resize at pack time: SHORT sets the shorter side (aspect kept), HxW sets "
                   "both (stretched, unless --center-crop).")
@click.option("--center-crop", is_flag=True,
              help="With --resize: scale to cover the target, then crop the centre "
                   "(--resize 224 --center-crop gives 224x224).")
@click.option("--max-size", type=int, default=None, metavar="N",
              help="Shrink images whose longer side exceeds N (never enlarges).")
@click.option("--encoding", type=click.Choice(["keep", "jpeg", "png", "raw"]), default="keep",
              show_default=True,
              help="keep: original bytes (re-encoded in their own format only if resized); "
                   "jpeg/png: re-encode; raw: decoded uint8 pixels, no decoding at read time "
                   "(needs one image size: --resize HxW or --resize N --center-crop).")
@click.option("--quality", type=int, default=90, show_default=True,
              help="JPEG quality when encoding JPEG.")
@click.option("--workers", type=int, default=None, metavar="N",
              help="Processes reading, checking and preprocessing images [default: usable "
                   "cores]. The output is identical for every N.")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--strict", is_flag=True,
              help="Stop at the first corrupt or unreadable image (default: skip it and list it "
                   "in the summary and in OUTPUT.report.json).")
@click.option("--verify-decode", is_flag=True,
              help="Fully decode every image while packing (slower; catches damage inside the "
                   "compressed data, not only truncation and bad headers).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar (default: when stderr is a terminal).")
@_handle_errors
def pack(source, output, format_, shard_size, resize, center_crop, max_size, encoding, quality,
         workers, overwrite, strict, verify_decode, as_json, progress):
    """Pack the image folder SOURCE into the dataset OUTPUT.

    SOURCE holds one sub-folder per class (the torchvision ImageFolder layout);
    images are found recursively inside each class folder. Labels are the
    indices of the sorted class names, as torchvision assigns them. By default
    the original file bytes are stored unchanged, with the label and the path
    relative to SOURCE; --resize/--encoding preprocess them once at pack time.

    \b
    Examples:
      fastdata pack images/ train.lmdb
      fastdata pack images/ train-%06d.tar --shard-size 256MB
      fastdata pack images/ train.h5 --resize 256 --encoding jpeg --quality 90
      fastdata pack cifar/ cifar.lmdb --encoding raw

    Nothing is left half-written: the output appears only when complete.
    """
    from fastdata.packers.pack import PackOptions
    from fastdata.packers.pack import pack as run_pack
    from fastdata.packers.preprocess import Preprocess, parse_resize

    pre = Preprocess(resize=parse_resize(resize), center_crop=center_crop, max_size=max_size,
                     encoding=encoding, quality=quality)
    options = PackOptions(format=format_, overwrite=overwrite, strict=strict,
                          verify_decode=verify_decode, shard_size=shard_size, preprocess=pre,
                          workers=workers)

    def on_event(msg: str) -> None:
        click.echo(f"warning: {msg}", err=True)

    summary = run_pack(source, output, options=options, progress=progress, on_event=on_event)
    if as_json:
        _print_json(summary.to_dict())
        return
    click.echo(
        f"packed {summary.records} images in {summary.classes} classes into {summary.output} "
        f"({summary.format}) in {summary.seconds:.1f} s, {summary.rate:,.0f} img/s")
    click.echo(f"  bytes in {human_bytes(summary.bytes_in)}, on disk "
               f"{human_bytes(summary.bytes_out)}; encodings "
               + ", ".join(f"{k} {v}" for k, v in summary.encodings.items()))
    if summary.ignored:
        click.echo(f"  ignored {summary.ignored} hidden or non-image file(s)")
    if summary.skipped:
        click.echo(f"  skipped {len(summary.skipped)} bad image(s):")
        for item in summary.skipped[:10]:
            click.echo(f"    {item.key}: {item.reason}")
        if len(summary.skipped) > 10:
            click.echo(f"    ... and {len(summary.skipped) - 10} more")
    if summary.report:
        click.echo(f"  report: {summary.report}")


@main.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@_handle_errors
def info(path, as_json):
    """Show the manifest of the packed dataset PATH."""
    from fastdata.formats import read_manifest

    m = read_manifest(path)
    if as_json:
        _print_json(m.to_dict())
        return
    classes = ", ".join(f"{c} ({n})" for c, n in zip(m.classes[:8], m.class_counts[:8]))
    if len(m.classes) > 8:
        classes += f", ... {len(m.classes) - 8} more"
    enc = m.encoding
    rows = [
        ("format", f"{m.format} (manifest v{m.version}, written by fastdata {m.fastdata_version})"),
        ("records", f"{m.count:,}"),
        ("classes", f"{len(m.classes)}: {classes}"),
        ("encoding", f"{enc.get('storage')}: "
                     + ", ".join(f"{k} {v}" for k, v in enc.get("formats", {}).items())
                     + (f", shape {enc['shape']}" if enc.get("shape") else "")),
        ("size", f"payload {human_bytes(m.bytes.get('payload', 0))}, on disk "
                 f"{human_bytes(m.bytes.get('on_disk', 0))} "
                 f"(source {human_bytes(m.bytes.get('source', 0))})"),
        ("shards", f"{len(m.shards)}: " + ", ".join(s["path"] for s in m.shards[:4])
                   + (" ..." if len(m.shards) > 4 else "")),
        ("checksums", f"{m.checksums.get('record')} per record; payload sha256 "
                      f"{m.checksums.get('payload_sha256', '')[:16]}..."),
        ("source", f"{m.source.get('root')} ({m.source.get('files')} files, "
                   f"{m.source.get('skipped')} skipped, {m.source.get('ignored')} ignored)"),
        ("created", m.created_at),
        ("options", ", ".join(f"{k}={v}" for k, v in m.pack_options.items())),
    ]
    click.echo(os.path.abspath(path))
    for name, value in rows:
        click.echo(f"  {name:<10} {value}")


@main.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option("--decode", is_flag=True, help="Also decode every image.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar.")
@_handle_errors
def verify(path, decode, as_json, progress):
    """Read every record of PATH and check it against its stored CRC32.

    Exits 1 when any record is damaged, listing each one.
    """
    from fastdata.loaders.verify import verify_dataset

    result = verify_dataset(path, decode=decode, progress=progress)
    if as_json:
        _print_json(result.to_dict())
    else:
        click.echo(f"{result.path}: {result.checked} records checked, {len(result.problems)} "
                   f"damaged" + (" (decoded)" if decode else ""))
        for p in result.problems[:20]:
            click.echo(f"  record {p['index']} ({p['key']}): {p['reason']}")
    if result.problems:
        sys.exit(1)


@main.command()
@click.argument("directory", type=click.Path(path_type=str))
@click.option("--kind", type=click.Choice(["photos", "tiny"]), default="photos", show_default=True,
              help="photos: ImageNet-like JPEGs (300-640 px a side); tiny: 32x32 PNGs like CIFAR.")
@click.option("-n", "--count", "n", type=int, default=None,
              help="Number of images [default: 512 photos, 2048 tiny].")
@click.option("--classes", type=int, default=None, help="Number of classes [default: 8 photos, 10 tiny].")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same bytes.")
@click.option("--overwrite", is_flag=True, help="Write into a non-empty DIRECTORY.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar.")
@_handle_errors
def synth(directory, kind, n, classes, seed, overwrite, as_json, progress):
    """Write a demo image folder (one sub-folder per class) into DIRECTORY."""
    from fastdata.demo import synthesize

    try:
        summary = synthesize(directory, kind=kind, n=n, classes=classes, seed=seed,
                             progress=progress, overwrite=overwrite)
    except ValueError as exc:  # an out-of-range option: one line, like every other error
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if as_json:
        _print_json(summary.to_dict())
        return
    what = "photo-like JPEG" if kind == "photos" else "32x32 PNG"
    click.echo(f"wrote {summary.images} {what} images in {summary.classes} classes to "
               f"{summary.root} ({human_bytes(summary.bytes)}, mean "
               f"{summary.mean_width:.0f}x{summary.mean_height:.0f}, "
               f"{human_bytes(summary.mean_bytes)} each) in {summary.seconds:.1f} s")


@main.command()
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
                   "(e.g. resize256); raw: SxS pixels stored pre-decoded.")
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
@click.option("--seed", type=int, default=0, show_default=True,
              help="Shuffling and --limit selection seed.")
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
          limit, cache, persistent_workers, cold, seed, no_pack, json_path, plot_path, progress):
    """Measure data-loading throughput: an image folder against every format.

    \b
    fastdata bench SRC_DIR        pack SRC_DIR into every format, then measure the
                                  folder (read as torchvision's ImageFolder does)
                                  and each packed dataset with the same settings
    fastdata bench PATH...        measure existing packed datasets / image folders
    fastdata bench --demo [tiny]  the same on generated demo data

    Every row returns the same batches ((B, 3, S, S) uint8 images, B labels)
    through a shuffled DataLoader; one warm-up epoch is discarded and the
    median of --epochs is reported, with samples/s, MB/s of stored data, the
    ratio to the folder baseline, pack time and size, CPU use and batch latency.

    \b
    Examples:
      fastdata bench --demo --workers 0,2
      fastdata bench ./images --variants keep,resize256,raw --json bench.json --plot bench.png
      fastdata bench train.lmdb train-000000.tar --limit 5000
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
                              ram_cache=cache == "ram", persistent_workers=persistent_workers)
    format_names = bm.parse_formats(formats)
    variant_list = bm.parse_variants(variants, size)

    def log(line: str) -> None:
        click.echo(line, err=True)

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
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    log(f"generated {summary.images} {demo} images in {summary.classes} classes "
        f"({summary.bytes / 1e6:.1f} MB) in {summary.seconds:.1f} s")
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
        click.echo(table, err=True)
        _print_json(report.to_dict())
    else:
        click.echo(table)
        if json_path:
            bm.write_json(report, json_path)
            log(f"wrote {json_path}")
    if plot_path:
        bm.write_plot(report, plot_path)
        log(f"wrote {plot_path}")
    if not any(r.ok for r in report.results):
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()

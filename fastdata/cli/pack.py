"""``fastdata pack``."""

from __future__ import annotations

import os

import click

from fastdata.cli import _handle_errors, _print_json, main
from fastdata.encodings import TORCHVISION_EXTENSIONS
from fastdata.formats import FORMATS, known_extensions, sharded_formats
from fastdata.machine import human_bytes


@main.command()
@click.argument("source", type=click.Path(file_okay=True, dir_okay=True, path_type=str))
@click.argument("output", type=click.Path(path_type=str))
@click.option("--format", "format_", metavar="NAME",
              help="Container format: " + "; ".join(f"{s.name}: {s.help}" for s in FORMATS.values())
                   + ". Default: chosen from OUTPUT's extension ("
                   + ", ".join(known_extensions()) + "). Give it for an OUTPUT without one "
                   "(tar and tfrecord then add theirs); an extension of another format is "
                   "refused.")
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
                   "cores]. Every N gives the same files byte for byte, except the manifest's "
                   "created_at (and LMDB's lock.mdb).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--resume", is_flag=True,
              help="Continue the interrupted pack to OUTPUT (Ctrl-C, kill, crash, power "
                   "loss): the pieces it finished (shards; for lmdb/hdf5 commits of 1000 "
                   "images) are checked and kept, the rest is packed, and the result is the "
                   "one an uninterrupted pack gives. Give the same SOURCE and options "
                   "(--workers may differ); a changed source or option is refused. Without "
                   "--resume, a pack starts over and removes what an interrupted one left.")
@click.option("--scheduler", metavar="ADDRESS", default=None,
              help="Pack on a Dask cluster: the address of its scheduler (tcp://HOST:8786; "
                   "start one with 'dask scheduler' and workers with 'dask worker ADDRESS'). "
                   "The workers read and preprocess the images (tar/tfrecord: they write the "
                   "shards too), so every worker must see SOURCE and OUTPUT's folder at the "
                   "same paths as this machine (a shared file system), and fastdata must "
                   "be installed on the workers and the scheduler. The output is the same, "
                   "byte for byte, as a local pack's. A worker that dies has its work "
                   "redone; if the scheduler goes, the finished pieces are kept and --resume "
                   "continues (with or without --scheduler).")
@click.option("--strict", is_flag=True,
              help="Stop at the first corrupt or unreadable image (default: skip it and list it "
                   "in the summary and in OUTPUT.report.json, for tar/tfrecord "
                   "NAME.report.json beside NAME.fastdata.json).")
@click.option("--verify-decode", is_flag=True,
              help="Fully decode every image while packing (slower; catches damage inside the "
                   "compressed data, not only truncation and bad headers; JPEGs that libjpeg "
                   "decodes only with a corrupt-data warning are skipped too).")
@click.option("--max-pixels", type=int, default=None, metavar="N",
              help="Skip (or under --strict refuse) images whose header declares more than N "
                   "pixels, before decoding them [default: 178956970, twice Pillow's "
                   "decompression-bomb limit]; 0 lifts the limit.")
@click.option("--extensions", metavar="LIST", default=None,
              help="Image file extensions to pack, comma-separated, any letter case "
                   "(gif,jpg,png). Default: torchvision ImageFolder's, "
                   + ",".join(e[1:] for e in TORCHVISION_EXTENSIONS)
                   + ", so the samples and their indices are ImageFolder(SOURCE)'s. A "
                   "leading + adds to that default instead of replacing it: --extensions "
                   "+gif packs GIFs too. Files with other extensions are ignored and "
                   "counted in the summary.")
@click.option("--path-column", metavar="NAME", default=None,
              help="For a list or Parquet SOURCE: the column holding each image. In a "
                   ".csv/.tsv/.jsonl list its file path, relative to the list's folder or "
                   "absolute [default: path]; in Parquet the image struct (bytes, path), its "
                   "bytes or its path [default: image].")
@click.option("--label-column", metavar="NAME", default=None,
              help="For a list or Parquet SOURCE: the column holding the labels, class names "
                   "(classes: the sorted names) or integers (kept as given; classes \"0\" to "
                   "the largest) [default: label, when there is one; without a label column "
                   "the records are unlabelled: label -1, no classes].")
@click.option("--shuffle", metavar="SEED", default=None,
              help="Write the records in a random order drawn from SEED (a whole number "
                   ">= 0) instead of class by class; labels and keys travel with their "
                   "records, and the same SEED gives the same files. Use it when the dataset "
                   "is much larger than a streaming reader's shuffle window, or when other "
                   "tools (webdataset, DALI) will read the shards with only a shuffle buffer: "
                   "unshuffled, a window holds one or two classes. Map-style reading "
                   "(DataLoader shuffle=True) does not need it.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar (default: when stderr is a terminal).")
@_handle_errors
def pack(source, output, format_, shard_size, resize, center_crop, max_size, encoding, quality,
         workers, overwrite, resume, scheduler, strict, verify_decode, max_pixels, extensions,
         path_column, label_column, shuffle, as_json, progress):
    """Pack the image folder (or list, or Parquet) SOURCE into the dataset OUTPUT.

    SOURCE holds one sub-folder per class (the torchvision ImageFolder layout);
    images are found recursively inside each class folder, with torchvision's
    extensions unless --extensions says otherwise. Labels are the indices of
    the sorted class names, as torchvision assigns them. SOURCE may also be a
    list of image files (.csv, .tsv: a header row naming a path column and
    optionally a label column; .jsonl: one JSON object per line), or a .parquet
    file or folder of them in the Hugging Face image layout; their other
    columns are kept as each record's metadata. By default
    the original file bytes are stored unchanged, with the label and the path
    relative to SOURCE; --resize/--encoding preprocess them once at pack time.

    \b
    Examples:
      fastdata pack images/ train.lmdb
      fastdata pack images/ train-%06d.tar --shard-size 256MB
      fastdata pack images/ train.h5 --resize 256 --encoding jpeg --quality 90
      fastdata pack cifar/ cifar.lmdb --encoding raw
      fastdata pack imagenet/train train-%06d.tar --shard-size 1GB --shuffle 0
      fastdata pack train.csv train.lmdb --label-column species
      fastdata pack hf/data/ train.h5

    Nothing is left half-written: the output appears only when complete. An
    interrupted pack keeps the pieces it finished beside OUTPUT (hidden), and the
    same command with --resume continues it.
    """
    from fastdata.packers.pack import PackOptions
    from fastdata.packers.pack import pack as run_pack
    from fastdata.packers.preprocess import Preprocess, parse_resize
    from fastdata.packers.shuffle import parse_seed
    from fastdata.packers.sources.dispatch import open_source

    pre = Preprocess(resize=parse_resize(resize), center_crop=center_crop, max_size=max_size,
                     encoding=encoding, quality=quality)
    limit = {} if max_pixels is None else {"max_pixels": max_pixels or None}
    options = PackOptions(format=format_, overwrite=overwrite, strict=strict,
                          verify_decode=verify_decode, shard_size=shard_size, preprocess=pre,
                          workers=workers, extensions=extensions, shuffle=parse_seed(shuffle),
                          resume=resume, **limit)

    def on_event(msg: str) -> None:
        click.echo(f"warning: {msg}", err=True)

    if path_column is not None or label_column is not None:
        source = open_source(source, path_column=path_column, label_column=label_column,
                             extensions=extensions)
    summary = run_pack(source, output, options=options, progress=progress, on_event=on_event,
                       scheduler=scheduler)
    if as_json:
        _print_json(summary.to_dict())
        return
    what = (f"{summary.records} images in {summary.classes} classes" if summary.classes
            else f"{summary.records} unlabelled images")
    click.echo(
        f"packed {what} into {summary.output} "
        f"({summary.format}) in {summary.seconds:.1f} s, {summary.rate:,.0f} img/s")
    click.echo(f"  bytes in {human_bytes(summary.bytes_in)}, on disk "
               f"{human_bytes(summary.bytes_out)}; encodings "
               + ", ".join(f"{k} {v}" for k, v in summary.encodings.items()))
    if summary.files and summary.files != [summary.output]:
        click.echo(f"  {_files_line(summary.files)}")
    if options.shuffle is not None:
        click.echo(f"  order: shuffled with seed {options.shuffle}")
    if summary.ignored:
        _echo_ignored(summary.ignored, summary.ignored_extensions)
    if summary.renamed:
        _echo_renamed(summary.renamed)
    if summary.skipped:
        click.echo(f"  skipped {len(summary.skipped)} bad image(s):")
        for item in summary.skipped[:10]:
            click.echo(f"    {item.key}: {item.reason}")
        if len(summary.skipped) > 10:
            click.echo(f"    ... and {len(summary.skipped) - 10} more")
    if summary.report:
        click.echo(f"  report: {summary.report}")


def _echo_ignored(count: int, by_extension: dict[str, int]) -> None:
    """The ignored count, with the extensions left out (they are what --extensions adds)."""
    click.echo(f"  ignored {count} hidden, stray or other-extension file(s)")
    if by_extension:
        click.echo("    extensions not packed: "
                   + ", ".join(f".{ext} {n}" if ext else f"(none) {n}"
                               for ext, n in by_extension.items())
                   + " (--extensions +EXT packs them too)")


def _echo_renamed(renamed) -> None:
    """Records stored under another tar member key than their own (the dataset keys
    stay the originals); the full list is in --json and the report file."""
    click.echo(f"  renamed {len(renamed)} tar member key(s) (dataset keys unchanged; all in "
               f"the report):")
    for item in renamed[:5]:
        click.echo(f"    {item.key} -> {item.stored_as}")
    if len(renamed) > 5:
        click.echo(f"    ... and {len(renamed) - 5} more")


def _files_line(files: list[str]) -> str:
    """What a sharded pack wrote, by name (the first and last few of many)."""
    names = [os.path.basename(f) for f in files]
    if len(names) > 9:
        names = names[:4] + ["..."] + names[-4:]
    return f"wrote {len(files)} files in {os.path.dirname(files[0])}: {', '.join(names)}"

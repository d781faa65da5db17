"""What ``fastdata pack`` and ``fastdata convert`` share: the options that say
how the output is written, the ``PackOptions`` they make, and the summary
printed at the end."""

from __future__ import annotations

import os

import click

from fastdata.cli.group import echo

from fastdata.formats import FORMATS, known_extensions, sharded_formats
from fastdata.machine import human_bytes

def _options(out: str) -> tuple:
    """The shared options, in the order --help lists them; ``out`` is what
    the command calls its output argument."""
    return (
        click.option("--format", "format_", metavar="NAME",
                     help="Container format: "
                          + "; ".join(f"{s.name}: {s.help}" for s in FORMATS.values())
                          + f". Default: chosen from {out}'s extension ("
                          + ", ".join(known_extensions()) + f"). Give it for an {out} "
                          "without one (tar and tfrecord then add theirs); an extension of "
                          "another format is refused."),
        click.option("--shard-size", metavar="N|SIZE", default=None,
                     help="/".join(sharded_formats()) + " only: a new shard every N "
                          "source images (10000; an image skipped as bad leaves its shard one "
                          "record short) or every SIZE bytes as stored (256MB; counted from "
                          "the source files' sizes before any image is read, so an estimate "
                          f"after --resize or --encoding). {out} may be a pattern: "
                          "out-%06d.tar or out-{000000..000099}.tar."),
        click.option("--split", metavar="NAME", default=None,
                     help="tar only: the split this output is in timm's dataset info, "
                          "_info.json in the shards' folder, which timm.data.create_dataset("
                          "'wds/NAME', root=FOLDER, split=NAME) reads. Each output packed "
                          "into one folder gets its own entry (pack train, then val: both "
                          f"are there). Default: {out}'s name without shard number and "
                          "extension (train-%06d.tar: train); timm takes a name with 'tar' "
                          "or '..' in it for a shard pattern, so such a name is refused "
                          "here, and such a default gets no entry."),
        click.option("--source-extensions", is_flag=True,
                     help="tar only: name each image member after its source file's "
                          "extension, lower-cased (IMG_1.JPEG: IMG_1.jpeg, b.tif: b.tif), "
                          "as earlier fastdata versions did, instead of one extension per "
                          "encoding (jpg, png, webp, ...). The default is what webdataset's "
                          ".to_tuple('jpg', 'cls'), timm and Hugging Face datasets look for; "
                          "keep the source's spelling only for readers that select members "
                          "by it (a pipeline written for such shards). The dataset's keys "
                          "keep the source names either way."),
        click.option("--resize", metavar="SHORT|HxW", default=None,
                     help="Resize at pack time: SHORT sets the shorter side (aspect kept), HxW "
                          "sets both (stretched, unless --center-crop)."),
        click.option("--center-crop", is_flag=True,
                     help="With --resize: scale to cover the target, then crop the centre "
                          "(--resize 224 --center-crop gives 224x224)."),
        click.option("--max-size", type=int, default=None, metavar="N",
                     help="Shrink images whose longer side exceeds N (never enlarges)."),
        click.option("--encoding", type=click.Choice(["keep", "jpeg", "png", "raw"]),
                     default="keep", show_default=True,
                     help="keep: original bytes (re-encoded in their own format only if "
                          "resized; raw pixels stay raw); jpeg/png: re-encode; raw: decoded "
                          "uint8 pixels, no decoding at read time (needs one image size: "
                          "--resize HxW or --resize N --center-crop)."),
        click.option("--quality", type=int, default=90, show_default=True,
                     help="JPEG quality when encoding JPEG."),
        click.option("--jpeg-restarts", is_flag=True,
                     help="Store JPEGs with a restart marker after every MCU (16x16 pixels "
                          "at 4:2:0), so that fastdata.RandomResizedCrop decodes only the "
                          "blocks a training crop covers; files grow by ~5%%. Re-encoded JPEGs "
                          "(--encoding jpeg, --resize) get them from the encoder; original "
                          "bytes are rewritten losslessly (the same pixels), which needs "
                          "libjpeg-turbo 3.1 or later (FASTDATA_TURBOJPEG)."),
        click.option("--workers", type=int, default=None, metavar="N",
                     help="Processes reading, checking and preprocessing images [default: "
                          "usable cores]. Every N gives the same files byte for byte, except "
                          "the manifest's created_at (and LMDB's lock.mdb)."),
        click.option("--overwrite", is_flag=True, help=f"Replace {out} if it exists."),
        click.option("--resume", is_flag=True,
                     help=f"Continue the interrupted run to {out} (Ctrl-C, kill, crash, "
                          "power loss): the pieces it finished (shards; for lmdb/hdf5 commits "
                          "of 1000 images) are checked and kept, the rest is written, and the "
                          "result is the one an uninterrupted run gives. Give the same input "
                          "and options (--workers may differ); a changed input or option is "
                          "refused. Without --resume, a run starts over and removes what an "
                          "interrupted one left."),
        click.option("--strict", is_flag=True,
                     help="Stop at the first corrupt or unreadable image (default: skip it and "
                          f"list it in the summary and in {out}.report.json, for tar/tfrecord "
                          "NAME.report.json beside NAME.fastdata.json)."),
        click.option("--verify-decode", is_flag=True,
                     help="Fully decode every image (slower; catches damage inside the "
                          "compressed data, not only truncation and bad headers; JPEGs that "
                          "libjpeg decodes only with a corrupt-data warning are skipped too)."),
        click.option("--max-pixels", type=int, default=None, metavar="N",
                     help="Skip (or under --strict refuse) images whose header declares more "
                          "than N pixels, before decoding them [default: 178956970, twice "
                          "Pillow's decompression-bomb limit]; 0 lifts the limit."),
        click.option("--shuffle", metavar="SEED", default=None,
                     help="Write the records in a random order drawn from SEED (a whole number "
                          ">= 0) instead of the input's (class by class for an image folder); "
                          "labels and keys travel with their "
                          "records, and the same SEED gives the same files. Use it when the "
                          "dataset is much larger than a streaming reader's shuffle window, or "
                          "when other tools (webdataset, DALI) will read the shards with only a "
                          "shuffle buffer: unshuffled, a window holds one or two classes. "
                          "Map-style reading (fastdata.Order(shuffle=True)) does not need it."),
        click.option("--keep-source-path", is_flag=True,
                     help="Record the input's absolute path (a URL without its credentials) "
                          "as the manifest's source.root; by default only its name is "
                          "recorded, so the packing machine's folders do not travel with "
                          "every copy of the dataset."),
        click.option("--allow-outside", is_flag=True,
                     help="Let the input's names lead out of its folder: a list's or "
                          "Parquet table's absolute or ../ paths, a dataset's links to files "
                          "elsewhere. Refused by default, so a list or dataset made by "
                          "someone else cannot make fastdata read other files; give it for "
                          "inputs of your own."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print the summary as JSON on stdout."),
        click.option("--progress/--no-progress", default=None,
                     help="Show a progress bar (default: when stderr is a terminal)."),
    )


def output_options(out: str = "OUTPUT"):
    """A decorator adding the shared options to a command whose output
    argument is named ``out``."""
    def add(func):
        for option in reversed(_options(out)):
            func = option(func)
        return func
    return add


def pack_options(*, format_, shard_size, resize, center_crop, max_size, encoding, quality,
                 workers, overwrite, resume, strict, verify_decode, max_pixels, shuffle,
                 extensions=None, jpeg_restarts=False, keep_source_path=False,
                 split=None, source_extensions=False):
    """The ``PackOptions`` the shared options ask for."""
    from fastdata.packers.options import PackOptions
    from fastdata.packers.preprocess import Preprocess, parse_resize
    from fastdata.packers.shuffle import parse_seed

    pre = Preprocess(resize=parse_resize(resize), center_crop=center_crop, max_size=max_size,
                     encoding=encoding, quality=quality, restarts=jpeg_restarts)
    limit = {} if max_pixels is None else {"max_pixels": max_pixels or None}
    # Only what was given: the manifest records writer options as passed.
    writer = {**({"split": split} if split is not None else {}),
              **({"source_extensions": True} if source_extensions else {})}
    return PackOptions(format=format_, overwrite=overwrite, strict=strict,
                       verify_decode=verify_decode, shard_size=shard_size, preprocess=pre,
                       workers=workers, extensions=extensions, shuffle=parse_seed(shuffle),
                       resume=resume, keep_source_path=keep_source_path,
                       writer_options=writer, **limit)


def echo_warning(msg: str) -> None:
    echo(f"warning: {msg}", err=True)


def echo_summary(summary, options, heading: str) -> None:
    """The summary after ``heading`` (what was done, to how many images)."""
    echo(f"{heading} into {summary.output} ({summary.format}) in "
               f"{summary.seconds:.1f} s, {summary.rate:,.0f} img/s")
    echo(f"  bytes in {human_bytes(summary.bytes_in)}, on disk "
               f"{human_bytes(summary.bytes_out)}; encodings "
               + ", ".join(f"{k} {v}" for k, v in summary.encodings.items()))
    if summary.files and summary.files != [summary.output]:
        echo(f"  {_files_line(summary.files)}")
    if options.shuffle is not None:
        echo(f"  order: shuffled with seed {options.shuffle}")
    if summary.ignored:
        _echo_ignored(summary.ignored, summary.ignored_extensions)
    if summary.renamed:
        _echo_renamed(summary.renamed)
    if summary.skipped:
        echo(f"  skipped {len(summary.skipped)} bad image(s):")
        for item in summary.skipped[:10]:
            echo(f"    {item.key}: {item.reason}")
        if len(summary.skipped) > 10:
            echo(f"    ... and {len(summary.skipped) - 10} more")
    if summary.report:
        echo(f"  report: {summary.report}")


def images_text(summary) -> str:
    """``N images in C classes`` (or ``N unlabelled images``)."""
    return (f"{summary.records} images in {summary.classes} classes" if summary.classes
            else f"{summary.records} unlabelled images")


def _echo_ignored(count: int, by_extension: dict[str, int]) -> None:
    """The ignored count, with the extensions left out (they are what --extensions adds)."""
    echo(f"  ignored {count} hidden, stray or other-extension file(s)")
    if by_extension:
        echo("    extensions not packed: "
                   + ", ".join(f".{ext} {n}" if ext else f"(none) {n}"
                               for ext, n in by_extension.items())
                   + " (--extensions +EXT packs them too)")


def _echo_renamed(renamed) -> None:
    """Records stored under another tar member key than their own (the dataset keys
    stay the originals); the full list is in --json and the report file."""
    echo(f"  renamed {len(renamed)} tar member key(s) (dataset keys unchanged; all in "
               f"the report):")
    for item in renamed[:5]:
        echo(f"    {item.key} -> {item.stored_as}")
    if len(renamed) > 5:
        echo(f"    ... and {len(renamed) - 5} more")


def _files_line(files: list[str]) -> str:
    """What a sharded pack wrote, by name (the first and last few of many)."""
    names = [os.path.basename(f) for f in files]
    if len(names) > 9:
        names = names[:4] + ["..."] + names[-4:]
    return f"wrote {len(files)} files in {os.path.dirname(files[0])}: {', '.join(names)}"

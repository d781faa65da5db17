"""``fastdata pack``."""

from __future__ import annotations

import click

from fastdata.cli.group import _handle_errors, _print_json, main
from fastdata.cli.packing import (PackingCommand, echo_summary, echo_warning, images_text,
                                  output_options, pack_options)
from fastdata.encodings import TORCHVISION_EXTENSIONS


@main.command(cls=PackingCommand,
              short_help="Pack an image folder, list or Parquet into a dataset.")
@click.argument("source", type=click.Path(file_okay=True, dir_okay=True, path_type=str))
@click.argument("output", type=click.Path(path_type=str))
@output_options()
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
                   ".csv/.tsv/.jsonl list its file path, relative to the list's folder "
                   "(and inside it, unless --allow-outside) [default: path]; in Parquet the "
                   "image struct (bytes, path), its bytes or its path [default: image].")
@click.option("--label-column", metavar="NAME", default=None,
              help="For a list or Parquet SOURCE: the column holding the labels, class names "
                   "(classes: the sorted names) or integers (kept as given; classes \"0\" to "
                   "the largest) [default: label, when there is one; without a label column "
                   "the records are unlabelled: label -1, no classes].")
@_handle_errors
def pack(source, output, scheduler, extensions, path_column, label_column, **shared):
    """Pack the image folder (or list, or Parquet) SOURCE into the dataset OUTPUT.

    SOURCE holds one sub-folder per class (the torchvision ImageFolder layout);
    images are found recursively inside each class folder, with torchvision's
    extensions unless --extensions says otherwise. Labels are the indices of
    the sorted class names, as torchvision assigns them. SOURCE may also be a
    list of image files (.csv, .tsv: a header row naming a path column and
    optionally a label column; .jsonl: one JSON object per line), or a .parquet
    file or folder of them in the Hugging Face image layout; their other
    columns are kept as each record's metadata. A packed dataset as SOURCE
    (.lmdb, .h5, .tar, .tfrecord) is converted: see fastdata convert. By default
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
    from fastdata.packers.pack import pack as run_pack
    from fastdata.packers.sources.dispatch import open_source

    options = pack_options(output, shared, extensions=extensions)
    allow_outside = shared["allow_outside"]
    if path_column is not None or label_column is not None or allow_outside:
        source = open_source(source, path_column=path_column, label_column=label_column,
                             extensions=extensions, allow_outside=allow_outside)
    summary = run_pack(source, output, options=options, progress=shared["progress"],
                       on_event=echo_warning, scheduler=scheduler)
    if shared["as_json"]:
        _print_json(summary.to_dict())
        return
    echo_summary(summary, options, f"packed {images_text(summary)}")

"""``fastdata pack``."""

from __future__ import annotations


import click

from fastdata.cli.cluster import cluster_options
from fastdata.cli.group import _handle_errors, _print_json, echo, main
from fastdata.cli.packing import (PackingCommand, echo_summary, echo_warning, images_text,
                                  output_options, pack_options)
from fastdata.encodings import TORCHVISION_EXTENSIONS
from fastdata.errors import FastDataError


@main.command(cls=PackingCommand,
              short_help="Pack an image folder, list or Parquet into a dataset.")
@click.argument("source", type=click.Path(file_okay=True, dir_okay=True, path_type=str))
@click.argument("output", type=click.Path(path_type=str))
@output_options()
@cluster_options
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
@click.option("--append", "append_", is_flag=True,
              help="Add SOURCE's images to the existing dataset OUTPUT as a new version "
                   "(new shards or a new part; nothing existing is rewritten). Keys it "
                   "holds already are refused; new classes go at the end of its list. "
                   "Give the options of the first pack. The keys are checked in pieces, on "
                   "--workers processes or on --scheduler/--ray (the new part is packed "
                   "there too), with memory per process that does not grow with the "
                   "dataset; --resume continues an interrupted append.")
@click.option("--skip-existing", is_flag=True,
              help="With --append: pass over SOURCE's images whose key OUTPUT holds, "
                   "instead of refusing them.")
@click.option("--label-column", metavar="NAME", default=None,
              help="For a list or Parquet SOURCE: the column holding the labels, class names "
                   "(classes: the sorted names) or integers (kept as given; classes \"0\" to "
                   "the largest) [default: label, when there is one; without a label column "
                   "the records are unlabelled: label -1, no classes].")
@_handle_errors
def pack(source, output, scheduler, ray, extensions, path_column, label_column, append_,
         skip_existing, **shared):
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

    
    With --append, SOURCE's images join the dataset OUTPUT as a new version:
      fastdata pack new-images/ train.lmdb --append
      fastdata info train.lmdb --history
    """
    from fastdata.packers.pack import pack as run_pack
    from fastdata.packers.sources.dispatch import open_source

    options = pack_options(output, shared, extensions=extensions)
    allow_outside = shared["allow_outside"]
    if path_column is not None or label_column is not None or allow_outside:
        source = open_source(source, path_column=path_column, label_column=label_column,
                             extensions=extensions, allow_outside=allow_outside)
    if skip_existing and not append_:
        raise FastDataError("--skip-existing applies to --append")
    if append_:
        _append(source, output, options, skip_existing, shared,
                {"scheduler": scheduler, "ray": ray})
        return
    summary = run_pack(source, output, options=options, progress=shared["progress"],
                       on_event=echo_warning, scheduler=scheduler, ray=ray)
    if shared["as_json"]:
        _print_json(summary.to_dict())
        return
    echo_summary(summary, options, f"packed {images_text(summary)}")


def _append(source, output, options, skip_existing: bool, shared: dict,
            cluster: dict) -> None:
    """``--append``: the key check runs as a job (on ``--scheduler``/``--ray``
    when given, else on ``--workers`` processes; ``--resume`` continues it and
    the pack), and the new part is packed there too."""
    from fastdata.ops.append import append

    if options.overwrite:
        raise FastDataError("--append adds to OUTPUT; --overwrite would replace it: give one")
    result = append(source, output, options=options, skip_existing=skip_existing,
                    progress=shared["progress"], on_event=echo_warning,
                    allow_outside=shared["allow_outside"], workers=options.workers,
                    resume=bool(options.resume), **cluster)
    if shared["as_json"]:
        _print_json(result.to_dict())
        return
    echo(f"appended {result.added:,} images to {output}: version {result.version}, "
         f"{result.records:,} records")
    if result.rebased:
        echo(f"  recorded after {result.rebased} version(s) another writer made meanwhile")
    if result.new_classes:
        echo(f"  new classes (at the end of the list): {', '.join(result.new_classes)}")
    if result.skipped_existing:
        echo(f"  passed over {result.skipped_existing:,} image(s) whose key it holds: "
             f"{', '.join(result.skipped_keys[:5])}"
             f"{' ...' if result.skipped_existing > 5 else ''}")
    echo_summary(result.summary, options, "packed the new part")

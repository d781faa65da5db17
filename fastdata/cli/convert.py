"""``fastdata convert``."""

from __future__ import annotations

import click

from fastdata.cli.cluster import cluster_options
from fastdata.cli.group import _handle_errors, _print_json, main
from fastdata.cli.packing import (PackingCommand, echo_summary, echo_warning, images_text,
                                  output_options, pack_options)


@main.command(cls=PackingCommand, short_help="Convert a dataset into another format.")
@click.argument("input_", metavar="IN", type=click.Path(path_type=str))
@click.argument("output", metavar="OUT", type=click.Path(path_type=str))
@output_options("OUT")
@cluster_options
@_handle_errors
def convert(input_, output, scheduler, ray, **shared):
    """Convert the dataset IN into the dataset OUT, in the format OUT's name gives.

    IN is any dataset fastdata reads: an LMDB folder, an .h5 file, a tar or
    TFRecord dataset (its NAME.fastdata.json, a shard, or a shard pattern such
    as out-%06d.tar), or tars and TFRecords written by other tools (webdataset,
    TensorFlow, the tfrecord package; their classes are the label numbers).
    Without --resize, --max-size or --encoding every record is carried over bit
    for bit: its stored bytes (raw pixels stay raw), label, key and metadata,
    with the classes and the record order. With them, images are decoded and
    processed as fastdata pack does. OUT must not be IN.

    \b
    Examples:
      fastdata convert train.lmdb train-%06d.tar --shard-size 256MB
      fastdata convert train-{000000..000099}.tar train.h5
      fastdata convert theirs.tfrecord train.lmdb
      fastdata convert train.lmdb train-224.lmdb --resize 224 --center-crop --encoding raw
      fastdata convert train.h5 shuffled-%06d.tar --shard-size 1GB --shuffle 0
      fastdata convert train.lmdb train-%06d.tar --ray HOST:6379

    Nothing is left half-written: OUT appears only when complete, and an
    interrupted convert continues with the same command and --resume.
    """
    from fastdata.packers.convert import convert as run_convert
    from fastdata.packers.sources.dataset import DatasetSource

    options = pack_options(output, shared)
    source = DatasetSource(input_, allow_outside=shared["allow_outside"])
    summary = run_convert(source, output, options=options, progress=shared["progress"],
                          on_event=echo_warning, scheduler=scheduler, ray=ray)
    if shared["as_json"]:
        _print_json(summary.to_dict())
        return
    echo_summary(summary, options, f"converted {images_text(summary)} from {source.root} "
                                   f"({source.format})")

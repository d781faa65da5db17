"""``fastdata subset``: a view selecting records of a dataset, without copying them."""

from __future__ import annotations

import click

from fastdata.cli.cluster import job_options
from fastdata.cli.group import (
    _handle_errors,
    _print_json,
    allow_outside_option,
    echo,
    main,
)


@main.command(short_help="Write a view: records of a dataset selected without copying them.")
@click.argument("dataset", type=click.Path(path_type=str))
@click.argument("view", type=click.Path(path_type=str))
@click.option("--classes", metavar="A,B", help="Keep the records of these classes.")
@click.option("--keys", "keys_file", type=click.Path(exists=True, dir_okay=False),
              metavar="FILE", help="Keep only the records whose key is listed in FILE (one "
                                   "key per line).")
@click.option("--exclude-keys", "exclude_file", type=click.Path(exists=True, dir_okay=False),
              metavar="FILE", help="Drop the records whose key is listed in FILE.")
@click.option("--where", metavar="EXPR",
              help="Keep the records whose metadata passes EXPR, for example "
                   "'width >= 256 and source == \"web\"' (names: metadata fields, key, "
                   "label, class; no function calls).")
@click.option("--fraction", type=click.FloatRange(0, 1, min_open=True), metavar="F",
              help="Then keep exactly round(F x N) of the N records left, drawn with --seed.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="Seed of --fraction's draw.")
@click.option("--stratify", is_flag=True,
              help="Draw --fraction of each class, so class shares stay as they were.")
@click.option("--exclude", multiple=True, metavar="DATASET",
              help="Drop the records whose bytes DATASET holds too (a validation set; "
                   "repeat for more). Every record of both is read and hashed.")
@click.option("--overwrite", is_flag=True, help="Replace an existing view file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar.")
@allow_outside_option
@job_options
@_handle_errors
def subset(dataset, view, classes, keys_file, exclude_file, where, fraction, seed, stratify,
           exclude, overwrite, as_json, progress, allow_outside, workers, resume, scheduler,
           ray):
    """Write VIEW (NAME.fastdata.json, in DATASET's folder or above it): a view
    that selects the records of DATASET passing every option given. No
    payload is copied; the selection is stored as ranges or a bitmap.

    A view opens like a dataset everywhere: open_dataset, streams, loader(),
    DALI, mix, info, verify, bench, and convert VIEW OUT to make a copy of
    its records. A subset of a view selects from the view's parent.

    The records are checked in pieces, on --workers processes of this machine
    or on a cluster (--scheduler, --ray); the view is the same, byte for
    byte, wherever they ran, and --resume continues an interrupted run. What
    grows with DATASET's records: one bit per record for the selection this
    machine writes; each process also holds the key lists given.

    \b
    Examples:
      fastdata subset train.lmdb cats.fastdata.json --classes cat,lynx
      fastdata subset train.tar.fastdata.json train-10.fastdata.json \\
          --fraction 0.1 --stratify
      fastdata subset train.lmdb clean.fastdata.json --exclude val.lmdb
      fastdata subset train.tar web.fastdata.json --where 'source == "web"' \\
          --scheduler tcp://HOST:8786
    """
    from fastdata.ops.subset import read_key_list
    from fastdata.ops.subset import subset as make

    result = make(dataset, view,
                  classes=[c.strip() for c in classes.split(",") if c.strip()]
                  if classes else None,
                  keys=read_key_list(keys_file) if keys_file else None,
                  exclude_keys=read_key_list(exclude_file) if exclude_file else None,
                  where=where, fraction=fraction, seed=seed, stratify=stratify,
                  exclude=exclude, overwrite=overwrite, progress=progress,
                  allow_outside=allow_outside, workers=workers, resume=resume,
                  scheduler=scheduler, ray=ray,
                  on_event=lambda note: echo(f"note: {note}", err=True))
    if as_json:
        _print_json(result.to_dict())
        return
    share = result.records / result.parent_records
    echo(f"wrote {result.path}: {result.records:,} of {result.parent_records:,} records of "
         f"{result.parent} ({share:.1%})")
    if result.excluded_by_content:
        echo(f"  {result.excluded_by_content:,} record(s) dropped: their bytes are in "
             f"{', '.join(exclude)}")
    if result.missing_count:
        echo(f"  {result.missing_count:,} listed key(s) are not in the dataset: "
             f"{', '.join(result.missing_keys[:5])}{' ...' if result.missing_count > 5 else ''}")

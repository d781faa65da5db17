"""``fastdata gc`` (remove what nothing uses from a dataset's history) and
``fastdata join`` (columns from a table, as a new version)."""

from __future__ import annotations

import click

from fastdata.cli.cluster import job_options
from fastdata.cli.group import _handle_errors, _print_json, echo, main


@main.command(short_help="Remove what nothing can use from a dataset's history.")
@click.argument("dataset", type=click.Path(path_type=str))
@click.option("--keep", type=click.IntRange(1), default=None, metavar="N",
              help="Also remove versions older than the N latest (the current one and "
                   "those a view was made from stay). Without it no version is removed.")
@click.option("--grace", default="24h", show_default=True, metavar="DURATION",
              help="Keep unrecorded files younger than this (an append or join may still "
                   "be writing them): 90s, 30m, 24h, 7d, or 0.")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_handle_errors
def gc(dataset, keep, grace, dry_run, as_json):
    """Remove from DATASET's history the part and column files that no kept
    version and no known view uses (left by refused or interrupted changes,
    or by versions removed), once older than --grace. With --keep N, also
    remove the versions older than the N latest. Kept always: the current
    version, versions a view was made from, the first pack's own files, and
    anything reached through a symbolic link (gc never follows one).

    \b
    Examples:
      fastdata gc train.lmdb --dry-run           # what would go
      fastdata gc train.lmdb                     # unrecorded files, older than a day
      fastdata info train.lmdb --history
      fastdata gc train.lmdb --keep 2            # and versions but the 2 latest
    """
    from fastdata.ops.gc import gc as collect

    result = collect(dataset, keep=keep, grace=_seconds(grace), dry_run=dry_run)
    if as_json:
        _print_json(result.to_dict())
        return
    verb = "would remove" if dry_run else "removed"
    echo(f"{dataset}: kept version(s) {_numbers(result.kept) or 'none recorded'}; {verb} "
         f"{len(result.removed_versions)} version(s)"
         + (f" ({_numbers(result.removed_versions)})" if result.removed_versions else "")
         + f" and {len(result.removed_files)} unused part or column file(s)")
    for path in result.removed_files[:20]:
        echo(f"  {verb}: {path}")
    if len(result.removed_files) > 20:
        echo(f"  ... {len(result.removed_files) - 20} more (--json lists all)")
    if result.young:
        echo(f"  kept {len(result.young)} unrecorded file(s) younger than {grace} "
             f"(a change may be writing them)")
    for link in result.links[:5]:
        echo(f"  not followed (a symbolic link): {link}")


def _numbers(found: list[int]) -> str:
    if len(found) > 8:
        return f"{found[0]}-{found[-1]}"
    return ", ".join(map(str, found))


def _seconds(text: str) -> float:
    """``90s``, ``30m``, ``24h``, ``7d`` or a number of seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a duration (90s, 30m, 24h, 7d)",
                                 param_hint="--grace") from None


@main.command(short_help="Join per-record columns from a table (captions, embeddings, labels).")
@click.argument("dataset", type=click.Path(path_type=str))
@click.argument("table", type=click.Path(exists=True, dir_okay=False, path_type=str))
@click.option("--key", required=True, metavar="COLUMN",
              help="The table's column holding each record's key (fastdata info shows "
                   "how keys look: the image's path relative to the packed folder).")
@click.option("--columns", metavar="A,B", default=None,
              help="The columns to join (default: all but --key and --label-column).")
@click.option("--label-column", metavar="COLUMN", default=None,
              help="A column of class names that become the records' new labels; names "
                   "the dataset lacks are added at the end of its classes.")
@click.option("--types", "types", metavar="NAME=TYPE,...", multiple=True,
              help="How columns are read: int, float, float32, bool, str or json (e.g. "
                   "score=float,id=int). Without it CSV/TSV cells stay text; JSON Lines "
                   "and Parquet keep their own types.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--allow-outside", is_flag=True, hidden=True)
@job_options
@_handle_errors
def join(dataset, table, key, columns, label_column, types, as_json, allow_outside, workers,
         resume, scheduler, ray):
    """Join the columns of TABLE (.csv, .tsv, .jsonl or .parquet) to the
    records of DATASET by key, as a new version of DATASET: the columns are
    stored beside it (with checksums) and its records are not touched.

    Read them with with_metadata=True: each sample's metadata holds its
    values. Table keys the dataset lacks, and records the table has no row
    for, are reported. Values keep their types: CSV/TSV cells are text
    unless --types names their column; JSON Lines and Parquet values keep
    their own (ints int64, floats float64, lists of numbers vectors). The
    table must be UTF-8.

    \b
    Examples:
      fastdata join train.lmdb captions.jsonl --key path
      fastdata join train.lmdb scores.csv --key path --types score=float,id=int
      fastdata join train.tar.fastdata.json fixed.csv --key path --label-column label
      fastdata join train.tar captions.jsonl --key path --scheduler tcp://HOST:8786
    """
    from fastdata.ops.join import join as run

    result = run(dataset, table, key=key, label_column=label_column,
                 columns=[c.strip() for c in columns.split(",") if c.strip()]
                 if columns else None, types=_types(types), allow_outside=allow_outside,
                 workers=workers, resume=resume, scheduler=scheduler, ray=ray,
                 on_event=lambda note: echo(f"note: {note}", err=True))
    if as_json:
        _print_json(result.to_dict())
        return
    kinds = ", ".join(f"{name} ({spec['kind']})" for name, spec in result.columns.items())
    echo(f"joined {kinds or 'labels'} to {dataset}: version {result.version}, "
         f"{result.matched:,} records matched")
    if result.relabelled or result.new_classes:
        echo(f"  {result.relabelled:,} label(s) changed"
             + (f"; new classes: {', '.join(result.new_classes)}" if result.new_classes
                else ""))
    if result.missing_in_table:
        echo(f"  {result.missing_in_table:,} record(s) have no row in the table: "
             f"{', '.join(result.missing_keys[:5])}"
             f"{' ...' if result.missing_in_table > 5 else ''}")
    if result.missing_in_dataset:
        echo(f"  {result.missing_in_dataset:,} table key(s) are not in the dataset: "
             f"{', '.join(result.unknown_keys[:5])}"
             f"{' ...' if result.missing_in_dataset > 5 else ''}")


def _types(given: tuple[str, ...]) -> dict[str, str]:
    """``--types a=int,b=float`` (the option may be given more than once)."""
    out = {}
    for text in given:
        for item in (t.strip() for t in text.split(",")):
            name, sep, kind = item.rpartition("=")
            if not item:
                continue
            if not sep or not name.strip():
                raise click.BadParameter(f"{item!r} is not NAME=TYPE (e.g. score=float)",
                                         param_hint="--types")
            out[name.strip()] = kind.strip()
    return out

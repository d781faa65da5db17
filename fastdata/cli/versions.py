"""``fastdata gc`` (remove old versions of a dataset) and ``fastdata join`` (columns
from a table, as a new version)."""

from __future__ import annotations

import click

from fastdata.cli.group import _handle_errors, _print_json, echo, main


@main.command(short_help="Remove old versions of a dataset and the files only they use.")
@click.argument("dataset", type=click.Path(path_type=str))
@click.option("--keep", type=click.IntRange(1), default=1, show_default=True, metavar="N",
              help="Keep the N latest versions (the current one always stays).")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_handle_errors
def gc(dataset, keep, dry_run, as_json):
    """Remove the versions of DATASET older than the --keep latest, then the
    parts and column files that no kept version uses. Versions that a view
    file in DATASET's folder names are kept too; the first pack's own files
    are never removed. Old versions go only through this command.

    \b
    Examples:
      fastdata info train.lmdb --history
      fastdata gc train.lmdb --keep 2 --dry-run
    """
    from fastdata.ops.gc import gc as collect

    result = collect(dataset, keep=keep, dry_run=dry_run)
    if as_json:
        _print_json(result.to_dict())
        return
    verb = "would remove" if dry_run else "removed"
    echo(f"{dataset}: kept version(s) {', '.join(map(str, result.kept))}; {verb} "
         f"{len(result.removed_versions)} version(s) and {len(result.removed_files)} file(s)")
    for path in result.removed_files[:20]:
        echo(f"  {path}")


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
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--allow-outside", is_flag=True, hidden=True)
@_handle_errors
def join(dataset, table, key, columns, label_column, as_json, allow_outside):
    """Join the columns of TABLE (.csv, .tsv, .jsonl or .parquet) to the
    records of DATASET by key, as a new version of DATASET: the columns are
    stored beside it (with checksums) and its records are not touched.

    Read them with with_metadata=True: each sample's metadata holds its
    values. Table keys the dataset lacks, and records the table has no row
    for, are reported.

    \b
    Examples:
      fastdata join train.lmdb captions.jsonl --key path
      fastdata join train.tar.fastdata.json fixed.csv --key path --label-column label
    """
    from fastdata.ops.join import join as run

    result = run(dataset, table, key=key, label_column=label_column,
                 columns=[c.strip() for c in columns.split(",") if c.strip()]
                 if columns else None, allow_outside=allow_outside)
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

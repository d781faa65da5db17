"""``fastdata gc``: remove old versions of a dataset."""

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
    from fastdata.versions.gc import gc as collect

    result = collect(dataset, keep=keep, dry_run=dry_run)
    if as_json:
        _print_json(result.to_dict())
        return
    verb = "would remove" if dry_run else "removed"
    echo(f"{dataset}: kept version(s) {', '.join(map(str, result.kept))}; {verb} "
         f"{len(result.removed_versions)} version(s) and {len(result.removed_files)} file(s)")
    for path in result.removed_files[:20]:
        echo(f"  {path}")

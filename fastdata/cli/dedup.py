"""``fastdata dedup``: exact duplicates, and what a dataset shares with others."""

from __future__ import annotations

import sys

import click

from fastdata.cli.cluster import job_options
from fastdata.cli.group import _handle_errors, _print_json, allow_outside_option, echo, main

#: Groups listed in the text report (``--json`` lists all).
SHOWN = 20


@main.command(short_help="Find exact duplicates, and records shared with other datasets.")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--against", "against", multiple=True, metavar="OTHER",
              help="Another dataset (any format, local or a URL; repeat for more): list "
                   "the records of PATH whose bytes it holds too, such as validation "
                   "images in a training set.")
@click.option("--near", is_flag=True,
              help="Find near-duplicates: images that look the same though their bytes "
                   "differ (resized, re-encoded, lightly cropped). Every record is decoded "
                   "small and hashed (a 63-bit DCT hash).")
@click.option("--threshold", type=click.IntRange(0, 24), default=None, metavar="BITS",
              help="With --near: the most bits two hashes may differ in (default 8; "
                   "re-encoded or resized copies differ by 0-4, unrelated photos by 16 "
                   "or more).")
@click.option("--flip", is_flag=True, help="With --near: a mirrored copy counts too.")
@click.option("--fail-on-shared", is_flag=True,
              help="Exit 1 when PATH shares a record with an --against dataset (for a "
                   "check in a pipeline).")
@click.option("--write-view", "write_view", metavar="VIEW",
              help="Write a view (NAME.fastdata.json, beside PATH) without the duplicates: "
                   "the first record of each group stays; with --against, records shared "
                   "with those datasets go too.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --write-view file.")
@click.option("--json", "as_json", is_flag=True, help="Print every group as JSON.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar.")
@allow_outside_option
@job_options
@_handle_errors
def dedup(path, against, near, threshold, flip, fail_on_shared, write_view, overwrite,
          as_json, progress, allow_outside, workers, resume, scheduler, ray):
    """Find the records of PATH with the same stored bytes (exact duplicates),
    grouped, each record by index and key; with --against, the records PATH
    shares with other datasets; with --near, images that look the same.

    Every record is read once and checked against its CRC32. Bytes are
    compared as stored: a resized or re-encoded copy is not an exact
    duplicate, but --near finds it.

    \b
    Examples:
      fastdata dedup train.lmdb
      fastdata dedup train.lmdb --against val.lmdb --against test.lmdb
      fastdata dedup train.lmdb --against val.lmdb --write-view clean.fastdata.json
      fastdata dedup train.lmdb --near --flip
      fastdata dedup train.tar --scheduler tcp://HOST:8786
    """
    from fastdata.duplicates import dedup as find

    report = find(path, against=against, near=near, threshold=threshold, flip=flip,
                  progress=progress, allow_outside=allow_outside, workers=workers,
                  resume=resume, scheduler=scheduler, ray=ray, on_event=lambda note: echo(f"note: {note}", err=True))
    written = None
    if write_view:
        from fastdata.ops.subset import subset

        written = subset(path, write_view, exclude_indices=report.to_drop(),
                         overwrite=overwrite, progress=progress, allow_outside=allow_outside)
    if as_json:
        _print_json({**report.to_dict(), **({"view": written.to_dict()} if written else {})})
    else:
        _print_report(report)
        if written is not None:
            echo(f"wrote {written.path}: {written.records:,} of {written.parent_records:,} "
                 f"records (without {len(report.to_drop()):,})")
    if fail_on_shared and report.shared():
        sys.exit(1)


def _print_report(report) -> None:
    names = report.datasets

    def member(m) -> str:
        where = "" if m.dataset == 0 else f"{names[m.dataset]}: "
        return f"{where}{m.key if m.key is not None else '(no key)'} ({m.index})"

    within = report.within()
    what = "exact duplicates" if report.near_threshold is None else (
        f"near-duplicates (hashes within {report.near_threshold} bits"
        f"{', mirrored too' if report.flip else ''})")
    echo(f"{names[0]}: {report.records[0]:,} records, {len(within)} group(s) of {what}, "
         f"{report.redundant()} record(s) beyond the first of each")
    for group in within[:SHOWN]:
        note = "" if report.near_threshold is None else \
            (" (same bytes)" if group.kind == "exact" else f" ({group.distance} bits)")
        echo("  " + ", ".join(member(m) for m in group.members if m.dataset == 0) + note)
    if len(within) > SHOWN:
        echo(f"  ... {len(within) - SHOWN} more (--json lists all)")
    for number, other in enumerate(names[1:], 1):
        shared = [g for g in report.shared() if number in g.datasets()]
        mine = sum(sum(m.dataset == 0 for m in g.members) for g in shared)
        holds = "hold bytes it holds too" if report.near_threshold is None else \
            "look like records it holds"
        echo(f"against {other} ({report.records[number]:,} records): {mine} record(s) of "
             f"{names[0]} {holds}")
        for group in shared[:SHOWN]:
            echo("  " + " = ".join(member(m) for m in group.members
                                   if m.dataset in (0, number)))
        if len(shared) > SHOWN:
            echo(f"  ... {len(shared) - SHOWN} more (--json lists all)")

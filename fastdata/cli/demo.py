"""``fastdata synth``: demo data."""

from __future__ import annotations

import sys

import click

from fastdata.cli.group import _handle_errors, _print_json, echo, main
from fastdata.machine import human_bytes


@main.command(short_help="Write a demo image folder of photo-like JPEGs.")
@click.argument("directory", type=click.Path(path_type=str))
@click.option("--kind", type=click.Choice(["photos", "tiny"]), default="photos", show_default=True,
              help="photos: ImageNet-like JPEGs (300-640 px a side); tiny: 32x32 PNGs like CIFAR.")
@click.option("-n", "--count", "n", type=int, default=None,
              help="Number of images [default: 512 photos, 2048 tiny].")
@click.option("--classes", type=int, default=None, help="Number of classes [default: 8 photos, 10 tiny].")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same bytes.")
@click.option("--overwrite", is_flag=True, help="Write into a non-empty DIRECTORY.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar.")
@_handle_errors
def synth(directory, kind, n, classes, seed, overwrite, as_json, progress):
    """Write a demo image folder (one sub-folder per class) into DIRECTORY."""
    from fastdata.demo import synthesize

    try:
        summary = synthesize(directory, kind=kind, n=n, classes=classes, seed=seed,
                             progress=progress, overwrite=overwrite)
    except ValueError as exc:  # an out-of-range option: one line, like every other error
        echo(f"error: {exc}", err=True)
        sys.exit(1)
    if as_json:
        _print_json(summary.to_dict())
        return
    echo(f"wrote {summary.describe()} to {summary.root} "
               f"({human_bytes(summary.bytes)}, mean {summary.mean_width:.0f}x"
               f"{summary.mean_height:.0f}, "
               f"{human_bytes(summary.mean_bytes)} each) in {summary.seconds:.1f} s")

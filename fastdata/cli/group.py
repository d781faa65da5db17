"""The ``fastdata`` command group and what its commands share: one-line errors
(library option names in CLI terms), output without credentials, JSON output."""

from __future__ import annotations

import functools
import json
import re
import sys

import click

from fastdata import __version__
from fastdata.errors import FastDataError
from fastdata.redaction import redact

# Library errors name options as the Python API spells them ("overwrite=True",
# "resize="); on the command line the same option is a flag. A message may give
# both, "near=True (CLI: --near)": the command line shows the flag alone.
_BOTH = re.compile(r"\b\w+=\S*? \(CLI: ([^()]+)\)")
_FLAG_PHRASES = (
    ("overwrite=True", "--overwrite"),
    ("strict=True", "--strict"),
    ("center_crop=True", "--center-crop"),
    ("resize=(h, w)", "--resize HxW"),
    ("resize=N", "--resize N"),
    ("encoding='raw'", "--encoding raw"),
    ("max_pixels=None", "--max-pixels 0"),
    ("skip_existing=True", "--skip-existing"),
    ("allow_outside=True", "--allow-outside"),
    ("near=True", "--near"),
    ("path with version=", "path with --at-version N"),
)
_FLAG_NAMES = re.compile(
    r"\b(shard_size|max_size|max_pixels|center_crop|quality|workers|resize|format|extensions"
    r"|shuffle|path_column|label_column|scheduler|threshold|flip|fraction)=\s?")
# A flag followed by itself in brackets, once the API spelling became the flag.
_REPEATED = re.compile(r"(--[\w-]+) \(\1\)")


def cli_terms(message: str) -> str:
    """A library message with its Python option names turned into CLI flags."""
    message = _BOTH.sub(r"\1", message)
    for api, flag in _FLAG_PHRASES:
        message = message.replace(api, flag)
    message = _FLAG_NAMES.sub(lambda m: "--" + m.group(1).replace("_", "-") + " ", message)
    return _REPEATED.sub(r"\1", message)


def echo(text: str = "", *, err: bool = False) -> None:
    """Print a line of the CLI's output; a URL's credentials never show (see
    fastdata.redaction)."""
    click.echo(redact(str(text)), err=err)


def _handle_errors(func):
    """One-line errors and clean exits instead of tracebacks."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except FastDataError as exc:
            echo(f"error: {cli_terms(str(exc))}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            # An interrupted pack has said what it kept for --resume.
            echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


#: ``--allow-outside`` of the commands that read a dataset (info, verify, dedup).
allow_outside_option = click.option(
    "--allow-outside", is_flag=True,
    help="Follow symbolic links in the dataset's folder that lead out of it "
         "(shards spread over disks by links you made). Refused by default: a "
         "dataset from elsewhere must not make fastdata read other files.")


def _print_json(data) -> None:
    echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fastdata")
def main() -> None:
    """Pack image folders into fast containers and feed them to PyTorch.

    \b
    Try it on built-in demo data:
      fastdata bench --demo               # every format against a plain image folder
      fastdata synth demo                 # a folder of photo-like JPEGs in 8 classes
      fastdata pack demo demo.lmdb        # pack it (format from the extension)
      fastdata convert demo.lmdb demo.tar # the same records in another format
      fastdata info demo.lmdb             # what is inside

    Then in Python: ds = fastdata.open_dataset("demo.lmdb").
    """

"""What ``fastdata pack`` and ``fastdata convert`` share: the options that say
how the output is written (with every registered format's writer options,
from its ``FormatSpec.options``), the ``PackOptions`` they make, and the
summary printed at the end."""

from __future__ import annotations

import functools
import os

import click

from fastdata.cli.group import cli_terms, echo
from fastdata.cli.sections import SectionedCommand
from fastdata.errors import FastDataError
from fastdata.formats import FORMATS, format_for_output, known_extensions, sharded_formats
from fastdata.formats import writer_options as offered_writer_options
from fastdata.machine import human_bytes


class PackingCommand(SectionedCommand):
    """A command with the shared output options: the registered formats'
    writer options join them after ``--shard-size``. They are read from the
    registry each time the command runs or prints its help, so a format
    registered after this module was imported has its options too. Its
    --help lists the options in sections (pack's own options among them)."""

    sections = (
        ("Input", ("extensions", "path_column", "label_column", "allow_outside")),
        ("Output and format", ("format_", "shard_size", "overwrite", "shuffle",
                               "keep_source_path")),
        ("Preprocessing", ("resize", "center_crop", "max_size", "encoding", "quality",
                           "jpeg_restarts")),
        ("Checks", ("strict", "verify_decode", "max_pixels")),
        ("Resume and append", ("resume", "append_", "skip_existing")),
        ("Performance", ("workers",)),
        ("Cluster", ("scheduler", "ray")),
    )

    def help_sections(self, ctx: click.Context) -> tuple:
        """The sections, with the formats' writer options after --shard-size."""
        writers = tuple(option.name for option in _writer_click_options())
        return tuple((title, names[:2] + writers + names[2:]) if "format_" in names
                     else (title, names) for title, names in self.sections)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        extra = _writer_click_options()
        taken = {p.name for p in params} | {opt for p in params for opt in p.opts}
        for option in extra:
            if option.name in taken or option.opts[0] in taken:
                raise ValueError(f"{option.opts[0]}, a writer option of {_owners(option.name)}, "
                                 f"is also an option of 'fastdata {self.name}': rename it")
        at = next((i + 1 for i, p in enumerate(params) if p.name == "shard_size"), len(params))
        return [*params[:at], *extra, *params[at:]]


def _writer_click_options() -> tuple[click.Option, ...]:
    """One click option per writer option name in the registry."""
    return _click_options(tuple(tuple((spec.name, option) for spec, option in offered)
                                for offered in offered_writer_options().values()))


@functools.lru_cache(maxsize=1)  # the same objects while the registry stays as it is
def _click_options(declared: tuple) -> tuple[click.Option, ...]:
    return tuple(_click_option(pairs) for pairs in declared)


def _click_option(pairs: tuple) -> click.Option:
    """The one ``--NAME`` of the formats in ``pairs`` ((format name, WriterOption):
    every format with a writer option of that name)."""
    option = pairs[0][1]
    helps = {o.help for _, o in pairs}
    text = "/".join(name for name, _ in pairs) + " only: " + (
        option.help if len(helps) == 1 else "; ".join(f"{name}: {o.help}" for name, o in pairs))
    if option.type is bool:
        return click.Option([option.flag, option.name], is_flag=True, help=text)
    return click.Option([option.flag, option.name], type=option.type, default=None,
                        metavar=option.metavar, help=text)


def _owners(name: str) -> str:
    """The formats with the writer option ``name``."""
    return " or ".join(spec.name for spec, _ in offered_writer_options().get(name, []))


def _options(out: str) -> tuple:
    """The shared options, in the order --help lists them; ``out`` is what
    the command calls its output argument."""
    return (
        click.option("--format", "format_", metavar="NAME",
                     help="Container format: "
                          + "; ".join(f"{s.name}: {s.help}" for s in FORMATS.values())
                          + f". Default: chosen from {out}'s extension ("
                          + ", ".join(known_extensions()) + f"). Give it for an {out} "
                          f"without one ({' and '.join(sharded_formats())} then add theirs); "
                          "an extension of another format is refused."),
        click.option("--shard-size", metavar="N|SIZE", default=None,
                     help="/".join(sharded_formats()) + " only: a new shard every N "
                          "source images (10000; an image skipped as bad leaves its shard one "
                          "record short) or every SIZE bytes as stored (256MB; counted from "
                          "the source files' sizes before any image is read, so an estimate "
                          f"after --resize or --encoding). {out} may be a pattern: "
                          "out-%06d.tar or out-{000000..000099}.tar."),
        click.option("--resize", metavar="SHORT|HxW", default=None,
                     help="Resize at pack time: SHORT sets the shorter side (aspect kept), HxW "
                          "sets both (stretched, unless --center-crop)."),
        click.option("--center-crop", is_flag=True,
                     help="With --resize: scale to cover the target, then crop the centre "
                          "(--resize 224 --center-crop gives 224x224)."),
        click.option("--max-size", type=int, default=None, metavar="N",
                     help="Shrink images whose longer side exceeds N (never enlarges)."),
        click.option("--encoding", type=click.Choice(["keep", "jpeg", "png", "raw"]),
                     default="keep", show_default=True,
                     help="keep: original bytes (re-encoded in their own format only if "
                          "resized; raw pixels stay raw); jpeg/png: re-encode; raw: decoded "
                          "uint8 pixels, no decoding at read time (needs one image size: "
                          "--resize HxW or --resize N --center-crop)."),
        click.option("--quality", type=int, default=90, show_default=True,
                     help="JPEG quality when encoding JPEG."),
        click.option("--jpeg-restarts", is_flag=True,
                     help="Store JPEGs with a restart marker after every MCU (16x16 pixels "
                          "at 4:2:0), so that fastdata.RandomResizedCrop decodes only the "
                          "blocks a training crop covers; files grow by about 5 percent. "
                          "Re-encoded JPEGs (--encoding jpeg, --resize) get them from the "
                          "encoder; original bytes are rewritten losslessly (the same "
                          "pixels), which needs libjpeg-turbo 3.1 or later "
                          "(FASTDATA_TURBOJPEG)."),
        click.option("--workers", type=int, default=None, metavar="N",
                     help="Processes reading, checking and preprocessing images [default: "
                          "usable cores]. Every N gives the same files byte for byte, except "
                          "the manifest's created_at (and LMDB's lock.mdb)."),
        click.option("--overwrite", is_flag=True, help=f"Replace {out} if it exists."),
        click.option("--resume", is_flag=True,
                     help=f"Continue the interrupted run to {out} (Ctrl-C, kill, crash, "
                          "power loss): the pieces it finished (shards; for lmdb/hdf5 commits "
                          "of 1000 images) are checked and kept, the rest is written, and the "
                          "result is the one an uninterrupted run gives. Give the same input "
                          "and options (--workers may differ); a changed input or option is "
                          "refused. The summary says how many records it took from the "
                          "interrupted run and how many it packed now. Without --resume, a "
                          "run starts over and removes what an interrupted one left."),
        click.option("--strict", is_flag=True,
                     help="Stop at the first corrupt or unreadable image (default: skip it and "
                          f"list it in the summary and in {out}.report.json, for tar/tfrecord "
                          "NAME.report.json beside NAME.fastdata.json)."),
        click.option("--verify-decode", is_flag=True,
                     help="Fully decode every image (slower; catches damage inside the "
                          "compressed data, not only truncation and bad headers; JPEGs that "
                          "libjpeg decodes only with a corrupt-data warning are skipped too)."),
        click.option("--max-pixels", type=int, default=None, metavar="N",
                     help="Skip (or under --strict refuse) images whose header declares more "
                          "than N pixels, before decoding them [default: 178956970, twice "
                          "Pillow's decompression-bomb limit]; 0 lifts the limit."),
        click.option("--shuffle", metavar="SEED", default=None,
                     help="Write the records in a random order drawn from SEED (a whole number "
                          ">= 0) instead of the input's (class by class for an image folder); "
                          "labels and keys travel with their "
                          "records, and the same SEED gives the same files. Use it when the "
                          "dataset is much larger than a streaming reader's shuffle window, or "
                          "when other tools (webdataset, DALI) will read the shards with only a "
                          "shuffle buffer: unshuffled, a window holds one or two classes. "
                          "Map-style reading (fastdata.Order(shuffle=True)) does not need it."),
        click.option("--keep-source-path", is_flag=True,
                     help="Record the input's absolute path (a URL without its credentials) "
                          "as the manifest's source.root; by default only its name is "
                          "recorded, so the packing machine's folders do not travel with "
                          "every copy of the dataset."),
        click.option("--allow-outside", is_flag=True,
                     help="Let the input's names lead out of its folder: a list's or "
                          "Parquet table's absolute or ../ paths, a dataset's links to files "
                          "elsewhere. Refused by default, so a list or dataset made by "
                          "someone else cannot make fastdata read other files; give it for "
                          "inputs of your own."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print the summary as JSON on stdout."),
        click.option("--progress/--no-progress", default=None,
                     help="Show a progress bar (default: when stderr is a terminal)."),
    )


def output_options(out: str = "OUTPUT"):
    """A decorator adding the shared options to a command whose output
    argument is named ``out`` (the command's class is :class:`PackingCommand`,
    which adds the formats' writer options)."""
    def add(func):
        for option in reversed(_options(out)):
            func = option(func)
        return func
    return add


def pack_options(output: str, params: dict, *, extensions=None):
    """The ``PackOptions`` that a command's shared options ask for: ``params``
    holds its click parameters by name (others are left alone); ``extensions``:
    pack's, for a folder source.

    Raises:
        FastDataError: a writer option was given that the output's format
            does not have.
    """
    from fastdata.packers.options import PackOptions
    from fastdata.packers.preprocess import Preprocess, parse_resize
    from fastdata.packers.shuffle import parse_seed

    pre = Preprocess(resize=parse_resize(params["resize"]), center_crop=params["center_crop"],
                     max_size=params["max_size"], encoding=params["encoding"],
                     quality=params["quality"], restarts=params["jpeg_restarts"])
    max_pixels = params["max_pixels"]
    limit = {} if max_pixels is None else {"max_pixels": max_pixels or None}
    return PackOptions(format=params["format_"], overwrite=params["overwrite"],
                       strict=params["strict"], verify_decode=params["verify_decode"],
                       shard_size=params["shard_size"], preprocess=pre,
                       workers=params["workers"], extensions=extensions,
                       shuffle=parse_seed(params["shuffle"]), resume=params["resume"],
                       keep_source_path=params["keep_source_path"],
                       writer_options=_given_writer_options(output, params), **limit)


def _given_writer_options(output: str, params: dict) -> dict:
    """The writer options given (the manifest records them as passed), each
    one the output's format has."""
    offered = offered_writer_options()
    given = {name: params[name] for name in offered if params.get(name) not in (None, False)}
    if given:
        spec = format_for_output(output, params["format_"])
        own = {option.name for option in spec.options}
        for name in given:
            if name not in own:
                owners = _owners(name)
                raise FastDataError(f"{offered[name][0][1].flag}: not an option of {spec.name} "
                                    f"outputs, only of {owners}; leave it out, or write "
                                    f"{owners}", path=output)
    return given


def echo_warning(msg: str) -> None:
    """A warning of the pack, with its option names in CLI terms (as errors)."""
    echo(f"warning: {cli_terms(msg)}", err=True)


def echo_summary(summary, options, heading: str) -> None:
    """The summary after ``heading`` (what was done, to how many images)."""
    echo(f"{heading} into {summary.output} ({summary.format}) in "
               f"{summary.seconds:.1f} s, {summary.rate:,.0f} img/s")
    echo(f"  bytes in {human_bytes(summary.bytes_in)}, on disk "
               f"{human_bytes(summary.bytes_out)}; encodings "
               + ", ".join(f"{k} {v}" for k, v in summary.encodings.items()))
    if summary.files and summary.files != [summary.output]:
        echo(f"  {_files_line(summary.files)}")
    if options.shuffle is not None:
        echo(f"  order: shuffled with seed {options.shuffle}")
    if summary.ignored:
        _echo_ignored(summary.ignored, summary.ignored_extensions)
    if summary.renamed:
        _echo_renamed(summary.renamed)
    if summary.skipped:
        echo(f"  skipped {len(summary.skipped)} bad image(s):")
        for item in summary.skipped[:10]:
            echo(f"    {item.key}: {item.reason}")
        if len(summary.skipped) > 10:
            echo(f"    ... and {len(summary.skipped) - 10} more")
    if summary.report:
        echo(f"  report: {summary.report}")
    if summary.upload is not None and summary.upload.bytes:
        u = summary.upload
        rate = f"{u.mb_s:,.0f} MB/s; " if u.mb_s else ""
        one = f"; one connection {u.connection_mb_s:,.0f} MB/s" if u.connection_mb_s else ""
        echo(f"  uploaded {human_bytes(u.bytes)} in {u.seconds:.1f} s ({rate}"
             f"{u.parts:,} parts, at most {u.parts_at_once} at once per file{one})")
    if summary.resumed is not None:
        r = summary.resumed
        echo(f"  resumed: {r.kept_records:,} records ({_pieces(r.kept_pieces)}) taken from "
             f"the interrupted pack, {r.packed_records:,} records "
             f"({_pieces(r.packed_pieces)}) packed now")


def _pieces(n: int) -> str:
    return f"{n} piece{'' if n == 1 else 's'}"


def images_text(summary) -> str:
    """``N images in C classes`` (or ``N unlabelled images``)."""
    return (f"{summary.records} images in {summary.classes} classes" if summary.classes
            else f"{summary.records} unlabelled images")


def _echo_ignored(count: int, by_extension: dict[str, int]) -> None:
    """The ignored count, with the extensions left out (they are what --extensions adds)."""
    echo(f"  ignored {count} hidden, stray or other-extension file(s)")
    if by_extension:
        echo("    extensions not packed: "
                   + ", ".join(f".{ext} {n}" if ext else f"(none) {n}"
                               for ext, n in by_extension.items())
                   + " (--extensions +EXT packs them too)")


def _echo_renamed(renamed) -> None:
    """Records stored under another tar member key than their own (the dataset keys
    stay the originals); the full list is in --json and the report file."""
    echo(f"  renamed {len(renamed)} tar member key(s) (dataset keys unchanged; all in "
               f"the report):")
    for item in renamed[:5]:
        echo(f"    {item.key} -> {item.stored_as}")
    if len(renamed) > 5:
        echo(f"    ... and {len(renamed) - 5} more")


def _files_line(files: list[str]) -> str:
    """What a sharded pack wrote, by name (the first and last few of many)."""
    names = [os.path.basename(f) for f in files]
    if len(names) > 9:
        names = names[:4] + ["..."] + names[-4:]
    return f"wrote {len(files)} files in {os.path.dirname(files[0])}: {', '.join(names)}"

"""``fastdata info`` and ``fastdata verify``."""

from __future__ import annotations

import json
import os
import sys

import click

from fastdata.cli.cluster import job_options
from fastdata.cli.group import _handle_errors, _print_json, allow_outside_option, echo, main
from fastdata.machine import human_bytes


_VERSION_WORDS = ("--at-version N names a version of the dataset (fastdata info PATH "
                  "--at-version 2); fastdata's own version: fastdata --version, before "
                  "the command")


class _InfoCommand(click.Command):
    """``info``, whose ``--at-version N`` is also spelled ``--version N`` (after
    the command; before it, ``--version`` is fastdata's own): a ``--version``
    without its number says which is which."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.BadOptionUsage as exc:
            if exc.option_name not in ("--at-version", "--version"):
                raise
            raise click.BadOptionUsage(exc.option_name, f"{exc.option_name} needs a "
                                       f"number: {_VERSION_WORDS}", ctx=ctx) from None


@main.command(cls=_InfoCommand,
              short_help="Show what a dataset holds, or why it cannot be read.")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--history", is_flag=True,
              help="List the dataset's versions (each append or join makes one): number, "
                   "when, what changed, records and digest.")
@click.option("--at-version", "--version", "version", type=click.IntRange(1), default=None,
              metavar="N",
              help="Show version N of a dataset that has changed since its pack (1: the "
                   "pack; --history lists them). --version N after the command is the "
                   "same; fastdata's own version is fastdata --version, before the command.")
@allow_outside_option
@_handle_errors
def info(path, as_json, history, version, allow_outside):
    """Show the manifest of the packed dataset PATH, or what the mixture file
    PATH (a JSON or YAML file of sources and weights) mixes, with each epoch's
    shares. Images the pack skipped are listed with their reasons, from its
    report file (NAME.report.json beside the dataset). The last line lists the
    decoders offered on this machine and why any other is not (--json prints
    the manifest alone)."""
    from fastdata.dataset.resolve import open_reader
    from fastdata.mixture_file import is_mixture_file

    if history:
        _print_history(path, as_json, allow_outside)
        return
    if is_mixture_file(path):
        from fastdata.cli.mixture_info import print_mixture

        print_mixture(path, as_json=as_json, allow_outside=allow_outside)
        return

    with open_reader(path, allow_outside=allow_outside, version=version) as reader:
        m, where = reader.manifest, reader.dataset_path
    if as_json:
        _print_json(m.to_dict())
        return
    from fastdata.formats.remote_files import absolute
    from fastdata.redaction import redact

    from fastdata.decoding.decode import decoder_status, decoder_status_line

    echo(redact(absolute(path)))
    rows = _manifest_rows(m)
    after = next(i + 1 for i, (name, _) in enumerate(rows) if name == "source")
    rows[after:after] = _skipped_rows(m, where)  # under the source's skipped count
    for name, value in rows:
        echo(f"  {name:<10} {value}")
    # This machine's, not the manifest's: which decoders can read it here, and
    # why the others are not offered (not installed, or a failed trial decode).
    echo(f"  {'decoders':<10} {decoder_status_line(decoder_status())}")


def _manifest_rows(m) -> list[tuple[str, str]]:
    """The manifest for humans: (field, text) rows; a nested value gets a row of
    its own under its field (name ""). Fields a foreign dataset lacks say so."""
    classes = ", ".join(f"{c} ({n:,})" for c, n in zip(m.classes[:8], m.class_counts[:8]))
    if len(m.classes) > 8:
        classes += f", ... {len(m.classes) - 8} more"
    written = (f"manifest v{m.version}, written by fastdata {m.fastdata_version}"
               if m.fastdata_version else "no fastdata manifest: written by another tool")
    sizes = [f"{what} {human_bytes(m.bytes[key])}" for key, what in
             (("payload", "payload"), ("on_disk", "on disk"), ("source", "source"))
             if isinstance(m.bytes.get(key), int)]
    shards = ", ".join(str(s.get("path")) for s in m.shards[:4])
    # One shard of a set: the encodings and the source are the whole set's.
    shard_of = m.extra.get("shard_of")
    whole = f" (all of {shard_of})" if shard_of else ""
    rows = [
        ("format", f"{m.format} ({written})"),
        ("records", f"{m.count:,}"),
        *_view_rows(m),
        *_version_rows(m),
        ("classes", f"{len(m.classes)}: {classes}" if m.classes
         else "none (unlabelled records, label -1)"),
        ("encoding", _encoding_text(m.encoding or {}) + whole),
        ("size", ", ".join(sizes) or "not recorded"),
        ("shards", f"{len(m.shards)}: {shards}" + (" ..." if len(m.shards) > 4 else "")
         + (f" (one shard of {shard_of})" if shard_of else "")),
        ("checksums", _checksums_text(m.checksums or {})),
        ("metadata", _metadata_text(m)),
        ("source", _source_text(m.source or {}) + whole),
        ("order", _order_text(m)),
        ("created", m.created_at or "not recorded"),
    ]
    scalars = {k: v for k, v in (m.pack_options or {}).items() if not isinstance(v, dict)}
    rows.append(("options", _plain(scalars) or "not recorded"))
    rows += [("", f"{k}: {_plain(v)}") for k, v in (m.pack_options or {}).items()
             if isinstance(v, dict)]
    return rows


#: Skipped images that info lists with their reasons (the report lists all).
SKIPPED_SHOWN = 5


def _skipped_rows(m, where: str) -> list[tuple[str, str]]:
    """The images the pack skipped, with their reasons, from its report file
    (``NAME.report.json`` beside the dataset); where that is not there, its name.
    Nothing for a view: the skips are its dataset's."""
    skipped = (m.source or {}).get("skipped")
    if not isinstance(skipped, int) or skipped <= 0 or \
            (isinstance(m.extra, dict) and m.extra.get("view")):
        return []
    from fastdata.formats.remote_files import absolute, is_remote
    from fastdata.packers.summary import report_path

    shard_of = m.extra.get("shard_of") if isinstance(m.extra, dict) else None
    if shard_of:  # one shard of a set: the set's report
        where = os.path.join(os.path.dirname(where), str(shard_of))
    report = absolute(report_path(where))
    how = f"{report} (JSON: its \"skipped\" list)"
    listed, why = None, "not found beside the dataset: it stays where the pack wrote it"
    if is_remote(report):
        why = "download it to read it (fastdata info reads it beside a local dataset)"
    elif os.path.isfile(report):
        listed, why = _read_skipped(report)
    if listed is None:
        return [("skipped", f"{skipped:,} image(s), each with its reason in the pack's "
                            f"report {how}; {why}")]
    rows = [("", f"{item.get('key')}: {item.get('reason')}") for item in listed[:SKIPPED_SHOWN]]
    rows[0] = ("skipped", rows[0][1])
    more = f"... {len(listed) - SKIPPED_SHOWN:,} more; " if len(listed) > SKIPPED_SHOWN else ""
    rows.append(("", f"{more}all {len(listed):,} with their reasons in {how}"))
    return rows


def _read_skipped(report: str) -> tuple[list[dict] | None, str]:
    """The report's skipped images ({key, reason}), or None and why not."""
    try:
        with open(report, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        return None, f"it cannot be read ({exc}); pack again to write it anew"
    listed = data.get("skipped") if isinstance(data, dict) else None
    if not isinstance(listed, list) or not listed or \
            not all(isinstance(item, dict) for item in listed):
        return None, "it lists no skipped images (not the report of this pack?)"
    return listed, ""


def _print_history(path: str, as_json: bool, allow_outside: bool = False) -> None:
    """The versions of the dataset at ``path``, oldest first (a view: those of
    the dataset it was made from, and which one that was)."""
    from fastdata.dataset.history import read_record, versions
    from fastdata.dataset.resolve import classify, dataset_path

    made_from = None
    if classify(path) == "view":
        view = read_record(path)
        made_from = view.of or {}
        where = made_from.get("path")
        if not where:
            echo(f"{path}: a view of a dataset it does not name (made by an earlier "
                 f"fastdata); fastdata info {path} shows what it selects")
            return
        from fastdata.storage.urls import dirname, join

        path = join(dirname(path), where)
    found = versions(dataset_path(path, allow_outside=allow_outside))
    if as_json:
        listed = [{k: v for k, v in {**x.to_dict(), "sha256": x.sha256}.items()
                   if k not in ("kind", "schema")} for x in found]
        _print_json({"view_of": made_from, "versions": listed} if made_from is not None
                    else listed)
        return
    if made_from is not None:
        echo(f"a view made from version {made_from.get('version') or 1} of {path}")
    if not found:
        echo(f"{path}: one version, the pack (no change since)")
        return
    echo(f"{path}: {len(found)} version(s), the current one last")
    for x in found:
        echo(f"  v{x.number:<3} {x.created_at}  {x.records:>12,} records  {x.sha256[:12]}  "
             f"{x.change}: {x.summary}")


def _view_rows(m) -> list[tuple[str, str]]:
    """A view's parent and selectors (none for a dataset)."""
    view = m.extra.get("view") if isinstance(m.extra, dict) else None
    if not isinstance(view, dict):
        return []
    whole = int(view.get("base_records") or 1)
    of = view.get("of") or {}
    return [("view", f"{m.count:,} of {whole:,} records ({m.count / max(1, whole):.1%}) of "
                     f"{of.get('path') or 'its dataset'} (version {of.get('version') or 1}), "
                     f"made {view.get('created_at')}"),
            ("selected", _plain(view.get("selected_by") or {}) or "all records")]


def _version_rows(m) -> list[tuple[str, str]]:
    """A changed dataset's version (none for one never changed)."""
    version = m.extra.get("dataset_version") if isinstance(m.extra, dict) else None
    if not isinstance(version, dict):
        return []
    return [("version", f"{version.get('number')} ({version.get('change')}; "
                        f"{version.get('parts')} part(s); --history lists all)")]


def _order_text(m) -> str:
    """The record order: source order, or shuffled at pack time with its seed."""
    seed = (m.pack_options or {}).get("shuffle")
    if seed is not None:
        return f"shuffled at pack time (seed {_plain(seed)})"
    return "source order" if m.fastdata_version else "not recorded"


def _plain(value) -> str:
    """A manifest value in words, never a Python repr: none/true/false, a dict as
    ``key=value, ...``, a list of ints as ``16x16x3``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        return ("x" if ints else ",").join(_plain(v) for v in value)
    return str(value)


def _encoding_text(enc: dict) -> str:
    """``keep (jpeg 500, png 12)``; raw storage with its shape, dtype and layout."""
    counts = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {_plain(v)}"
                       for k, v in (enc.get("formats") or {}).items())
    text = _plain(enc.get("storage") or "unknown") + (f" ({counts})" if counts else "")
    for field in ("shape", "dtype", "layout"):
        if enc.get(field):
            text += f", {field} {_plain(enc[field])}"
    return text


def _metadata_text(m) -> str:
    """Whether records carry per-sample metadata, how many, and where it is."""
    extra = m.extra if isinstance(m.extra, dict) else {}
    meta = extra.get("metadata")
    if not isinstance(meta, dict):
        return "none" if m.fastdata_version else "none found"
    records = meta.get("records")
    count = f"{records:,} of {m.count:,} records" if isinstance(records, int) else "present"
    where = ", ".join(f"{k} {_plain(v)}" for k, v in meta.items() if k != "records")
    return count + (f" ({where})" if where else "")


def _checksums_text(checksums: dict) -> str:
    if not checksums.get("record"):
        return "none stored"
    text = f"{_plain(checksums['record'])} per record"
    if checksums.get("payload_sha256"):
        text += f"; payload sha256 {str(checksums['payload_sha256'])[:16]}..."
    return text


def _source_text(source: dict) -> str:
    """``ROOT (N files, N skipped, N ignored)``, with what else the source recorded."""
    parts = [f"{source[k]:,} {k}" for k in ("files", "skipped", "ignored")
             if isinstance(source.get(k), int)]
    known = {"root", "fingerprint", "files", "skipped", "ignored", "note", "extensions",
             "ignored_extensions"}
    if isinstance(source.get("extensions"), list):
        parts.append("extensions " + " ".join(map(str, source["extensions"])))
    if isinstance(source.get("ignored_extensions"), dict) and source["ignored_extensions"]:
        parts.append("not packed: " + ", ".join(
            f"{ext} {n}" for ext, n in source["ignored_extensions"].items()))
    parts += [f"{k}={_plain(v)}" for k, v in source.items() if k not in known]
    if source.get("note"):
        parts.append(_plain(source["note"]))
    root = _plain(source["root"]) if source.get("root") else "not recorded"
    return root + (f" ({', '.join(parts)})" if parts else "")


@main.command(short_help="Check every byte that a dataset's manifest covers.")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--decode", is_flag=True,
              help="Also decode every image; a JPEG that decodes only with libjpeg's "
                   "corrupt-data warning counts as damaged.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar.")
@allow_outside_option
@job_options
@_handle_errors
def verify(path, decode, as_json, progress, allow_outside, workers, resume, scheduler, ray):
    """Check every byte of PATH that its manifest covers.

    Each record against its stored CRC32; labels, CRC32s, keys and the index
    against their SHA-256; tar/TFRecord shards against their SHA-256 and the
    TFRecord .idx files against the index. Exits 1 when anything is damaged,
    listing each problem on one line. Records and shard files are checked in
    pieces, in parallel, on this machine (from 65,536 records) or on a
    cluster (--scheduler, --ray); LMDB in one child process.

    \b
    Examples:
      fastdata verify train.lmdb
      fastdata verify train.tar --decode --workers 8
      fastdata verify /shared/train.tar --scheduler tcp://HOST:8786
    """
    from fastdata.ops.verify import verify_dataset

    result = verify_dataset(path, decode=decode, progress=progress, allow_outside=allow_outside,
                            workers=workers, resume=resume, scheduler=scheduler, ray=ray,
                            on_event=lambda note: echo(f"note: {note}", err=True))
    if as_json:
        _print_json(result.to_dict())
    else:
        files = sum(p["index"] is None for p in result.problems)
        echo(f"{result.path}: {result.checked} records checked, {result.damaged} "
                   f"damaged" + (f", {files} file problem(s)" if files else "")
                   + (" (decoded)" if decode else ""))
        for p in result.problems[:20]:
            if p["index"] is None:
                echo(f"  {p['path']}: {p['reason']}")
            else:
                echo(f"  {_record_problem(p)}")
        if len(result.problems) > 20:
            echo(f"  ... {len(result.problems) - 20} more (--json lists all)")
    if not result.ok:
        sys.exit(1)


def _record_problem(problem: dict) -> str:
    """``record 3 (KEY) fails its CRC32 check ...``: the record named once, even
    when the reason starts with it; no key when the keys cannot be read."""
    head = f"record {problem['index']}"
    key = f" ({problem['key']})" if problem["key"] is not None else ""
    reason = problem["reason"]
    rest = reason[len(head):] if reason.startswith(head + " ") else f": {reason}"
    return f"{head}{key}{rest}"

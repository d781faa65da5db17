"""``fastdata info`` and ``fastdata verify``."""

from __future__ import annotations

import os
import sys

import click

from fastdata.cli import _handle_errors, _print_json, main
from fastdata.machine import human_bytes


@main.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@_handle_errors
def info(path, as_json):
    """Show the manifest of the packed dataset PATH."""
    from fastdata.formats import read_manifest

    m = read_manifest(path)
    if as_json:
        _print_json(m.to_dict())
        return
    classes = ", ".join(f"{c} ({n})" for c, n in zip(m.classes[:8], m.class_counts[:8]))
    if len(m.classes) > 8:
        classes += f", ... {len(m.classes) - 8} more"
    enc = m.encoding
    rows = [
        ("format", f"{m.format} (manifest v{m.version}, written by fastdata {m.fastdata_version})"),
        ("records", f"{m.count:,}"),
        ("classes", f"{len(m.classes)}: {classes}"),
        ("encoding", f"{enc.get('storage')}: "
                     + ", ".join(f"{k} {v}" for k, v in enc.get("formats", {}).items())
                     + (f", shape {enc['shape']}" if enc.get("shape") else "")),
        ("size", f"payload {human_bytes(m.bytes.get('payload', 0))}, on disk "
                 f"{human_bytes(m.bytes.get('on_disk', 0))} "
                 f"(source {human_bytes(m.bytes.get('source', 0))})"),
        ("shards", f"{len(m.shards)}: " + ", ".join(s["path"] for s in m.shards[:4])
                   + (" ..." if len(m.shards) > 4 else "")),
        ("checksums", f"{m.checksums.get('record')} per record; payload sha256 "
                      f"{m.checksums.get('payload_sha256', '')[:16]}..."),
        ("source", f"{m.source.get('root')} ({m.source.get('files')} files, "
                   f"{m.source.get('skipped')} skipped, {m.source.get('ignored')} ignored"
                   + (f"; extensions {' '.join(map(str, m.source['extensions']))}"
                      if isinstance(m.source.get("extensions"), list) else "") + ")"),
        ("created", m.created_at),
        ("options", ", ".join(f"{k}={v}" for k, v in m.pack_options.items())),
    ]
    click.echo(os.path.abspath(path))
    for name, value in rows:
        click.echo(f"  {name:<10} {value}")


@main.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option("--decode", is_flag=True,
              help="Also decode every image; a JPEG that decodes only with libjpeg's "
                   "corrupt-data warning counts as damaged.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar.")
@_handle_errors
def verify(path, decode, as_json, progress):
    """Check every byte of PATH that its manifest covers.

    Each record against its stored CRC32; labels, CRC32s, keys and the index
    against their SHA-256; tar/TFRecord shards against their SHA-256 and the
    TFRecord .idx files against the index. Exits 1 when anything is damaged,
    listing each problem on one line.
    """
    from fastdata.loaders.verify import verify_dataset

    result = verify_dataset(path, decode=decode, progress=progress)
    if as_json:
        _print_json(result.to_dict())
    else:
        files = sum(p["index"] is None for p in result.problems)
        click.echo(f"{result.path}: {result.checked} records checked, {result.damaged} "
                   f"damaged" + (f", {files} file problem(s)" if files else "")
                   + (" (decoded)" if decode else ""))
        for p in result.problems[:20]:
            if p["index"] is None:
                click.echo(f"  {p['path']}: {p['reason']}")
            else:
                click.echo(f"  record {p['index']} ({p['key']}): {p['reason']}")
        if len(result.problems) > 20:
            click.echo(f"  ... {len(result.problems) - 20} more (--json lists all)")
    if not result.ok:
        sys.exit(1)

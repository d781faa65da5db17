"""``fastdata info MIX.json``: what a mixture file mixes, and each epoch's shares."""

from __future__ import annotations

from fastdata.cli.group import _print_json, echo


def print_mixture(path: str, *, as_json: bool, allow_outside: bool) -> None:
    from fastdata.dataset.mixture_summary import mixture_summary
    from fastdata.redaction import redact

    summary = mixture_summary(path, allow_outside=allow_outside)
    if as_json:
        _print_json(summary)
        return
    order = f"shuffled (seed {summary['seed']})" if summary["shuffle"] else "stored order"
    echo(f"{redact(path)}: a mixture of {len(summary['sources'])} sources, "
         f"{summary['samples_per_epoch']:,} samples per epoch, each source's records "
         f"{order}, interleaved")
    for s in summary["sources"]:
        share = f"weight {s['weight']:g}" if s["count"] is None else f"count {s['count']:,}"
        echo(f"  {s['name']:<12} {s['format']}, {s['records']:,} records, "
             f"{s['classes']} classes; {share}: {s['per_epoch']:,} per epoch "
             f"({s['passes_per_epoch']:g} passes)  {redact(s['path'])}")
    labels = summary["labels"]
    if "error" in labels:
        echo(f"  labels       classes={labels['classes']!r} cannot be used: {labels['error']}")
    elif labels["merged"] is None:
        echo("  labels       each source's own (classes='own')")
    else:
        echo(f"  labels       {len(labels['merged'])} classes (classes={labels['classes']!r})")
    for e, counts in enumerate(summary["epochs"]):
        echo(f"  epoch {e:<6} " + ", ".join(f"{n} {c:,}" for n, c in counts.items()))

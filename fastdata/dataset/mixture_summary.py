"""What a mixture file mixes, in numbers, for ``fastdata info`` and the
benchmark: each source's records and classes (read from its current
version), weights, and the shares of the first epochs (no torch)."""

from __future__ import annotations

from fastdata.mixture_file import combine_classes, read_mixture_file

#: Epochs whose shares ``info`` lists.
EPOCHS_SHOWN = 3


def mixture_summary(path: str, *, allow_outside: bool = False) -> dict:
    """The mixture of file ``path`` as a dict: its sources (format, records,
    classes, weight or count, samples per epoch and passes over the source
    per epoch), how their labels combine, and the shares of the first epochs.

    Raises:
        FastDataError: the file, or a source's manifest, cannot be read.
    """
    from fastdata.dataset.resolve import read_manifest
    from fastdata.errors import FastDataError
    from fastdata.order.mixture import MixSource, Mixture

    described = read_mixture_file(path)
    manifests = {}
    for name, spec in described.sources.items():
        try:
            manifests[name] = read_manifest(spec["path"], version=spec.get("version"),
                                            allow_outside=allow_outside)
        except FastDataError as exc:
            raise FastDataError(f"mixture source {name!r}: {exc}", path=path) from exc
    mixture = Mixture([MixSource(name, m.count, weight=described.sources[name].get("weight"),
                                 count=described.sources[name].get("count"))
                       for name, m in manifests.items()],
                      samples_per_epoch=described.samples_per_epoch, seed=described.seed,
                      shuffle=described.shuffle)
    own = {name: list(m.classes) for name, m in manifests.items()}
    try:
        merged, _ = combine_classes(own, described.classes)
        labels = {"classes": described.classes, "merged": merged}
    except FastDataError as exc:
        labels = {"classes": described.classes, "error": exc.message}
    counts = mixture.counts(0)
    sources = [{"name": name, "path": described.sources[name]["path"], "format": m.format,
                "records": m.count, "classes": len(m.classes),
                "weight": described.sources[name].get("weight"),
                "count": described.sources[name].get("count"),
                "per_epoch": int(c), "passes_per_epoch": round(int(c) / m.count, 3)}
               for (name, m), c in zip(manifests.items(), counts)]
    epochs = [{name: int(c) for name, c in zip(manifests, mixture.counts(e))}
              for e in range(EPOCHS_SHOWN)]
    return {"mixture": path, "samples_per_epoch": mixture.samples_per_epoch,
            "shuffle": described.shuffle, "seed": described.seed, "labels": labels,
            "sources": sources, "epochs": epochs}



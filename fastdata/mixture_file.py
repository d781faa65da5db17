"""A mixture described in a small file, for ``fastdata.mix``, ``fastdata info``
and ``fastdata bench``.

JSON (or YAML, when PyYAML is installed)::

    {
      "sources": {
        "imagenet": {"path": "imagenet.lmdb", "weight": 0.8},
        "extra":    {"path": "s3://bucket/extra.tar", "weight": 0.2}
      },
      "samples_per_epoch": 100000,
      "classes": "union",
      "shuffle": true,
      "seed": 0
    }

Every source has a ``path`` (relative paths are relative to the file's folder)
and a ``weight`` or a ``count``; the other keys are optional (``classes``:
"own", "merge", "union" or a list of class names). No torch here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from fastdata.errors import FastDataError

#: How a mixture's labels are combined (besides a list of class names).
#: How a mixture labels its samples (besides a list of class names).
ClassMode = Literal["own", "merge", "union"]
CLASS_MODES = get_args(ClassMode)
#: A mixture file's keys besides "sources".
OPTIONAL = ("samples_per_epoch", "classes", "shuffle", "seed")
SUFFIXES = (".json", ".yaml", ".yml")


@dataclass(frozen=True)
class MixtureFile:
    """A parsed mixture file (sources' paths made absolute where local)."""

    path: str
    sources: dict[str, dict[str, Any]]
    samples_per_epoch: int | None = None
    classes: Any = "own"
    shuffle: bool = True
    seed: int = 0
    extra: dict = field(default_factory=dict)


def is_mixture_file(path) -> bool:
    """Whether ``path`` is a local JSON/YAML file holding a mixture (a
    ``"sources"`` mapping); a fastdata manifest is not one."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fspath(path)
    if "://" in text or not text.lower().endswith(SUFFIXES) or \
            text.endswith(".fastdata.json") or not os.path.isfile(text):
        return False
    try:
        data = _load(text)
    except (FastDataError, OSError, ValueError):
        return False
    return isinstance(data, dict) and "sources" in data and "format" not in data


def read_mixture_file(path) -> MixtureFile:
    """Parse a mixture file.

    Raises:
        FastDataError: it cannot be read, or a key is missing or wrong (named).
    """
    path = os.path.abspath(os.fspath(path))
    data = _load(path)
    if not isinstance(data, dict) or not isinstance(data.get("sources"), dict) \
            or not data["sources"]:
        raise FastDataError("a mixture file holds a 'sources' mapping of name -> "
                            "{path, weight or count}", path=path)
    unknown = sorted(set(data) - {"sources", *OPTIONAL})
    if unknown:
        raise FastDataError(f"unknown keys {unknown}; a mixture file takes sources, "
                            f"{', '.join(OPTIONAL)}", path=path)
    folder = os.path.dirname(path)
    sources = {}
    for name, spec in data["sources"].items():
        if isinstance(spec, str):
            spec = {"path": spec}
        if not isinstance(spec, dict) or "path" not in spec:
            raise FastDataError(f"source {name!r} needs a path (and a weight or a count)",
                                path=path)
        where = str(spec["path"])
        if "://" not in where and not os.path.isabs(where):
            where = os.path.join(folder, where)
        sources[str(name)] = {**spec, "path": where}
    spe = data.get("samples_per_epoch")
    if spe is not None and (isinstance(spe, bool) or not isinstance(spe, int) or spe < 1):
        raise FastDataError(f"samples_per_epoch must be a positive integer, not {spe!r}",
                            path=path)
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise FastDataError(f"seed must be a non-negative integer, not {seed!r}", path=path)
    return MixtureFile(path=path, sources=sources, samples_per_epoch=spe,
                       classes=data.get("classes", "own"),
                       shuffle=bool(data.get("shuffle", True)), seed=seed)


def _load(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise FastDataError(f"cannot read the mixture file ({exc.strerror})", path=path) from exc
    if path.lower().endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise FastDataError(f"not valid JSON: {exc}", path=path) from exc
    try:
        import yaml
    except ImportError:
        raise FastDataError("a YAML mixture file needs PyYAML (pip install pyyaml); or "
                            "write it as JSON", path=path) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FastDataError(f"not valid YAML: {exc}", path=path) from exc


def combine_classes(own: dict[str, list[str]], classes
                    ) -> tuple[list[str] | None, list[np.ndarray] | None]:
    """The merged class list and, per source (in ``own``'s order), the array
    mapping its labels to merged ones (None: labels kept as they are).

    ``classes``: "own" (each source's own labels), "merge" (one class list
    every source has identically), "union" (the sorted union, by name) or a
    list of class names (every source's classes mapped into it by name).

    Raises:
        FastDataError: the sources' classes cannot be combined so (named).
    """
    names = list(own)
    if isinstance(classes, str):
        if classes not in CLASS_MODES:
            raise ValueError(f"classes must be one of {', '.join(CLASS_MODES)} or a list of "
                             f"class names, not {classes!r}")
        if classes == "own":
            return None, None
        if classes == "merge":
            first = names[0]
            differ = [n for n in names if own[n] != own[first]]
            if differ:
                raise FastDataError(
                    f"classes='merge' needs one class list, but the sources "
                    f"{', '.join(map(repr, differ))} have other classes than {first!r} "
                    f"({_sample(own[first])} against {_sample(own[differ[0]])}); pass "
                    f"classes='union' to map labels by class name, or keep them 'own'")
            return list(own[first]), None
        merged = sorted({c for listed in own.values() for c in listed})
    else:
        merged = [str(c) for c in classes]
        if len(set(merged)) != len(merged):
            raise ValueError("classes lists a class name twice")
    index = {c: i for i, c in enumerate(merged)}
    relabel = []
    for name in names:
        missing = [c for c in own[name] if c not in index]
        if missing:
            raise FastDataError(f"mixture source {name!r} has classes not in the classes "
                                f"given: {_sample(missing)}")
        relabel.append(np.asarray([index[c] for c in own[name]], dtype=np.int64))
    return merged, relabel


def _sample(names, limit: int = 4) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}]"

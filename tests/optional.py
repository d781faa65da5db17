"""The tests' optional dependencies: one registry, one way to probe them.

Every test that needs something an extra brings (DALI, obstore, pyarrow, a
Dask cluster, ...) asks here, by the entry's name, and never with its own
``find_spec`` or ``importorskip``::

    import optional

    needs_dali = optional.skip_unless("dali")        # a mark: a test, a class,
    pytestmark = optional.skip_unless("obstore")     # or a whole module
    pa = optional.require("pyarrow")                 # the module, or a skip (also at
                                                     # a module's top, or in a fixture)
    optional.skip_if_missing("lightning")            # the same, importing nothing
    if optional.available("dali"): ...               # a plain answer

A probe never raises, whatever is installed: ``importlib.util.find_spec("nvidia.dali")``
raises ModuleNotFoundError where the parent package ``nvidia`` is absent, which
once stopped the whole suite at collection on a machine without DALI. A skip's
reason names what is missing and the extra that brings it ("needs NVIDIA DALI:
pip install -e '.[dali]'"). The skip is an ordinary one: under ``.ci/run``
(``FASTDATA_CI=1``), which installs every extra, the hooks of conftest.py turn it
into a failure (tests/allowed_skips.py), so a broken install cannot quietly drop
the tests of what it lacks.

Run as a script, this module runs pytest with dependencies hidden, as on a
machine without them (``.ci/run`` collects the suite so)::

    python tests/optional.py --without dali -- --collect-only -q
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import pytest


@dataclass(frozen=True)
class Dependency:
    """An optional dependency of the tests.

    Attributes:
        what: its name in a skip reason.
        install: how to get it, named by this project's extra where one brings it.
        modules: the modules that must all be importable (the first is what
            :func:`require` returns).
        probe: where importability is not the whole question (a library found
            at run time): a function answering whether it is usable, run once.
        hides: more top-level packages that ``--without`` hides.
    """

    what: str
    install: str
    modules: tuple[str, ...] = ()
    probe: Callable[[], bool] | None = None
    hides: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return f"needs {self.what}: {self.install}"

    @property
    def top_level(self) -> frozenset[str]:
        """The packages that ``--without`` hides: those of ``modules``, and ``hides``."""
        return frozenset(m.partition(".")[0] for m in self.modules + self.hides)


def _extra(name: str) -> str:
    return f"pip install -e '.[{name}]'"


def _turbojpeg() -> bool:
    from fastdata.decoding import turbojpeg

    return turbojpeg.available()


#: Every optional dependency a test probes, by the name the tests ask for.
DEPENDENCIES: dict[str, Dependency] = {
    "dali": Dependency("NVIDIA DALI", _extra("dali"), ("nvidia.dali",)),
    "obstore": Dependency("obstore", _extra("cloud"), ("obstore",)),
    "boto3": Dependency("boto3", _extra("test"), ("boto3",)),
    "gcp-storage-emulator": Dependency("gcp-storage-emulator", _extra("test"),
                                       ("gcp_storage_emulator",)),
    "distributed": Dependency("Dask distributed", _extra("dask"), ("distributed",)),
    "ray": Dependency("Ray", _extra("ray"), ("ray",)),
    "pyarrow": Dependency("pyarrow", _extra("parquet"), ("pyarrow", "pyarrow.parquet")),
    "jpeg4py": Dependency("jpeg4py", _extra("jpeg4py"), ("jpeg4py",)),
    # fastdata finds the library itself: the turbojpeg wheel's, $FASTDATA_TURBOJPEG's
    # or the system's (fastdata.decoding.turbojpeg).
    "turbojpeg": Dependency("a TurboJPEG 3 library", _extra("turbo"), probe=_turbojpeg,
                            hides=("turbojpeg",)),
    "webdataset": Dependency("webdataset", _extra("test"), ("webdataset",)),
    "tfrecord": Dependency("the tfrecord package", _extra("test"), ("tfrecord",)),
    "torchdata": Dependency("torchdata", _extra("test"),
                            ("torchdata.stateful_dataloader",)),
    "hypothesis": Dependency("hypothesis", _extra("test"), ("hypothesis",)),
    "datasets": Dependency("Hugging Face datasets", _extra("test"), ("datasets",)),
    "lightning": Dependency("PyTorch Lightning", _extra("test"), ("lightning",)),
    "selenium": Dependency("selenium", _extra("test"), ("selenium",)),
    "docs": Dependency("the docs tools", _extra("docs"),
                       ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python",
                        "mkdocs_click")),
    "yaml": Dependency("PyYAML", _extra("docs"), ("yaml",)),
    # No extra: PyPI's torchvision imports only beside the torch build it was
    # made for. The tests run them in an interpreter that has them
    # (ci_needs.vision_python); here only for --without.
    "vision": Dependency("timm and torchvision",
                         "pip install timm torchvision (a build for this torch), or set "
                         "FASTDATA_VISION_PYTHON", ("timm", "torchvision")),
}


def _entry(name: str) -> Dependency:
    try:
        return DEPENDENCIES[name]
    except KeyError:
        raise KeyError(f"no optional dependency {name!r} in tests/optional.py; "
                       f"known: {', '.join(DEPENDENCIES)}") from None


def _found(module: str) -> bool:
    """Whether ``module`` can be imported; never raises (a missing parent
    package, a module in sys.modules without a spec, a broken namespace)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError, AttributeError):
        return False


@functools.cache
def available(name: str) -> bool:
    """Whether the dependency ``name`` is there; never raises."""
    dep = _entry(name)
    if not all(_found(module) for module in dep.modules):
        return False
    return dep.probe() if dep.probe is not None else True


def reason(name: str) -> str:
    """The skip reason for a missing ``name``: what it is and how to install it."""
    return _entry(name).reason


def skip_unless(*names: str) -> pytest.MarkDecorator:
    """A skipif mark for tests that need every one of ``names``."""
    absent = [name for name in names if not available(name)]
    return pytest.mark.skipif(bool(absent), reason="; ".join(map(reason, absent)))


def skip_if_missing(name: str) -> None:
    """Skip, with the entry's reason, where the dependency ``name`` is missing:
    in a test, a fixture, or at a module's top (the module is skipped whole)."""
    __tracebackhide__ = True    # the skip is reported at the caller's line
    if not available(name):
        pytest.skip(reason(name), allow_module_level=True)


def require(name: str, module: str | None = None) -> ModuleType:
    """The module ``module`` (by default the entry's first), imported; a skip
    (:func:`skip_if_missing`) where the dependency is missing. A dependency that
    is there but fails to import raises its error: that is no skip."""
    __tracebackhide__ = True
    skip_if_missing(name)
    return importlib.import_module(module or _entry(name).modules[0])


# -- hiding dependencies, as on a machine without them -------------------------------


class _Hidden:
    """A finder (on ``sys.meta_path``, or of one ``sys.path`` entry) that finds
    nothing under the hidden top-level names and defers to the finder it wraps
    for everything else."""

    def __init__(self, finder, hidden: frozenset[str]) -> None:
        self._finder = finder
        self._hidden = hidden

    def find_spec(self, name, *args, **kwargs):
        if name.partition(".")[0] in self._hidden:
            return None
        find_spec = getattr(self._finder, "find_spec", None)
        return None if find_spec is None else find_spec(name, *args, **kwargs)

    def __getattr__(self, attr):
        return getattr(self._finder, attr)


def top_level_names(names: list[str]) -> frozenset[str]:
    """The top-level packages of the dependencies ``names`` ("all": every one)."""
    if names == ["all"]:
        names = list(DEPENDENCIES)
    return frozenset().union(*(_entry(name).top_level for name in names))


def hide(names: list[str]) -> frozenset[str]:
    """Make the dependencies ``names`` unimportable in this process, as where
    they are not installed: ``import nvidia.dali`` raises ModuleNotFoundError
    ("No module named 'nvidia'"), ``find_spec("nvidia")`` is None. Child
    processes are not affected: this is for collecting, not running, the tests."""
    hidden = top_level_names(names)
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in hidden)
    if loaded:
        raise RuntimeError(f"cannot hide what is imported already: {', '.join(loaded)}")
    # The finders there now (an editable install's among them), and each
    # sys.path entry's finder, which every later meta path finder that searches
    # sys.path uses too (pytest's assertion rewriting hook, inserted first).
    sys.meta_path[:] = [_Hidden(finder, hidden) for finder in sys.meta_path]
    hooks = list(sys.path_hooks)

    def hidden_entry(entry: str) -> _Hidden:
        for hook in hooks:
            try:
                return _Hidden(hook(entry), hidden)
            except ImportError:
                continue
        raise ImportError(f"no finder for {entry!r}")

    sys.path_hooks.insert(0, hidden_entry)
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    available.cache_clear()
    return hidden


def main(argv: list[str]) -> int:
    """``optional.py --without NAME[,NAME...]|all -- PYTEST_ARGS``: pytest in
    this process with those dependencies hidden."""
    import argparse

    parser = argparse.ArgumentParser(prog="tests/optional.py", description=main.__doc__)
    parser.add_argument("--without", required=True,
                        help=f"comma-separated: {', '.join(DEPENDENCIES)}, or all")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    hidden = hide(args.without.split(","))
    plugins = _plugins_of(hidden)
    print(f"tests/optional.py: hidden: {', '.join(sorted(hidden))}"
          f"{'; their pytest plugins: ' + ', '.join(plugins) if plugins else ''}", flush=True)
    blocked = [arg for name in plugins for arg in ("-p", f"no:{name}")]
    return int(pytest.main([*blocked, *args.pytest_args]))


def _plugins_of(hidden: frozenset[str]) -> list[str]:
    """The pytest plugins that the distributions of the ``hidden`` packages
    bring (hypothesis's, say): gone too where those are not installed."""
    from importlib.metadata import entry_points, packages_distributions

    dists = {dist for top, names in packages_distributions().items() if top in hidden
             for dist in names}
    return sorted(ep.name for ep in entry_points(group="pytest11") if ep.dist.name in dists)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

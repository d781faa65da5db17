"""``import fastdata`` stays light; third-party libraries load only when needed.

Allow-lists, not deny-lists: each case names every third-party top-level
module it may load, so a new heavy import anywhere fails here, whatever its
name. The standard library and what the interpreter loads before any of our
code (site hooks, the editable-install finder) are always allowed.
"""

from __future__ import annotations

import ast
import itertools
import json
import textwrap
from pathlib import Path

import pytest
from conftest import run_python


def _third_party_after(statements: str) -> set[str]:
    code = f"""
        import json, sys
        before = set(sys.modules)
        {statements}
        new = {{m.split(".")[0] for m in set(sys.modules) - before}}
        print(json.dumps(sorted(new - set(sys.stdlib_module_names))))
        """
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("statements,allowed", [
    ("import fastdata", {"fastdata"}),
    ("import fastdata; fastdata.FastDataError; fastdata.CorruptDataError; fastdata.__version__",
     {"fastdata"}),
    ("import fastdata.formats, fastdata.records, fastdata.errors, fastdata.machine",
     {"fastdata"}),
    # `fastdata --help` must not pay for torch, numpy or any format library.
    ("import fastdata.cli", {"fastdata", "click"}),
    ("import fastdata.decoding.decoder_registry", {"fastdata"}),
    # Packing and reading need the format libraries, never torch.
    ("import fastdata; fastdata.pack; fastdata.formats.open_reader; "
     "import fastdata.formats.lmdb.reader, fastdata.formats.hdf5.reader, "
     "fastdata.formats.tfrecord.reader, fastdata.formats.tar.reader",
     {"fastdata", "numpy", "lmdb", "h5py", "crc32c", "PIL", "tqdm"}),
    # The storage layer loads obstore only when a remote URL is used.
    ("import fastdata.storage; fastdata.storage.is_url('s3://b/x')", {"fastdata"}),
    # The torch-free sub-packages, reached as attributes of fastdata.
    ("import fastdata; fastdata.order.Order; fastdata.decoding.Decode; "
     "fastdata.decoding.CenterCrop; fastdata.decoding.RandomResizedCrop; "
     "fastdata.storage.is_url('s3://b/x')", {"fastdata", "numpy"}),
    # DALI pipelines are built without importing DALI or torch up front.
    ("import fastdata.dali", {"fastdata", "numpy"}),
], ids=["fastdata", "errors", "registry", "cli", "decoder-registry", "pack-and-read", "storage",
    "torch-free-subpackages", "dali"])
def test_imports_stay_within_their_allow_list(statements, allowed):
    loaded = _third_party_after(statements)
    assert loaded <= allowed, f"unexpected imports: {sorted(loaded - allowed)}"


def test_dataset_access_imports_torch():
    assert "torch" in _third_party_after("import fastdata; fastdata.LMDBDataset")


def test_subpackages_are_attributes_imported_on_first_use():
    code = """
        import fastdata, sys
        subpackages = ("fastdata.order", "fastdata.decoding", "fastdata.storage")
        assert not set(subpackages) & set(sys.modules), sorted(sys.modules)
        assert fastdata.order.Order is fastdata.Order
        assert fastdata.decoding.Decode is fastdata.Decode
        assert fastdata.decoding.CenterCrop is fastdata.CenterCrop
        assert fastdata.decoding.RandomResizedCrop is fastdata.RandomResizedCrop
        assert fastdata.storage.join("s3://b/x", "y") == "s3://b/x/y"
        assert set(subpackages) <= set(sys.modules)
        assert "Decode" in dir(fastdata.decoding) and "Order" in dir(fastdata.order)
        try:
            fastdata.order.no_such_name
        except AttributeError as exc:
            assert "fastdata.order" in str(exc) and "no_such_name" in str(exc)
        else:
            raise SystemExit("no AttributeError")
        print("ok")
        """
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_dir_lists_lazy_names():
    code = """
        import fastdata, sys
        names = dir(fastdata)
        assert "LMDBDataset" in names and "pack" in names and "open_dataset" in names, names
        assert "torch" not in sys.modules
        try:
            fastdata.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise SystemExit("no AttributeError")
        print("ok")
        """
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# -- which package may import which ----------------------------------------------------

#: Package -> the fastdata packages it must never import (at any depth of its
#: modules, function-level imports included): the layers above it.
FORBIDDEN = {
    "formats": {"loaders", "dali", "packers", "bench", "cli", "demo", "dataset", "ops"},
    "decoding": {"loaders", "dali", "packers", "formats", "bench", "cli", "dataset", "ops"},
    "order": {"loaders", "dali", "packers", "formats", "decoding", "bench", "cli", "dataset",
              "ops"},
    "storage": {"loaders", "dali", "packers", "formats", "decoding", "order", "bench", "cli",
                "dataset", "ops"},
    "dataset": {"loaders", "dali", "packers", "ops", "bench", "cli", "demo"},
    "packers": {"loaders", "dali", "bench", "ops"},
    "ops": {"loaders", "dali", "bench", "cli", "demo"},
    "dali": {"loaders", "packers", "bench", "cli", "ops"},
    "meter": {"loaders", "dali", "packers", "formats", "decoding", "order", "bench", "cli",
              "dataset", "ops", "demo"},
    # The job runner and its executors: under every job (packers, ops).
    "jobs": {"loaders", "dali", "packers", "formats", "decoding", "order", "bench", "cli",
             "dataset", "ops", "demo", "meter", "storage"},
}
#: Packages that never import torch: only the torch layer (loaders) and the
#: tools built on it do (DALI only to find the current CUDA device).
TORCH_FREE = ("formats", "decoding", "order", "storage", "dataset", "packers", "ops",
              "meter", "jobs")


def _imports(package: str) -> list[tuple[str, int, str]]:
    """(file, line, imported module) of every import in ``fastdata/<package>``."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "fastdata" / package
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [(str(path), node.lineno, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append((str(path), node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_no_layer_above_it(package):
    bad = [f"{path}:{line}: {module}" for path, line, module in _imports(package)
           if module.split(".")[0] == "fastdata" and len(module.split(".")) > 1
           and module.split(".")[1] in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_names_no_layer_above_it_in_a_lazy_reference(package):
    """A "module:attribute" string (resolved where it is used, so no import)
    still ties a package to the module it names: none names a layer above."""
    import re
    from pathlib import Path

    named = re.compile(r"[\"']fastdata\.(\w+)[\w.]*:\w+[\"']")
    root = Path(__file__).resolve().parents[1] / "fastdata" / package
    bad = [f"{path}: {m.group(0)}" for path in sorted(root.rglob("*.py"))
           for m in named.finditer(path.read_text(encoding="utf-8"))
           if m.group(1) in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", TORCH_FREE)
def test_torch_stays_in_the_torch_layer(package):
    bad = [f"{path}:{line}: {module}" for path, line, module in _imports(package)
           if module.split(".")[0] == "torch"]
    assert not bad, "\n".join(bad)


# -- no import cycles ------------------------------------------------------------------
#
# The graph, read with ``ast`` (nothing is imported): one node per module of fastdata/
# (a package is its __init__.py) and an edge A -> B for every import in A that can run
# and imports B.
# * Every import statement counts, wherever it is: module level, functions, methods,
#   try/except. Not one under ``if TYPE_CHECKING:``, which never runs.
# * ``import fastdata.x.y``, ``from fastdata.x import y`` and their relative forms are
#   an edge to fastdata.x.y when that is a module; ``from fastdata.x import name`` of an
#   attribute is an edge to fastdata.x (its __init__.py).
# * Importing a module is not counted as importing its parent packages, though Python
#   runs their __init__ first: a package is set up before its children, so that step
#   cannot loop. Naming the package itself is an edge to it (``import fastdata.x``,
#   ``from fastdata.x import name``, ``from fastdata import x``): a package whose
#   __init__ imports its children, and a child that takes names from the package, is
#   a cycle.
# * A package's lazy names (its __init__'s ``_LAZY`` "module:attribute" table and
#   ``_SUBMODULES``, imported by its ``__getattr__`` on first access) are an edge from
#   whoever takes one, ``from fastdata import open_dataset`` or ``fastdata.open_dataset``
#   (in a module that does ``import fastdata``), to the module that defines it; the
#   __init__ itself imports nothing for them. A module's own ``__getattr__`` that runs
#   an import is an ordinary import inside a function.
# * A "module:attribute" string (fastdata.lazy.load: a format's reader, a decoder, a
#   child process's task) is not an import: a registry entry is resolved where it is
#   used, and a child's task is imported in the child.

#: Cycles allowed while being taken apart (none today), each the set of modules of
#: one strongly connected component. A cycle must lie inside an entry, and every
#: entry must still hold one, so the set only shrinks.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runnable(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack += node.orelse
        else:
            stack += ast.iter_child_nodes(node)


def import_graph(root: Path) -> dict[str, dict[str, str]]:
    """Module -> {module it imports: "file:line" of the first such import}, for the
    package at ``root`` (see the rules above)."""
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in files.items()}
    lazy: dict[str, dict[str, str]] = {}
    for name, path in files.items():
        if path.name != "__init__.py":
            continue
        for node in trees[name].body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] \
                    in (["_LAZY"], ["_SUBMODULES"]):
                value = ast.literal_eval(node.value)
                table = lazy.setdefault(name, {})
                if node.targets[0].id == "_LAZY":
                    table.update({k: v.partition(":")[0] for k, v in value.items()})
                else:
                    table.update({k: f"{name}.{k}" for k in value})
    top = root.name

    def taken(module: str, names) -> list[str]:
        out = []
        for attr in names:
            if f"{module}.{attr}" in files:
                out.append(f"{module}.{attr}")
            else:
                out += [module, *([lazy[module][attr]] if attr in lazy.get(module, {}) else [])]
        return out

    graph: dict[str, dict[str, str]] = {}
    for name, tree in trees.items():
        where = f"{files[name].relative_to(root.parent)}:"
        package = name if files[name].name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, {})
        nodes = list(_runnable(tree))
        binds_top = False
        inner = {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}
        for node in nodes:
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
                binds_top |= any(a.name.split(".")[0] == top and not a.asname
                                 for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = taken(base, [alias.name for alias in node.names])
            else:
                continue
            for target in targets:
                if target in files and target != name:
                    edges.setdefault(target, f"{where}{node.lineno}")
        if not binds_top:
            continue
        for node in nodes:  # fastdata.open_dataset, fastdata.formats.read_manifest, ...
            if not isinstance(node, ast.Attribute) or id(node) in inner:
                continue
            chain = [node.attr]
            value = node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if not (isinstance(value, ast.Name) and value.id == top):
                continue
            module, target = top, None
            for attr in chain:
                if f"{module}.{attr}" in files:
                    module = target = f"{module}.{attr}"
                else:
                    target = lazy.get(module, {}).get(attr, target)
                    break
            if target in files and target != name:
                edges.setdefault(target, f"{where}{node.lineno}")
    return graph


def strongly_connected(graph: dict[str, dict[str, str]]) -> list[frozenset[str]]:
    """The cycles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe_cycle(graph: dict[str, dict[str, str]], component: frozenset[str]) -> str:
    """Chains of module names, the shortest loop through each module of
    ``component``, each import with the line it is on."""
    chains = {}
    for start in sorted(component):
        paths = {start: [start]}
        queue = [start]
        loop = None
        while queue and loop is None:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w == start:
                    loop = paths[v] + [start]
                    break
                if w in component and w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
        turn = loop.index(min(loop[:-1]))
        chains.setdefault(tuple(loop[turn:-1] + loop[:turn + 1]), None)
    lines = []
    for chain in chains:
        lines.append(" -> ".join(chain))
        lines += [f"    {graph[a][b]}: {a} imports {b}" for a, b in itertools.pairwise(chain)]
    return "\n".join(lines)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / "pkg"


def test_the_import_graph_follows_its_rules(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": """
            _LAZY = {"thing": "pkg.sub.deep:Thing"}
            _SUBMODULES = ("side",)
            """,
        "a.py": """
            from typing import TYPE_CHECKING
            from pkg.sub import deep, name
            if TYPE_CHECKING:
                import pkg.hinted
            def later():
                from . import side
            """,
        "b.py": """
            import pkg
            def use():
                return pkg.thing, pkg.side.x
            """,
        "c.py": "from pkg import thing\n",
        "hinted.py": "",
        "side.py": "",
        "sub/__init__.py": "from .deep import name\n",
        "sub/deep.py": "from ..side import *\n",
    })
    graph = import_graph(root)
    assert graph["pkg"] == {}
    assert set(graph["pkg.a"]) == {"pkg.sub.deep", "pkg.sub", "pkg.side"}
    assert graph["pkg.a"]["pkg.side"] == "pkg/a.py:7"
    assert set(graph["pkg.b"]) == {"pkg", "pkg.sub.deep", "pkg.side"}
    assert set(graph["pkg.c"]) == {"pkg", "pkg.sub.deep"}
    assert set(graph["pkg.sub"]) == {"pkg.sub.deep"}
    assert set(graph["pkg.sub.deep"]) == {"pkg.side"}
    assert strongly_connected(graph) == []


def test_cycles_are_found_and_shown_as_chains(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from pkg.child import x\n",
        "child.py": "def f():\n    from pkg import y\n",
        "a.py": "import pkg.b\n",
        "b.py": "from pkg.c import z\n",
        "c.py": "from pkg import a\n",
        "alone.py": "import pkg.a\n",
    })
    graph = import_graph(root)
    assert sorted(map(sorted, strongly_connected(graph))) == [
        ["pkg", "pkg.child"], ["pkg.a", "pkg.b", "pkg.c"]]
    assert describe_cycle(graph, frozenset({"pkg.a", "pkg.b", "pkg.c"})) == (
        "pkg.a -> pkg.b -> pkg.c -> pkg.a\n"
        "    pkg/a.py:1: pkg.a imports pkg.b\n"
        "    pkg/b.py:1: pkg.b imports pkg.c\n"
        "    pkg/c.py:1: pkg.c imports pkg.a")


def test_fastdata_has_no_import_cycles():
    graph = import_graph(Path(__file__).resolve().parents[1] / "fastdata")
    cycles = strongly_connected(graph)
    new = [c for c in cycles if not any(c <= known for known in KNOWN_CYCLES)]
    gone = [known for known in KNOWN_CYCLES if not any(c <= known for c in cycles)]
    message = []
    if new:
        message.append("import cycles (move what both sides need to the module that owns it):")
        message += [describe_cycle(graph, c) for c in new]
    if gone:
        message.append("KNOWN_CYCLES lists cycles that are gone; remove them: "
                       + "; ".join(", ".join(sorted(k)) for k in gone))
    known = [c for c in cycles if c not in new]
    if message and known:
        message.append("and the known ones, being taken apart:")
        message += [describe_cycle(graph, c) for c in known]
    assert not message, "\n".join(message)

"""``import fastdata`` stays light; third-party libraries load only when needed.

Allow-lists, not deny-lists: each case names every third-party top-level
module it may load, so a new heavy import anywhere fails here, whatever its
name. The standard library and what the interpreter loads before any of our
code (site hooks, the editable-install finder) are always allowed.
"""

from __future__ import annotations

import json

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
    # DALI pipelines are built without importing DALI or torch up front.
    ("import fastdata.dali", {"fastdata", "numpy"}),
], ids=["fastdata", "errors", "registry", "cli", "decoder-registry", "pack-and-read", "storage",
    "dali"])
def test_imports_stay_within_their_allow_list(statements, allowed):
    loaded = _third_party_after(statements)
    assert loaded <= allowed, f"unexpected imports: {sorted(loaded - allowed)}"


def test_dataset_access_imports_torch():
    assert "torch" in _third_party_after("import fastdata; fastdata.LMDBDataset")


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
    "formats": {"loaders", "dali", "packers", "bench", "cli", "demo"},
    "decoding": {"loaders", "dali", "packers", "formats", "bench", "cli"},
    "order": {"loaders", "dali", "packers", "formats", "decoding", "bench", "cli"},
    "storage": {"loaders", "dali", "packers", "formats", "decoding", "order", "bench", "cli"},
    "packers": {"loaders", "dali", "bench"},
    "dali": {"loaders", "packers", "bench", "cli"},
}
#: Packages that never import torch: only the torch layer (loaders) and the
#: tools built on it do (DALI only to find the current CUDA device).
TORCH_FREE = ("formats", "decoding", "order", "storage", "packers")


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


@pytest.mark.parametrize("package", TORCH_FREE)
def test_torch_stays_in_the_torch_layer(package):
    bad = [f"{path}:{line}: {module}" for path, line, module in _imports(package)
           if module.split(".")[0] == "torch"]
    assert not bad, "\n".join(bad)

"""The tests' optional dependencies are probed one way (tests/optional.py): the
probe never raises, a skip names the extra that brings what is missing, and the
suite collects with them hidden (what .ci/run checks)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import allowed_skips
import optional
import pytest
from ci_needs import top_level_commands

TESTS = Path(__file__).parent
ROOT = TESTS.parent


def test_a_missing_parent_package_is_an_answer_not_an_error(monkeypatch):
    monkeypatch.setitem(optional.DEPENDENCIES, "nothing", optional.Dependency(
        "nothing", "pip install nothing", ("fastdata_no_such_parent.child",)))
    with pytest.raises(ModuleNotFoundError):     # what stopped the suite once
        importlib.util.find_spec("fastdata_no_such_parent.child")
    assert optional.available("nothing") is False
    mark = optional.skip_unless("nothing")
    assert mark.args == (True,) and mark.kwargs["reason"] == "needs nothing: pip install nothing"
    with pytest.raises(pytest.skip.Exception, match="needs nothing: pip install nothing"):
        optional.require("nothing")


def test_each_reason_names_the_extra_that_brings_it():
    assert optional.reason("dali") == "needs NVIDIA DALI: pip install -e '.[dali]'"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for name, dep in optional.DEPENDENCIES.items():
        named = re.findall(r"pip install -e '\.\[(\w+)\]'", dep.reason)
        assert named or name == "vision", f"{name}: {dep.reason}"
        assert set(named) <= set(extras), f"{name} names an extra pyproject.toml lacks"


def test_ci_allows_none_of_these_skips():
    """CI installs every extra: a skip for one fails the run there."""
    for name in optional.DEPENDENCIES:
        assert allowed_skips.allowed(optional.reason(name)) is None, name


def test_an_unknown_name_says_which_exist():
    with pytest.raises(KeyError, match="known: dali, obstore"):
        optional.available("DALI")


def test_no_test_probes_an_import_by_itself():
    """One way to probe: find_spec and importorskip live in tests/optional.py
    (test_ci_needs.py runs pytest's importorskip on purpose, in generated code)."""
    own = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name in ("optional.py", "test_optional.py", "test_ci_needs.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(find_spec|importorskip)\(", line):
                own.append(f"{path.name}:{n}: {line.strip()}")
    assert not own, "probe through tests/optional.py instead:\n" + "\n".join(own)


GENERATED = {
    "test_guarded.py": '''
        import optional

        dali = optional.skip_unless("dali")

        @dali
        def test_on_dali():
            import nvidia.dali  # noqa: F401

        def test_plain():
            pass
        ''',
    "test_unguarded.py": '''
        import nvidia.dali  # noqa: F401

        def test_never():
            pass
        ''',
}


def _collect_without(tmp_path, *files: str) -> subprocess.CompletedProcess:
    """``tests/optional.py --without dali`` collecting ``files`` of GENERATED in a
    child, with none of the suite's settings."""
    for name, code in GENERATED.items():
        (tmp_path / name).write_text(textwrap.dedent(code))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("FASTDATA_CI", "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, str(TESTS / "optional.py"), "--without", "dali", "--",
         "-p", "no:cacheprovider", "-c", "pytest.ini", "--rootdir", ".", "--collect-only",
         "-q", *files], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        check=False)


def test_without_dali_a_guarded_module_collects(tmp_path):
    result = _collect_without(tmp_path, "test_guarded.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tests/optional.py: hidden: nvidia" in result.stdout
    assert "2 tests collected" in result.stdout


def test_without_dali_an_unguarded_import_fails_collection(tmp_path):
    result = _collect_without(tmp_path, "test_guarded.py", "test_unguarded.py")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "ERROR collecting test_unguarded.py" in result.stdout
    assert "No module named 'nvidia'" in result.stdout


def test_hidden_is_as_absent(tmp_path):
    """In a child: find_spec of the package is None, of a module in it raises as
    where the package is absent, and the probe says no."""
    script = textwrap.dedent('''
        import importlib.util, sys
        import optional
        optional.hide(["dali", "obstore"])
        assert importlib.util.find_spec("nvidia") is None
        assert importlib.util.find_spec("obstore") is None
        try:
            importlib.util.find_spec("nvidia.dali")
        except ModuleNotFoundError as err:
            assert str(err) == "No module named 'nvidia'", err
        else:
            raise AssertionError("nvidia.dali found")
        assert not optional.available("dali") and not optional.available("obstore")
        assert optional.available("tfrecord") == (importlib.util.find_spec("tfrecord") is not None)
        import json  # the rest imports as before
        print("ok")
        ''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get(
        "PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path, check=False)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


def test_hiding_what_is_imported_already_is_refused(monkeypatch):
    monkeypatch.setitem(optional.DEPENDENCIES, "pytest-itself",
                        optional.Dependency("pytest", "", ("pytest",)))
    meta_path = list(sys.meta_path)
    with pytest.raises(RuntimeError, match="imported already: .*pytest"):
        optional.hide(["pytest-itself"])
    assert sys.meta_path == meta_path      # refused before anything changed


def test_ci_collects_the_suite_without_dali_and_without_every_extra():
    commands = top_level_commands((ROOT / ".ci" / "run").read_text())
    assert "collect_without dali" in commands and "collect_without all" in commands

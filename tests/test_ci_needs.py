"""Under .ci/run a missing component fails the run, and so does any skip that
tests/allowed_skips.py does not allow; by hand they skip, saying why."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import allowed_skips
import pytest
from ci_needs import (_imports_vision, checkout_env, ci_spelling, missing, top_level_commands,
                      vision_python)

ROOT = Path(__file__).parent.parent


def test_a_missing_component_skips_by_hand(monkeypatch):
    monkeypatch.delenv("FASTDATA_CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Azurite is not installed"):
        missing("Azurite is not installed")


def test_a_missing_component_fails_in_ci(monkeypatch):
    monkeypatch.setenv("FASTDATA_CI", "1")
    with pytest.raises(pytest.fail.Exception, match="Azurite is not installed.*must provide"):
        missing("Azurite is not installed")


def test_ci_sets_it_and_pins_the_golden_versions():
    ci = ROOT / ".ci"
    run = (ci / "run").read_text()
    assert "export FASTDATA_CI=1" in run and 'PIP_CONSTRAINT="$PWD/.ci/constraints.txt' in run
    assert 'export FASTDATA_VISION_PYTHON="$VISION/bin/python"' in run
    pins = dict(line.split("==") for line in (ci / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    import json

    made_with = json.loads((Path(__file__).parent / "golden" / "expected.json").read_text())
    assert pins["Pillow"] == made_with["libraries"]["Pillow"]
    assert pins["numpy"] == made_with["libraries"]["numpy"]
    assert pins["opencv-python-headless"].startswith(made_with["libraries"]["opencv"] + ".")


def test_a_vision_python_that_does_not_import_them_is_named(monkeypatch):
    monkeypatch.setenv("FASTDATA_CI", "1")
    monkeypatch.setenv("FASTDATA_VISION_PYTHON", "/nonexistent/bin/python")
    if _imports_vision(sys.executable) is None:      # this interpreter has them
        assert vision_python() == sys.executable
        return
    with pytest.raises(pytest.fail.Exception,
                       match=r"timm and torchvision do not import .*/nonexistent/bin/python"):
        vision_python()


# -- skips CI allows (tests/allowed_skips.py) ---------------------------------------


@pytest.mark.parametrize("reason", [
    "needs CUDA",                                              # test_cache_prefetch, test_dali
    "checks the machine without CUDA",                         # test_dali, on a GPU machine
    "checks the message of a machine without CUDA",            # test_gpu_scripts
    "needs libjpeg-turbo 3.1+ for lossless restart markers",   # test_jpeg_restarts
    "this libjpeg-turbo adds restart markers losslessly",      # the same, on 3.1
])
def test_the_allowlist_takes_the_reasons_no_ci_machine_can_avoid(reason):
    assert allowed_skips.allowed(reason) is not None
    assert allowed_skips.allowed(reason.upper()) is not None


@pytest.mark.parametrize("reason", [
    "moto_server is not on PATH (pip install 'moto[server]') (.ci/run provides it)",
    "could not import 'obstore': No module named 'obstore'",
    "could not import 'distributed': No module named 'distributed'",
    "NVIDIA DALI is not installed",
    "PyTorch Lightning is not installed",
    "no TurboJPEG 3",
    "moto needs CUDA",            # a whole reason must match, not a part of it
])
def test_the_allowlist_takes_nothing_else(reason):
    assert allowed_skips.allowed(reason) is None


def test_every_entry_of_the_allowlist_says_why():
    source = Path(allowed_skips.__file__).read_text()
    for entry in allowed_skips.ALLOWED:
        above = source[:source.index(f'"{entry.name}"')].rstrip().splitlines()
        assert above[-1].strip().startswith("Allowed(") and above[-2].strip().startswith("#")


GENERATED = {
    "test_skips.py": '''
        import pytest

        def test_runs():
            pass

        @pytest.mark.skipif(True, reason="needs CUDA")
        def test_on_a_gpu():
            pass

        def test_without_its_server():
            pytest.skip("moto_server is not installed")

        @pytest.mark.xfail(reason="a known bug", strict=True)
        def test_known_bug():
            assert False
        ''',
    "test_gone.py": '''
        import pytest

        pytest.importorskip("fastdata_no_such_module")

        def test_never():
            pass
        ''',
}


def _run_generated(tmp_path, ci: bool) -> subprocess.CompletedProcess:
    """pytest on GENERATED in a child, with this suite's conftest.py as a plugin
    (its hooks as they run here) and nothing else of the suite's settings."""
    for name, code in GENERATED.items():
        (tmp_path / name).write_text(textwrap.dedent(code))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = checkout_env()
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env["PYTHONPATH"]])
    env.pop("FASTDATA_CI", None)
    env.pop("PYTEST_ADDOPTS", None)
    if ci:
        env["FASTDATA_CI"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conftest",
         "-c", "pytest.ini", "--rootdir", ".", "--continue-on-collection-errors", "-q",
         *GENERATED], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_in_ci_a_skip_not_allowed_fails_naming_the_test_and_the_reason(tmp_path):
    result = _run_generated(tmp_path, ci=True)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "FAILED test_skips.py::test_without_its_server - skipped: moto_server" in out
    assert ("skipped: moto_server is not installed (test_skips.py::test_without_its_server "
            "skipped at test_skips.py:12; FASTDATA_CI=1 fails every skip") in out
    assert "ERROR test_gone.py - skipped: could not import" in out   # a module skipped whole
    assert ("skipped: could not import 'fastdata_no_such_module': No module named "
            "'fastdata_no_such_module' (test_gone.py skipped at test_gone.py:4;") in out
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error" in out, out
    assert "skips FASTDATA_CI=1 allows (tests/allowed_skips.py)" in out
    assert "no CUDA: 1 skipped (needs CUDA)\n" in out
    assert "libjpeg-turbo 3.1 lossless restart markers: 0 skipped\n" in out


def test_by_hand_every_skip_stays_a_skip(tmp_path):
    result = _run_generated(tmp_path, ci=False)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "1 passed, 3 skipped, 1 xfailed" in out, out
    assert "skips by reason" in out
    assert "1 skipped: needs CUDA [allowed in CI: no CUDA]" in out
    assert ("1 skipped: moto_server is not installed [fails under FASTDATA_CI=1]" in out)


# -- the servers: a missing one named in CI --------------------------------------------


def test_a_missing_moto_server_fails_in_ci_naming_it(monkeypatch, tmp_path):
    from servers import MotoServer

    monkeypatch.setenv("PATH", str(tmp_path))      # an empty folder: no moto_server
    monkeypatch.setenv("FASTDATA_CI", "1")
    with pytest.raises(pytest.fail.Exception, match="moto_server is not on PATH"):
        MotoServer()
    monkeypatch.delenv("FASTDATA_CI")
    with pytest.raises(pytest.skip.Exception, match="moto_server is not on PATH"):
        MotoServer()


# -- .ci/run runs the README's test command, as a line of its own -----------------------


README_COMMAND = 'pip install -e ".[test,dali]" && python -m pytest -q'
CI_COMMAND = '"$PY" -m pip install -e ".[test,dali]" && "$PY" -m pytest -q'


def test_the_readme_command_is_spelled_as_ci_runs_it():
    assert ci_spelling(README_COMMAND) == CI_COMMAND


@pytest.mark.parametrize("script", [
    f"# {CI_COMMAND}\n",                                  # a comment
    f"echo '{CI_COMMAND}'\n",                             # a string
    f"true || {CI_COMMAND}\n",                            # a line that contains it
    f"{CI_COMMAND} || true\n",
    f"if false; then\n    {CI_COMMAND}\nfi\n",            # a block that does not run
    f"if false; then {CI_COMMAND}; fi\n",
    f"while false; do\n  {CI_COMMAND}\ndone\n",
    f"later() {{\n    {CI_COMMAND}\n}}\n",                 # a function nobody calls
    f"false || {{\n    {CI_COMMAND}\n}}\n",
    f"cat <<EOF\n{CI_COMMAND}\nEOF\n",                    # a heredoc
    f"exit 0\n{CI_COMMAND}\n",                            # after the script ends
])
def test_a_command_ci_does_not_run_is_not_taken_for_it(script):
    assert CI_COMMAND not in top_level_commands(f"set -e\n{script}echo done\n")


def test_a_command_ci_runs_is_found():
    script = ("if x; then\n  y\nfi\ncat <<'EOF'\ntext\nEOF\n"
              '"$PY" -m pip install \\\n    -e ".[test,dali]" && "$PY" -m pytest -q\n')
    assert top_level_commands(script)[-1] == CI_COMMAND
    assert CI_COMMAND in top_level_commands(Path(ROOT, ".ci", "run").read_text())

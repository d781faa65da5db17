"""Under .ci/run a missing component fails the run; by hand it skips, saying why."""

from __future__ import annotations

import sys

import pytest
from ci_needs import _imports_vision, missing, vision_python


def test_a_missing_component_skips_by_hand(monkeypatch):
    monkeypatch.delenv("FASTDATA_CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Azurite is not installed"):
        missing("Azurite is not installed")


def test_a_missing_component_fails_in_ci(monkeypatch):
    monkeypatch.setenv("FASTDATA_CI", "1")
    with pytest.raises(pytest.fail.Exception, match="Azurite is not installed.*must provide"):
        missing("Azurite is not installed")


def test_ci_sets_it_and_pins_the_golden_versions():
    from pathlib import Path

    ci = Path(__file__).parent.parent / ".ci"
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

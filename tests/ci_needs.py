"""Skips that CI must not take.

A test whose component is missing (an emulator, the pinned library versions)
skips, with the reason, where the suite runs by hand; under ``.ci/run``, which
sets ``FASTDATA_CI=1`` and installs every component, the same thing fails the
run instead, so a broken install cannot quietly remove what it was meant to
test.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("FASTDATA_CI") == "1"


def missing(reason: str) -> None:
    """Skip with ``reason`` by hand; fail with it in CI."""
    if in_ci():
        pytest.fail(f"{reason}; .ci/run (FASTDATA_CI=1) must provide it")
    pytest.skip(f"{reason} (.ci/run provides it)")

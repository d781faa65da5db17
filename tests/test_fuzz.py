"""The fuzz harness (engine: tests/fuzzing.py; command: bench/fuzz.py).

The fast form damages every file kind of every format a few dozen times and
asserts that no trial crashed, hung, ran out of memory or read back a wrong
record without an error. The other tests check the harness itself: that it
tells the outcomes apart, so that a clean run means something.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fuzzing
from conftest import run_python

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tar_pristine(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    return fuzzing.build(str(work), ["tar"])["tar"]


def _copy(p: fuzzing.Pristine, dest: Path) -> str:
    shutil.copytree(p.root, dest)
    return str(dest)


def test_undamaged_dataset_reads_back_as_harmless(tar_pristine):
    steps = fuzzing.evaluate(tar_pristine, tar_pristine.root)
    assert steps == {"map": ["ok", None], "stream": ["ok", None], "verify": ["ok", None]}
    assert fuzzing.classify(steps, 0, False) == "harmless"


def test_flipped_payload_byte_is_detected_by_every_reader(tar_pristine, tmp_path):
    root = _copy(tar_pristine, tmp_path / "copy")
    index = np.load(os.path.join(root, tar_pristine.files["index.npy"][0]))
    with open(os.path.join(root, tar_pristine.files["shard"][0]), "r+b") as f:
        f.seek(int(index["offset"][5]) + 20)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    steps = fuzzing.evaluate(tar_pristine, root)
    assert [status for status, _ in steps.values()] == ["detected"] * 3, steps
    assert fuzzing.classify(steps, 0, False) == "detected"


def test_records_unlike_the_originals_are_silent_wrong(tar_pristine):
    # The harness must notice a label that differs from the original one.
    shifted = dataclasses.replace(tar_pristine, labels=[*tar_pristine.labels[:7], 3,
                                                        *tar_pristine.labels[8:]])
    assert shifted.labels[7] != tar_pristine.labels[7]
    steps = fuzzing.evaluate(shifted, tar_pristine.root)
    assert steps["map"][0] == steps["stream"][0] == "silent-wrong"
    assert "record 7: label" in steps["map"][1]
    assert fuzzing.classify(steps, 0, False) == "silent-wrong"


def test_outcome_precedence():
    ok, wrong = ["ok", None], ["silent-wrong", "record 1"]
    assert fuzzing.classify(None, None, True) == "hang"
    assert fuzzing.classify(None, -11, False) == "crash"  # a signal
    assert fuzzing.classify(None, -9, False) == "oom"  # SIGKILL we did not send
    assert fuzzing.classify({"a": ["detected", "x"], "b": wrong}, 0, False) == "silent-wrong"
    assert fuzzing.classify({"a": ["oom", "x"], "b": wrong}, 0, False) == "oom"
    assert fuzzing.classify({"a": ["crash", "x"], "b": ["oom", "y"]}, 0, False) == "crash"
    assert fuzzing.classify({"a": ok, "b": ["detected", "x"]}, 0, False) == "detected"


def test_damage_is_reproducible(tar_pristine):
    trial = fuzzing.Trial("tar", "index.npy", 3)
    assert trial.damage(tar_pristine, 0) == trial.damage(tar_pristine, 0)
    others = {fuzzing.Trial("tar", "index.npy", n).damage(tar_pristine, 0)[1] for n in range(8)}
    assert len(others) == 8


def test_children_that_hang_crash_or_exhaust_memory_are_caught(tmp_path):
    """The time limit, the memory limit and signal deaths, with readers that
    misbehave on purpose (run from a fresh interpreter: trials fork)."""
    code = """
        import json, os, sys, time
        sys.path.insert(0, sys.argv[1])
        import fuzzing

        def hang(p, root): time.sleep(60)
        def abort(p, root): os.abort()
        def hog(p, root):
            return {"map": fuzzing._step(lambda p, path: len(bytearray(8 << 30)), p, root)}
        def raise_value_error(p, root):
            return {"map": fuzzing._step(lambda p, path: int("x"), p, root)}

        pristines = fuzzing.build(sys.argv[2], ["tar"])
        out = {}
        for name, check in [("hang", hang), ("abort", abort), ("hog", hog),
                            ("value", raise_value_error), ("real", None)]:
            result, = fuzzing.run([fuzzing.Trial("tar", "keys.json", 0)], pristines,
                                  sys.argv[2], timeout=3, mem_bytes=1 << 30, check=check)
            out[name] = result["outcome"]
        print(json.dumps(out))
    """
    proc = run_python(code, str(ROOT / "tests"), str(tmp_path), timeout=120,
                      env=_env(), cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcomes["hang"] == "hang"
    assert outcomes["abort"] == "crash"
    assert outcomes["hog"] == "oom"  # 8 GiB under a limit of 1 GiB
    assert outcomes["value"] == "crash"
    assert outcomes["real"] in fuzzing.OUTCOMES


@pytest.mark.slow
def test_fuzz_fast_form(tmp_path):
    """Every file kind of every format, damaged FAST['trials'] times: each trial
    must raise a FastDataError or read back the original records."""
    report_path = tmp_path / "fuzz.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fuzz.py"), "--fast", "--json", str(report_path),
         "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600, env=_env(), cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    kinds = [(d, k) for d, by_kind in report["counts"].items() for k in by_kind]
    assert len(kinds) >= 20
    assert all(sum(report["counts"][d][k].values()) == fuzzing.FAST["trials"] for d, k in kinds)
    bad = {o: report["totals"][o] for o in fuzzing.FAILURES if report["totals"][o]}
    assert not bad, f"{bad}\n{proc.stdout}"


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env

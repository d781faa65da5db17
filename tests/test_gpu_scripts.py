"""bench/gpu_check.py and bench/gpu_train_check.py, the checks for a machine
with CUDA: on this one they must at least run, and say what they skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optional
import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run(script: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FASTDATA_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_training_rows_that_need_no_cuda_run(tmp_path):
    result = run("gpu_train_check.py", "--cpu", "--n", "16", "--batch", "8", "--size", "32",
                 "--epochs", "1", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    fastdata_row = next(line for line in lines if line.startswith("fastdata fused (CPU)"))
    assert "torch.uint8 [8, 3, 32, 32]" in fastdata_row and fastdata_row.endswith("True")
    dali_row = next(line for line in lines if line.startswith("DALI image_random_crop (cpu)"))
    if optional.available("dali"):
        assert dali_row.endswith("True"), dali_row  # DALI is here: its CPU row must run
    else:
        assert "skipped" in dali_row, dali_row
    vision_row = next(line for line in lines if line.startswith("torchvision decode_jpeg (cpu)"))
    assert vision_row.endswith("True") or "skipped: torchvision is not installed" in vision_row


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="checks the message of a machine without CUDA")
def test_without_cuda_the_gpu_checks_say_so_and_succeed(tmp_path):
    for script in ("gpu_check.py", "gpu_train_check.py"):
        result = run(script, tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "no CUDA GPU on this machine" in result.stdout

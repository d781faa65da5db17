"""The scripts in examples/ run as a user runs them, on data made with the CLI.

``examples/train_classifier.py`` runs as two torch.distributed ranks (gloo, on
the CPU) under ``python -m torch.distributed.run``: both ranks train, each on
its own equal share of every epoch, and a job killed with SIGKILL after a
mid-epoch checkpoint resumes to the very batches, crops, losses and weights of
a job that was never interrupted; at each epoch's end it prints the loader's
advice and appends its figures (``--stats``). The short examples run where
their library is installed (timm, torchvision, Lightning, Hugging Face
datasets; timm and torchvision maybe in an interpreter of their own,
$FASTDATA_VISION_PYTHON) and are skipped with the reason where it is not.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import optional
import pytest

from ci_needs import vision_python
from conftest import TESTS_DIR

ROOT = Path(TESTS_DIR).parent
EXAMPLES = ROOT / "examples"
TRAIN = EXAMPLES / "train_classifier.py"

RECORDS, CLASSES, BATCH, RANKS = 96, 4, 8, 2
STEPS_PER_EPOCH = RECORDS // (RANKS * BATCH)          # 6
EPOCHS, STEPS = 6, 30                                 # a 36-step schedule, run to step 30
EVERY = 5                                             # checkpoints at 5, 10, 15, 20, 25: mid-epoch
TRAIN_ARGS = ["--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--image-size", "16",
              "--model", "cnn", "--lr", "0.05", "--seed", "3", "--log-every", "10"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    # The examples show the current API: a deprecated name used in them fails.
    env["PYTHONWARNINGS"] = "error::DeprecationWarning:__main__"
    return env


def _cli(*args: str, cwd: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "fastdata.cli", *args, "--no-progress"],
                            cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """96 tiny PNGs in 4 classes, made and packed with the CLI; the folder holding them."""
    work = tmp_path_factory.mktemp("examples")
    _cli("synth", "--kind", "tiny", "-n", str(RECORDS), "--classes", str(CLASSES),
         "--seed", "1", "images", cwd=work)
    _cli("pack", "images", "train.lmdb", cwd=work)
    _cli("pack", "images", "train-%06d.tar", "--shard-size", "32", cwd=work)
    return work


# -- torchrun jobs --------------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # gone already
        return []


def _kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL a torchrun job: torchrun starts each rank in a session of its own,
    so each rank's process group goes, then torchrun's."""
    for pid in _children(proc.pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _start(work: Path, name: str, *args: str) -> subprocess.Popen:
    # --standalone: the rendezvous store binds a free port itself.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={RANKS}", str(TRAIN), "train.lmdb", *TRAIN_ARGS, *args]
    log = open(work / f"{name}.out", "w")  # a file: a chatty job never fills a pipe
    return subprocess.Popen(cmd, cwd=work, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _torchrun(work: Path, name: str, *args: str, timeout: float = 120) -> str:
    proc = _start(work, name, *args)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = "a hang"
    finally:
        _kill_job(proc)
    out = (work / f"{name}.out").read_text()
    assert code == 0, f"{name} exited with {code}:\n{out[-4000:]}"
    return out


def _steps(path: Path) -> dict[int, dict]:
    return {d["step"]: d for d in map(json.loads, path.read_text().splitlines())}


def _logs(work: Path, name: str) -> list[dict[int, dict]]:
    return [_steps(work / f"{name}.rank{r}.jsonl") for r in range(RANKS)]


@pytest.fixture(scope="module")
def uninterrupted(data) -> list[dict[int, dict]]:
    """Job A: two ranks, STEPS steps without a break; each rank's step log
    (and, in a-stats.jsonl, the loader's figures at each epoch's end)."""
    out = _torchrun(data, "a", "--max-steps", str(STEPS), "--checkpoint", "a.pt",
                    "--log-batches", "a.jsonl", "--stats", "a-stats.jsonl")
    assert f"{RANKS} rank(s) on cpu" in out, out
    return _logs(data, "a")


@pytest.mark.slow
def test_two_ranks_train_on_equal_shares_of_each_epoch(data, uninterrupted):
    import fastdata

    targets = fastdata.open_dataset(data / "train.lmdb").targets
    ranks = uninterrupted
    # Two processes, each its own rank of a world of two, each taking every step.
    assert [sorted(log) for log in ranks] == [list(range(1, STEPS + 1))] * RANKS
    assert {d["rank"] for log in ranks for d in log.values()} == {0, 1}
    assert {d["world"] for log in ranks for d in log.values()} == {RANKS}
    assert len({d["pid"] for log in ranks for d in log.values()}) == RANKS
    for step in range(1, STEPS + 1):
        batches = [log[step] for log in ranks]
        for d in batches:  # the logged records are the batch the step trained on
            assert len(d["records"]) == BATCH
            assert d["labels"] == [targets[i] for i in d["records"]]
        assert batches[0]["images"] != batches[1]["images"]
    # Each full epoch: every record exactly once over both ranks, a new order each time.
    orders = []
    for epoch in range(STEPS // STEPS_PER_EPOCH):
        steps = range(epoch * STEPS_PER_EPOCH + 1, (epoch + 1) * STEPS_PER_EPOCH + 1)
        seen = [i for s in steps for log in ranks for i in log[s]["records"]]
        assert sorted(seen) == list(range(RECORDS)), epoch
        assert {log[s]["epoch"] for s in steps for log in ranks} == {epoch}
        orders.append(seen)
    assert len({tuple(o) for o in orders}) == len(orders)


@pytest.mark.slow
def test_train_classifier_logs_the_loading_figures_of_each_epoch(data, uninterrupted):
    # Rank 0 appended one JSON line per epoch (fastdata.log_stats), with every
    # rank's figures gathered (fastdata.stats(ranks=True)), and printed the advice.
    lines = [json.loads(line) for line in (data / "a-stats.jsonl").read_text().splitlines()]
    epochs = STEPS // STEPS_PER_EPOCH
    assert [d["epoch"] for d in lines] == list(range(epochs)), lines
    assert [d["step"] for d in lines] == [(e + 1) * STEPS_PER_EPOCH for e in range(epochs)]
    for d in lines:
        assert 0 <= d["data_wait"] <= 1, d
        assert d["batches"] == STEPS_PER_EPOCH, d    # counted afresh each epoch
        # The advice: this rank's line, or the line naming a rank far slower than the rest.
        assert d["stages"] and d["advice"].startswith(("data wait ", "rank ")), d
        assert [r["rank"] for r in d["ranks"]] == list(range(RANKS)), d
        assert all(0 <= r["data_wait"] <= 1 for r in d["ranks"]), d
    out = (data / "a.out").read_text()
    for e in range(epochs):
        assert f"epoch {e} loading: {lines[e]['advice']}" in out, out


def _wait_for_step(fd: int, step: int, proc: subprocess.Popen, timeout: float) -> None:
    """Read one rank's step log from its FIFO, a byte at a time, up to ``step``'s line."""
    line, deadline = b"", time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the job ended (exit {proc.returncode}) before step {step}")
        if time.monotonic() > deadline:
            pytest.fail(f"no step {step} after {timeout}s")
        if not select.select([fd], [], [], 0.1)[0]:
            continue
        byte = os.read(fd, 1)
        line += byte
        if byte == b"\n":
            if json.loads(line)["step"] >= step:
                return
            line = b""


@pytest.mark.slow
def test_a_job_killed_after_a_checkpoint_resumes_exactly(data, uninterrupted):
    import torch

    # Job B is stopped while it is still training: rank 1 writes its step log into
    # a FIFO with a one-page buffer that this test reads, so the job cannot run
    # more than a page of lines (~17 steps) ahead of the test. Once rank 1 has
    # taken step EVERY + 1, rank 0 has written the checkpoint of step EVERY
    # (before that step began); then the whole job gets SIGKILL.
    fifo = data / "b.rank1.jsonl"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # read-write: neither end blocks opening
    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 4096)
    proc = _start(data, "b", "--checkpoint", "b.pt", "--checkpoint-every", str(EVERY),
                  "--log-batches", "b.jsonl")
    try:
        _wait_for_step(fd, EVERY + 1, proc, timeout=120)
    finally:
        _kill_job(proc)
        os.close(fd)
    assert proc.returncode == -signal.SIGKILL
    out = (data / "b.out").read_text()
    assert f"checkpoint saved at step {EVERY}" in out, out

    saved = torch.load(data / "b.pt", weights_only=True)
    resumed_at = saved["step"]
    point = saved["data"]
    assert resumed_at % EVERY == 0 and resumed_at < STEPS - EVERY, resumed_at
    assert 0 < point["consumed"] < RECORDS, point  # inside an epoch, not at its end
    assert point["epoch"] == resumed_at // STEPS_PER_EPOCH

    # Rank 0's log (a plain file) agrees with job A up to the kill.
    b0 = _steps(data / "b.rank0.jsonl")
    assert len(b0) >= resumed_at
    for s, d in b0.items():
        assert {k: d[k] for k in ("records", "images", "loss")} == \
               {k: uninterrupted[0][s][k] for k in ("records", "images", "loss")}, s

    # Job C: the same command resumes from b.pt and runs to STEPS.
    out = _torchrun(data, "c", "--checkpoint", "b.pt", "--checkpoint-every", str(EVERY),
                    "--max-steps", str(STEPS), "--log-batches", "c.jsonl")
    assert f"resumed from b.pt at step {resumed_at}" in out, out
    for rank, log in enumerate(_logs(data, "c")):
        assert sorted(log) == list(range(resumed_at + 1, STEPS + 1))
        for s, d in log.items():  # the same batches, crops and losses, bit for bit
            a = uninterrupted[rank][s]
            assert (d["epoch"], d["records"], d["images"], d["loss"]) == \
                   (a["epoch"], a["records"], a["images"], a["loss"]), (rank, s)

    a_end = torch.load(data / "a.pt", weights_only=True)
    c_end = torch.load(data / "b.pt", weights_only=True)
    assert a_end["step"] == c_end["step"] == STEPS
    assert a_end["data"] == c_end["data"]
    assert a_end["model"].keys() == c_end["model"].keys()
    for name, tensor in a_end["model"].items():
        assert torch.equal(tensor, c_end["model"][name]), name
    momenta = [s["momentum_buffer"] for s in a_end["optimizer"]["state"].values()]
    assert all(torch.equal(m, c_end["optimizer"]["state"][i]["momentum_buffer"])
               for i, m in enumerate(momenta))


@pytest.mark.slow
def test_a_checkpoint_at_an_epochs_end_resumes_into_the_next_epoch(data, uninterrupted):
    import torch

    # Job D checkpoints at step 6, the last batch of epoch 0, and stops there.
    out = _torchrun(data, "d", "--checkpoint", "d.pt", "--checkpoint-every",
                    str(STEPS_PER_EPOCH), "--max-steps", str(STEPS_PER_EPOCH))
    assert f"checkpoint saved at step {STEPS_PER_EPOCH}" in out, out
    saved = torch.load(data / "d.pt", weights_only=True)
    assert saved["step"] == STEPS_PER_EPOCH
    # Every batch of epoch 0 taken: the point saved is epoch 1's start.
    assert (saved["data"]["epoch"], saved["data"]["consumed"]) == (1, 0)
    # Job E resumes from it: epoch 1 from its start, the uninterrupted job's steps.
    end = 2 * STEPS_PER_EPOCH
    out = _torchrun(data, "e", "--checkpoint", "d.pt", "--max-steps", str(end),
                    "--log-batches", "e.jsonl")
    assert f"resumed from d.pt at step {STEPS_PER_EPOCH}, epoch 1" in out, out
    for rank, log in enumerate(_logs(data, "e")):
        assert sorted(log) == list(range(STEPS_PER_EPOCH + 1, end + 1))
        for s, d in log.items():
            a = uninterrupted[rank][s]
            assert d["epoch"] == a["epoch"] == 1, (rank, s)
            assert (d["records"], d["images"], d["loss"]) == \
                   (a["records"], a["images"], a["loss"]), (rank, s)


# -- the short examples -----------------------------------------------------------


def _python_for(module: str) -> str:
    """The interpreter that runs an example needing ``module``, or a skip.
    timm and torchvision may live in an interpreter of their own
    (``ci_needs.vision_python``)."""
    if module in ("torchvision", "timm"):
        return vision_python()
    optional.skip_if_missing(module)
    return sys.executable


SHORT = {
    "timm_transforms.py": ("timm", ["train.lmdb", "--image-size", "32", "--batch-size", "8",
                                    "--steps", "2"],
                           ["step 2:", f"eval: {RECORDS} images of (3, 32, 32)"]),
    "torchvision_v2.py": ("torchvision", ["train.lmdb", "--image-size", "16", "--batch-size",
                                          "8"], ["per sample: (8, 3, 16, 16)",
                                                 "per batch: (8, 3, 16, 16)"]),
    "lightning_datamodule.py": ("lightning", ["train.lmdb", "--image-size", "16",
                                              "--batch-size", "8", "--max-steps", "14"],
                                ["epoch 1: 12 batches of its order", "fitted 14 steps", "val_acc",
                                 "epoch 0 loading: data wait ", "fastdata/data_wait"]),
    "hf_datasets.py": ("datasets", ["train.tar.fastdata.json", "--batch-size", "8"],
                       [f"{RECORDS} rows: the labels of fastdata's {RECORDS} records",
                        "a batch of 8: image (3, 32, 32)", "streamed: key class_000/"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SHORT))
def test_short_example_runs(script, data, tmp_path):
    module, args, expected = SHORT[script]
    python = _python_for(module)
    # Hugging Face's cache in this test's folder, not the user's.
    env = {**_env(), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([python, str(EXAMPLES / script), *args], cwd=data, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for text in expected:
        assert text in result.stdout, result.stdout[-3000:]

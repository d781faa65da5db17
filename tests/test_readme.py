"""The README runs as written: every Python block and every command line.

The blocks are taken from README.md itself, in order, and run in one working
folder the way a reader would paste them: ```bash blocks line by line in a
shell, ```python blocks each in a fresh interpreter. ```text blocks are
synopses (placeholders such as SOURCE) and are not run. The only things the
test provides are what a reader brings: a folder of their own images
(``images/``) and a TFRecord written by other software (``theirs.tfrecord``).
``pip install`` lines are not run; the test checks that they name extras that
exist and that .ci/run runs the README's test command as written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import TESTS_DIR

ROOT = Path(TESTS_DIR).parent
README = ROOT / "README.md"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # README line of the block's first line of code
    code: str

    @property
    def id(self) -> str:
        return f"{self.lang}-line{self.line}"


def readme_blocks(text: str | None = None) -> list[Block]:
    text = README.read_text(encoding="utf-8") if text is None else text
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        line = text.count("\n", 0, match.start()) + 2
        blocks.append(Block(match.group(1), line, match.group(2)))
    return blocks


def command_lines(code: str) -> list[str]:
    """A bash block's commands: continuations joined, comments and blanks left out."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [ln.strip() for ln in joined.splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


BLOCKS = readme_blocks()
RUN = [b for b in BLOCKS if b.lang in ("bash", "python")]


def test_every_code_block_says_what_it_is():
    # An unmarked block would be skipped by the test below without anyone noticing.
    unmarked = [b.line for b in BLOCKS if b.lang not in ("bash", "python", "text")]
    assert not unmarked, f"README.md code blocks without bash/python/text at lines {unmarked}"
    assert len(RUN) >= 15


def _pip_lines() -> list[str]:
    return [ln for b in BLOCKS if b.lang == "bash" for ln in command_lines(b.code)
            if "pip install" in ln]


def test_ci_runs_the_readmes_test_command():
    first = next(b for b in BLOCKS if b.lang == "bash")
    tests = [ln for ln in command_lines(first.code) if "pytest" in ln]
    assert len(tests) == 1, first.code
    ci = (ROOT / ".ci" / "run").read_text()
    assert '"$PY" -m ' + tests[0].replace("python -m ", '"$PY" -m ') in ci
    torch_step = [ln for ln in command_lines(first.code) if "torch==" in ln]
    assert len(torch_step) == 1 and torch_step[0].startswith('python -c "import torch"')
    version = re.search(r"torch==([\d.]+)", torch_step[0]).group(1)
    assert f'"torch=={version}"' in ci
    requirement = next(d for d in _pyproject()["project"]["dependencies"]
                       if d.startswith("torch"))
    low, high = re.fullmatch(r"torch>=([\d.]+),<(\d+)", requirement).groups()
    assert tuple(map(int, version.split("."))) >= tuple(map(int, low.split(".")))
    assert int(version.split(".")[0]) < int(high)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pip_lines_name_extras_that_exist():
    extras = set(_pyproject()["project"]["optional-dependencies"])
    lines = _pip_lines()
    assert len(lines) >= 4
    for ln in lines:
        for group in re.findall(r'-e "\.\[([\w,]+)\]"', ln):
            assert set(group.split(",")) <= extras, ln
    # A lighter test command without the DALI wheels is documented.
    assert 'pip install -e ".[test]" && python -m pytest -q' in lines


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder holding what a reader brings: their images and a foreign TFRecord."""
    from fastdata.demo import synthesize

    work = tmp_path_factory.mktemp("readme")
    synthesize(str(work / "images"), kind="photos", n=24, classes=3, seed=5)
    _write_foreign_tfrecord(work / "theirs.tfrecord", work / "images")
    return work


def _write_foreign_tfrecord(path: Path, images: Path) -> None:
    import tfrecord

    writer = tfrecord.TFRecordWriter(os.fspath(path))
    for label, folder in enumerate(sorted(p for p in images.iterdir() if p.is_dir())):
        for image in sorted(folder.iterdir())[:4]:
            writer.write({"img_raw": (image.read_bytes(), "byte"), "class_id": (label, "int")})
    writer.close()


def _env() -> dict:
    env = dict(os.environ)
    # The commands run as a reader runs them: the `fastdata` script next to this
    # interpreter, the checkout importable even without an editable install.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # What torchrun sets, for the blocks that start a (one-rank) process group.
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()))
    # The README shows the current API: a deprecated name in its code (the
    # warning is attributed to the block, module __main__) fails the block.
    env["PYTHONWARNINGS"] = "error::DeprecationWarning:__main__"
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _needs(block: Block) -> str | None:
    """Why a block cannot run here, or None."""
    if "torchdata" in block.code:
        try:
            import torchdata  # noqa: F401
        except ImportError:
            return "torchdata is not installed (the test extra)"
    if "fastdata.dali" in block.code:
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            return "NVIDIA DALI is not installed (the dali extra)"
    return None


def _s3_for(block: Block, request) -> dict:
    """For a block using s3://bucket: moto's S3 server holding the shard it reads,
    and the AWS_* variables pointing at it."""
    if "s3://bucket/" not in block.code:
        return {}
    pytest.importorskip("obstore")
    server = request.getfixturevalue("s3_server")
    server.make_bucket("bucket")
    server.put("s3://bucket/shards/train-000000.tar", os.urandom(50_000))
    return server.env


def _runnable(line: str) -> str:
    """The part of a command line this test runs: ``pip install`` steps are
    checked, not run (the environment running the tests has them), and the test
    command would run this suite again."""
    if "||" in line and "pip install" in line:
        return ""
    parts = [p.strip() for p in line.split("&&")]
    return " && ".join(p for p in parts if "pip install" not in p and "pytest" not in p)


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_readme_block_runs_as_written(block, workdir, request):
    reason = _needs(block)
    if reason:
        pytest.skip(reason)
    if block.lang == "python":
        env = {**_env(), **_s3_for(block, request)}
        result = subprocess.run([sys.executable, "-c", block.code], cwd=workdir, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (
            f"README.md line {block.line}: python block failed\n{result.stderr[-3000:]}")
        assert "MixedSizeWarning" not in result.stderr, result.stderr[-2000:]
        return
    for line in map(_runnable, command_lines(block.code)):
        if not line:
            continue
        if shutil.which("fastdata", path=_env()["PATH"]) is None and line.startswith("fastdata"):
            pytest.skip("the fastdata command is not installed (pip install -e .)")
        result = subprocess.run(["bash", "-c", line], cwd=workdir,
                                env={**_env(), **_s3_for(block, request)},
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (
            f"README.md line {block.line}: `{line}` exited {result.returncode}\n"
            f"{result.stdout[-1500:]}\n{result.stderr[-3000:]}")

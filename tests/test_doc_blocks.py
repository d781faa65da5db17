"""The README and every page of the documentation site run as written.

The blocks are taken from README.md, then from each page of docs/ in the
site's order (mkdocs.yml's nav), and run the way a reader would paste them:
the README's in one working folder, the site's pages in another, in
reading order, so a page uses only what earlier pages made: ```bash blocks line by line
in a shell, ```python blocks each in a fresh interpreter. ```text blocks are
synopses (placeholders such as SOURCE) and are not run. The README's quick
start blocks run exactly as written, in order, in an empty folder: they make
their own images (``fastdata synth demo/``). The site's pages start from what
a reader brings: a TFRecord written by other software (``theirs.tfrecord``)
and the checkout's ``examples/``; Getting started makes ``demo/``, the image
folder every later page uses. ``pip install`` lines are not run; the test
checks that they name extras that exist and that .ci/run runs the README's
test command as a line of its own. A block that needs a package the test
environment lacks (DALI, Lightning, Hugging Face datasets) is skipped with the
reason (a failure under FASTDATA_CI=1: tests/allowed_skips.py); blocks using
timm or torchvision run in an interpreter that has them (this one, or
$FASTDATA_VISION_PYTHON; see tests/ci_needs.py).
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

import optional
import pytest

from ci_needs import ci_spelling, top_level_commands, vision_python
from conftest import TESTS_DIR

ROOT = Path(TESTS_DIR).parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # the file's line of the block's first line of code
    code: str
    file: str = "README.md"  # relative to the checkout

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}-{self.lang}"

    @property
    def where(self) -> str:
        return f"{self.file} line {self.line}"


def readme_blocks(text: str | None = None, file: str = "README.md") -> list[Block]:
    text = README.read_text(encoding="utf-8") if text is None else text
    blocks = []
    # Fences may be indented (inside a list or an admonition).
    for match in re.finditer(r"^( *)```(\w*)\n(.*?)^\1```", text, re.M | re.S):
        line = text.count("\n", 0, match.start()) + 2
        code = re.sub(rf"(?m)^{match.group(1)}", "", match.group(3))
        blocks.append(Block(match.group(2), line, code, file))
    return blocks


def site_pages() -> list[Path]:
    """docs/ pages in the site's order: the nav of mkdocs.yml."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = config.split("\nnav:", 1)[1] if "\nnav:" in config else ""
    return [DOCS / m for m in re.findall(r"^\s+-\s+(?:[^:\n]+:\s+)?(\S+\.md)\s*$", nav, re.M)]


def all_blocks() -> list[Block]:
    blocks = readme_blocks()
    for page in site_pages():
        if page.exists():
            blocks += readme_blocks(page.read_text(encoding="utf-8"),
                                    page.relative_to(ROOT).as_posix())
    return blocks


def command_lines(code: str) -> list[str]:
    """A bash block's commands: continuations joined, comments and blanks left out."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [ln.strip() for ln in joined.splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def section_of(block: Block, text: str) -> str:
    """The title of the ``## `` section a block of ``text`` stands in ("" before any)."""
    lines = text.splitlines()[:block.line - 1]
    titles = [ln[3:].strip() for ln in lines if ln.startswith("## ")]
    return titles[-1] if titles else ""


README_BLOCKS = readme_blocks()
BLOCKS = all_blocks()
#: The README's quick start: its sections titled "Quick start...", run by
#: test_readme_quick_start_runs_as_written_in_an_empty_folder, in one folder.
QUICK_START = [b for b in README_BLOCKS if b.lang in ("bash", "python")
               and section_of(b, README.read_text(encoding="utf-8")).startswith("Quick start")]
RUN = [b for b in BLOCKS if b.lang in ("bash", "python") and b not in QUICK_START]


def test_every_code_block_says_what_it_is():
    # An unmarked block would be skipped by the test below without anyone noticing.
    unmarked = [b.where for b in BLOCKS if b.lang not in ("bash", "python", "text")]
    assert not unmarked, f"code blocks without bash/python/text: {unmarked}"
    assert len(RUN) >= 15


def test_every_page_of_the_site_is_read():
    pages = site_pages()
    assert len(pages) >= 20 and all(p.exists() for p in pages), pages
    assert {b.file for b in BLOCKS} >= {"README.md"}


def _pip_lines() -> list[str]:
    # Synopses (text) too: an install line there must name extras that exist.
    return [ln.split("  #")[0].strip() for b in BLOCKS if b.lang in ("bash", "text")
            for ln in command_lines(b.code) if "pip install" in ln]


def test_ci_runs_the_readmes_test_command():
    first = next(b for b in README_BLOCKS if b.lang == "bash")
    tests = [ln for ln in command_lines(first.code) if "pytest" in ln]
    assert len(tests) == 1, first.code
    ci = (ROOT / ".ci" / "run").read_text()
    # Run as a whole line, not in a comment, a string or a block that may not run.
    assert ci_spelling(tests[0]) in top_level_commands(ci), (
        f".ci/run does not run the README's test command as a line of its own: "
        f"{ci_spelling(tests[0])}")
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
    """Two folders: the README's blocks run in one, empty (its quick start
    makes its own images), the site's pages in the other, which holds what a
    reader brings (a foreign TFRecord, the checkout's examples/), so a page
    can use only what an earlier page made."""
    from fastdata.demo import synthesize

    base = tmp_path_factory.mktemp("docs")
    synthesize(str(base / "theirs"), kind="photos", n=24, classes=3, seed=5)
    site = base / "site"
    site.mkdir()
    _write_foreign_tfrecord(site / "theirs.tfrecord", base / "theirs")
    (site / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    readme = base / "readme"
    readme.mkdir()
    return {"readme": readme, "site": site}


def _write_foreign_tfrecord(path: Path, images: Path) -> None:
    import tfrecord

    writer = tfrecord.TFRecordWriter(os.fspath(path))
    for label, folder in enumerate(sorted(p for p in images.iterdir() if p.is_dir())):
        for image in sorted(folder.iterdir())[:4]:
            writer.write({"img_raw": (image.read_bytes(), "byte"), "class_id": (label, "int")})
    writer.close()


def _env(python: str = sys.executable) -> dict:
    env = dict(os.environ)
    # The commands run as a reader runs them: the `fastdata` script next to the
    # interpreter, the checkout importable even without an editable install.
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # What torchrun sets, for the blocks that start a (one-rank) process group;
    # port 0: the one rank's store binds a free port itself.
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="0")
    # The README shows the current API: a deprecated name in its code (the
    # warning is attributed to the block, module __main__) fails the block.
    env["PYTHONWARNINGS"] = "error::DeprecationWarning:__main__"
    return env


# What a block's code says it needs: (pattern, the dependency in tests/optional.py).
NEEDS = [
    (r"torchdata", "torchdata"),
    (r"fastdata\.dali|nvidia\.dali", "dali"),
    (r"\b(import|from) (lightning|pytorch_lightning)\b|examples/lightning", "lightning"),
    (r"\b(import|from) datasets\b|examples/hf_", "datasets"),
]


# Blocks using timm or torchvision run in an interpreter that has them, maybe
# not this one (ci_needs.vision_python).
VISION = r"\b(import|from) (timm|torchvision)\b|examples/(timm|torchvision)"


def _python(block: Block) -> str:
    return vision_python() if re.search(VISION, block.code) else sys.executable


def _needs(block: Block) -> str | None:
    """Why a block cannot run here, or None."""
    for pattern, name in NEEDS:
        if re.search(pattern, block.code) and not optional.available(name):
            return optional.reason(name)
    return None


def _s3_for(block: Block, request) -> dict:
    """For a block using s3://bucket: moto's S3 server holding the shard it reads,
    and the AWS_* variables pointing at it."""
    if "s3://bucket/" not in block.code:
        return {}
    optional.require("obstore")
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


def _caches(workdir: Path) -> dict:
    """Caches inside the test's folder: the blocks write nothing to the user's home."""
    return {"FASTDATA_CACHE_DIR": str(workdir / ".cache" / "fastdata"),
            "HF_HOME": str(workdir / ".cache" / "huggingface")}


def _run_block(block: Block, workdir: Path, request, lines: list[str]) -> None:
    """Run ``block`` in ``workdir``: a python block in a fresh interpreter, a
    bash block's ``lines`` one by one in a shell; fail naming the line."""
    python = _python(block)
    if block.lang == "python":
        env = {**_env(python), **_caches(workdir), **_s3_for(block, request)}
        result = subprocess.run([python, "-c", block.code], cwd=workdir, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (
            f"{block.where}: python block failed\n{result.stderr[-3000:]}")
        assert "MixedSizeWarning" not in result.stderr, result.stderr[-2000:]
        return
    for line in lines:
        if not line:
            continue
        if shutil.which("fastdata", path=_env(python)["PATH"]) is None \
                and line.startswith("fastdata"):
            pytest.skip("the fastdata command is not installed (pip install -e .)")
        result = subprocess.run(["bash", "-c", line], cwd=workdir,
                                env={**_env(python), **_caches(workdir),
                                     **_s3_for(block, request)},
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (
            f"{block.where}: `{line}` exited {result.returncode}\n"
            f"{result.stdout[-1500:]}\n{result.stderr[-3000:]}")


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_block_runs_as_written(block, workdir, request):
    workdir = workdir["readme" if block.file == "README.md" else "site"]
    reason = _needs(block)
    if reason:
        pytest.skip(reason)
    _run_block(block, workdir, request, [_runnable(ln) for ln in command_lines(block.code)])


def test_the_readme_quick_start_makes_its_own_data():
    """The quick start's first command makes the images the rest reads, and no
    line of it is left out when run (no install step, no test command)."""
    assert len(QUICK_START) >= 4, [b.where for b in QUICK_START]
    first = command_lines(QUICK_START[0].code)
    assert QUICK_START[0].lang == "bash" and first[0].startswith("fastdata synth demo/"), first
    for block in QUICK_START:
        if block.lang == "bash":
            assert all(_runnable(ln) == ln for ln in command_lines(block.code)), block.where


def test_readme_quick_start_runs_as_written_in_an_empty_folder(tmp_path, request):
    """README.md's quick start blocks, as a reader on a fresh machine pastes
    them: in order, in one empty folder, every line as written."""
    folder = tmp_path / "fresh"
    folder.mkdir()
    left_out = []
    for block in QUICK_START:
        reason = _needs(block)
        if reason:
            left_out.append(f"{block.where}: {reason}")
            continue
        _run_block(block, folder, request, command_lines(block.code))
    if left_out:
        pytest.skip(f"quick start blocks left out: {left_out}")

"""Every ``pip install`` line users are shown names this project (from the
checkout: ``pip install -e .``) or a dependency, never another project's
distribution: ``fastdata`` on PyPI is an unrelated package.

Scanned: the README, the docs, the examples and every message and
docstring in the package.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the examples and pages install beside fastdata's own dependencies.
EXAMPLES_NEED = {"torch", "torchvision", "timm", "lightning", "datasets", "pyyaml", "boto3",
                 "litdata", "mosaicml-streaming", "ffcv", "webdataset", "energon"}
_LINE = re.compile(r"pip3? install\b([^\n]*)")
#: Options followed by a value.
_VALUED = {"-c", "--constraint", "-r", "--requirement", "--index-url", "-i", "--find-links",
           "-f", "--extra-index-url", "--target", "-t"}


def _allowed() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set(EXAMPLES_NEED)
    for spec in project["dependencies"] + [s for extra in project["optional-dependencies"]
                                           .values() for s in extra]:
        names.add(_name(spec))
    return names


def _name(spec: str) -> str:
    return re.split(r"[\[<>=!~; ]", spec.strip("\"'"), maxsplit=1)[0].lower().replace("_", "-")


def _files() -> list[Path]:
    out = [ROOT / "README.md"]
    out += sorted((ROOT / "docs").rglob("*.md"))
    out += sorted((ROOT / "examples").rglob("*.py"))
    out += sorted((ROOT / "fastdata").rglob("*.py"))
    return out


def installs() -> list[tuple[str, str]]:
    """(file, distribution) of every name a ``pip install`` line installs: the
    words after it up to the end of the command (a comment, ``&&``, a
    closing quote, bracket or backtick, or a comma)."""
    found = []
    for path in _files():
        text = path.read_text(encoding="utf-8")
        for match in _LINE.finditer(text):
            for word in _command_words(match.group(1)):
                bare = word.strip("\"'")
                if bare.startswith("-") or bare.startswith(".") or "/" in bare:
                    continue  # an option, or this checkout (".", ".[cloud]") or a path
                found.append((str(path.relative_to(ROOT)), _name(bare)))
    return found


def _command_words(rest: str) -> list[str]:
    words, skip = [], False
    for token in re.findall(r"\"[^\"]*\"|'[^']*'|[^\s]+", rest):
        if token[0] in "#(" or token in ("&&", "||", ";", "\\", "|"):
            break
        end = re.search(r"[`)\",;:]|'$", token) if token[0] not in "\"'" else None
        word = token[:end.start()] if end else token
        if skip:
            skip = False
        elif word in _VALUED:
            skip = True
        elif word and re.match(r"[A-Za-z\"'.-]", word):
            words.append(word)
        if end:
            break
    return words


def test_install_lines_name_this_project_or_a_dependency():
    allowed = _allowed()
    bad = [(f, name) for f, name in installs() if name not in allowed]
    assert not bad, ("pip install lines naming another project's distribution (install "
                     "fastdata from the checkout: pip install -e \".[extra]\"): "
                     f"{sorted(set(bad))}")


def test_the_scan_finds_the_lines_it_checks():
    names = {name for _, name in installs()}
    assert {"torch", "pyarrow", "nvidia-dali-cuda130", "timm"} <= names, names
    assert "fastdata" not in names

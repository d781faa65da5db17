"""The README and the documentation site read on a page: no prose paragraph
over 120 words, no code line wider than 88 characters (what a code block
shows at 1280 px without scrolling)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_WORDS = 120
MAX_CODE = 88


def pages() -> list[Path]:
    docs = ROOT / "docs"
    return [ROOT / "README.md"] + sorted(p for p in docs.rglob("*.md")
                                         if "hooks" not in p.relative_to(docs).parts)


def units(text: str):
    """(line number, kind, text): ``code`` lines of fenced blocks, ``prose``
    paragraphs (a list item is one of its own; tables, headings and
    mkdocstrings directives are neither)."""
    fence = None
    para: list[str] = []
    start = 0
    directive = False

    def flush():
        nonlocal para
        if para:
            yield start, "prose", " ".join(para)
        para = []

    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            else:
                yield n, "code", line
            continue
        match = re.match(r"\s*(```+|~~~+)", line)
        if match:
            yield from flush()
            fence = match.group(1)
            continue
        if stripped.startswith(":::"):
            yield from flush()
            directive = True
            continue
        if directive and (line.startswith("    ") or not stripped):
            directive = bool(stripped)
            continue
        directive = False
        if not stripped or stripped.startswith(("|", "#", "<")):
            yield from flush()
            continue
        if re.match(r"\s*([-*+]|\d+\.)\s", line):
            yield from flush()
        if not para:
            start = n
        para.append(stripped)
    yield from flush()


def _problems():
    long_prose, wide_code = [], []
    for page in pages():
        name = page.relative_to(ROOT).as_posix()
        for n, kind, text in units(page.read_text(encoding="utf-8")):
            if kind == "prose" and len(text.split()) > MAX_WORDS:
                long_prose.append(f"{name}:{n} ({len(text.split())} words)")
            if kind == "code" and len(text) > MAX_CODE:
                wide_code.append(f"{name}:{n} ({len(text)} characters)")
    return long_prose, wide_code


def test_no_prose_paragraph_is_over_120_words():
    long_prose, _ = _problems()
    assert not long_prose, ("paragraphs over 120 words (split them, or make a list or a "
                            f"table): {long_prose}")


def test_no_code_line_is_wider_than_the_page():
    _, wide_code = _problems()
    assert not wide_code, (f"code lines over {MAX_CODE} characters (they scroll at 1280 px): "
                           f"{wide_code}")


def test_the_checks_see_paragraphs_and_code():
    text = "# T\n\n" + "word " * 130 + "\n\n```python\n" + "x" * 100 + "\n```\n- a\n- b\n"
    got = list(units(text))
    assert [k for _, k, _ in got] == ["prose", "code", "prose", "prose"]
    assert len(got[0][2].split()) == 130

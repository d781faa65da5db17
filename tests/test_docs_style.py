"""The README and the documentation site read on a page: no prose paragraph
over 120 words, no code line wider than 88 characters (what a code block
shows at 1280 px without scrolling), no page over 1,500 words of prose (a
longer one is two pages), no table cell over 40 words (a longer one is a
list below the table), and every benchmark script a page tells readers to
run says that it runs from a checkout of the repository and how long it
takes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_WORDS = 120
MAX_CODE = 88
MAX_PAGE_WORDS = 1500
MAX_CELL_WORDS = 40


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


def table_cells(text: str):
    """(line number, cell text) of every Markdown table cell outside code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        match = re.match(r"\s*(```+|~~~+)", line)
        if match:
            fence = None if fence and line.strip().startswith(fence) else (fence or match.group(1))
            continue
        if fence is None and line.lstrip().startswith("|"):
            # a pipe inside `code` or escaped (\|) does not end a cell
            plain = re.sub(r"`[^`]*`", lambda m: m.group().replace("|", "/"), line)
            for cell in re.split(r"(?<!\\)\|", plain.strip().strip("|")):
                yield n, cell.strip()


def prose_words(text: str) -> int:
    return sum(len(t.split()) for _, kind, t in units(text) if kind == "prose")


def test_no_page_has_over_1500_words_of_prose():
    long = [f"{p.relative_to(ROOT).as_posix()} ({prose_words(p.read_text(encoding='utf-8'))})"
            for p in pages() if prose_words(p.read_text(encoding="utf-8")) > MAX_PAGE_WORDS]
    assert not long, (f"pages over {MAX_PAGE_WORDS} words of prose (split them into pages "
                      f"of their own, linked from the nav): {long}")


def test_no_table_cell_is_over_40_words():
    wide = [f"{p.relative_to(ROOT).as_posix()}:{n} ({len(cell.split())} words)"
            for p in pages() for n, cell in table_cells(p.read_text(encoding="utf-8"))
            if len(cell.split()) > MAX_CELL_WORDS]
    assert not wide, (f"table cells over {MAX_CELL_WORDS} words (a table compares; put the "
                      f"detail in a list below it): {wide}")


#: A benchmark script's command in a code block: ``python bench/NAME.py ...``.
BENCH = re.compile(r"\bpython3? bench/\w+\.py")
#: A duration: "about 3 minutes", "10 s", "a minute", "seconds".
DURATION = re.compile(r"\d[\d.,½–-]*\s*(?:s|seconds?|min|minutes?|hours?)\b"
                      r"|\b(?:a|one|two|a few) (?:seconds?|minutes?)\b|\bseconds\b")
#: Bench commands that name no duration, and why.
NO_DURATION = {
    "docs/speed/dali.md": "bench/gpu_check.py runs only on a machine with CUDA; "
                          "bench/RESULTS.md records no run of it",
}


def bench_blocks():
    """(page, line, the block's code lines, the prose paragraphs just before and
    just after it) of every code block holding a bench command."""
    for page in pages():
        name = page.relative_to(ROOT).as_posix()
        found = list(units(page.read_text(encoding="utf-8")))
        k = 0
        while k < len(found):
            if found[k][1] != "code":
                k += 1
                continue
            start = k
            while k < len(found) and found[k][1] == "code" and found[k][0] - found[start][0] \
                    == k - start:
                k += 1
            code = [text for _, _, text in found[start:k]]
            if any(BENCH.search(line) for line in code):
                before = next((t for _, kind, t in reversed(found[:start]) if kind == "prose"), "")
                after = next((t for _, kind, t in found[k:] if kind == "prose"), "")
                yield name, found[start][0], code, before, after


def test_bench_commands_say_from_a_checkout_and_how_long():
    """Code first, then prose: the paragraph before or after the block says
    "from a checkout", and it or the commands' comments say how long."""
    missing = []
    for name, n, code, before, after in bench_blocks():
        near = before + " " + after
        if "checkout" not in near:
            missing.append(f"{name}:{n} {code[0].strip()!r}: neither paragraph beside it says "
                           f"it runs from a checkout of the repository")
        comments = " ".join(line.partition("#")[2] for line in code)
        if name not in NO_DURATION and not DURATION.search(near + " " + comments):
            missing.append(f"{name}:{n} {code[0].strip()!r}: no duration (in a comment or the "
                           f"paragraph beside it; durations: bench/RESULTS.md)")
    assert not missing, "\n".join(missing)


def test_the_checks_see_cells_and_bench_commands():
    text = "| a | `x|y` b |\n|---|---|\n\n```text\n| not a cell |\n```\n"
    assert [c for _, c in table_cells(text)] == ["a", "`x/y` b", "---", "---"]
    assert DURATION.search("about 2½ minutes") and DURATION.search("# 10 s")
    assert not DURATION.search("the 10 shards")
    assert any(name == "docs/scale.md" for name, *_ in bench_blocks())

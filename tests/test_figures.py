"""One source for every speed figure: bench/RESULTS.md.

``bench/figures.py`` makes docs/speed/figures.md, the README's comparison
table and one headline sentence from RESULTS.md's tables; the figures page,
the README and the home page (docs/index.md) hold that sentence word for
word. Here they are checked to be current, and every speed figure in the
README and the docs, the home page included, in prose and tables (a ratio
such as ``1.67×`` or ``4.06–4.13×``, or a rate in samples/s), to be one
RESULTS.md or that page gives.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_docs_style import pages, units  # noqa: E402

#: A ratio: a number or a range, then ×, not a size such as 224×224.
RATIO = re.compile(r"(?<![\d×.])(\d+(?:\.\d+)?(?:\s*[–-]\s*\d+(?:\.\d+)?)?)\s?×(?!\s?\d)")
#: A rate: a number of samples per second.
RATE = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+|\d+)\s*(?:samples|images|records)/s")


def _norm(text: str) -> str:
    return re.sub(r"\s*[–-]\s*", "-", text)


def _source_figures() -> tuple[set[str], set[str]]:
    text = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    text += (ROOT / "docs" / "speed" / "figures.md").read_text(encoding="utf-8")
    ratios = {_norm(m) for m in RATIO.findall(text)}
    ratios |= {_norm(m) for m in re.findall(r"\|\s*(\d+\.\d+)\s*\|", text)}  # table cells
    numbers = set(re.findall(r"\d{1,3}(?:,\d{3})+|\d+", text))
    return ratios, numbers


def _page_figures():
    for page in pages():
        if page.name == "figures.md":
            continue
        name = page.relative_to(ROOT).as_posix()
        text = page.read_text(encoding="utf-8")
        rows = [(n, line) for n, line in enumerate(text.splitlines(), 1)
                if line.lstrip().startswith("|")]
        prose = [(n, t) for n, kind, t in units(text) if kind == "prose"]
        for line, text in prose + rows:
            for m in RATIO.findall(text):
                yield name, line, "ratio", _norm(m)
            for m in RATE.findall(text):
                yield name, line, "rate", m


def test_the_figures_page_and_readme_table_are_current():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "figures.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


HEADLINE = re.compile(r"<!-- headline:begin \(bench/figures.py\) -->\n(.*?)\n<!-- headline:end -->",
                      re.S)


def _headline(path: Path) -> str:
    """The headline sentence a page holds, its link and line breaks left out."""
    found = HEADLINE.findall(path.read_text(encoding="utf-8"))
    assert len(found) == 1, f"{path.relative_to(ROOT)} holds {len(found)} headline blocks"
    return re.sub(r"\s*\(\[[^\]]*\]\([^)]*\)\)\.$", ".", " ".join(found[0].split()))


def test_the_readme_and_home_page_give_the_figures_pages_headline():
    page = _headline(ROOT / "docs" / "speed" / "figures.md")
    assert RATIO.search(page), page
    for other in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        assert _headline(other) == page, f"{other.relative_to(ROOT)}'s headline differs"
    # The home page gives no other ratio than the headline's.
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert {_norm(m) for m in RATIO.findall(home)} == {_norm(m) for m in RATIO.findall(page)}


def test_every_speed_figure_comes_from_the_results():
    ratios, numbers = _source_figures()
    unsourced = [f"{name}:{line} {value}" for name, line, kind, value in _page_figures()
                 if (value not in ratios if kind == "ratio" else value not in numbers)]
    assert not unsourced, ("speed figures that bench/RESULTS.md and docs/speed/figures.md "
                           f"do not give (cite the figures page instead): {unsourced}")


def test_the_scan_sees_the_figures():
    text = "tar is 1.67× the folder, resized 3.8–4.1×, at 1,655 samples/s; 224×224."
    assert [_norm(m) for m in RATIO.findall(text)] == ["1.67", "3.8-4.1"]
    assert RATE.findall(text) == ["1,655"]

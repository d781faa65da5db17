"""The documentation site in a real browser: Debian's headless Chromium,
driven through chromedriver (selenium), the site built to a folder and
opened from disk (file://), at 1280×900 as a reader's window.

* every page loads without a console error (no request leaves the site:
  fonts are the system's, the search shim is the site's own);
* search works opened from disk: typing a word lists pages;
* no code block is wider than its box (nothing scrolls sideways);
* the Concepts page's diagrams (inline SVG, nothing fetched) are drawn: each
  has a size, boxes and text that the browser laid out;
* the pages split from longer ones (packing, bad input, pack options; reading
  and writing at a URL) load whole, from disk, with nothing fetched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import optional
import pytest
from ci_needs import missing

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    optional.skip_if_missing("docs")
    site_dir = tmp_path_factory.mktemp("browser-site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(site_dir)],
                          cwd=ROOT, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return site_dir


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        missing("Chromium is not installed (Debian: apt-get install chromium chromium-driver)")
    webdriver = optional.require("selenium", "selenium.webdriver")
    Service = optional.require("selenium", "selenium.webdriver.chrome.service").Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")
    # No network of its own: background requests would fail on a closed network.
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def test_every_page_loads_without_console_errors(site, browser):
    pages = _pages(site)
    assert len(pages) >= 25, pages
    errors = {}
    for page in pages:
        browser.get(page.as_uri())
        got = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        if got:
            errors[str(page.relative_to(site))] = got
    assert not errors, f"console errors: {errors}"


def test_no_code_block_scrolls_sideways(site, browser):
    wide = {}
    for page in _pages(site):
        browser.get(page.as_uri())
        found = browser.execute_script(
            "return [...document.querySelectorAll('.md-content pre > code')]"
            ".filter(c => c.scrollWidth > c.clientWidth + 1)"
            ".map(c => c.innerText.split('\\n').reduce((a, b) => a.length > b.length"
            " ? a : b).slice(0, 100))")
        if found:
            wide[str(page.relative_to(site))] = found
    assert not wide, f"code blocks wider than the page at 1280 px: {wide}"


def test_search_works_opened_from_disk(site, browser):
    from selenium.webdriver.common.by import By

    browser.get((site / "index.html").as_uri())
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    if not box.is_displayed():  # a narrow window: behind the header's search button
        browser.find_element(By.CSS_SELECTOR, "label.md-header__button[for=__search]").click()
    box.click()
    box.send_keys("resume")
    deadline = time.monotonic() + 30
    titles: list[str] = []
    while time.monotonic() < deadline and not titles:
        titles = [e.text for e in browser.find_elements(
            By.CSS_SELECTOR, ".md-search-result__item") if e.text.strip()]
        time.sleep(0.2)
    assert titles, ("search listed nothing for 'resume' on the site opened from disk; "
                    f"console: {browser.get_log('browser')}")


#: What the browser fetched that is not a file of the site (the offline rule).
_FETCHED_OUTSIDE = ("return performance.getEntriesByType('resource').map(e => e.name)"
                    ".filter(n => !n.startsWith('file:') && !n.startsWith('data:'))")


def test_the_concepts_diagrams_render_offline(site, browser):
    page = site / "concepts.html"
    browser.get(page.as_uri())
    drawn = browser.execute_script("""
        return [...document.querySelectorAll('.md-content svg.concept-diagram')].map(svg => {
            const box = svg.getBoundingClientRect();
            const texts = [...svg.querySelectorAll('text')];
            return {width: box.width, height: box.height,
                    rects: svg.querySelectorAll('rect').length, texts: texts.length,
                    blank: texts.filter(t => t.getBBox().width === 0).length,
                    outside: [...svg.querySelectorAll('image, use, foreignObject')].length};
        })""")
    assert len(drawn) >= 2, f"concepts.html has {len(drawn)} inline SVG diagrams"
    for svg in drawn:
        assert svg["width"] > 300 and svg["height"] > 150, svg
        assert svg["rects"] >= 5 and svg["texts"] >= 10 and svg["blank"] == 0, svg
        assert svg["outside"] == 0, svg   # drawn inline: nothing to fetch
    assert not browser.execute_script(_FETCHED_OUTSIDE)
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


SPLIT = {"packing/index.html": "Packing a dataset", "packing/options.html": "Pack options",
         "packing/bad-input.html": "Bad input", "remote/reading.html": "Reading from object storage",
         "remote/writing.html": "Writing to object storage", "concepts.html": "Concepts"}


@pytest.mark.parametrize("name", sorted(SPLIT))
def test_the_split_pages_load_whole_from_disk(site, browser, name):
    from selenium.webdriver.common.by import By

    browser.get((site / name).as_uri())
    title = browser.find_element(By.CSS_SELECTOR, ".md-content h1").text
    assert title.startswith(SPLIT[name]), title
    assert not browser.execute_script(_FETCHED_OUTSIDE)
    # The nav shows the page as the current one.
    active = browser.execute_script(
        "return [...document.querySelectorAll('.md-nav__link--active')].map(a => a.innerText)")
    assert active, f"{name} is not marked in the nav"
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"{name}: {errors}"

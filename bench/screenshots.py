"""Screenshots of the documentation site, to look at what a change to docs/ renders as.

Builds the site (mkdocs.yml) to a temporary folder and takes a headless Chromium
screenshot of each page asked for, opened from disk (file://).

    python bench/screenshots.py OUT_DIR [PAGE ...] [--width 1280] [--height 900] [--dark]
    python bench/screenshots.py shots index reference/cli reference/api
    python bench/screenshots.py shots "reference/api#fastdata.loaders.make_loader.loader" --height 1600

A PAGE is a page's path in docs/ without ".md" (``reading/index``), optionally with
``#anchor`` (the API reference's anchors are the objects' full paths; the shot then
starts at the anchor's entry); the default pages are the home page and the two reference pages. Each
PNG is named after its page (``reference-api.png``). Needs the docs extra
(``pip install -e .[docs]``) and Chromium (Debian: ``apt-get install chromium``).
Not run by the tests; tests/test_docs_site.py checks the built site's contents.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PAGES = ("index", "reference/cli", "reference/api")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    sys.exit("no Chromium found: install it (Debian: apt-get install chromium)")


def build_site(site_dir: str) -> float:
    """Build the site with ``mkdocs build --strict`` into ``site_dir``; the seconds taken."""
    start = time.perf_counter()
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", site_dir],
        cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mkdocs build failed:\n{done.stdout}{done.stderr}")
    return time.perf_counter() - start


# Headless Chromium screenshots a scrolled page blank (a #fragment or scrolling from a
# script alike), so a page with an anchor is shot from a copy that starts there:
# the article's blocks before the one holding the anchor are removed on load.
_FROM_ANCHOR = """<script>(() => {
  const article = document.querySelector("article");
  let node = document.getElementById(%s);
  if (!node) return;
  while (node.parentElement && node.parentElement !== article) node = node.parentElement;
  while (node.previousElementSibling) node.previousElementSibling.remove();
})()</script></body>"""


def page_url(site_dir: str, page: str) -> str:
    """The file:// URL of a page (``reference/api#anchor``) of a site built with
    ``use_directory_urls: false``: with an anchor, of a copy of it that starts there."""
    path, _, anchor = page.partition("#")
    path = path.removesuffix(".md").removesuffix(".html")
    html = Path(site_dir, path + ".html")
    if not html.is_file():
        sys.exit(f"no page {page!r} in the built site ({html} is missing)")
    if not anchor:
        return html.as_uri()
    text = html.read_text(encoding="utf-8")
    if f'id="{anchor}"' not in text:
        sys.exit(f"no anchor {anchor!r} in {path}.html")
    copy = html.with_name(f"{html.stem}.from-{len(list(html.parent.iterdir()))}.html")
    script = _FROM_ANCHOR % json.dumps(anchor)
    copy.write_text(text.replace("</body>", script, 1), encoding="utf-8")
    return copy.as_uri()


def screenshot(browser: str, url: str, out: Path, *, width: int, height: int,
               dark: bool) -> None:
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--allow-file-access-from-files", f"--window-size={width},{height}",
            f"--screenshot={out}", "--virtual-time-budget=3000"]
    if dark:
        args.append("--force-dark-mode")  # prefers-color-scheme: dark, the site's slate palette
    done = subprocess.run(args + [url], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not out.is_file():
        sys.exit(f"chromium failed on {url}:\n{done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder for the PNGs (created)")
    parser.add_argument("pages", nargs="*", default=list(DEFAULT_PAGES),
                        help="pages, as paths in docs/ without .md, optionally #anchor")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--dark", action="store_true", help="the dark palette")
    args = parser.parse_args()

    browser = find_browser()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fastdata-site-") as site_dir:
        seconds = build_site(site_dir)
        print(f"built the site in {seconds:.1f} s")
        for page in args.pages:
            name = page.replace("/", "-").replace("#", "--").removesuffix(".md")
            out = out_dir / f"{name}{'-dark' if args.dark else ''}.png"
            screenshot(browser, page_url(site_dir, page), out, width=args.width,
                       height=args.height, dark=args.dark)
            print(out)


if __name__ == "__main__":
    main()

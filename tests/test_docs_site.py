"""The documentation site (mkdocs.yml, docs/): the nav and the pages agree, and
``mkdocs build --strict`` builds a page per nav entry, the whole CLI reference and the
whole public Python API.

The build takes ~6-10 s on 2 cores (mkdocstrings reads the package's source); it runs
once for the module. mkdocs, mkdocstrings and mkdocs-click are in the test extra.
"""

from __future__ import annotations

import html as html_lib
import os
import re
import subprocess
import sys
from pathlib import Path

import optional
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _nav_pages() -> list[str]:
    """The files the nav of mkdocs.yml names, in order."""
    yaml = optional.require("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def walk(items) -> list[str]:
        pages = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            pages.extend(walk(value) if isinstance(value, list) else [value])
        return pages

    return walk(config["nav"])


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), f"pages named twice in the nav: {nav}"
    missing = [page for page in nav if not (DOCS / page).is_file()]
    assert not missing, f"the nav of mkdocs.yml names pages docs/ lacks: {missing}"
    pages = sorted(str(p.relative_to(DOCS).as_posix()) for p in DOCS.rglob("*.md")
                   if "hooks" not in p.relative_to(DOCS).parts)
    orphans = sorted(set(pages) - set(nav))
    assert not orphans, (f"pages in docs/ that the nav of mkdocs.yml does not list (add them "
                         f"to the nav): {orphans}")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    optional.skip_if_missing("docs")
    site_dir = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return site_dir


def _text(page: Path) -> str:
    """A built page's text, tags removed, entities decoded."""
    return html_lib.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


@pytest.mark.slow
def test_the_site_has_a_page_per_nav_entry(site):
    # use_directory_urls: false, so docs/a/b.md is site/a/b.html
    missing = [page for page in _nav_pages()
               if not (site / page).with_suffix(".html").is_file()]
    assert not missing, f"nav entries without a built page: {missing}"
    assert not (site / "hooks").exists(), "docs/hooks/ (the hooks' code) was published"


@pytest.mark.slow
def test_the_cli_reference_has_every_command_and_option(site, monkeypatch):
    import click

    from fastdata.cli import main
    from fastdata.formats import FORMATS

    # The site documents the package's formats, not the one the test suite adds.
    monkeypatch.delitem(FORMATS, "toy", raising=False)

    page = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    text = _text(site / "reference" / "cli.html")
    assert main.commands, "the click group has no commands"
    for name, command in main.commands.items():
        if command.hidden:
            continue
        assert f'id="fastdata-{name}"' in page, f"no entry for 'fastdata {name}'"
        assert f"fastdata {name} [OPTIONS]" in text, f"no usage line for 'fastdata {name}'"
        # get_params: with pack's and convert's writer options, from the registry
        for param in command.get_params(click.Context(command)):
            if isinstance(param, click.Option) and not param.hidden:
                assert param.opts[0] in text, f"'fastdata {name}' lacks {param.opts[0]}"
    # click's \b paragraphs became text blocks; no click sentinel leaked into the page
    assert "\b" not in page and "Sentinel" not in page
    assert "fastdata pack images/ train.lmdb\n" in text


@pytest.mark.slow
def test_the_api_reference_has_the_public_api(site):
    """Every name of ``fastdata.__all__`` (``__version__``, a string, is named in the
    text) and every class and function of ``fastdata.dali.__all__`` (its constants are
    not entries) has an entry, at its public name's anchor, headed by that name."""
    import inspect

    import fastdata
    import fastdata.dali

    page = (site / "reference" / "api.html").read_text(encoding="utf-8")
    names = [f"fastdata.{name}" for name in fastdata.__all__ if name != "__version__"]
    names += [f"fastdata.dali.{name}" for name in fastdata.dali.__all__
              if inspect.isclass(getattr(fastdata.dali, name))
              or inspect.isfunction(getattr(fastdata.dali, name))]
    headings = set(re.findall(r'<h3 id="[^"]+" class="doc doc-heading">\s*(?:<code>)?'
                              r'(?:<span[^>]*>)?([\w.]+)', page))
    missing = [name for name in names if name not in headings or f'id="{name}"' not in page]
    assert not missing, f"public names without an entry in docs/reference/api.md: {missing}"
    assert "fastdata.__version__" in _text(site / "reference" / "api.html")
    # the docstrings' Sphinx roles were turned into code (docs/hooks/reference.py)
    roles = re.findall(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>", page)
    assert not roles, f"Sphinx roles left as text: {len(roles)}"


def test_every_class_in_the_api_reference_names_its_public_members():
    """A class entry lists the members a user calls (``members:``), so helpers
    one module calls on another's object (``RandomResizedCrop.eighths``) stay
    out of the reference."""
    page = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^::: ([\w.]+)\n((?:    .*\n)*)", page, flags=re.M)
    classes = [(name, options) for name, options in blocks
               if name.rsplit(".", 1)[1][0].isupper() and "Error" not in name
               and "Warning" not in name]
    assert len(classes) >= 15, classes
    unlisted = [name for name, options in classes if "members:" not in options]
    assert not unlisted, f"class entries without a members list: {unlisted}"


@pytest.mark.slow
def test_the_api_reference_leaves_internals_out_and_formats_signatures(site):
    page = (site / "reference" / "api.html").read_text(encoding="utf-8")
    for internal in ("eighths", "unfused_reason", "shuffle_of", "loader_batch", "mean255",
                     "entries_at"):
        assert f".{internal}\"" not in page, internal
    # A long signature is laid out a parameter a line (the docs extra's formatter).
    start = page.index('id="fastdata.open_dataset"')
    signature = page[start:page.index("</code></pre>", start)]
    assert signature.count("\n") >= 5, signature[:400]


@pytest.mark.slow
def test_search_works_opened_from_disk(site):
    """A browser opening the site from disk will not fetch the search index
    (file:// has no fetch): the offline plugin inlines it as a script, loaded
    through an iframe worker shim on every page."""
    index = site / "search" / "search_index.js"
    assert index.is_file() and index.stat().st_size > 10_000
    assert "getting-started" in index.read_text(encoding="utf-8")
    for page in ("index.html", "reading/mixing.html"):
        assert "iframe-worker" in (site / page).read_text(encoding="utf-8"), page

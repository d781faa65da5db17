"""mkdocs hooks for the reference pages (mkdocs.yml: ``hooks:``).

- The click help texts' ``\\b`` paragraphs (click's "keep these lines as they are":
  examples, aligned columns) become text blocks on the CLI page, as ``--help``
  prints them, instead of lines run together into one paragraph. mkdocs-click
  drops the marker and passes the lines on as Markdown, so its description
  function is wrapped here.
- The docstrings' Sphinx roles (``:class:`fastdata.Order```, ``:func:`~x.y```),
  which Markdown leaves as text, become code, linked to the object's entry when
  the page documents it; an entry documented under its module's path
  (``fastdata.loaders.opening.open_dataset``) gets its public name's anchor too
  (``reference/api.md#fastdata.open_dataset``).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator

import mkdocs_click._docs as click_docs
from mkdocs.exceptions import PluginError

_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(~?)([\w.]+)(\(\))?</code>")
_ID = re.compile(r'\bid="(fastdata[\w.]*)"')


def _keep_lines(help_text: str) -> Iterator[str]:
    """``help_text`` as Markdown: each ``\\b`` paragraph as a text block (its first
    line stays prose when only the lines after it are indented, as in "Examples:")."""
    for paragraph in help_text.split("\n\n"):
        lines = paragraph.splitlines()
        if not lines or lines[0].strip() != "\b":
            yield from lines
            yield ""
            continue
        lines = lines[1:]
        if len(lines) > 1 and not lines[0].startswith(" ") and all(
                line.startswith(" ") for line in lines[1:] if line.strip()):
            yield lines[0]
            yield ""
            lines = lines[1:]
        yield "```text"
        yield from textwrap.dedent("\n".join(lines)).splitlines()
        yield "```"
        yield ""


def _make_description(ctx, remove_ascii_art: bool = False) -> Iterator[str]:
    help_lines = list(_original_description(ctx, remove_ascii_art))
    yield from _keep_lines("\n".join(help_lines).strip("\n"))


def on_startup(**kwargs) -> None:
    global _original_description
    current = getattr(click_docs, "_make_description", None)
    if current is None:
        raise PluginError("docs/hooks/reference.py: mkdocs_click._docs._make_description is "
                          "gone (a new mkdocs-click?): update the hook")
    if current is not _make_description:
        _original_description = current
        click_docs._make_description = _make_description


def on_page_content(html: str, **kwargs) -> str:
    """Sphinx roles as code, linked to an entry of this page when there is one: the name
    itself, ``fastdata.NAME`` and ``fastdata.dali.NAME`` by their documented paths,
    or a member or sibling of the object whose entry the role is in."""
    if 'class="doc' not in html:  # no mkdocstrings entries on this page
        return html
    anchors = [(m.start(), m.group(1)) for m in _ID.finditer(html)]
    ids = {anchor for _, anchor in anchors}
    public = _public_paths()

    def replace(match: re.Match) -> str:
        tilde, name, call = match.groups()
        shown = (name.rsplit(".", 1)[-1] if tilde else name) + (call or "")
        around = [anchor for start, anchor in anchors if start < match.start()]
        inside = around[-1] if around else ""
        candidates = [name, public.get(name), f"fastdata.{name}", public.get(f"fastdata.{name}"),
                      f"fastdata.dali.{name}", public.get(f"fastdata.dali.{name}")]
        while inside:
            candidates.append(f"{inside}.{name}")
            inside = inside.rpartition(".")[0]
        for target in candidates:
            if target in ids:
                return f'<a href="#{target}"><code>{shown}</code></a>'
        return f"<code>{shown}</code>"

    html = _ROLE.sub(replace, html)
    # An entry documented under its module's path is also at its public name's anchor
    # (api.html#fastdata.open_dataset), for links from the other pages.
    for name, path in public.items():
        if path in ids and name not in ids:
            html = re.sub(f'(<h[1-6] id="{re.escape(path)}")',
                          f'<a id="{name}"></a>\\1', html, count=1)
    return html


def _public_paths() -> dict[str, str]:
    """``fastdata.NAME`` and ``fastdata.dali.NAME`` -> the path they are documented
    under, without importing them (``fastdata``'s names are lazy)."""
    import fastdata
    import fastdata.dali
    import fastdata.errors

    paths = {f"fastdata.{name}": target.replace(":", ".")
             for name, target in fastdata._LAZY.items()}
    for name in fastdata.__all__:
        if hasattr(fastdata.errors, name):
            paths[f"fastdata.{name}"] = f"fastdata.errors.{name}"
    for name in fastdata.dali.__all__:
        obj = getattr(fastdata.dali, name)
        if hasattr(obj, "__qualname__"):
            paths[f"fastdata.dali.{name}"] = f"{obj.__module__}.{obj.__qualname__}"
    return paths


_original_description = click_docs._make_description

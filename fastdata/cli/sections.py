"""Commands whose ``--help`` lists the options in titled sections (``fastdata
pack --help``: Input, Output and format, Preprocessing, ...) instead of one
long list. Every option is listed once: those no section names go last, under
"Other options"."""

from __future__ import annotations

import click
from click.formatting import term_len

#: Where --help puts the options that no section names.
REST = "Other options"


class SectionedCommand(click.Command):
    """A command whose --help groups its options: ``sections`` holds (title,
    parameter names) in the order --help shows them; a section without any of
    the command's options is left out. The CLI reference (mkdocs-click) lists
    the options in one block, as click's own ``format_options`` does."""

    sections: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def help_sections(self, ctx: click.Context) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The sections for ``ctx`` (a subclass may add options known only then)."""
        return self.sections

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                rows[param.name] = record
        grouped = [(title, [rows.pop(name) for name in names if name in rows])
                   for title, names in self.help_sections(ctx)]
        grouped.append((REST, list(rows.values())))
        # One column for the option names in every section, as in one list.
        width = min(30, max((term_len(term) for _, found in grouped for term, _ in found),
                            default=0))
        for title, found in grouped:
            if found:
                with formatter.section(title):
                    formatter.write_dl([(term.ljust(width), text) for term, text in found])

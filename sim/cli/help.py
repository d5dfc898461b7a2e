"""`--help` in sections: a click Command whose options are listed under headings (click's own
``formatter.section``), so a command of 60 options reads as a few short lists."""

from __future__ import annotations

from typing import Callable

import click


class SectionedCommand(click.Command):
    """A click Command listing its options under sections: ``section_of(param)`` names the section
    of each option (sections appear in the order of ``section_order``, then any other in the
    order met); ``--help`` goes last, under the last section."""

    def __init__(self, *args, section_of: Callable[[click.Parameter], str], section_order: tuple = (), **kw):
        super().__init__(*args, **kw)
        self.section_of = section_of
        self.section_order = section_order

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {name: [] for name in self.section_order}
        last = None
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.name == "help":
                groups.setdefault(last or "Options", []).append(record)
                continue
            last = self.section_of(param)
            groups.setdefault(last, []).append(record)
        for name, rows in groups.items():
            if rows:
                with formatter.section(name):
                    formatter.write_dl(rows)

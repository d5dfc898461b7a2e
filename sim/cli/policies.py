"""`marconi policies`: every policy preset with the engine and version it reproduces, and its knobs."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from policies.base import ALIASES, PRESETS
from sim.cli.options import format_option


def _rows() -> list[dict]:
    aliases: dict[str, list[str]] = {}
    for old, new in ALIASES.items():
        aliases.setdefault(new, []).append(old)
    return [
        {
            "name": p.name,
            "engine": p.engine,
            "version": p.version or "-",
            "aliases": aliases.get(p.name, []),
            "stores": "input + output" if p.stores_last_token else "input + output - 1",
            "description": p.description,
            "knobs": [asdict(k) for k in p.knobs()],
        }
        for p in PRESETS.values()
    ]


def _one_line(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters at a word boundary."""
    if len(text) <= width:
        return text
    return text[: width - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def register(main: click.Group) -> None:
    @main.command("policies")
    @format_option("json: every preset with its knobs (name, flag, type, default, choices or min/max).")
    def policies(fmt: str) -> None:
        """List the policy presets (--policy): engine, engine version, what each stores, one line each."""
        rows = _rows()
        if fmt == "json":
            click.echo(json.dumps(rows, indent=2, default=str))
            return
        head = ("policy", "engine", "version", "old name", "description")
        body = [
            (r["name"], r["engine"], r["version"], ", ".join(r["aliases"]) or "-", _one_line(r["description"], 80))
            for r in rows
        ]
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(4)]
        for j, line in enumerate([head, *body]):
            click.echo("  ".join([*(c.ljust(w) for c, w in zip(line[:4], widths)), line[4]]).rstrip())
            if j == 0:
                click.echo("  ".join("-" * w for w in [*widths, len(head[4])]))

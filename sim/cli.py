"""The ``marconi`` command line. Each command group lives next to the code it drives and is
registered here; groups that need optional extras import them lazily."""

from __future__ import annotations

import sys

import click

from sim.errors import UsageError
from traces.base import TraceError


class _Main(click.Group):
    """Turns our known user errors into one clear line and exit code 2 (no traceback)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (UsageError, TraceError) as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Main)
@click.version_option(package_name="marconi-sim")
def main() -> None:
    """Simulate prefix caching of recurrent state for hybrid LLMs (Marconi and baselines)."""


def _register() -> None:
    from sim import cli_run

    cli_run.register(main)
    for module in ("sim.cli_models", "traces.cli", "kernels.cli", "sim.cli_sweep"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError:
            continue
        mod.register(main)


_register()

"""`marconi run` and `marconi models` (filled in by the simulator core)."""

import click


def register(main: click.Group) -> None:
    pass

"""A command group typed alone (``marconi traces``, ``marconi kernels``) shows its help as the
bare ``marconi`` does: click's usage, the group's text and its commands, one to a line, and exit
code 2 (click's for a group without a command). It used to fold that help into one "Error: Usage:
..." line, the shape kept for real usage errors (an unknown subcommand still gets it)."""

from __future__ import annotations

import pytest

from sim.cli import main

GROUPS = {"traces": ("list", "prepare", "stats"), "kernels": ("check",)}


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_group_alone_prints_its_help(runner, group):
    res = runner.invoke(main, [group], prog_name="marconi")
    assert res.exit_code == 2
    text = res.stdout + res.stderr
    lines = text.splitlines()
    assert lines[0] == f"Usage: marconi {group} [OPTIONS] COMMAND [ARGS]..."
    assert "Error" not in text
    assert "Commands:" in lines
    listed = [ln.split()[0] for ln in lines[lines.index("Commands:") + 1 :] if ln.strip()]
    assert set(GROUPS[group]) <= set(listed)


def test_the_bare_program_and_a_group_agree_on_the_exit_code(runner):
    assert runner.invoke(main, []).exit_code == runner.invoke(main, ["traces"]).exit_code == 2


def test_an_unknown_subcommand_is_still_one_line(runner):
    res = runner.invoke(main, ["traces", "bogus"], prog_name="marconi")
    assert res.exit_code == 2
    assert res.stderr.strip() == "Error: No such command 'bogus'. (see `marconi traces --help`)"

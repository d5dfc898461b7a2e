"""``marconi kernels check``: runs the checks and prints a pass/fail table; clear exit 2 when the
kernels extra is missing. The module itself must import without torch (the simulator imports it)."""

import builtins

import click
from click.testing import CliRunner
from without_torch import run_without_torch


def _group():
    from kernels.cli import register

    g = click.Group()
    register(g)
    return g


def test_cli_module_imports_without_torch():
    out = run_without_torch(
        "import click\n"
        "from kernels.cli import register\n"
        "g = click.Group(); register(g)\n"
        "print(sorted(g.commands['kernels'].commands))\n"
    )
    assert "['check']" in out


def test_check_exits_2_without_torch(monkeypatch):
    real = builtins.__import__

    def imp(name, *a, **k):
        if name.split(".")[0] == "torch":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", imp)
    res = CliRunner().invoke(_group(), ["kernels", "check"])
    assert res.exit_code == 2
    assert "pip install 'marconi-sim[kernels]'" in res.output


# `marconi kernels check` itself (exit 0, at least ten checks, every one PASS, "all checks passed")
# is a README command: tests/test_readme_commands.py runs it and checks its table (one run of the
# ~10 CPU s of interpreted kernels, not two)

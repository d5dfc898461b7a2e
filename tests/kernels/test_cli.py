"""``marconi kernels check``: runs the checks and prints a pass/fail table; clear exit 2 when the
kernels extra is missing. The module itself must import without torch (the simulator imports it)."""

import builtins
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner


def _group():
    from kernels.cli import register

    g = click.Group()
    register(g)
    return g


def test_cli_module_imports_without_torch():
    code = ("import sys, builtins\n"
            "real = builtins.__import__\n"
            "def imp(name, *a, **k):\n"
            "    if name.split('.')[0] in ('torch', 'triton'):\n"
            "        raise ImportError(name)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imp\n"
            "import click\n"
            "from kernels.cli import register\n"
            "g = click.Group(); register(g)\n"
            "print(sorted(g.commands['kernels'].commands))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "['check']" in out.stdout


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


def test_check_runs_and_passes():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    res = CliRunner().invoke(_group(), ["kernels", "check"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.endswith(("PASS", "FAIL"))]
    assert len(lines) >= 10 and all(ln.endswith("PASS") for ln in lines)
    assert "all checks passed" in res.output

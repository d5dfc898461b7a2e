"""`marconi run` with no options prints the same table, byte for byte, as before the layered
restructuring (stored copy captured from commit 4f766ae; results must not move by a single digit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main

STORED = Path(__file__).parent / "data" / "default_run.txt"


@pytest.mark.slow
def test_default_run_prints_the_stored_table_byte_for_byte():
    res = CliRunner().invoke(main, ["run", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert res.stdout == STORED.read_text()

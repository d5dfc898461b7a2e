"""`marconi run` prints the same table, byte for byte, as stored: with ``--scheduler fcfs`` the
numbers of before the layered restructuring (first captured from commit 4f766ae, when fcfs was
the only scheduler; results must not move by a single digit; the columns are issue 45's: TPOT,
queueing delay, throughput, batch size and preemptions joined the table; FLOPs saved is asked for
with --columns), and with no options the
default (continuous batching since it was validated against the H200's step times)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main

STORED = Path(__file__).parent / "data" / "default_run.txt"
STORED_DEFAULT = Path(__file__).parent / "data" / "default_run_continuous.txt"


@pytest.mark.slow
def test_fcfs_run_prints_the_stored_table_byte_for_byte():
    res = CliRunner().invoke(main, ["run", "--no-progress", "--scheduler", "fcfs", "--columns", "default,flops_saved"])
    assert res.exit_code == 0, res.output
    assert res.stdout == STORED.read_text()


@pytest.mark.slow
def test_default_run_is_continuous_batching_and_prints_the_stored_table():
    res = CliRunner().invoke(main, ["run", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "continuous batching (8192 tokens, 256 seqs per step)" in res.stdout.splitlines()[0]
    assert res.stdout == STORED_DEFAULT.read_text()

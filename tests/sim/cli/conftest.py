"""Fixtures of the CLI tests."""

import pytest
from click.testing import CliRunner


@pytest.fixture(scope="module")
def runner():
    """One click runner per test module (the command runs in process)."""
    return CliRunner()

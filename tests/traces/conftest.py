"""Shared fixtures of the traces tests (the private trace cache is the root conftest's)."""

from __future__ import annotations

from pathlib import Path

import pytest

# The ``shared`` folder sits beside the repository checkout (../shared from the repo root).
SHARED = (Path(__file__).resolve().parents[2] / ".." / "shared").resolve()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared folder not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def qwen():
    from traces.tokenizers import get_tokenizer

    return get_tokenizer("qwen3.5")


@pytest.fixture(scope="session")
def default_sharegpt():
    """The embedded default trace (tokenized once per test session)."""
    from traces.registry import TraceOptions, load_trace

    return load_trace("sharegpt", TraceOptions())

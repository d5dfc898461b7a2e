"""Shared fixtures of the traces tests: a private trace cache and the ``shared`` folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The ``shared`` folder sits beside the repository checkout (../shared from the repo root).
SHARED = (Path(__file__).resolve().parents[2] / ".." / "shared").resolve()


@pytest.fixture(scope="session", autouse=True)
def _trace_cache(tmp_path_factory):
    """Every test session gets its own trace cache, so tests never read a user's cache."""
    old = os.environ.get("MARCONI_CACHE_DIR")
    os.environ["MARCONI_CACHE_DIR"] = str(tmp_path_factory.mktemp("marconi-cache"))
    yield
    if old is None:
        os.environ.pop("MARCONI_CACHE_DIR", None)
    else:
        os.environ["MARCONI_CACHE_DIR"] = old


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

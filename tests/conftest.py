"""Fixtures for every test package: no test reads or writes the user's caches or result folders."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_trace_cache(tmp_path_factory):
    """One private trace cache per test session (``MARCONI_CACHE_DIR``); subprocesses and notebook
    kernels inherit it. Notebook folders come only from what a test sets."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MARCONI_CACHE_DIR", str(tmp_path_factory.mktemp("marconi-cache")))
    for name in ("RESULTS_DIR", "SMALL_SWEEP_DIR"):
        mp.delenv(name, raising=False)
    yield
    mp.undo()



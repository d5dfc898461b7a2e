"""Fixtures for every test package: no test reads or writes the user's caches or result folders;
GPU-marked tests are skipped where the kernels are interpreted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _session_cache_dir(tmp_path_factory) -> Path:
    """The test run's trace cache: under pytest-xdist one folder for all workers (beside their own
    base temp folders), so a trace is tokenized once per run, not once per worker. Cache writes are
    atomic (a temp file renamed into place), so workers filling the same entry is safe."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        path = base.parent / "marconi-cache"
        path.mkdir(exist_ok=True)
        return path
    return tmp_path_factory.mktemp("marconi-cache")


@pytest.fixture(scope="session", autouse=True)
def _private_trace_cache(tmp_path_factory):
    """One private trace cache per test run (``MARCONI_CACHE_DIR``); subprocesses and notebook
    kernels inherit it. Notebook folders come only from what a test sets."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MARCONI_CACHE_DIR", str(_session_cache_dir(tmp_path_factory)))
    for name in ("RESULTS_DIR", "SMALL_SWEEP_DIR"):
        mp.delenv(name, raising=False)
    yield
    mp.undo()


def pytest_configure(config):
    # interpreted kernels without the interpreter's repeated language patching (the same bits,
    # about half the time: tests/interp_patch_once.py; INTERP_PATCH_ONCE=0 to time without it)
    if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("INTERP_PATCH_ONCE") != "0":
        from interp_patch_once import install

        install()


def pytest_collection_modifyitems(config, items):
    # `slow` tests first (a stable sort: the rest keep their order): pytest-xdist hands out tests
    # in collection order, so a long test collected near the end (the README's commands, ~40 s)
    # would keep one worker busy while the other sits idle; started first, the other worker takes
    # the short tests meanwhile
    items.sort(key=lambda it: it.get_closest_marker("slow") is None)
    gpu = [it for it in items if it.get_closest_marker("gpu") or it.get_closest_marker("gpu_long")]
    if not gpu:
        return
    from gpu_env import compiled_gpu  # imports torch: only when GPU-marked tests were collected

    if compiled_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and compiled Triton (TRITON_INTERPRET unset)")
    for item in gpu:
        item.add_marker(skip)

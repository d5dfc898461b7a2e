"""Shared setup for the kernel tests. Each module skips cleanly without torch/triton."""

import os

import pytest

try:
    import torch
except ImportError:  # the modules themselves call pytest.importorskip
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available()

if not HAS_CUDA:
    # The interpreter must be chosen before triton is first imported by the kernels.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and compiled Triton (TRITON_INTERPRET unset)")
    for item in items:
        if item.get_closest_marker("gpu") or item.get_closest_marker("gpu_long"):
            item.add_marker(skip)

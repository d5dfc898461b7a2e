"""Shared setup for the replay tests: the Triton interpreter on CPU-only hosts, the gpu marker,
and a tiny replay stack (fp32, interpreter-friendly shapes)."""

import os

import pytest

try:
    import torch
except ImportError:  # torch-free modules still run; the torch ones call pytest.importorskip
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available()

if not HAS_CUDA:
    # must be chosen before triton is first imported by the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and compiled Triton (TRITON_INTERPRET unset)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_shape():
    from sim.replay.model import ReplayShape

    # GVA (2 value heads per key head), K = V = 16: the smallest shapes the kernels take
    return ReplayShape(hidden=32, layers=2, k_heads=1, v_heads=2, head_k_dim=16, head_v_dim=16,
                       conv_width=4, vocab_rows=512)


@pytest.fixture(scope="session")
def tiny_model(tiny_shape):
    from sim.replay.model import GDNStack

    return GDNStack(tiny_shape, device="cpu", dtype=torch.float32, seed=7)


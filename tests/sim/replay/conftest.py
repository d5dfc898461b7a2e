"""Shared setup for the replay tests: a tiny replay stack (fp32) on the CPU's default gated-delta
backend (plain torch, kernels/torch_gdn.py); the tests that run the Triton kernels on a CPU-only
host (``kernel="triton"``) get the interpreter, chosen here before triton is first imported. Under
pytest-xdist each worker runs torch on one thread (2 workers on CI's 2 cores: torch's thread pool
on busy cores slows the tiny ops many times)."""

import os

import pytest
from gpu_env import torch, use_interpreter_without_cuda

use_interpreter_without_cuda()
if torch is not None and os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_shape():
    from sim.replay.model import ReplayShape

    # GVA (2 value heads per key head), K = V = 16: the smallest shapes the Triton kernels take
    return ReplayShape(
        hidden=32, layers=2, k_heads=1, v_heads=2, head_k_dim=16, head_v_dim=16, conv_width=4, vocab_rows=512
    )


@pytest.fixture(scope="session")
def tiny_model(tiny_shape):
    from sim.replay.model import GDNStack

    return GDNStack(tiny_shape, device="cpu", dtype=torch.float32, seed=7)

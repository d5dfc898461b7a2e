"""Shared setup for the replay tests: the Triton interpreter on CPU-only hosts and a tiny replay
stack (fp32, interpreter-friendly shapes)."""

import pytest
from gpu_env import torch, use_interpreter_without_cuda

use_interpreter_without_cuda()


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


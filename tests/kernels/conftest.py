"""Shared setup for the kernel tests. Each module skips cleanly without torch/triton. Under
pytest-xdist each worker runs torch on one thread, as in the main pass (where
tests/sim/replay/conftest.py sets it for the whole worker): `make test`'s Triton-3.9 pass
collects tests/kernels alone, and there torch's default two threads per worker spun against the
other worker (test_chunk_gdn.py's compat tests, -n 0: 24.4 CPU s on torch's default two threads,
20.7 on one)."""

import os

import pytest
from gpu_env import HAS_CUDA, compiled_gpu, torch, use_interpreter_without_cuda

use_interpreter_without_cuda()
if torch is not None and os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def bf16_kernels_supported() -> bool:
    """bf16 tensor-core products need compute capability 8.0 (a T4 is 7.5; torch may still call
    bf16 "supported" there through emulation, which Triton's dots do not have)."""
    return HAS_CUDA and torch.cuda.get_device_capability() >= (8, 0)


# ---- GPU: compile the suite's kernel variants in parallel processes before the tests ---------
# The GPU suite needs ~50 kernel compilations (6 head dims x 2 half dtypes x 4 kernels, plus
# fp32 and the small dims); one after another they take longer than the tests themselves.
# Worker processes each run ``kernels.warmup`` for one variant and fill Triton's on-disk cache;
# the test process then loads the binaries from that cache. Failures only cost the speed-up.
GPU_VARIANTS = [(dt, d, 2, 4) for dt in ("float16", "bfloat16") for d in (16, 32, 64, 100, 128, 256)] + [
    ("float32", 128, 4, 8)
]


@pytest.fixture(scope="session", autouse=True)
def _precompile_gpu_kernels(request):
    items = request.session.items
    if not compiled_gpu() or not any(it.get_closest_marker("gpu") or it.get_closest_marker("gpu_long") for it in items):
        yield
        return
    from kernels.warmup import warmup_in_processes

    configs = [
        # one sequence a call at these heads: the wide state block's batches would only add compiles
        dict(
            num_heads=h,
            num_v_heads=hv,
            head_k_dim=d,
            head_v_dim=d,
            dtype=dt,
            conv_dim=64 if d == 64 else None,
            wide_batches=False,
        )
        for dt, d, h, hv in GPU_VARIANTS
        if dt != "bfloat16" or bf16_kernels_supported()
    ]
    try:
        warmup_in_processes(configs)
    except Exception as exc:  # noqa: BLE001 - only the speed-up is lost
        print(f"kernel precompile skipped: {type(exc).__name__}: {exc}")
    yield


def pytest_report_header(config):
    """Which Triton the run uses (`make test` runs tests/kernels on two versions)."""
    try:
        import triton
    except ImportError:
        return "triton: not installed"
    return f"triton {triton.__version__} ({triton.__file__})"

"""A replay that runs out of memory ends with one line and exit code 2, not torch's traceback.

Found on an H100 (80 GB): qwen3-next-80b-a3b at full depth on the Mooncake sample with a 40GB
store warned "replay may run out of GPU memory: 119.4 GB planned ... 76.8 GB free", went on, and
died in ``chunk_launch.outputs`` with ``torch.OutOfMemoryError`` and a 30-line traceback. The
replay itself is stood in for (``run_replay`` raising what torch raises); the real allocator
errors' texts are torch's, quoted from that run and from issue 41's CPU report."""

from __future__ import annotations

import pytest

from sim.cli import main

torch = pytest.importorskip("torch")

GPU_OOM = (
    "CUDA out of memory. Tried to allocate 3.48 GiB. GPU 0 has a total capacity of 79.18 GiB of which "
    "112.19 MiB is free. Including non-PyTorch memory, this process has 79.06 GiB memory in use."
)
CPU_OOM = (
    "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 60430432264 bytes. Error code 12 (Cannot allocate memory)"
)
ARGS = ["replay", "--trace", "synthetic:chat:sessions=1,turns=1", "--device", "cpu", "--requests", "1"]
ARGS += ["--no-progress", "--model", "replay-tiny"]


def _raising(monkeypatch, exc):
    import sim.replay.session as session

    def run_replay(*a, **k):
        raise exc

    monkeypatch.setattr(session, "run_replay", run_replay)


@pytest.mark.parametrize(
    "exc, expect",
    [
        (
            torch.OutOfMemoryError(GPU_OOM),
            "Error: replay ran out of memory on this machine (CUDA out of memory. Tried to allocate 3.48 GiB): "
            "lower --capacity or --requests",
        ),
        (
            RuntimeError(CPU_OOM),
            "Error: replay ran out of memory on this machine ([enforce fail at alloc_cpu.cpp:121] data. "
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 60430432264 bytes. Error code 12): "
            "lower --capacity or --requests",
        ),
    ],
    ids=["torch-oom", "cpu-allocator"],
)
def test_out_of_memory_is_one_line(runner, monkeypatch, exc, expect):
    _raising(monkeypatch, exc)
    res = runner.invoke(main, ARGS)
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == expect
    assert "Traceback" not in res.output


def test_the_gpu_line_names_the_gpu_and_the_host_store():
    from sim.cli.replay import out_of_memory_line

    line = out_of_memory_line(torch.OutOfMemoryError(GPU_OOM), "cuda")
    assert line == (
        "replay ran out of memory on the GPU (CUDA out of memory. Tried to allocate 3.48 GiB): "
        "lower --capacity or --requests, or use --store host"
    )


def test_another_runtime_error_still_raises(runner, monkeypatch):
    """Only memory errors are turned into a line: a bug elsewhere keeps its traceback."""
    _raising(monkeypatch, RuntimeError("shape mismatch"))
    res = runner.invoke(main, ARGS)
    assert res.exit_code == 1
    assert isinstance(res.exception, RuntimeError) and str(res.exception) == "shape mismatch"

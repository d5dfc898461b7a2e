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


def test_the_line_says_the_request_the_run_had_reached():
    """marconi-7b at full depth on the Mooncake sample ran out of an H100's memory (session 31) and
    the line said nothing of where: the run's error now carries the request last looked up, and the
    line names it."""
    from sim.cli.replay import out_of_memory_line

    exc = torch.OutOfMemoryError(GPU_OOM)
    exc.add_note("replay's last lookup: request 11 (87,571 prompt tokens)")
    assert out_of_memory_line(exc, "cuda") == (
        "replay ran out of memory on the GPU, the last request looked up 11 (87,571 prompt tokens) (CUDA out of "
        "memory. Tried to allocate 3.48 GiB): lower --capacity or --requests, or use --store host"
    )


def test_a_runs_error_carries_the_request_it_was_at(monkeypatch):
    """``execute``: an allocator error inside the run (stood in for at the third request's prefill)
    is raised with the request last looked up, its prompt length from the trace."""
    from sim.config import SimConfig
    from sim.replay.runner import Replayer
    from sim.replay.session import ReplaySettings, run_replay
    from sim.simulate import build
    from traces.registry import TraceOptions, load_trace

    trace = load_trace(
        "synthetic:chat:sessions=2,turns=2,prompt_tokens=300,user_tokens=20,output_tokens=8", TraceOptions()
    )
    prefill = Replayer.prefill
    seen = []

    def failing(self, rid, start, end):
        seen.append(rid)
        if len(seen) == 3:
            raise torch.OutOfMemoryError(GPU_OOM)
        return prefill(self, rid, start, end)

    monkeypatch.setattr(Replayer, "prefill", failing)
    cfg = SimConfig(policy="marconi", model="replay-tiny", capacity_bytes=10**9)
    with pytest.raises(torch.OutOfMemoryError) as info:
        run_replay(trace, cfg, ReplaySettings(device="cpu", dtype="fp32", kernel="torch"), build=build)
    rid = seen[-1]
    n = trace.requests[rid].n_input_tokens(trace.block_tokens)
    assert info.value.__notes__[0] == f"replay's last lookup: request {rid} ({n:,} prompt tokens)"
    # and what it held then: the event it was handling, the store, the step executor (continuous
    # batching, the default), the open flights (no torch allocator on a CPU)
    assert info.value.__notes__[1] == (
        f"replay's memory at the failure: during request {rid}'s prefill; store 0.0 GB, running requests 0.0 GB, "
        "open flights 0.0 GB"
    )


def test_the_line_says_what_the_replay_held_when_it_failed():
    """marconi-7b at full depth on the Mooncake sample under continuous batching at 10 GB planned
    65 GB of an H100's 70 GB free, warned nothing and ran out of memory (session 33): the line now
    sets what the replay held beside torch's figure, for the next run to say which part the plan
    missed."""
    from sim.cli.replay import out_of_memory_line

    exc = torch.OutOfMemoryError(GPU_OOM)
    exc.add_note("replay's last lookup: request 20 (26,353 prompt tokens)")
    exc.add_note(
        "replay's memory at the failure: during a step of 8,192 tokens; store 10.2 GB, running requests 12.9 GB, "
        "open flights 7.8 GB, torch allocated 66.1 GB, reserved 70.0 GB"
    )
    assert out_of_memory_line(exc, "cuda") == (
        "replay ran out of memory on the GPU, the last request looked up 20 (26,353 prompt tokens) (CUDA out of "
        "memory. Tried to allocate 3.48 GiB; during a step of 8,192 tokens; store 10.2 GB, running requests "
        "12.9 GB, open flights 7.8 GB, torch allocated 66.1 GB, reserved 70.0 GB): lower --capacity or "
        "--requests, or use --store host"
    )


@pytest.mark.parametrize("scheduler", ["fcfs", "continuous"])
def test_the_held_figures_are_the_replays_own_at_the_failure(monkeypatch, scheduler):
    """``memory_at_failure`` at a failure stood in for at the first event after the store holds
    something (and, continuous, the executor runs requests): its figures are the store's device
    bytes, the executor's buffers and pool, the open flights' bytes, each read off the parts at
    that moment (a CPU store is on the compute device, so it counts)."""
    from sim.config import SimConfig
    from sim.replay import pipeline
    from sim.replay.session import ReplaySettings, run_replay
    from sim.simulate import build
    from traces.registry import TraceOptions, load_trace

    trace = load_trace(
        "synthetic:chat:sessions=3,turns=3,prompt_tokens=300,user_tokens=20,output_tokens=8", TraceOptions()
    )
    seen = {}
    build_parts = pipeline.build

    def capture(*a, **k):
        parts = build_parts(*a, **k)
        seen["parts"] = parts
        return parts

    monkeypatch.setattr(pipeline, "build", capture)

    def after(name, sim, replayer):
        parts = seen["parts"]
        busy = parts.stepper is None or parts.stepper.kv_bytes > 0
        if name in ("step", "prefill") and parts.store.device_bytes > 0 and busy:
            seen["at"] = (
                name,
                parts.store.device_bytes,
                parts.stepper.kv_bytes + parts.stepper.pool_bytes if parts.stepper is not None else None,
                replayer.open_bytes(),
            )
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: stood in")

    cfg = SimConfig(policy="marconi", model="replay-tiny", capacity_bytes=10**9, scheduler=scheduler)
    settings = ReplaySettings(device="cpu", dtype="fp32", kernel="torch")
    with pytest.raises(RuntimeError) as info:
        run_replay(trace, cfg, settings, build=build, after_event=after)
    name, store, running, flights = seen["at"]
    held = [n for n in info.value.__notes__ if n.startswith("replay's memory at the failure: ")]
    gb = 1e9
    expect = f"store {store / gb:.1f} GB"
    if running is not None:
        expect += f", running requests {running / gb:.1f} GB"
    expect += f", open flights {flights / gb:.1f} GB"
    # the hook runs as the event's last part: the note names the event
    (note,) = held
    during = note.removeprefix("replay's memory at the failure: during ").split("; ")[0]
    if name == "step":
        assert during.startswith("a step of ") and during.endswith(" tokens")
    else:
        assert during.startswith("request ") and during.endswith("'s prefill")
    assert note.endswith(f"; {expect}")
    assert store > 0 and (running is None or running > 0)
    # a failure after the event stream (the last requests' work, ``Replayer.finish``) says so
    from sim.replay.runner import Replayer

    def finish(self):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: stood in")

    monkeypatch.setattr(Replayer, "finish", finish)
    with pytest.raises(RuntimeError) as info:
        run_replay(trace, cfg, settings, build=build)
    assert info.value.__notes__[-1].startswith("replay's memory at the failure: during the last requests' work; store ")


def test_on_a_gpu_the_held_figures_add_torchs_allocated_and_reserved(monkeypatch):
    """``memory_at_failure`` of a GPU run (torch's figures stood in for: no GPU here): a host
    store counts nothing, a shadow's store on the device counts, the executor's buffers and pool,
    every replayer's open flights, then torch's allocated and reserved bytes."""
    from types import SimpleNamespace

    from sim.replay.pipeline import memory_at_failure

    def replayer(store_bytes, flights):
        return SimpleNamespace(store=SimpleNamespace(device_bytes=store_bytes), open_bytes=lambda: flights)

    parts = SimpleNamespace(
        replayer=replayer(0, 5 * 10**9),
        shadows=(replayer(2 * 10**9, 10**9),),
        stepper=SimpleNamespace(kv_bytes=12 * 10**9, pool_bytes=9 * 10**8),
        model=SimpleNamespace(device=torch.device("cuda")),
    )
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 66_149_000_000)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 70_000_000_000)
    assert memory_at_failure(parts, "a step of 8,192 tokens") == (
        "during a step of 8,192 tokens; store 2.0 GB, running requests 12.9 GB, open flights 6.0 GB, "
        "torch allocated 66.1 GB, reserved 70.0 GB, 3.9 GB of it cached in pieces: "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may help"
    )
    # under a GiB cached unallocated: no word of it (1 GiB is where it is said)
    from sim.replay.pipeline import FRAGMENTED_BYTES

    assert FRAGMENTED_BYTES == 1 << 30
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 66_149_000_000 + (1 << 30) - 1)
    assert memory_at_failure(parts, "").endswith("torch allocated 66.1 GB, reserved 67.2 GB")
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 66_149_000_000 + (1 << 30))
    assert memory_at_failure(parts, "").endswith(
        "1.1 GB of it cached in pieces: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may help"
    )

"""Replay attached to the real simulator (replay-tiny preset on the CPU's default gated-delta
backend, plain torch): every hit restored, checked and passing in both state alignments and both
modes on a synthetic chat trace, a tiny ShareGPT slice and a hash-block (Bailian-format) trace;
after every event the store holds exactly the simulator's live checkpoints. One small replay runs
the Triton kernels (the interpreter on a CPU), which keeps replay's wiring to them covered; one
runs where triton cannot be imported."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sim.config import SimConfig  # noqa: E402
from sim.replay.session import ReplaySettings, run_replay  # noqa: E402
from sim.simulate import build  # noqa: E402
from traces.registry import TraceOptions, load_trace  # noqa: E402

CHAT = "synthetic:chat:sessions=6,turns=4,prompt_tokens=40,user_tokens=24,output_tokens=16,prompts=2"


def replay(trace, alignment, mode, *, capacity=40_000, requests=24, policy="marconi", kernel="auto"):
    events = Counter()

    def after(name, sim, replayer):
        events[name] += 1
        live = set(sim.tree.checkpoints())
        assert replayer.store.ids() == live, (name, replayer.store.ids() ^ live)

    cfg = SimConfig(
        policy=policy, model="replay-tiny", capacity_bytes=capacity, alpha=0.5, state_alignment=alignment, mode=mode
    )
    settings = ReplaySettings(layers=1, device="cpu", dtype="fp32", requests=requests, kernel=kernel)
    return run_replay(trace, cfg, settings, build=build, after_event=after), events


def check(res, events):
    s = res.summary
    assert res.failures == [], [f.message() for f in res.failures]
    assert s["hits"] > 0 and s["hits_validated"] == s["hits"]
    assert s["max_restore_error"] < 1e-4
    assert events["lookup"] == s["requests"]
    # the store never held more than the simulator's capacity in states allows
    assert s["store_peak_bytes"] > 0


@pytest.fixture(scope="module")
def chat():
    return load_trace(CHAT, TraceOptions())


@pytest.mark.parametrize("alignment", ["exact", "chunk"])
@pytest.mark.parametrize("mode", ["des", "sequential"])
def test_chat_all_hits_validated(chat, alignment, mode):
    res, events = replay(chat, alignment, mode)
    check(res, events)
    assert events["evict"] > 0  # the capacity is small enough that states are evicted
    df = res.requests
    assert (df.loc[df["hit_tokens"] > 0, "restored"]).all()
    if alignment == "chunk":
        # a restore inside a prompt (not at a previous turn's end) sits on a 64-multiple
        assert res.summary["late_admits"] == 0


@pytest.fixture(scope="module")
def sharegpt_slice():
    try:
        # whole conversations cut at 400 tokens: ~two dozen short requests, the later turns hit
        return load_trace("sharegpt", TraceOptions(sessions=20, max_tokens=400, min_rounds=2))
    except Exception as exc:  # noqa: BLE001 - the dataset package or tokenizer may be absent
        pytest.skip(f"ShareGPT not available: {exc}")


@pytest.mark.parametrize("alignment, mode", [("exact", "sequential"), ("chunk", "des")])
def test_sharegpt_slice_all_hits_validated(sharegpt_slice, alignment, mode):
    res, events = replay(
        sharegpt_slice, alignment, mode, capacity=10**6, requests=None, policy="sglang+" if mode == "des" else "marconi"
    )
    check(res, events)


def test_cpu_default_is_the_torch_backend(chat):
    res, events = replay(chat, "chunk", "des", requests=6)
    check(res, events)
    assert res.settings["kernel"] == res.summary["kernel"] == "torch"
    assert res.settings["kernel_requested"] == "auto" and res.settings["cpu_threads"] >= 1


def test_cpu_threads_one_for_small_presets(monkeypatch):
    """A small preset on the CPU replays on one torch thread (restored after); a wide one, a GPU
    or an explicit OMP_NUM_THREADS keep torch's setting."""
    from sim.cost import get_model
    from sim.replay.session import cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    with cpu_threads(torch.device("cpu"), get_model("replay-tiny")) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    for device, model in ((torch.device("cpu"), "qwen3.5-9b"), (torch.device("cuda"), "replay-tiny")):
        with cpu_threads(device, get_model(model)) as n:
            assert n == before == torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with cpu_threads(torch.device("cpu"), get_model("replay-tiny")) as n:
        assert n == before == torch.get_num_threads()


def in_fresh_thread(fn):
    """``fn()`` in a new thread (its exception re-raised here). CPython 3.11 keeps frames on 16 KiB
    data-stack chunks and unmaps one when the frame at its base returns; at pytest's call depth the
    Triton interpreter's calls in this replay cross a chunk boundary and map / unmap a chunk each
    time (1.4 M pairs: 2.5x the CPU time); a new thread starts a data stack of its own
    (benchmarks/results/2026-12-05-test-speed/)."""
    import threading

    out = []

    def body():
        try:
            out.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            out.append((False, exc))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


# one shared prompt of 70 tokens and 2-token outputs: each interpreted call costs ~0.5 s whatever
# its length, so few decode steps; still from-scratch prefills over a 64-token boundary, prefills
# from restored states, decode steps and validated hits
TRITON_CHAT = "synthetic:chat:sessions=4,turns=3,prompt_tokens=70,user_tokens=24,output_tokens=2,prompts=1"


@pytest.mark.slow
def test_triton_interpreter_backend_end_to_end():
    """The wiring of replay to the project's Triton kernels (interpreted on a CPU): a few requests
    of a chat trace, every hit validated."""
    pytest.importorskip("triton")
    trace = load_trace(TRITON_CHAT, TraceOptions())
    res, events = in_fresh_thread(lambda: replay(trace, "exact", "des", requests=3, kernel="triton"))
    check(res, events)
    assert res.settings["kernel"] == res.summary["kernel"] == "triton"
    assert res.summary["hits"] >= 2 and events["decode"] == 3


def test_cpu_replay_needs_no_triton():
    """With triton unimportable, a CPU replay on the default backend runs and validates its hits."""
    code = (
        "import builtins\n"
        "real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name.split('.')[0] == 'triton':\n"
        "        raise ImportError(name, name='triton')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\n"
        "import sys\n"
        "from sim.config import SimConfig\n"
        "from sim.replay.session import ReplaySettings, run_replay\n"
        "from sim.simulate import build\n"
        "from traces.registry import TraceOptions, load_trace\n"
        f"trace = load_trace({CHAT!r}, TraceOptions())\n"
        "cfg = SimConfig(policy='marconi', model='replay-tiny', capacity_bytes=40_000, alpha=0.5)\n"
        "res = run_replay(trace, cfg, ReplaySettings(device='cpu', dtype='fp32', requests=6), build=build)\n"
        "s = res.summary\n"
        "print(s['kernel'], s['hits'] > 0, s['hits_validated'] == s['hits'], s['failures'], 'triton' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["torch", "True", "True", "0", "False"]


def test_hash_block_trace_replayed(tmp_path):
    """Bailian-format rows (16-token blocks): a session of growing turns and a second session
    sharing the first block; tokens are drawn per hash id, so shared blocks restore."""
    rows = [
        dict(
            chat_id=1,
            parent_chat_id=-1,
            timestamp=0.0,
            input_length=40,
            output_length=20,
            type="text",
            turn=1,
            hash_ids=[5, 6, 7],
        ),
        dict(
            chat_id=2,
            parent_chat_id=-1,
            timestamp=0.5,
            input_length=30,
            output_length=5,
            type="text",
            turn=1,
            hash_ids=[5, 9],
        ),
        dict(
            chat_id=3,
            parent_chat_id=1,
            timestamp=3.0,
            input_length=90,
            output_length=10,
            type="text",
            turn=2,
            hash_ids=[5, 6, 7, 8, 10, 11],
        ),
        dict(
            chat_id=4,
            parent_chat_id=3,
            timestamp=6.0,
            input_length=120,
            output_length=4,
            type="text",
            turn=3,
            hash_ids=[5, 6, 7, 8, 10, 11, 12, 13],
        ),
    ]
    p = tmp_path / "bailian.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = load_trace(f"bailian:{p}", TraceOptions())
    res, events = replay(trace, "exact", "des", capacity=10**6, requests=None)
    check(res, events)
    assert res.summary["hits"] >= 2


@pytest.mark.parametrize("scheduler, max_open, stepper", [("continuous", 48, "StepExecutor"), ("fcfs", 16, "NoneType")])
def test_a_continuous_replay_keeps_a_batch_of_flights_open_and_steps_it(chat, scheduler, max_open, stepper):
    """``pipeline.build``: under the continuous scheduler the replayer keeps ``max_num_seqs + 8``
    flights open (every running request's, at least 16) and a ``StepExecutor`` replays the
    steps; under any other, 16 flights and no stepper (mutation survivors of ``pipeline.build``'s
    two ``continuous`` tests, -m pipeline --seed 0)."""
    from sim.cost import get_model
    from sim.replay import pipeline
    from sim.replay.session import VOCAB_ROWS, token_source

    cfg = SimConfig(policy="marconi", model="replay-tiny", mode="des", scheduler=scheduler, max_num_seqs=40)
    settings = ReplaySettings(layers=1, device="cpu", dtype="fp32", requests=6)
    parts = pipeline.build(
        chat,
        cfg,
        settings,
        get_model("replay-tiny"),
        1,
        "torch",
        torch.device("cpu"),
        timing=None,
        vocab_rows=VOCAB_ROWS,
        tokens_of=token_source(chat, 0),
    )
    assert parts.replayer.max_open == max_open and type(parts.stepper).__name__ == stepper

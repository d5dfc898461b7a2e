"""The warm-up before a replay is timed (``sim/replay/warm.py``, ``ReplaySettings.warmup`` on a
GPU): which untimed calls it makes (the stack's runs, the step executor's batches, the kernels' own warm-up
on the Triton backend), the memory reserve of the longest prompt (``presize``: what it holds while
it runs and what it frees), the wait for the device's queued work and the seconds it returns. One
test runs the tiny CPU model's own stack (every call valid for it); the others record the calls
on a stand-in of its shapes (a step's 16K-token batch would take seconds on a CPU)."""

import importlib
import weakref
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from sim.replay.warm import _warm_steps, _zero_batch, presize, presize_tokens, warm  # noqa: E402

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # chunks of a step's longest sequence (16K tokens)


class Clock:
    """``time`` for sim.replay.warm: ``perf_counter`` hands out ``ticks`` in order."""

    def __init__(self, *ticks):
        self.ticks = list(ticks)

    def perf_counter(self):
        return self.ticks.pop(0)


def recorder(log, run=None):
    """``run`` and ``forward_batch`` that record every call in ``log``; ``run`` also runs the
    given stack's own ``run`` (else it returns a fresh state stand-in)."""

    def spy_run(tokens, state, start, wanted=(), on_state=None, **kw):
        first = int(tokens[0]) if len(tokens) else None
        assert tokens.tolist() == list(range(first, first + len(tokens)))  # consecutive ids
        out = run(tokens, state, start, wanted, on_state, **kw) if run else (object(), None, 1)
        log.append(
            SimpleNamespace(
                what="run",
                first=first,
                n=len(tokens),
                state=state,
                start=start,
                wanted=list(wanted),
                sink=on_state is not None,
                keep=kw.get("keep_outputs", False),
                out=out[0],
            )
        )
        return out

    def spy_batch(toks, cu, starts, rec0, conv0, kv, **kw):
        log.append(
            SimpleNamespace(
                what="batch", toks=toks, cu=list(cu), starts=list(starts), rec0=rec0, conv0=conv0, kv=kv, kw=kw
            )
        )

    return spy_run, spy_batch


@pytest.fixture
def calls(monkeypatch):
    """Every call of the warm-up to ``stack`` (the tiny model's shapes, the torch backend; its
    ``run`` and ``forward_batch`` recorded, not run) and ``torch.cuda.synchronize``, in one log."""
    log = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append(SimpleNamespace(what="sync")))
    return log


@pytest.fixture
def stack(tiny_shape, calls):
    run, batch = recorder(calls)
    return SimpleNamespace(
        shape=tiny_shape, device=torch.device("cpu"), dtype=torch.float32, kernel="torch", run=run, forward_batch=batch
    )


def runs(log):
    return [(c.first, c.n, c.start, c.wanted, c.sink, c.keep) for c in log if c.what == "run"]


#: warm's own stack runs: from scratch with boundary states at and between chunks and a split
#: (100 and 130), from a state with a split (250), 63 tokens (no boundary), 64 (one, at the end)
STACK_RUNS = [
    (0, 200, 0, [64, 128], True, True),
    (0, 130, 0, [64, 100, 130], True, True),
    (130, 170, 130, [192, 250], True, True),
    (0, 63, 0, [], False, False),
    (0, 64, 0, [64], True, False),
]


def test_warm_runs_the_stack_then_reserves_the_longest_prompt(tiny_model, calls, monkeypatch):
    """The tiny model's own runs (each call valid for the stack), recorded."""
    tiny_model.run = recorder(calls, tiny_model.run)[0]
    monkeypatch.setattr("sim.replay.warm.time", Clock(10.0, 12.5))
    try:
        assert warm(tiny_model, torch.device("cpu"), longest_prompt=130) == 2.5  # seconds, end - start
    finally:
        del tiny_model.run
    # ... then presize: 130 tokens -> three chunks, 192 tokens, a boundary state at 128
    assert runs(calls) == STACK_RUNS + [(0, 192, 0, [128], True, False)]
    r = [c for c in calls if c.what == "run"]
    assert r[2].state is r[1].out  # the third run starts from the second's state
    assert all(c.state is None for c in r[:2] + r[3:])
    assert not any(c.what in ("batch", "sync") for c in calls)  # no steps asked; a CPU: no sync


def test_warm_with_no_prompt_reserves_nothing(stack, calls):
    warm(stack, torch.device("cpu"))
    assert runs(calls) == STACK_RUNS


def test_warm_waits_for_a_cuda_devices_queued_work_before_it_returns(stack, calls):
    """Its seconds count the device's work: one ``torch.cuda.synchronize`` after the last call (a
    CPU model stands in; the warm-up's calls run on the model's device)."""
    warm(stack, torch.device("cuda"), longest_prompt=64)
    assert [c.what for c in calls] == ["run"] * 6 + ["sync"]


def step_batches(boundaries: bool):
    """The step executor's batches, hand-worked: per bucket of n chunks a ragged chunk of
    64n - 10 tokens from a state at 10, a 70-token sequence from scratch, two decode tokens (at 5
    and 700); with ``boundaries`` each again keeping the outputs and a boundary at 64 of the
    second; then decode-only steps of 1 and 16 sequences at 100."""
    out = []
    for n in BUCKETS:
        T = 64 * n - 10
        cu = [0, T, T + 70, T + 71, T + 72]
        out.append((cu, [10, 0, 5, 700], False))
        if boundaries:
            out.append((cu, [10, 0, 5, 700], True))
    out.append(([0, 1], [100], False))
    out.append((list(range(17)), [100] * 16, False))
    return out


@pytest.mark.parametrize("steps, batches", [(True, False), (False, True), (True, True)])
def test_warm_runs_the_step_batches_when_asked(stack, calls, steps, batches):
    warm(stack, torch.device("cpu"), steps=steps, batches=batches)
    got = [c for c in calls if c.what == "batch"]
    assert [(c.cu, c.starts, "boundaries" in c.kw) for c in got] == step_batches(batches)
    assert runs(calls) == STACK_RUNS  # the stack's runs first, the batches after them
    assert [c.what for c in calls[:5]] == ["run"] * 5
    s = stack.shape
    for c in got:
        assert c.toks.tolist() == list(range(c.cu[-1]))
        N = len(c.starts)
        assert c.rec0.shape == (s.layers, N, s.v_heads, s.head_k_dim, s.head_v_dim) and not c.rec0.any()
        assert c.conv0.shape == (s.layers, N, s.conv_dim, s.conv_width - 1) and not c.conv0.any()
        assert c.kv is None  # no attention layers
        if "boundaries" in c.kw:
            assert c.kw["boundaries"] == [[], [64], [], []] and c.kw["keep_outputs"] is True
            assert c.kw["on_state"] is not None


def test_step_batches_hold_one_zero_kv_per_sequence_on_attention_layers():
    """``_zero_batch`` with attention: a zero KV of ``starts[n]`` tokens for each sequence, in the
    model's dtype; the recurrent states in fp32, conv windows in the dtype."""
    shape = SimpleNamespace(
        layers=3,
        v_heads=2,
        head_k_dim=4,
        head_v_dim=8,
        conv_dim=40,
        conv_width=4,
        attn_layers=2,
        attn_kv_heads=1,
        attn_head_dim=16,
    )
    model = SimpleNamespace(shape=shape, device=torch.device("cpu"), dtype=torch.bfloat16)
    rec0, conv0, kv = _zero_batch(model, [10, 0, 5])
    assert rec0.shape == (3, 3, 2, 4, 8) and rec0.dtype == torch.float32 and not rec0.any()
    assert conv0.shape == (3, 3, 40, 3) and conv0.dtype == torch.bfloat16 and not conv0.any()
    assert [t.shape for t in kv] == [(2, 2, p, 1, 16) for p in (10, 0, 5)]
    assert all(t.dtype == torch.bfloat16 and not t.any() for t in kv)
    batches = []
    model.forward_batch = lambda toks, cu, starts, *a, **kw: batches.append((cu, starts))
    _warm_steps(model)
    assert batches == [(cu, st) for cu, st, _ in step_batches(False)]


def test_the_triton_backend_warms_its_kernels_at_the_stacks_shapes(stack, calls, monkeypatch):
    """On the Triton backend, ``kernels.warmup`` runs first, at 63, 64 and 200 tokens (no
    boundary, one at the end, three chunks and a partial) with the stack's heads, dims, dtype,
    gate and beta flags and conv shape; a refusal (TypeError, ValueError, RuntimeError) leaves
    the stack's runs to cover it. On the torch backend it is not called. The submodule is imported
    first, as tests/kernels/conftest.py and ``warmup_in_processes``' callers do: ``kernels.warmup``
    is then the module, not the function."""
    pytest.importorskip("triton")
    module = importlib.import_module("kernels.warmup")
    seen = []

    def spy(buckets, **kw):
        seen.append((buckets, kw))
        calls.append(SimpleNamespace(what="kernels"))

    monkeypatch.setattr(module, "warmup", spy)
    warm(stack, torch.device("cpu"))
    assert seen == []  # the torch backend: nothing of Triton's
    stack.kernel = "triton"
    warm(stack, torch.device("cpu"))
    s = stack.shape
    assert seen == [
        (
            (63, 64, 200),
            dict(
                num_heads=s.k_heads,
                num_v_heads=s.v_heads,
                head_k_dim=s.head_k_dim,
                head_v_dim=s.head_v_dim,
                dtype=torch.float32,
                device=torch.device("cpu"),
                use_gate_in_kernel=True,
                use_beta_sigmoid=True,
                conv_dim=s.conv_dim,
                conv_width=s.conv_width,
            ),
        )
    ]
    assert [c.what for c in calls[5:7]] == ["kernels", "run"]  # the kernels first, then the stack
    for err in (TypeError, ValueError, RuntimeError):
        calls.clear()

        def refuse(buckets, err=err, **kw):
            raise err("refused")

        monkeypatch.setattr(module, "warmup", refuse)
        warm(stack, torch.device("cpu"))
        assert runs(calls) == STACK_RUNS


@pytest.mark.parametrize("tokens, wanted", [(1, []), (63, []), (64, []), (65, [64]), (128, [64]), (129, [128])])
def test_presize_runs_from_scratch_with_a_boundary_state_below_its_end(stack, calls, tokens, wanted):
    """As the hits' reference check runs it: a state at the last whole chunk below the end (none
    within the first chunk)."""
    assert presize(stack, tokens) == tokens
    assert runs(calls) == [(0, tokens, 0, wanted, True, False)]


def test_presize_of_no_tokens_runs_nothing(stack, calls):
    assert presize(stack, 0) == 0
    assert calls == []


def test_presize_tokens_round_up_to_whole_chunks():
    rounded = {0: 0, -1: 0, -3: 0, 1: 64, 63: 64, 64: 64, 65: 128, 127: 128, 128: 128, 129: 192, 1000: 1024}
    assert {n: presize_tokens(n) for n in rounded} == rounded
    assert presize_tokens(64.0) == 64 and isinstance(presize_tokens(65), int)


class Parts:
    """Boundary-state stand-ins whose copies (``clone``) are counted and watched (weakrefs)."""

    def __init__(self):
        self.copies = []

    def part(self):
        parts = self

        class Part:
            def clone(self):
                c = Part()
                parts.copies.append(weakref.ref(c))
                return c

        return Part()

    def alive(self):
        return sum(r() is not None for r in self.copies)


def fake_stack(parts, fail: bool):
    """A model whose ``run`` hands a boundary state of two layers to the sink, checks the sink
    holds a copy of each (as the reference check does: the copies' memory is part of the call),
    then returns or runs out of device memory."""

    def run(tokens, state, start, wanted=(), on_state=None, **kw):
        for layer in range(2):
            on_state(wanted[0], layer, parts.part(), parts.part())
        assert len(parts.copies) == 4 and parts.alive() == 4  # r and c of both layers, held
        if fail:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return None, None, 1

    return SimpleNamespace(device=torch.device("cpu"), run=run)


def test_presize_holds_the_boundary_copies_for_the_call_and_frees_them_after():
    parts = Parts()
    assert presize(fake_stack(parts, fail=False), 130) == 130
    assert parts.alive() == 0


def test_presize_out_of_memory_frees_the_copies_before_emptying_the_cache(monkeypatch):
    """A reserve that does not fit is given up: 0 tokens, the copies dropped and then the
    allocator's cache emptied (so the blocks they held go back too)."""
    parts = Parts()
    at_empty = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: at_empty.append(parts.alive()))
    assert presize(fake_stack(parts, fail=True), 130) == 0
    assert at_empty == [0]

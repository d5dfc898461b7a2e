"""Every rule of today's engine presets holds under every scheduler (issue 43, item 2): sequential,
``--scheduler fcfs`` and ``--scheduler continuous`` (the default in ``des`` mode) give the same hit
tokens on tiny traces where the rule decides the hit, and the continuous scheduler ends a prefill
step where the engine ends it.

Engine sources: vllm-project/vllm ``vllm/v1/core/sched/scheduler.py`` ``_mamba_block_aligned_split``
(the ``stops`` tuple, L411-L437 as read in vLLM main: block-aligned steps, the last cacheable block,
the block-floored shared-prefix junction) and ``vllm/v1/core/kv_cache_manager.py``
``get_computed_blocks`` (L286-L292: ``shared_prefix_boundary = num_new_computed_tokens +
num_uncached``, no flag); NVIDIA/TensorRT-LLM ``kv_cache/mamba_cache_manager/common.py``
``prepare_expect_snapshot_points`` (chunks end at snapshot points); sgl-project/sglang
``mamba_component.py`` (no_buffer: a state at every chunk end; extra_buffer: one tracked state per
extend step); InternLM/lmdeploy v0.16.0 ``block_trie`` (a checkpoint at every forward end).

Request i is its own session at t = i; with the tiny prompts here each request finishes before
the next arrives, so the continuous scheduler runs one request at a time with the same budget as
``--prefill-chunk`` (``--max-num-batched-tokens`` set equal).
"""

from __future__ import annotations

import pytest
from engine_cases import cat, one_per_session, run, state_depths, toks

from sim.config import SimConfig
from sim.engine.drivers import run as drive
from sim.engine.events import EventLog, Step
from sim.simulate import build

SCHEDULERS = (("sequential", "auto"), ("des", "fcfs"), ("des", "continuous"))


def run_in(mode, scheduler, trace, policy, **cfg):
    if scheduler == "continuous":
        cfg.setdefault("max_num_batched_tokens", cfg.get("prefill_chunk_tokens", 8192))
    return run(trace, policy, mode=mode, scheduler=scheduler, **cfg)


def shared_then_own(shared, k, own=100):
    """``k`` requests sharing their first ``shared`` tokens, then ``own`` tokens of their own."""
    return one_per_session(
        *[(cat(toks(0, shared), toks(1000 * (i + 1), own)), toks(50_000 + 10 * i, 5)) for i in range(k)]
    )


# a 300-token prompt, then a prompt sharing its first 200 tokens
PAIR = one_per_session((toks(0, 300), toks(9000, 5)), (cat(toks(0, 200), toks(5000, 100)), toks(9100, 5)))

CASES = {
    # vLLM #45238's shape: the junction (300 floored to 256) is cut and kept by request 1 without a
    # flag, and request 2 reuses it (vLLM main always takes it: kv_cache_manager.py L286-L292)
    "vllm-junction": (shared_then_own(300, 3), "vllm", dict(block_size=64), [0, 0, 256]),
    # dense retention, 128-token steps of 64-token blocks: the step end at 128 keeps a state, so
    # the second prompt reuses 128 (and its own junction at 192 is cut and kept)
    "vllm-step-ends": (
        PAIR,
        "vllm",
        dict(block_size=64, prefix_cache_retention_interval=-1, prefill_chunk_tokens=128),
        [0, 128],
    ),
    # SGLang no_buffer: a state at every chunk end (128, 256) and at the prompt end
    "sglang-no-buffer": (
        PAIR,
        "sglang",
        dict(mamba_radix_cache_strategy="no_buffer", prefill_chunk_tokens=128),
        [0, 128],
    ),
    # SGLang extra_buffer: one tracked state per extend step of 128 tokens (at 128, 256)
    "sglang-extra-buffer": (PAIR, "sglang", dict(prefill_chunk_tokens=128), [0, 128]),
    # TensorRT-LLM: snapshots every 128 tokens, whatever the chunking
    "trtllm-interval": (PAIR, "trtllm", dict(periodic_snapshot_interval=128), [0, 128]),
    # LMDeploy: a checkpoint at each forward end (128, 256, the prompt end 300)
    "lmdeploy-forward-ends": (PAIR, "lmdeploy", dict(prefill_chunk_tokens=128), [0, 128]),
}


@pytest.mark.parametrize("mode,scheduler", SCHEDULERS, ids=[s for _, s in SCHEDULERS])
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_engine_rule_holds_under_every_scheduler(case, mode, scheduler):
    trace, policy, cfg, want = CASES[case]
    got, _ = run_in(mode, scheduler, trace, policy, **cfg)
    assert got == want


@pytest.mark.parametrize("mode,scheduler", SCHEDULERS, ids=[s for _, s in SCHEDULERS])
def test_vllm_keeps_the_junction_state_without_a_flag(mode, scheduler):
    """The junction request (1) ends a step at 256 and keeps the state there; without it no state
    of this trace lies on the shared part (each prompt's own last full block is 384)."""
    got, sim = run_in(mode, scheduler, shared_then_own(300, 3), "vllm", block_size=64)
    assert got == [0, 0, 256] and 256 in state_depths(sim.tree)
    assert run_in(mode, scheduler, shared_then_own(300, 3), "vllm-0.11-align", block_size=64)[0] == [0, 0, 0]


def prefill_steps(trace, policy, **cfg):
    """Per request, the (start, end) of its prefill chunks under the continuous scheduler."""
    log = EventLog()
    cfg.setdefault("max_num_batched_tokens", cfg.get("prefill_chunk_tokens", 8192))
    config = SimConfig(
        policy=policy, model="qwen3.5-9b", capacity_bytes=10**15, mode="des", scheduler="continuous", **cfg
    )
    drive(build(trace, config, observers=(log,)))
    steps: dict[int, list] = {}
    for ev in log.events:
        for rid, a, b in ev.prefills if isinstance(ev, Step) else ():
            steps.setdefault(int(rid), []).append((a, b))
    return steps


def test_continuous_vllm_cuts_at_the_junction_as_the_engine_does():
    """_mamba_block_aligned_split with an 8192-token budget: request 1 (no hit, junction at 256 of
    400 prompt tokens) runs 0..256 then 256..384 (the last full block) then the tail; request 2
    hits 256 and runs to 384, then the tail."""
    steps = prefill_steps(shared_then_own(300, 3), "vllm", block_size=64)
    assert steps[0] == [(0, 384), (384, 400)]
    assert steps[1] == [(0, 256), (256, 384), (384, 400)]
    assert steps[2] == [(256, 384), (384, 400)]


def test_continuous_trtllm_ends_chunks_at_snapshot_points():
    """prepare_expect_snapshot_points: interval 128 and an end offset of 10 on a 300-token prompt:
    snapshot points 128, 256, 290; the scheduler ends the chunks there."""
    steps = prefill_steps(
        one_per_session((toks(0, 300), toks(9000, 5))),
        "trtllm",
        periodic_snapshot_interval=128,
        additional_snapshot_offsets_from_end="10",
    )
    assert steps[0] == [(0, 128), (128, 256), (256, 290), (290, 300)]


def test_continuous_vllm_realigns_a_block_wider_than_the_budget():
    """vLLM main's split (scheduler.py ``_mamba_block_aligned_split`` at 487ecf187: "a block too
    wide for one chunk advances sub-block and re-aligns at the next boundary"): block 528, 96
    tokens a step: a chunk started mid-block stops at the next block boundary (528), so the state
    there exists (dense retention) and a prompt sharing 600 tokens reuses 528 under every
    scheduler; benchmarks/differential_vllm_split.py checks the whole grid against the engine's
    method (1,420 / 1,420 cases agree)."""
    steps = prefill_steps(
        one_per_session((toks(0, 1056), toks(9000, 5))),
        "vllm",
        block_size=528,
        prefill_chunk_tokens=96,
        prefix_cache_retention_interval=-1,
    )
    assert steps[0] == [
        (a, b)
        for a, b in zip(
            [0, 96, 192, 288, 384, 480, 528, 624, 720, 816, 912, 1008],
            [96, 192, 288, 384, 480, 528, 624, 720, 816, 912, 1008, 1056],
        )
    ]
    pair = one_per_session((toks(0, 1056), toks(9000, 5)), (cat(toks(0, 600), toks(5000, 100)), toks(9100, 5)))
    for mode, scheduler in SCHEDULERS:
        got, _ = run_in(
            mode, scheduler, pair, "vllm", block_size=528, prefill_chunk_tokens=96, prefix_cache_retention_interval=-1
        )
        assert got == [0, 528], scheduler

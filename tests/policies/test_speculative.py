"""``--speculative-tokens K`` (MTP / EAGLE draft length) for ``vllm``, ``sglang`` and ``trtllm``
(issue 43, item 4): which states survive, the extra state slots a running request holds, and the
alignment unit a hit loses, as each engine's code has them.

Sources:
- vllm-project/vllm: ``vllm/v1/core/sched/scheduler.py`` ``_mamba_block_aligned_split`` ("when
  Eagle mode is enabled, FullAttn prunes the last matching block": ``last_cache_position -=
  block_size``) and ``single_type_kv_cache_manager.py``'s EAGLE block drop (every kept state one
  block earlier: the one alignment unit lost per hit of vLLM #54360 / #53670); ``MambaSpec
  (num_speculative_blocks=num_speculative_tokens)`` and ``mamba_utils.preprocess_mamba`` ("copy the
  mamba state of previous step to the last (1 + num_speculative_blocks) block").
- sgl-project/sglang: ``mem_cache/memory_pool.py`` ``MambaPool`` (``intermediate_ssm_state_cache``
  ``[layers, size + 1, speculative_num_draft_tokens, ...]``: K + 1 states per running request with
  top-k 1), ``arg_groups/mamba_hook.py`` (0e009ce0c254) ``validate_mamba_extra_buffer``: ``assert
  mamba_track_interval >= speculative_num_draft_tokens``; placement unchanged (the verify step keeps
  every draft token's state, ``prepare_mamba_track_for_verify``).
- NVIDIA/TensorRT-LLM mamba cache manager ``_promote_mamba_state_triton`` (intermediate buffer
  ``[layers, max_batch_size, T, ...]``, T = max_draft_len + 1; the accepted state is promoted into the
  pool) and ``prepare_expect_snapshot_points`` (snapshots at prompt positions: unchanged).
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from engine_cases import TINY, cat, one_per_session, run, state_depths, toks

from policies.base import PolicyError
from sim.cli import main

SAME = one_per_session(*[(toks(0, 3602), toks(10_000 + 10 * i, 5)) for i in range(2)])
# three turns of one conversation, each sending the whole history back
TURNS = one_per_session(
    (toks(0, 700), toks(5000, 300)),
    (cat(toks(0, 700), toks(5000, 300), toks(9000, 400)), toks(6000, 300)),
    (cat(toks(0, 700), toks(5000, 300), toks(9000, 400), toks(6000, 300), toks(9500, 200)), toks(7000, 50)),
)


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
@pytest.mark.parametrize("k", [1, 3])
def test_vllm_loses_one_block_per_hit_and_says_so(method, k):
    """Block 1600, identical 3,602-token prompts: without speculation the state at 3200 serves the
    second; with EAGLE / MTP it sits one block earlier, so the hit is 1600 and the 1,600 tokens
    between are the speculative miss; the rest is the grid (401) and the lookup cap (1)."""
    got, sim = run(SAME, "vllm", block_size=1600)
    assert got == [0, 3200] and sim.misses.counts["speculative"][1] == 0
    got, sim = run(SAME, "vllm", block_size=1600, speculative_method=method, speculative_tokens=k)
    assert got == [0, 1600] and state_depths(sim.tree) == [1600]
    m = {c: int(v[1]) for c, v in sim.misses.counts.items() if v[1]}
    assert m == {"speculative": 1600, "no_checkpoint": 401, "last_token_rule": 1}


def test_vllm_running_request_holds_num_speculative_blocks_more():
    """1 slot (the running state: one block per Mamba group, a second only in a step that enters
    a new block); under EAGLE / MTP the running state spans 1 + num_speculative_blocks blocks
    (num_speculative_blocks = K; a method without K counts 1)."""
    assert run(SAME, "vllm", block_size=1600)[1].admission.running_state_slots == 1
    assert run(SAME, "vllm", block_size=1600, speculative_method="mtp")[1].admission.running_state_slots == 2
    sim = run(SAME, "vllm", block_size=1600, speculative_method="eagle", speculative_tokens=4)[1]
    assert sim.admission.running_state_slots == 5


def test_vllm_refuses_draft_tokens_without_a_method():
    with pytest.raises(PolicyError, match="--speculative-method"):
        run(SAME, "vllm", block_size=1600, speculative_tokens=2)


@pytest.mark.parametrize(
    "policy,cfg,slots",
    [
        ("sglang", {}, 3),
        ("sglang", {"mamba_radix_cache_strategy": "no_buffer"}, 1),
        ("trtllm", {"periodic_snapshot_interval": 256}, 1),
    ],
)
@pytest.mark.parametrize("scheduler", ["fcfs", "continuous"])
def test_sglang_and_trtllm_keep_their_states_and_hold_k_plus_one_more(policy, cfg, slots, scheduler):
    """The verify step keeps every draft token's state, so the same states survive and every hit
    is the same with K = 3 as without (a follow-up conversation, both schedulers); a running
    request holds K + 1 intermediate states more."""
    kw = dict(mode="des", scheduler=scheduler, **cfg)
    base, sim0 = run(TURNS, policy, **kw)
    spec, sim3 = run(TURNS, policy, speculative_tokens=3, **kw)
    assert spec == base and base[1] > 0 and base[2] > base[1]
    assert sim0.admission.running_state_slots == slots and sim3.admission.running_state_slots == slots + 4
    assert int(sim3.misses.counts["speculative"].sum()) == 0


def test_sglang_refuses_a_track_interval_below_the_draft_tokens():
    """validate_mamba_extra_buffer: mamba_track_interval >= speculative_num_draft_tokens (K + 1)."""
    with pytest.raises(PolicyError, match="must be >= the 8 draft tokens"):
        run(SAME, "sglang", page_size=4, mamba_track_interval=4, speculative_tokens=7)
    run(SAME, "sglang", page_size=4, mamba_track_interval=8, speculative_tokens=7)  # 8 >= 8


def test_the_extra_slots_are_charged_to_the_cache_under_continuous_batching():
    """The tiny model's state is 16 bytes: one running TensorRT-LLM request with K = 3 holds 4
    intermediate states more, 64 bytes more at the peak."""
    one = one_per_session((toks(0, 40), toks(100, 5)))
    kw = dict(spec=TINY, mode="des", scheduler="continuous", periodic_snapshot_interval=16)
    peak0 = run(one, "trtllm", **kw)[1].rec.peak_charged_bytes
    peak3 = run(one, "trtllm", speculative_tokens=3, **kw)[1].rec.peak_charged_bytes
    assert peak3 - peak0 == 4 * TINY.state_bytes() == 64


def test_the_flag_on_the_command_line():
    base = ["run", "--trace", "synthetic:chat", "--sessions", "2", "--model", "qwen3.5-9b", "--no-progress"]
    ok = CliRunner().invoke(main, [*base, "--policy", "sglang,trtllm", "--speculative-tokens", "3"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(main, [*base, "--policy", "vllm", "--speculative-tokens", "3"])
    assert bad.exit_code == 2 and "--speculative-method" in bad.output and "Traceback" not in bad.output
    bad = CliRunner().invoke(main, [*base, "--policy", "marconi", "--speculative-tokens", "3"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output

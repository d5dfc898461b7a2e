"""vLLM presets against vLLM's own tests and issues (``policies/vllm.py``).

Sources: vllm-project/vllm ``tests/v1/core/test_mamba_align_chunk_split.py`` (stored version
09f730d09235), ``vllm/v1/core/sched/scheduler.py::_mamba_block_aligned_split`` (00024d314514),
PR #30877 (decode caching) and issues #40696, #42317.
"""

from __future__ import annotations

from engine_cases import one_per_session, run, state_depths, toks
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import get_preset
from policies.vllm import align_step_ends, vllm_block_tokens
from sim.config import SimConfig
from sim.cost import get_model
from traces.base import Request, Trace


def test_vllm_block_is_the_attention_block_raised_to_the_state_page():
    # Qwen3.5-9B-like: state page 32 x 128 x 128 x 4 + (2*16*128 + 32*128) x 3 x 2 = 2,146,304 B;
    # attention page per token 2 x 4 x 256 x 2 = 4,096 B -> 524 tokens -> 16 x 33 = 528
    assert vllm_block_tokens(get_model("qwen3.5-9b")) == 528
    assert vllm_block_tokens(get_model("qwen3-next-80b-a3b")) == 1056  # 2 KV heads: 1,048 -> 1,056
    assert vllm_block_tokens(get_model("llama-7b")) == 16  # no state: the attention block
    cfg = SimConfig(policy="vllm-align", model="qwen3.5-9b")
    assert get_preset("vllm-align").grid_for(get_model("qwen3.5-9b"), cfg) == 528
    cfg.block_size = 64
    assert get_preset("vllm-all").grid_for(get_model("qwen3.5-9b"), cfg) == 64


def test_disabling_eagle_block_drop_keeps_the_trailing_cache_boundary():
    """vLLM test_mamba_align_chunk_split.py::test_disabling_eagle_block_drop_keeps_the_trailing_cache_boundary:
    block 1600, a 3,602-token prompt scheduled whole: the first step is cut at 2 x 1600 = 3200
    (``last = n - n % B``), so its state is kept; the 402-token tail keeps none."""
    assert align_step_ends(0, 3602, 1600, 16384) == [3200, 3602]
    # the repeat reuses 3200 (block 1600's state was never taken: one step ran through it)
    same = [(toks(0, 3602), toks(10_000 + 10 * i, 5)) for i in range(2)]
    got, sim = run(one_per_session(*same), "vllm-align", block_size=1600)
    assert got == [0, 3200] and state_depths(sim.tree) == [3200]


@settings(max_examples=200, deadline=None)
@given(
    B=st.sampled_from([16, 528, 1600]),
    hit_blocks=st.integers(0, 4),
    n=st.integers(1, 9000),
    budget=st.integers(1, 5000),
)
def test_intermediate_chunk_ends_stay_block_aligned(B, hit_blocks, n, budget):
    """vLLM test_mamba_align_chunk_split.py::test_intermediate_chunk_ends_stay_block_aligned (and
    test_unaligned_resume_never_runs_past_its_block's grid rule): every non-final prefill step
    ends on the block grid, the prompt's last full block is always a step end, the last step
    ends at the prompt end."""
    hit = min(hit_blocks * B, (n - 1) // B * B)
    ends = align_step_ends(hit, n, B, budget)
    assert ends[-1] == n and ends == sorted(set(ends))
    assert all(e % B == 0 for e in ends[:-1] if e <= n - n % B)
    last = n - n % B
    if last > hit:
        assert last in ends
    assert all(b - a <= max(budget, B) for a, b in zip([hit] + ends, ends))


def test_block_528_prompt_of_979_tokens_reuses_its_first_block():
    # vLLM #40696 (Qwen3.5-4B, block 528): "prompts under 528 get 0 % hits, a 979-token prompt
    # about 54 %": the prefill is cut at 528 (its last full block): 528 / 979 = 54 %
    same = [(toks(0, 979), toks(10_000 + 10 * i, 5)) for i in range(3)]
    got, sim = run(one_per_session(*same), "vllm-align")
    assert got == [0, 528, 528] and state_depths(sim.tree) == [528]
    assert run(one_per_session(*same), "vllm-all")[0] == [0, 528, 528]
    short = [(toks(0, 500), toks(10_000 + 10 * i, 5)) for i in range(3)]
    for policy in ("vllm-align", "vllm-all"):
        got, sim = run(one_per_session(*short), policy)
        assert got == [0, 0, 0] and sim.grid == 528 and sim.tree.n_states == 0, policy


def _two_turns():
    # turn 1: 1,000-token prompt + 100 output; turn 2: turn 1 + its output + 500 new tokens
    t1 = Request(session_id=0, turn=0, input_tokens=toks(0, 1000), output_tokens=toks(1000, 100))
    t2 = Request(session_id=0, turn=1, input_tokens=toks(0, 1600), output_tokens=toks(5000, 10), think_time=1.0)
    return Trace("two-turns", [t1, t2])


def test_vllm_align_keeps_the_prompts_last_block_and_the_blocks_decode_crosses():
    # vLLM #42317 ("0 % at concurrency 1") is about intermediate states: an unchunked prompt has
    # none, but it keeps the state at its last full block. Turn 1 (1000 tokens, block 528):
    # one step cut at 528, then the tail; decode 1000 -> 1100 crosses 1056 (PR #30877 decode
    # caching). Turn 2 reuses 1056 (its input holds turn 1's output), cuts at 1584 = 3 x 528.
    got, sim = run(_two_turns(), "vllm-align")
    assert got == [0, 1056] and state_depths(sim.tree) == [528, 1056, 1584]
    # chunked at 528 tokens the same states appear (every step ends on the grid)
    got, sim = run(_two_turns(), "vllm-align", prefill_chunk_tokens=528)
    assert got == [0, 1056] and state_depths(sim.tree) == [528, 1056, 1584]
    # vllm-all: every block boundary of the prompt and of decode, the same ones here
    got, sim = run(_two_turns(), "vllm-all")
    assert got == [0, 1056] and state_depths(sim.tree) == [528, 1056, 1584]


def test_decode_capture_serves_a_follow_up_turn():
    # PR #30877: a 600-token prompt (state at 528) decodes 500 tokens across 1056; a prompt that
    # continues the whole conversation reuses 1056, not just 528
    r0 = (toks(0, 600), toks(600, 500))
    r1 = (toks(0, 1300), toks(9000, 5))
    got, sim = run(one_per_session(r0, r1), "vllm-align")
    assert got == [0, 1056]
    assert 1056 in state_depths(sim.tree)


def test_vllm_block_aligned_repeat_hits_one_block_short():
    # a 1,056-token prompt (2 blocks) ends on a boundary -> one step, a state at block 2; a repeat
    # may reuse at most 1,055 tokens (one token is recomputed) -> block 1, which has no state -> 0
    same = [(toks(0, 1056), toks(10_000 + 10 * i, 5)) for i in range(2)]
    got, sim = run(one_per_session(*same), "vllm-align")
    assert got == [0, 0] and state_depths(sim.tree) == [1056]


def test_only_whole_blocks_are_cached():
    # 1,100 tokens of input + output at block 528: two whole blocks (1,056 tokens) of KV, the
    # 44-token tail is not cached
    got, sim = run(one_per_session((toks(0, 1000), toks(1000, 100))), "vllm-align")
    assert sim.tree.kv_tokens == 1056


# ---- the admission lists on hand-counted cases (each line guards one boundary) ----------------
from types import SimpleNamespace  # noqa: E402

from policies.base import ADMISSION, AdmissionContext  # noqa: E402
from policies.vllm import decode_boundaries  # noqa: E402


def _ctx(n_input, n_full, B, input_tokens=-1):
    return AdmissionContext(n_input=n_input, n_full=n_full, block_tokens=B, input_tokens=input_tokens)


def test_decode_boundaries_are_the_blocks_decode_completes():
    # a 100-token prompt on 16-token blocks is 6 full blocks + 4 tokens: decode crosses boundaries
    # 7, 8, ... up to the last full block of input + output (block 7 is the first decode completes)
    assert decode_boundaries(_ctx(7, 9, 16, input_tokens=100)) == [7, 8, 9]
    assert decode_boundaries(_ctx(7, 7, 16, input_tokens=100)) == [7]  # exactly one block completed
    assert decode_boundaries(_ctx(7, 6, 16, input_tokens=100)) == []  # decode completes no block
    # a prompt ending on a boundary: its own block is prefill's, decode starts with the next one
    assert decode_boundaries(_ctx(4, 6, 16, input_tokens=64)) == [5, 6]


def test_align_prefill_states_from_a_hit_and_at_a_prompt_ending_on_a_block():
    align = ADMISSION["vllm-align"]
    pol = align(align.Params(prefill_chunk_tokens=10_000))
    # hit at block 2 of 16 tokens; a 64-token prompt (4 whole blocks) prefilled in one step: the
    # state at its end (block 4) is kept, since it lies on the grid
    assert pol.prefill_checkpoints(SimpleNamespace(hit_sym=2, match_sym=2), _ctx(4, 5, 16)) == [4]
    # 70 tokens: the step is cut at the last full block (64 = block 4); the 6-token tail keeps none
    assert pol.prefill_checkpoints(SimpleNamespace(hit_sym=2, match_sym=2), _ctx(5, 5, 16, 70)) == [4]
    # budget 32 from a hit at block 1 (16 tokens): steps end at 48, 64 (blocks 3 and 4)
    pol = align(align.Params(prefill_chunk_tokens=32))
    assert pol.prefill_checkpoints(SimpleNamespace(hit_sym=1, match_sym=1), _ctx(4, 4, 16)) == [3, 4]
    assert align_step_ends(16, 64, 16, 32) == [48, 64]
    assert align_step_ends(0, 70, 16, 32) == [32, 64, 70]


def test_all_mode_keeps_every_block_after_the_hit():
    pol = ADMISSION["vllm-all"]()
    assert pol.prefill_checkpoints(SimpleNamespace(hit_sym=2, match_sym=2), _ctx(5, 7, 16)) == [3, 4, 5]
    assert pol.prefill_checkpoints(SimpleNamespace(hit_sym=0, match_sym=0), _ctx(2, 2, 16)) == [1, 2]
    assert pol.decode_checkpoints(SimpleNamespace(hit_sym=0, match_sym=0), _ctx(2, 4, 16)) == [3, 4]


def test_scheduled_chunks_follow_the_block_grid_and_stop_at_the_prompt_end():
    """``_mamba_block_aligned_split`` under a batching scheduler, on 16-token blocks and a
    100-token prompt (its last full block ends at 96): a step before 96 is a whole number of
    blocks; a budget under one block waits (0) unless the whole step budget is under a block; a
    step crossing 96 is cut there; from 96 on, the step is the tail that is left, however large
    the budget."""
    pol = ADMISSION["vllm-align"]()
    ctx = _ctx(7, 7, 16, input_tokens=100)
    assert pol.schedule_chunk(0, 100, 40, 64, ctx) == 32  # 40 -> two whole blocks
    assert pol.schedule_chunk(32, 100, 64, 64, ctx) == 64  # ends exactly at 96
    assert pol.schedule_chunk(32, 100, 10, 64, ctx) == 0  # 10 tokens left of 64: wait
    assert pol.schedule_chunk(32, 100, 10, 10, ctx) == 10  # a 10-token step budget: run 10
    assert pol.schedule_chunk(80, 100, 64, 64, ctx) == 16  # cut at the last full block
    assert pol.schedule_chunk(96, 100, 64, 64, ctx) == 4  # the 4-token tail, not the budget
    assert pol.schedule_chunk(96, 100, 3, 64, ctx) == 3  # a tail step takes what the budget has
    # today's vllm preset schedules the same way
    assert ADMISSION["vllm"]().schedule_chunk(96, 100, 64, 64, ctx) == 4

"""Today's engine presets (``sglang``, ``vllm``, ``trtllm``, ``lmdeploy``): the engines' knobs, the
last-token rule, and the behaviours their trackers report, each worked by hand on a tiny trace.

Sources (each test names its own): sgl-project/sglang
``python/sglang/srt/mem_cache/unified_cache_components/mamba_component.py`` (008c2fbbb588),
``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py`` (226149ac457b),
``test/registered/unit/mem_cache/test_mamba_unittest.py`` (54ac12ace81e); vllm-project/vllm
``tests/v1/core/test_mamba_align_retention_grid.py`` (9ab07979812c),
``tests/v1/core/test_mamba_align_chunk_split.py`` (09f730d09235), issues #40696, #45238, PR #37898;
NVIDIA/TensorRT-LLM PR #16598 (``mamba_state_config.periodic_snapshot_interval``,
``additional_snapshot_offsets_from_start`` / ``_from_end``) and
``tests/unittest/_torch/executor/test_mamba_cache_manager.py``;
InternLM/lmdeploy v0.16.0 (1263d5cd8) ``tests/pytorch/paging/test_block_trie/``.

Sequential mode: request i is its own session at t = i (``engine_cases``).
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from engine_cases import cat, one_per_session, run, state_depths, toks
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import ALIASES, PRESETS, PolicyError, get_preset
from policies.trtllm_current import snapshot_offsets, snapshot_points
from sim.cli import main
from sim.config import SimConfig
from sim.cost import get_model
from sim.errors import UsageError

CURRENT = ("sglang", "vllm", "trtllm", "lmdeploy")


# ---------------------------------------------------------------------------------- the last-token rule


@settings(max_examples=40, deadline=None)
@given(n_in=st.integers(2, 300), n_out=st.integers(1, 300))
def test_a_finished_request_stores_input_plus_output_minus_one(n_in, n_out):
    """Every engine stores input + output - 1 tokens (issue 19): the last sampled token is never
    run through the model. SGLang no_buffer keeps all KV and a state at the request end, so both
    show it exactly; the paper's rule (sglang+) keeps input + output."""
    trace = one_per_session((toks(0, n_in), toks(10_000, n_out)))
    _, sim = run(trace, "sglang", mamba_radix_cache_strategy="no_buffer")
    assert sim.tree.kv_tokens == n_in + n_out - 1 and max(state_depths(sim.tree)) == n_in + n_out - 1
    _, paper = run(trace, "sglang+")
    assert paper.tree.kv_tokens == n_in + n_out


def test_every_current_preset_follows_the_engine_rule_and_every_earlier_one_keeps_the_projects():
    for name, preset in PRESETS.items():
        if name in CURRENT:
            assert not preset.stores_last_token, name
        elif preset.engine in ("paper", "bound", "baseline") or name in ALIASES.values():
            assert preset.stores_last_token, name  # golden outputs and old results unchanged


def test_a_follow_up_turn_hits_one_token_short_of_the_old_rule():
    """SGLang no_buffer, X = 10 prompt tokens, Y = 5 output tokens; the next turn sends X + Y + Z.
    The engine stored 14 tokens (state at 14), so the follow-up reuses 14; the earlier preset
    (input + output stored) reused 15."""
    trace = one_per_session((toks(0, 10), toks(10, 5)), (cat(toks(0, 15), toks(500, 4)), toks(100, 5)))
    got, sim = run(trace, "sglang", mamba_radix_cache_strategy="no_buffer")
    assert got == [0, 14] and state_depths(sim.tree)[:2] == [10, 14]
    assert run(trace, "sglang-v1")[0] == [0, 15]


def test_identical_prompt_with_the_last_token_rule_21158():
    """SGLang #21158 under today's no_buffer: an identical 10-token prompt sent twice reuses
    nothing (the lookup stops at 9 tokens, the only states are at 10 and 14), the engine's
    reported 0 % for identical prompts."""
    trace = one_per_session((toks(0, 10), toks(10, 5)), (toks(0, 10), toks(100, 5)))
    assert run(trace, "sglang", mamba_radix_cache_strategy="no_buffer")[0] == [0, 0]


# ---------------------------------------------------------------------------------- SGLang


def test_sglang_auto_is_extra_buffer_and_tracks_decode_on_the_interval():
    """``auto`` resolves to extra_buffer (#30127, #39430). r0: 300 prompt tokens, 212 output
    tokens: the prefill track is 256 (300 rounded down to mamba_cache_chunk_size 64); the engine
    stored 511 tokens, so the 256-token decode grid reaches no new track (the earlier preset
    stored 512 and tracked 512). r1 (600 tokens, sharing 512) reuses 256, not 512."""
    trace = one_per_session((toks(0, 300), toks(300, 212)), (cat(toks(0, 512), toks(900, 88)), toks(2000, 3)))
    got, sim = run(trace, "sglang")
    assert got == [0, 256] and state_depths(sim.tree)[0] == 256
    assert run(trace, "sglang", mamba_radix_cache_strategy="extra_buffer")[0] == [0, 256]
    assert run(trace, "sglang", mamba_radix_cache_strategy="extra_buffer_lazy")[0] == [0, 256]
    assert run(trace, "sglang-v2")[0] == [0, 512]
    # a 128-token track interval: the decode track at 384 (511 // 128 x 128) now exists
    assert run(trace, "sglang", mamba_track_interval=128)[0] == [0, 384]


def test_sglang_page_size_sets_the_grid_and_the_capture_chunk():
    """``--page-size 128``: the radix tree matches whole pages and mamba_cache_chunk_size =
    max(64, page) = 128, so a 200-token prompt is tracked at 128 (page 1: 192)."""
    trace = one_per_session((toks(0, 200), toks(1000, 5)), (toks(0, 200), toks(2000, 5)))
    assert run(trace, "sglang")[0] == [0, 192]
    got, sim = run(trace, "sglang", page_size=128)
    assert got == [0, 128] and sim.grid == 128


def test_sglang_memory_split_follows_the_engine():
    """model_runner_kv_cache_mixin.py (226149ac457b): with --max-mamba-cache-size unset the mamba
    pool gets rest x ratio / (1 + ratio) and int(that // per-request state bytes) states.
    Qwen3.5-9B: 51,511,296 B a state; 10 GB at 0.9 -> 4.737 GB -> 91 states; KV gets the rest."""
    trace = one_per_session((toks(0, 50), toks(100, 5)))
    state = get_model("qwen3.5-9b").state_bytes()
    _, sim = run(trace, "sglang", gpu_memory="10GB")
    assert sim.tree.state_capacity == 91 == int(10e9 * 0.9 / 1.9 // state)
    assert sim.tree.capacity_bytes == 10**10 and sim.tree.kv_capacity_bytes == 10**10 - 91 * state
    _, sim = run(trace, "sglang", gpu_memory="10GB", mamba_full_memory_ratio=0.5)
    assert sim.tree.state_capacity == int(10e9 * 0.5 / 1.5 // state) == 64
    _, sim = run(trace, "sglang", max_mamba_cache_size=7)
    assert sim.tree.state_capacity == 7
    _, sim = run(trace, "sglang", max_mamba_cache_size=1)  # the smallest pool is a pool too
    assert sim.tree.state_capacity == 1
    _, sim = run(trace, "sglang")
    assert sim.tree.state_capacity is None  # no knob: one budget, as before


@pytest.mark.parametrize(
    ("knobs", "words"),
    [
        ({"mamba_radix_cache_strategy": "no_buffer", "page_size": 2}, "--page-size 1"),
        ({"page_size": 64, "mamba_track_interval": 100}, "multiple of --page-size"),
        ({"mamba_full_memory_ratio": 0.5}, "--gpu-memory"),
        ({"max_mamba_cache_size": 8, "state_pool": "8"}, "give one"),
        ({"mamba_radix_cache_strategy": "no_buffer", "mamba_track_interval": 512}, "extra_buffer only"),
    ],
)
def test_sglang_refuses_combinations_the_engine_cannot_run(knobs, words):
    trace = one_per_session((toks(0, 50), toks(100, 5)))
    with pytest.raises(PolicyError, match=words):
        run(trace, "sglang", **knobs)


def test_sglang_refresh_is_the_consumed_state_with_a_kv_path():
    """mamba_component.py ``refresh_lru`` (008c2fbbb588): MATCH_END refreshes only the consumed
    mamba state; the full component refreshes the matched path. Same rule as sglang-v1."""
    rules = get_preset("sglang").engine_rules(get_model("qwen3.5-9b"), SimConfig(policy="sglang"))
    assert rules.refresh == get_preset("sglang-v1").engine_rules(None, None).refresh
    assert (rules.refresh.hit, rules.refresh.state) == ("to-hit", "consumed")
    assert rules.kv_extent == "state"  # extra_buffer inserts key[:mamba_last_track_seqlen]


# ---------------------------------------------------------------------------------- vLLM


def test_vllm_528_token_cliff_40696():
    """vLLM #40696 (Qwen3.5-4B; the 9B preset has the same 528-token block): prompts under 528
    tokens never hit, a repeated 979-token prompt hits 528 (54 %)."""
    trace = one_per_session(
        (toks(0, 500), toks(9000, 5)),
        (toks(0, 500), toks(9100, 5)),
        (toks(0, 979), toks(9200, 5)),
        (toks(0, 979), toks(9300, 5)),
    )
    got, sim = run(trace, "vllm")
    assert sim.grid == 528 and got == [0, 0, 0, 528]


@pytest.mark.parametrize(
    ("interval", "kept"),
    [
        (4800, [4800, 9600]),  # the grid: blocks 2, 5 (states at 4800, 9600)
        (0, [9600]),  # semantic only: the prompt's last full block
        (-1, [1600, 3200, 4800, 6400, 8000, 9600]),  # None: every step end kept
    ],
)
def test_vllm_retention_grid(interval, kept):
    """vLLM test_mamba_align_retention_grid.py (9ab07979812c): block 1600, interval 3 x 1600;
    one block per scheduled step. test_grid_blocks_survive_relocation: only grid blocks are kept;
    -1 stands for retention_interval None (the dense mask)."""
    trace = one_per_session((toks(0, 9700), toks(20_000, 5)))
    _, sim = run(trace, "vllm", block_size=1600, prefill_chunk_tokens=1600, prefix_cache_retention_interval=interval)
    assert state_depths(sim.tree) == kept


@pytest.mark.parametrize(
    ("interval", "n_out", "kept"),
    [
        (0, 300, [64]),  # no decode state: the mask keeps only the prompt's replay boundary
        (128, 300, [64, 128, 256, 384]),
        (128, 250, [64, 128, 256]),  # the newest boundary (320) is off the grid: not kept
        (-1, 300, [64, 128, 192, 256, 320, 384]),
        # 385 tokens, 384 stored (the engine stores one token less): the last stored token ends
        # block 6, whose state is kept; one token fewer (383 stored) ends inside it
        (-1, 285, [64, 128, 192, 256, 320, 384]),
        (-1, 284, [64, 128, 192, 256, 320]),
    ],
)
def test_vllm_retention_keeps_no_decode_state_off_the_grid(interval, n_out, kept):
    """vLLM 0.34.0 ``vllm/v1/core/kv_cache_coordinator.py`` L65-L88 (``replay_boundaries``: the
    reachable boundaries are ``num_prompt_tokens - 1`` only, with the junction added in
    ``single_type_kv_cache_manager.py`` L516) and ``MambaManager.reachable_block_mask``
    (``single_type_kv_cache_manager.py`` L1554-L1612): under retention a decode block boundary is
    kept only on the retention grid; the rolling newest boundary the preset kept before (from
    test_mamba_align_retention_grid.py at 9ab07979812c) is not in the engine's code. Block 64, a
    100-token prompt (its state at 64): the engine, driven by ``benchmarks/differential_vllm.py``'s
    ``Engine``, keeps exactly these states."""
    trace = one_per_session((toks(0, 100), toks(5000, n_out)))
    _, sim = run(trace, "vllm", block_size=64, prefix_cache_retention_interval=interval)
    assert state_depths(sim.tree) == kept


@pytest.mark.parametrize(("interval", "hits"), [(0, [0, 528, 528]), (-1, [0, 528, 1056])])
def test_vllm_prompt_of_whole_blocks_keeps_its_state_one_block_short(interval, hits):
    """vLLM 0.34.0 ``get_mamba_prefill_checkpoint_position`` (``vllm/v1/kv_cache_interface.py``
    L1203-L1220; ``Scheduler._mamba_block_aligned_split``, ``scheduler.py`` L596-L600): the last
    cacheable prompt state is ``(n - 1) // B * B``, so a 1,056-token prompt (two 528-token blocks)
    runs [528, 1056] and, under retention 0, keeps the state at 528, not at 1056 (the replay
    boundary ``n - 1`` floors to 528). A resend hits 528; a 1,156-token extension hits 528 too
    (1056 with every state kept). The engine gives the same hits (``differential_vllm.py``)."""
    trace = one_per_session(
        (toks(0, 1056), toks(9000, 5)),
        (toks(0, 1056), toks(9100, 5)),
        (toks(0, 1156), toks(9200, 5)),
    )
    got, sim = run(trace, "vllm", prefix_cache_retention_interval=interval)
    assert sim.grid == 528 and got == hits


def test_vllm_retention_interval_is_a_multiple_of_the_block():
    """``kv_cache_coordinator.py`` L33-L62 (``_validate_prefix_cache_retention_interval``): vLLM
    refuses an interval that is not a multiple of the scheduler block."""
    trace = one_per_session((toks(0, 50), toks(100, 5)))
    with pytest.raises(PolicyError, match="multiple of the 64-token block"):
        run(trace, "vllm", block_size=64, prefix_cache_retention_interval=100)


def test_vllm_junction_checkpoint_45238():
    """PR #37898 on #45238's workload shape: prompts share 300 tokens, then differ. Block 64: the
    single state of each prompt (384) lies in its own tokens; vLLM main detects the shared prefix
    (``get_computed_blocks``' ``shared_prefix_boundary``, kv_cache_manager.py L286-L292, no flag),
    so the second request ends a prefill step at the shared part's last block boundary (256) and
    keeps that state, and the third reuses it. vLLM 0.11 (before #37898) never reuses anything
    here. ``--enable-mamba-shared-prefix-checkpoint`` is the EAGLE sub-block junction (renamed from
    ``--enable-mamba-fine-grained-prefix-cache`` in #57382), which the simulator does not model."""
    trace = one_per_session(
        *[(cat(toks(0, 300), toks(1000 * (i + 1), 100)), toks(50_000 + 10 * i, 5)) for i in range(3)]
    )
    assert run(trace, "vllm-0.11-align", block_size=64)[0] == [0, 0, 0]
    got, sim = run(trace, "vllm", block_size=64)
    assert got == [0, 0, 256] and 256 in state_depths(sim.tree)
    with pytest.raises(PolicyError, match="not modelled"):
        run(trace, "vllm", block_size=64, enable_mamba_shared_prefix_checkpoint=True)


def test_vllm_eagle_drops_one_block():
    """test_mamba_align_chunk_split.py::test_disabling_eagle_block_drop_keeps_the_trailing_cache_boundary
    (09f730d09235) both ways: block 1600, a 3,602-token prompt. Without a draft model the state
    at 3200 is kept and reused; with EAGLE (or MTP) the kept state is one block earlier."""
    same = one_per_session(*[(toks(0, 3602), toks(10_000 + 10 * i, 5)) for i in range(2)])
    got, sim = run(same, "vllm", block_size=1600)
    assert got == [0, 3200] and state_depths(sim.tree) == [3200]
    for method in ("eagle", "mtp"):
        got, sim = run(same, "vllm", block_size=1600, speculative_method=method)
        assert got == [0, 1600] and state_depths(sim.tree) == [1600], method


def test_vllm_refuses_meaningless_knobs():
    trace = one_per_session((toks(0, 50), toks(100, 5)))
    with pytest.raises(UsageError, match="--prefix-cache-retention-interval"):
        run(trace, "vllm", prefix_cache_retention_interval=-2)
    with pytest.raises(PolicyError, match="no effect"):
        run(trace, "vllm", speculative_method="eagle", prefix_cache_retention_interval=4096)
    with pytest.raises(PolicyError, match="hybrid"):
        run(trace, "vllm", model="llama-7b", enable_mamba_shared_prefix_checkpoint=True)
    with pytest.raises(UsageError, match="1 to 4096"):
        run(trace, "vllm", block_size=8320)  # NemotronH's block (#48401): more than the simulator hashes


# ---------------------------------------------------------------------------------- TensorRT-LLM


def test_trtllm_without_a_snapshot_policy_reuses_nothing():
    """TensorRT-LLM's V2 manager: a hybrid model with block reuse on and no snapshot policy gets
    reuse disabled (0 % hits by configuration)."""
    trace = one_per_session((toks(0, 600), toks(600, 10)), (toks(0, 600), toks(700, 10)))
    got, sim = run(trace, "trtllm")
    assert got == [0, 0] and state_depths(sim.tree) == []


def test_trtllm_periodic_snapshots():
    """periodic_snapshot_interval 256: snapshots at 256 and 512 in the prompt and none in decode
    (``try_commit_blocks`` stops committing when the context ends, ``mamba_cache_manager_v2.py``
    at 28295084972c), so a 1,100-token follow-up of a 600 + 500 turn reuses 512, not 1024."""
    trace = one_per_session((toks(0, 600), toks(600, 500)), (toks(0, 1100), toks(5000, 3)))
    got, sim = run(trace, "trtllm", periodic_snapshot_interval=256)
    assert got == [0, 512] and state_depths(sim.tree) == [256, 512, 768, 1024]  # r1's own 768, 1024


def test_trtllm_snapshot_points_port_the_engines_test():
    """Ported from TensorRT-LLM's ``tests/unittest/_torch/executor/test_mamba_cache_manager.py``
    ``test_v2_hybrid_prepare_expect_snapshot_points``: interval 64, offsets from the start [128,
    999], from the end [0, 22, 999]; prompts of 150, 128 and 32 tokens. Periodic and fixed points
    are one union; an offset beyond the prompt (999) is ignored, end offset 0 is the prompt end."""
    got = [snapshot_points(n, 64, (128, 999), (0, 22, 999)) for n in (150, 128, 32)]
    assert got == [[64, 128, 150], [64, 106, 128], [10, 32]]
    # ``..._without_periodic_snapshots``: interval 0, start [128], end [0, 13], a 150-token prompt
    assert snapshot_points(150, 0, (128,), (0, 13)) == [128, 137, 150]


def test_trtllm_fixed_offsets_place_the_engines_points_in_the_tree():
    """The same case through the simulator: a 150-token prompt holds states at 64, 128 and 150.
    The 128- and 32-token prompts of the engine's test snapshot at [64, 106, 128] and [10, 32],
    but the tree keeps one recurrent page per 32-token block, the deepest
    (``_block_radix_tree.py`` ``Block.can_replace_page``, L462-L474 of the stored version
    065ff9e9; ``kvCache.cpp`` ``_snapshotSsmToTreeBlock`` replaces a shallower page): 106 and 128
    share the block (96, 128], 10 and 32 the block (0, 32], so [64, 128] and [32] remain (found
    by ``benchmarks/differential_trtllm.py``)."""
    offsets = {
        "periodic_snapshot_interval": 64,
        "additional_snapshot_offsets_from_start": "128,999",
        "additional_snapshot_offsets_from_end": "0,22,999",
    }
    for n, want in ((150, [64, 128, 150]), (128, [64, 128]), (32, [32])):
        _, sim = run(one_per_session((toks(0, n), toks(5000, 1))), "trtllm", **offsets)
        assert state_depths(sim.tree) == want, n


def test_trtllm_unaligned_end_offset_is_the_only_reuse_point():
    """Ported from ``test_v2_block_reuse_commit_saves_ssm_snapshot_at_snapshot_point``: end offset
    13 on a 150-token prompt commits at 137 (not a multiple of the 32-token block: no alignment is
    required) and nothing past it, so the prompt end holds no state; a follow-up that extends the
    prompt reuses 137 tokens."""
    trace = one_per_session((toks(0, 150), toks(5000, 5)), (cat(toks(0, 150), toks(900, 40)), toks(6000, 3)))
    got, sim = run(trace, "trtllm", additional_snapshot_offsets_from_end="13")
    assert got == [0, 137]
    assert state_depths(sim.tree) == [137, 177]  # r1: 190 - 13; its 137 was the hit, not stored again


def test_trtllm_commits_nothing_past_the_last_snapshot_point():
    """Ported from TensorRT-LLM's ``tests/unittest/_torch/executor/test_mamba_cache_manager.py``
    ``test_v2_block_reuse_commit_saves_ssm_snapshot_at_snapshot_point`` (newest stored version):
    ``try_commit_blocks`` commits ``token_ids[:137]`` at the point 137 of a 150-token prompt and,
    when the context ends at 150, only stops committing ("The remaining suffix advances request
    history but must not publish a second attention/SSM snapshot beyond the configured
    boundary"). So 137 tokens of KV and one state at 137 remain, none of the prompt's last 13
    tokens nor of the 40-token answer."""
    trace = one_per_session((toks(0, 150), toks(5000, 40)))
    _, sim = run(trace, "trtllm", additional_snapshot_offsets_from_end="13")
    assert sim.tree.kv_tokens == 137 and state_depths(sim.tree) == [137]


def test_trtllm_fixed_offsets_hits_by_hand():
    """Offsets from the start [300], from the end [0, 100]; no interval (the engine's default).
    r0 (1,000-token prompt): states at 300, 900 (1000 - 100) and 1000 (the prompt end); none in
    decode. r1 sends the same 1,000 tokens: the lookup stops at 999, so it reuses 900 and adds
    nothing (its points above 900 are 1000, held). r2 extends the prompt to 1,050 tokens: it reuses
    the prompt-end state at 1000 and snapshots 1050 only (950 lies below its hit). r3 shares 500
    tokens: it reuses 300 and snapshots 500 (600 - 100) and 600."""
    trace = one_per_session(
        (toks(0, 1000), toks(5000, 10)),
        (toks(0, 1000), toks(6000, 10)),
        (cat(toks(0, 1000), toks(7000, 50)), toks(8000, 10)),
        (cat(toks(0, 500), toks(9000, 100)), toks(9500, 10)),
    )
    got, sim = run(
        trace, "trtllm", additional_snapshot_offsets_from_start="300", additional_snapshot_offsets_from_end="0,100"
    )
    assert got == [0, 900, 1000, 300]
    assert state_depths(sim.tree) == [300, 500, 600, 900, 1000, 1050]


def test_trtllm_fixed_offsets_combine_with_the_interval():
    """Interval 256 and a start offset 100: r0 (600 prompt, 500 output) holds 100, 256 and 512,
    all from the prompt (no decode states); a 1,100-token follow-up reuses 512 and snapshots its
    own 768 and 1024, a 200-token one reuses 100."""
    trace = one_per_session(
        (toks(0, 600), toks(600, 500)),
        (toks(0, 1100), toks(5000, 3)),
        (cat(toks(0, 200), toks(9000, 20)), toks(9500, 3)),
    )
    got, sim = run(trace, "trtllm", periodic_snapshot_interval=256, additional_snapshot_offsets_from_start="100")
    assert got == [0, 512, 100]
    assert state_depths(sim.tree) == [100, 256, 512, 768, 1024]


def test_trtllm_offsets_outside_the_prompt_are_ignored():
    """A start offset beyond the prompt and an end offset equal to its length (point 0) place
    nothing, as the engine ignores them: no state, no hit."""
    trace = one_per_session((toks(0, 600), toks(600, 10)), (toks(0, 700), toks(900, 10)))
    got, sim = run(
        trace, "trtllm", additional_snapshot_offsets_from_start="5000", additional_snapshot_offsets_from_end="600,5000"
    )
    assert got == [0, 0] and state_depths(sim.tree)[:1] == [100]  # r1: 700 - 600 = 100, its own


def test_trtllm_a_deeper_snapshot_replaces_a_shallower_one_in_its_block():
    """One recurrent page per 32-token radix-tree block, the deepest (TensorRT-LLM
    ``tensorrt_llm/runtime/kv_cache_manager_v2/_block_radix_tree.py``, stored version 065ff9e9:
    ``Block.__init__`` L405-L450 replaces a covered partial sibling and adopts its pages,
    ``can_replace_page`` L462-L474 keeps the larger token count; ``kvCache.cpp``
    ``_snapshotSsmToTreeBlock`` installs only a deeper page). End offset 0: r0's prompt end 140
    and r1's 150 share the block (128, 160] on one path, so r1 (hit 140) replaces 140 by 150; r2
    leaves that path at 145, inside the block, and finds no snapshot it covers: 0, where a state
    at 140 would have given 140. Checked against the engine's own tree with
    ``benchmarks/differential_trtllm.py``'s harness: [0, 140, 0]."""
    A = toks(0, 200)
    trace = one_per_session(
        (A[:140], toks(9000, 3)), (A[:150], toks(9010, 3)), (cat(A[:145], toks(5000, 55)), toks(9020, 3))
    )
    got, sim = run(trace, "trtllm", additional_snapshot_offsets_from_end="0")
    assert got == [0, 140, 0]
    assert state_depths(sim.tree) == [150, 200]


def test_trtllm_a_shallower_snapshot_is_not_kept_under_a_deeper_one():
    """The other direction (``kvCache.cpp`` ``_snapshotPartialBlockToTree``: a partial block
    covered by a longer sibling attaches its state there, and ``_snapshotSsmToTreeBlock`` returns
    when that block's page covers as much): r0 snapshots 150; r1's prompt is r0's first 140
    tokens, its prompt end 140 lies in the same block under 150 and is not kept, so r2, which
    shares exactly those 140 tokens, reuses nothing (engine: [0, 0, 0])."""
    A = toks(0, 200)
    trace = one_per_session(
        (A[:150], toks(9000, 3)), (A[:140], toks(9010, 3)), (cat(A[:140], toks(5000, 40)), toks(9020, 3))
    )
    got, sim = run(trace, "trtllm", additional_snapshot_offsets_from_end="0")
    assert got == [0, 0, 0]
    assert state_depths(sim.tree) == [150, 180]


def test_trtllm_partial_block_match_stops_at_32_children():
    """A snapshot inside a block the request does not match whole is found by the partial match,
    which TensorRT-LLM skips under a block with 32 children or more
    (``_block_radix_tree.py`` ``find_best_partial_match_in_next_nodes``, L291-L310 of the stored
    version 065ff9e9: ``if len(block.next) >= 32: return None, 0``, TODO TRTLLM-7784). 34
    prompts share their first 20 tokens (a start offset 20 snapshots there, inside the first
    block) and then differ; each keeps its own first block, so the 33rd and 34th find 32 and 33
    children at the root and miss (engine: the same hits)."""
    prompts = [cat(toks(0, 20), toks(1000 + 100 * k, 80)) for k in range(34)]
    trace = one_per_session(*[(p, toks(90_000 + 10 * i, 3)) for i, p in enumerate(prompts)])
    got, _ = run(trace, "trtllm", additional_snapshot_offsets_from_start="20", additional_snapshot_offsets_from_end="0")
    assert got == [0] + [20] * 31 + [0, 0]


@pytest.mark.parametrize(
    "knob, value, message",
    [
        ("additional_snapshot_offsets_from_start", "0", "must be positive (>= 1), not 0"),
        ("additional_snapshot_offsets_from_start", "1024,,4096", "comma-separated integer"),
        ("additional_snapshot_offsets_from_start", "1.5", "comma-separated integer"),
        ("additional_snapshot_offsets_from_end", "-1", "must be non-negative (>= 0), not -1"),
        ("additional_snapshot_offsets_from_end", "0,", "comma-separated integer"),
    ],
)
def test_trtllm_refuses_bad_offsets(knob, value, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        run(one_per_session((toks(0, 50), toks(100, 5))), "trtllm", **{knob: value})


def test_trtllm_offsets_parse_as_the_engines_lists():
    assert snapshot_offsets("", "--x", 1) == () and snapshot_offsets(" 4096, 1024,1024 ", "--x", 1) == (1024, 4096)
    assert snapshot_offsets("0", "--x", 0) == (0,)
    with pytest.raises(PolicyError, match="--x"):
        snapshot_offsets("1e3", "--x", 1)


# ---------------------------------------------------------------------------------- LMDeploy


def test_lmdeploy_decode_checkpoint_with_the_last_token_rule():
    """LMDeploy v0.16.0: one replaceable decode checkpoint per sequence, block-aligned, at the last
    multiple of prefix_cache_decode_state_interval (64 here, block 64). A 100 + 28-token request
    stores 127 tokens, so no decode checkpoint (the earlier preset stored 128 and checkpointed
    there); a 140-token follow-up reuses the prompt-end checkpoint at 100 instead of 128."""
    trace = one_per_session((toks(0, 100), toks(100, 28)), (toks(0, 140), toks(900, 3)))
    assert run(trace, "lmdeploy", prefix_cache_decode_state_interval=64)[0] == [0, 100]
    assert run(trace, "lmdeploy-0.16-pytorch", prefix_cache_decode_state_interval=64)[0] == [0, 128]
    with pytest.raises(PolicyError, match="multiple of the 64-token block"):
        run(trace, "lmdeploy", prefix_cache_decode_state_interval=100)


def test_lmdeploy_loses_the_prompt_end_checkpoint_after_an_unaligned_restore():
    """LMDeploy v0.16.0 ``BlockTrie.allocate`` / ``_extend_trie_path`` (trie.py at 1263d5cd8): a
    request restored from a checkpoint off the block grid recomputes the blocks from the restored
    one on into private blocks; the trie path stops at the first block the trie does not hold, so
    a prompt-end checkpoint anchored beyond it is not saved (``reserve_save`` -> -1). Found by
    benchmarks/differential_lmdeploy.py against the engine's own scheduler. Block 64: r0 = 35 +
    29 tokens (63 stored, no full block), r1 = r0's 64 tokens + 12 restores 35 and cannot save
    76; r2 = r1's prompt + 3 reuses 35, not 76 (the earlier preset: 76)."""
    r1 = cat(toks(0, 35), toks(1000, 29), toks(3000, 12))
    trace = one_per_session((toks(0, 35), toks(1000, 29)), (r1, toks(4000, 5)), (cat(r1, toks(5000, 3)), toks(6000, 2)))
    got, sim = run(trace, "lmdeploy")
    assert got == [0, 35, 35] and 76 not in state_depths(sim.tree)
    assert run(trace, "lmdeploy-0.16-pytorch")[0] == [0, 35, 76]
    # the same restore when the trie already holds the block: the checkpoint is saved
    trace = one_per_session(
        (toks(0, 35), toks(1000, 40)),
        (cat(toks(0, 35), toks(1000, 39), toks(3000, 2)), toks(4000, 5)),
        (cat(toks(0, 35), toks(1000, 39), toks(3000, 5)), toks(6000, 2)),
    )
    assert run(trace, "lmdeploy")[0] == [0, 35, 76]


def test_lmdeploy_keeps_the_anchors_checkpoint_at_the_same_step():
    """LMDeploy v0.16.0 ``CheckpointLifecycle._reserve_checkpoint`` (checkpoint_lifecycle.py at
    1263d5cd8): an anchor's published checkpoint at the same step is not replaced, whichever path
    it is on. Block 16: two different 12-token prompts both anchor on the root; the second one's
    checkpoint is refused, so a follow-up of the first reuses 12 and one of the second nothing
    (engine, driven by benchmarks/differential_lmdeploy.py: hits 0, 0, 0, 12). The earlier preset
    replaced the first checkpoint instead."""
    trace = one_per_session(
        (toks(0, 12), toks(100, 2)),
        (toks(500, 12), toks(600, 2)),
        (cat(toks(500, 12), toks(700, 5)), toks(800, 2)),
        (cat(toks(0, 12), toks(900, 5)), toks(950, 2)),
    )
    assert run(trace, "lmdeploy", block_size=16)[0] == [0, 0, 0, 12]
    assert run(trace, "lmdeploy-0.16-pytorch", block_size=16)[0] == [0, 0, 12, 0]


def test_lmdeploy_keeps_the_pinned_restored_checkpoint():
    """LMDeploy at 1263d5cd8: the checkpoint a request restores is pinned at admission
    (paging/scheduler.py L330 ``_pin_ssm_restore_if_needed``) and unpinned only after its first
    forward's save is published (engine/engine_loop.py L420-L421); the save is reserved while the
    pin holds (engine/inputs_maker.py L942-L943), and ``_reserve_checkpoint`` refuses to replace a
    pinned checkpoint (paging/block_trie/checkpoint_lifecycle.py L393, ``pin_count > 0``). So a
    prompt ending in the restored checkpoint's block saves nothing there. Block 64: r0 = 128
    tokens (checkpoint at 128); r1 = r0 + 10 restores 128 and its end 138 anchors on the same
    block: refused, so r2 = r1 + 3 reuses 128 (engine, driven by
    benchmarks/differential_lmdeploy.py: 0, 128, 128; the rule unmodelled gave 138). A prompt
    ending in the next block (r0 + 70) saves its end as before."""
    r0 = toks(0, 128)
    r1 = cat(r0, toks(3000, 10))
    trace = one_per_session((r0, toks(1000, 29)), (r1, toks(4000, 5)), (cat(r1, toks(5000, 3)), toks(6000, 2)))
    got, sim = run(trace, "lmdeploy")
    assert got == [0, 128, 128] and 138 not in state_depths(sim.tree)
    assert run(trace, "lmdeploy-0.16-pytorch")[0] == [0, 128, 138]
    r1 = cat(r0, toks(3000, 70))
    trace = one_per_session((r0, toks(1000, 29)), (r1, toks(4000, 5)), (cat(r1, toks(5000, 3)), toks(6000, 2)))
    assert run(trace, "lmdeploy")[0] == [0, 128, 198]


def test_lmdeploy_orders_recency_as_the_engine_clock_does():
    """LMDeploy at 1263d5cd8 stamps a checkpoint's recency with ``time.perf_counter()`` when it
    is pinned for a restore (paging/block_trie/checkpoint_lifecycle.py L199) and when it is
    published (L454), and evicts the least recent when a save finds no free slot (L399, L360-L377):
    the checkpoint a request restores is older than the one it saves. State pool 2, block 64: r0
    saves 128; r1 = r0 + 70 restores 128 and saves 198; r2 (unrelated) needs a slot: 128 goes,
    so r3 = r1 + 5 reuses 198 (engine, driven by benchmarks/differential_lmdeploy.py: 0, 128, 0,
    198). Sequential mode gives r1's lookup and insert one time: without the engine's order the
    tie went to the deeper state, 198, and r3 reused 128. lmdeploy-0.16-pytorch keeps that order."""
    P = toks(0, 128)
    trace = one_per_session(
        (P, toks(1000, 3)),
        (cat(P, toks(2000, 70)), toks(3000, 3)),
        (toks(5000, 50), toks(6000, 3)),
        (cat(P, toks(2000, 70), toks(7000, 5)), toks(8000, 2)),
    )
    got, sim = run(trace, "lmdeploy", state_pool="2")
    assert got == [0, 128, 0, 198] and 128 not in state_depths(sim.tree)
    assert run(trace, "lmdeploy-0.16-pytorch", state_pool="2")[0] == [0, 128, 0, 128]


def test_lmdeploy_evicts_an_unpinned_checkpoint_on_the_running_path():
    """LMDeploy at 1263d5cd8: a request pins only the checkpoint it restores (paging/scheduler.py
    L330, ``pin_restore``); a save that finds no free slot evicts the least recent published
    checkpoint without a pin (paging/block_trie/checkpoint_lifecycle.py L399, L360-L377,
    ``_is_evictable_checkpoint`` L537-L539), one on the request's own matched path too. State pool
    2, block 64: r0 saves 128, r1 = r0 + 64 restores 128 and saves 192; r2 = r1 + 64 restores 192
    (pinned) and saves 256: 128, above it on its path, goes; r3 = r0 + 5 finds nothing (engine,
    driven by benchmarks/differential_lmdeploy.py: 0, 128, 192, 0). The tree kept every state on
    a locked path, so 256 was not saved and r3 reused 128; lmdeploy-0.16-pytorch still does."""
    P = toks(0, 128)
    Q = cat(P, toks(2000, 64))
    S = cat(Q, toks(3000, 64))
    trace = one_per_session(
        (P, toks(1000, 3)), (Q, toks(4000, 3)), (S, toks(5000, 3)), (cat(P, toks(6000, 5)), toks(7000, 2))
    )
    got, sim = run(trace, "lmdeploy", state_pool="2")
    assert got == [0, 128, 192, 0] and 128 not in state_depths(sim.tree)
    assert run(trace, "lmdeploy-0.16-pytorch", state_pool="2")[0] == [0, 128, 192, 128]


# ---------------------------------------------------------------------------------- listing, aliases, CLI


def _cli(*args):
    return CliRunner().invoke(main, list(args))


def test_marconi_policies_lists_engine_version_and_knobs():
    res = _cli("policies")
    assert res.exit_code == 0
    for name, preset in PRESETS.items():
        line = next(ln for ln in res.output.splitlines() if ln.startswith(name + " "))
        assert preset.engine in line and (preset.version or "-") in line
    rows = {r["name"]: r for r in json.loads(_cli("policies", "--format", "json").output)}
    knobs = {k["name"]: k for k in rows["sglang"]["knobs"]}
    assert knobs["mamba_radix_cache_strategy"]["choices"] == ["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"]
    assert knobs["mamba_track_interval"]["min"] == 1 and knobs["mamba_track_interval"]["type"] == "int"
    assert {"prefix_cache_retention_interval", "enable_mamba_shared_prefix_checkpoint", "block_size"} <= {
        k["name"] for k in rows["vllm"]["knobs"]
    }
    assert {"block_size", "prefix_cache_decode_state_interval", "state_pool"} <= {
        k["name"] for k in rows["lmdeploy"]["knobs"]
    }
    assert {
        "periodic_snapshot_interval",
        "additional_snapshot_offsets_from_start",
        "additional_snapshot_offsets_from_end",
    } <= {k["name"] for k in rows["trtllm"]["knobs"]}
    assert rows["sglang-0.5.9-no-buffer"]["aliases"] == ["sglang-v1"]
    assert rows["vllm"]["stores"] == "input + output - 1" and rows["marconi"]["stores"] == "input + output"


def test_old_names_print_the_same_results():
    base = [
        "run",
        "--trace",
        "synthetic:chat",
        "--sessions",
        "6",
        "--model",
        "qwen3.5-9b",
        "--format",
        "json",
        "--no-progress",
        "--policy",
    ]
    for old, new in ALIASES.items():
        extra = ["--block-size", "64"] if "block_size" in get_preset(new).reads() else []
        a, b = json.loads(_cli(*base, old, *extra).output), json.loads(_cli(*base, new, *extra).output)
        assert a[0].pop("policy") == old and b[0].pop("policy") == new
        assert a == b, old


def test_engine_knobs_on_the_command_line():
    base = [
        "run",
        "--trace",
        "synthetic:chat",
        "--sessions",
        "4",
        "--model",
        "qwen3.5-9b",
        "--no-progress",
        "--format",
        "json",
    ]
    ok = _cli(
        *base,
        "--policy",
        "sglang,vllm,trtllm,lmdeploy",
        "--mamba-radix-cache-strategy",
        "no_buffer",
        "--no-enable-mamba-shared-prefix-checkpoint",
        "--periodic-snapshot-interval",
        "256",
        "--prefix-cache-retention-interval",
        "0",
        "--gpu-memory",
        "80GB",
        "--mamba-full-memory-ratio",
        "0.5",
    )
    assert ok.exit_code == 0, ok.output
    assert {r["policy"] for r in json.loads(ok.stdout)} == set(CURRENT)
    bad = _cli(*base, "--policy", "sglang", "--mamba-radix-cache-strategy", "no_buffer", "--page-size", "16")
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert len(bad.output.strip().splitlines()) == 1 and "--page-size 1" in bad.output
    bad = _cli(*base, "--policy", "vllm", "--enable-mamba-shared-prefix-checkpoint")
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "not modelled" in bad.output
    bad = _cli(*base, "--policy", "sglang", "--mamba-track-interval", "0")
    assert bad.exit_code == 2 and "--mamba-track-interval must be >= 1" in bad.output

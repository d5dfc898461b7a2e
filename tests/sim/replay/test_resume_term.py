"""The resumed-call term of the time model (issue 41, session 17): a prefill from a restored
state runs its gated-delta layers slower per kernel chunk than the same prompt from scratch (H200:
+4.1 us a chunk and layer on qwen3-next-80b-a3b, +5.2 on qwen3.5-27b, over the same request's
from-scratch reference; attention and MLP 1.0x). ``HardwareTiming.gdn_resume_ms_per_chunk``
prices it in ``prefill_time_s`` only; ``calibration.fit_resume`` takes it from suffix / reference
pairs; a timing file without it loads with 0. Exact values on hand-made tables."""

import json
from dataclasses import replace

import pandas as pd
import pytest

from sim.cost import HardwareTiming, gdn_chunks, get_model, read_timing_file, timing_to_dict
from sim.errors import UsageError
from sim.replay.calibration import RESUME_MIN_CHUNKS, Run, fit_resume, resume_extras
from sim.replay.measure import replayed_spec

KINDS = ("attention", "gated_delta", "mlp")


def timing(**kw) -> HardwareTiming:
    return HardwareTiming(
        {"attn_linear": 2.0, "attn_quadratic": 4.0, "gdn_linear": 1.5, "gdn_chunk": 30.0, "mlp_linear": 1.5},
        {"attention": 0.2, "gated_delta": 0.1, "mlp": 0.03},
        0.025,
        4.0,
        989.0,
        1,
        **kw,
    )


def test_a_resumed_prefill_pays_the_term_per_chunk_and_gated_delta_layer():
    spec = get_model("replay-tiny")  # 3 gated-delta layers, 1 attention, 4 MLPs
    t0, t1 = timing(), timing(gdn_resume_ms_per_chunk=0.004)
    assert t1.prefill_time_s(spec, 0, 1024) == t0.prefill_time_s(spec, 0, 1024)  # from scratch: none
    assert gdn_chunks(512, 1024) == 8
    extra = t1.prefill_time_s(spec, 512, 1024) - t0.prefill_time_s(spec, 512, 1024)
    assert extra == pytest.approx(3 * 8 * 0.004e-3, rel=1e-9)  # 96 us
    # a split adds its ragged chunk, also resumed
    extra = t1.prefill_time_s(spec, 512, 1024, 1) - t0.prefill_time_s(spec, 512, 1024, 1)
    assert extra == pytest.approx(3 * 9 * 0.004e-3, rel=1e-9)
    # a step is priced as before (its varlen call passes every sequence a state: seq_ms holds it)
    assert t1.step_time_s(spec, [(512, 1024)], [700]) == t0.step_time_s(spec, [(512, 1024)], [700])
    # a model without gated-delta layers does not pay it
    dense = replace(spec, n_gdn=0, n_attn=4)
    assert t1.prefill_time_s(dense, 512, 1024) == t0.prefill_time_s(dense, 512, 1024)


def test_timing_files_with_and_without_the_term(tmp_path):
    d0 = timing_to_dict(timing())
    assert "gdn_resume_ms_per_chunk" not in d0  # written only when fitted: an old file's keys
    d1 = timing_to_dict(timing(gdn_resume_ms_per_chunk=0.0048))
    assert d1["gdn_resume_ms_per_chunk"] == 0.0048
    p0, p1 = tmp_path / "old.json", tmp_path / "new.json"
    p0.write_text(json.dumps(d0))
    p1.write_text(json.dumps(d1))
    assert read_timing_file(p0).gdn_resume_ms_per_chunk == 0.0  # an old file loads, without the term
    assert read_timing_file(p1) == timing(gdn_resume_ms_per_chunk=0.0048)
    p1.write_text(json.dumps(dict(d1, gdn_resume_ms_per_chunk=-0.001)))
    with pytest.raises(UsageError, match="gdn_resume_ms_per_chunk must be a finite number >= 0"):
        read_timing_file(p1)
    with pytest.raises(UsageError, match="non-negative"):
        timing(gdn_resume_ms_per_chunk=-1.0)


def pair(hit, n_in, s_per_layer, f_per_layer, k=2, **kw):
    row = dict(
        request=0,
        hit_tokens=hit,
        input_tokens=n_in,
        restored=True,
        validated=True,
        kernel_calls=1,
        suffix_ms_gated_delta=s_per_layer * k,
        full_ms_gated_delta=f_per_layer * k,
        suffix_host_bound=False,
        full_host_bound=False,
    )
    row.update(kw)
    return row


def test_the_term_is_the_median_extra_of_suffix_reference_pairs():
    spec = get_model("qwen3-next-80b-a3b")
    counts = {"attention": 0, "gated_delta": 2, "mlp": 0}
    t = timing()
    F = t.layer_fixed_ms(replayed_spec(spec, counts))["gated_delta"]
    hit, n_in = 512, 512 + 64 * 20  # 20 chunks resumed, 28 from scratch
    c, c0 = gdn_chunks(hit, n_in), gdn_chunks(0, n_in)
    assert (c, c0) == (20, 28)
    rows = []
    for e in (0.004, 0.006, 0.005):  # per chunk: the reference's 10 us a chunk, the suffix's 10 + e
        rows.append(pair(hit, n_in, F + c * (0.010 + e), F + c0 * 0.010))
    # left out: under RESUME_MIN_CHUNKS chunks, not validated, host-bound either way, two calls
    short = 512 + 64 * (RESUME_MIN_CHUNKS - 1)
    rows.append(pair(hit, short, F + 1.0, F + 0.1))
    rows.append(pair(hit, n_in, F + 1.0, F + 0.1, validated=False))
    rows.append(pair(hit, n_in, F + 1.0, F + 0.1, suffix_host_bound=True))
    rows.append(pair(hit, n_in, F + 1.0, F + 0.1, full_host_bound=True))
    rows.append(pair(hit, n_in, F + 1.0, F + 0.1, kernel_calls=2))
    run = Run(spec, counts, pd.DataFrame(rows), "pairs")
    assert resume_extras(run, t).tolist() == pytest.approx([0.004, 0.006, 0.005], rel=1e-9)
    term, info = fit_resume([run], t)
    assert term == pytest.approx(0.005, rel=1e-9) and info["pairs"] == 3
    # a suffix faster per chunk than its reference: never a negative term
    fast = Run(spec, counts, pd.DataFrame([pair(hit, n_in, F + c * 0.008, F + c0 * 0.010)]), "fast")
    assert fit_resume([fast], t)[0] == 0.0
    # no pairs (a table from before the per-layer columns, or no gated-delta layer replayed): 0
    assert fit_resume([Run(spec, {"attention": 1, "gated_delta": 0, "mlp": 1}, run.table)], t) == (0.0, {"pairs": 0})

"""``HardwareTiming.step_time_s`` remembers each model's one-token decode work by context
(``_memo``): the step times it gives must be the very floats the plain sum gives, for every model
on one timing, with the table cleared when it fills, and a copy of the timing (``with_gpus``)
must not read another's table. The timing carries a resumed-call term, which the plain sum adds for
every prefill from a state."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost import LAYER_KINDS, default_timing, gdn_chunks, get_model, weight_gb

# the committed files price none since the conv fix (session 25): the term set here so that its
# path is exercised
TIMING = replace(default_timing("qwen3.5-9b"), gdn_resume_ms_per_chunk=0.0048)
SPECS = [get_model("qwen3.5-9b"), get_model("qwen3.5-27b"), get_model("qwen3-next-80b-a3b")]


def plain_step_time_s(t, spec, prefills, contexts) -> float:
    """The step time summed without the table: every sequence's work_parts in order, per layer
    the additive or the overlap form."""
    if not prefills and not contexts:
        return 0.0
    work, core = dict.fromkeys(LAYER_KINDS, 0.0), dict.fromkeys(LAYER_KINDS, 0.0)
    seqs = [(p, L, gdn_chunks(p, L)) for p, L in prefills] + [(c, c + 1, 1) for c in contexts]
    for i, (p, L, chunks) in enumerate(seqs):
        lin, cr = t.work_parts(spec, p, L, chunks)
        for k in LAYER_KINDS:
            work[k] += lin[k]
            core[k] += cr[k]
        if i < len(prefills) and 0 < p < L and spec.n_gdn:  # a prefill from a state: the resumed chunks' extra
            core["gated_delta"] += t.gdn_resume_ms_per_chunk * chunks / t.gpus
    n, more = t._layers(spec), max(0, len(seqs) - 1)
    read = {k: t.ms_per_weight_gb[k] * weight_gb(spec)[k] / t.gpus for k in LAYER_KINDS}
    layer = {}
    for k in LAYER_KINDS:
        if t.layer_form == "overlap":
            layer[k] = t.layer_call_ms[k] + more * t.seq_ms[k] + max(read[k], work[k]) + core[k]
        else:
            layer[k] = t.layer_call_ms[k] + read[k] + more * t.seq_ms[k] + work[k] + core[k]
    ms = t.call_ms + sum(n[k] * max(t.layer_floor_ms[k], layer[k]) for k in LAYER_KINDS)
    s = ms * 1e-3
    if t.comm_ms_per_call or t.comm_ms_per_token:
        tokens = sum(max(L - p, 0) for p, L in prefills) + len(contexts)
        s += (t.comm_ms_per_call + tokens * t.comm_ms_per_token) * 1e-3
    return s


steps = st.lists(
    st.tuples(
        st.integers(0, len(SPECS) - 1),
        st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 3000)), max_size=3),
        st.lists(st.integers(1, 200), max_size=12),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(steps, st.sampled_from([1, 2, 4]), st.sampled_from(["additive", "overlap"]))
def test_remembered_step_times_are_the_plain_sums(seq, gpus, form):
    t = replace(TIMING, layer_form=form, kv_query_heads=form == "overlap").with_gpus(gpus)
    for i, pre, ctx in seq:  # the same few contexts again and again, across models: table hits
        spec = SPECS[i]
        prefills = [(p, p + n) for p, n in pre]
        assert t.step_time_s(spec, prefills, ctx) == plain_step_time_s(t, spec, prefills, ctx)


def test_a_full_table_starts_again_and_stays_exact(monkeypatch):
    t = TIMING.with_gpus(1)
    monkeypatch.setattr(type(t), "_MEMO_CONTEXTS", 4)
    spec = SPECS[0]
    for c in range(1, 40):
        ctx = [c, c + 1, 3 * c]
        assert t.step_time_s(spec, [], ctx) == plain_step_time_s(t, spec, [], ctx)
        assert len(t._model_memo(spec)[1]) <= 4


def test_copies_and_models_do_not_share_a_table():
    a, b = TIMING.with_gpus(1), TIMING.with_gpus(2)
    s9, s27 = SPECS[0], SPECS[1]
    ctx = [100, 2000]
    assert a.step_time_s(s9, [], ctx) == plain_step_time_s(a, s9, [], ctx)
    assert b.step_time_s(s9, [], ctx) == plain_step_time_s(b, s9, [], ctx)
    assert a.step_time_s(s27, [], ctx) == plain_step_time_s(a, s27, [], ctx)
    assert a.step_time_s(s9, [], ctx) != b.step_time_s(s9, [], ctx)
    assert a.step_time_s(s9, [], ctx) != a.step_time_s(s27, [], ctx)


def test_fresh_copies_of_a_spec_do_not_pile_up():
    """Replay prices a fresh ``replace`` of its spec at every step: the table keeps a few models,
    not one per step, and stays exact."""
    from dataclasses import replace

    t = TIMING.with_gpus(1)
    for i in range(50):
        spec = replace(SPECS[0], n_attn=1 + i % 3)
        assert t.step_time_s(spec, [(0, 70)], [5, 9]) == plain_step_time_s(t, spec, [(0, 70)], [5, 9])
        assert len(t._memo) <= type(t)._MEMO_MODELS

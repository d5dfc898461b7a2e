"""The whole tiny preset (replay-tiny: 1 attention + 3 gated-delta layers, 4 MLPs) replayed
against the real simulator on the CPU (plain-torch gated delta): every hit's states and KV restored
and validated, per-layer-type times in the summary and the per-request table, and after every
event the store holds exactly the simulator's live checkpoints and the KV of their prefixes."""

import pytest

torch = pytest.importorskip("torch")

from sim.config import SimConfig  # noqa: E402
from sim.replay.session import ReplaySettings, run_replay, token_source  # noqa: E402
from sim.replay.tokens import page_keys  # noqa: E402
from sim.simulate import build  # noqa: E402
from traces.registry import TraceOptions, load_trace  # noqa: E402

CHAT = "synthetic:chat:sessions=1,turns=3,prompt_tokens=40,user_tokens=12,output_tokens=8,prompts=1"


def test_tiny_preset_whole_model_replay():
    trace = load_trace(CHAT, TraceOptions())
    tokens_of = token_source(trace, 0)
    checked = []

    def after(name, sim, rp):
        live = sim.tree.checkpoints()
        assert rp.store.ids() == set(live), name
        # the KV pages are exactly those of the live checkpoints' prefixes (filled ones)
        want = set()
        for cp in live:
            info = rp.store.info(cp)
            if info.kv_written:
                want |= set(page_keys(tokens_of(info.request)[0], info.position, rp.store.page_tokens))
        assert set(rp.store._pages) == want, name
        checked.append(name)

    cfg = SimConfig(
        policy="marconi",
        model="replay-tiny",
        capacity_bytes=10**7,
        alpha=0.5,
        state_alignment="exact",
        mode="sequential",
    )
    res = run_replay(trace, cfg, ReplaySettings(device="cpu", dtype="fp32"), build=build, after_event=after)
    s = res.summary
    assert res.failures == [], [f.message() for f in res.failures]
    assert s["layers_replayed"] == {"attention": 1, "gated_delta": 3, "mlp": 4}
    assert s["hits"] == 2 and s["hits_validated"] == s["kv_hits_validated"] == 2
    assert s["kv_failures"] == 0 and 0 < s["max_kv_error"] < 1e-4 and s["max_rec_error"] < 1e-4
    assert all(s["measured_ms_by_layer_type"][k] > 0 for k in ("attention", "gated_delta", "mlp"))
    df = res.requests
    assert (df["suffix_ms_attention"] > 0).all() and (df["suffix_ms_gated_delta"] > 0).all()
    assert (df.loc[df["validated"], "full_ms_mlp"] > 0).all()
    assert "admit" in checked and "lookup" in checked

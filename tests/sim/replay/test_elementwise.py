"""``marconi replay --elementwise fused``: the replayed model with ``kernels.norms``' fused ops
computes the model its torch path does (CPU: the Triton interpreter; the kernels themselves are
checked against the torch ops in tests/kernels/test_norms.py)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import dataclasses  # noqa: E402

from sim.cost import get_model  # noqa: E402
from sim.errors import UsageError  # noqa: E402
from sim.replay.model import HybridModel, ReplayShape, elementwise_backend  # noqa: E402


def _tiny_models(name="replay-tiny"):
    shape = ReplayShape.from_spec(get_model(name))
    plain = HybridModel(shape, device="cpu", dtype=torch.float32, seed=7)
    fused = HybridModel(shape, device="cpu", dtype=torch.float32, seed=7)
    fused._set_elementwise("fused", None)  # a GPU's choice, run here in the interpreter
    return shape, plain, fused


@pytest.mark.parametrize("name", ["replay-tiny", "replay-tiny-moe"])
def test_model_fused_matches_torch(name):
    """``--elementwise fused`` computes the same model: every layer's output and the end states
    (recurrent, conv, KV) of a 100-token prefill and its 30-token resumption within fp32
    summation order, and every op took the fused path."""
    shape, plain, fused = _tiny_models(name)
    assert fused.elementwise == "fused" and fused._fused_gate and fused._fused_qk
    gen = torch.Generator().manual_seed(1)
    toks = torch.randint(0, 1000, (130,), generator=gen)
    sp, op, _ = plain.run(toks[:100], None, 0, keep_outputs=True)
    sf, of, _ = fused.run(toks[:100], None, 0, keep_outputs=True)
    for a, b in zip(op, of):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    for a, b in ((sp.rec, sf.rec), (sp.conv, sf.conv), (sp.kv, sf.kv)):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    sp2, op2, _ = plain.run(toks[100:], sp, 100, keep_outputs=True)
    sf2, of2, _ = fused.run(toks[100:], sf, 100, keep_outputs=True)
    torch.testing.assert_close(of2[-1], op2[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sf2.rec, sp2.rec, atol=1e-4, rtol=1e-4)


def test_model_fused_batch_equals_per_sequence():
    """A varlen batch of three sequences (one resumed from a state, one a decode token) gives
    each sequence's rows bit for bit as its own call does: the fused ops are row-wise."""
    shape, _, fused = _tiny_models()
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randint(0, 1000, (90,), generator=gen), torch.randint(0, 1000, (40,), generator=gen)
    st, _, _ = fused.run(b[:39], None, 0)
    c = torch.randint(0, 1000, (1,), generator=gen)

    def three(t):  # sequence 1 resumes from ``st``, 0 and 2 start from zeros
        return torch.stack([torch.zeros_like(t), t, torch.zeros_like(t)])

    out = fused.forward_batch(
        torch.cat([a, b[39:], c]),
        [0, 90, 91, 92],
        [0, 39, 0],
        rec0=[three(st.rec[l]) for l in range(shape.layers)],
        conv0=[three(st.conv[l]) for l in range(shape.layers)],
        kv=[None, st.kv, None],
    )
    xa, _, _ = fused.forward_segment(fused.embed(a), None, 0, [])
    xb, _, _ = fused.forward_segment(fused.embed(b[39:]), st, 39, [])
    torch.testing.assert_close(out.x[:90], xa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.x[90:91], xb, atol=1e-5, rtol=1e-5)


def test_elementwise_choice():
    """``fused`` runs on a GPU only (a CPU model runs torch's ops); an unknown name is a usage
    error naming the choices; head sizes that are not powers of two keep those ops on torch."""
    assert elementwise_backend("fused", "cpu") == "torch"
    assert elementwise_backend("fused", "cuda") == "fused"
    assert elementwise_backend("torch", "cuda") == "torch"
    with pytest.raises(UsageError, match="torch, fused"):
        elementwise_backend("triton")
    shape, plain, fused = _tiny_models()
    assert plain.elementwise == "torch" and not plain._fused_gate and not plain._fused_qk
    odd = dataclasses.replace(shape, attn_head_dim=24)
    fused.shape = odd
    fused._set_elementwise("fused", None)
    assert fused._fused_gate and not fused._fused_qk
    from sim.replay.model import _pow2

    assert [n for n in range(0, 70) if _pow2(n)] == [1, 2, 4, 8, 16, 32, 64]


def test_a_timing_file_records_its_elementwise_ops_and_a_replay_on_the_other_says_so(tmp_path):
    """A file fitted with ``--elementwise fused`` says so (``"elementwise": "fused"``; the
    default torch is not written: the committed files stay byte-equal); a GPU replay compared
    with a timing of the other ops says it in its time model line (after a note on attention,
    where both differ), one with the same says nothing."""
    import json
    from dataclasses import replace

    from sim.cost import default_timing, read_timing_file, timing_to_dict
    from sim.replay.calibration import replay_timing

    spec = get_model("qwen3.5-9b")
    base = default_timing("qwen3.5-9b", gpu="h100", tensor_parallel=1)
    assert base.elementwise == "torch" and "elementwise" not in timing_to_dict(base)
    fused = replace(base, elementwise="fused")
    assert timing_to_dict(fused)["elementwise"] == "fused"
    (tmp_path / "t.json").write_text(json.dumps(timing_to_dict(fused)))
    assert read_timing_file(tmp_path / "t.json").elementwise == "fused"
    h100 = "NVIDIA H100 80GB HBM3"
    _, note = replay_timing(None, spec, "bf16", "cuda", h100, 1000, 8, elementwise="fused")
    assert note == "the timing was fitted with torch norms and activations, this replay runs fused"
    _, note = replay_timing(None, spec, "bf16", "cuda", h100, 1000, 8, elementwise="torch")
    assert note == ""
    _, note = replay_timing(fused, spec, "bf16", "cuda", h100, 1000, 8, attention="cudnn")
    assert note == (
        "the timing was fitted with sdpa attention, this replay runs cudnn; "
        "the timing was fitted with fused norms and activations, this replay runs torch"
    )
    _, note = replay_timing(fused, spec, "bf16", "cuda", h100, 1000, 8, elementwise="fused")
    assert note == ""


def test_replay_settings_record_what_ran(tmp_path):
    """On a CPU ``--elementwise fused`` runs as torch, and the summary's settings say both
    (``elementwise`` what ran, ``elementwise_requested`` what was asked); a calibration written
    from a run records the ops that ran."""
    from sim.config import SimConfig
    from sim.cost import read_timing_file
    from sim.replay.session import ReplaySettings, calibrate, run_replay
    from sim.simulate import build
    from traces.registry import TraceOptions, load_trace

    trace = load_trace("synthetic:chat", TraceOptions(sessions=3, seed=1))
    cfg = SimConfig(policy="marconi", model="replay-tiny", capacity_bytes=10**8)
    st = ReplaySettings(layers=2, dtype="fp32", device="cpu", elementwise="fused", requests=6)
    res = run_replay(trace, cfg, st, build=build)
    assert res.settings["elementwise"] == "torch" and res.settings["elementwise_requested"] == "fused"
    assert res.summary["hits"] > 0 and res.summary["hits_validated"] == res.summary["hits"]
    calibrate(res, cfg, tmp_path / "t.json")
    assert read_timing_file(tmp_path / "t.json").elementwise == "torch"
    res.settings["elementwise"] = "fused"  # as a GPU run's settings say
    calibrate(res, cfg, tmp_path / "f.json")
    assert read_timing_file(tmp_path / "f.json").elementwise == "fused"

"""``marconi replay --attention``: the cuDNN path's bucketed, padded attention (sim.replay.model.
attend_bucketed) is exact by construction; here it runs with SDPA's math kernel standing in for
cuDNN (the CPU has no cuDNN) against ``_attend``, the path every replay has used. The GPU test
(tests/sim/replay/test_replay_gpu.py) runs it with cuDNN itself."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.nn.attention import SDPBackend  # noqa: E402

from sim.errors import UsageError  # noqa: E402
from sim.replay import model as M  # noqa: E402

MATH = [SDPBackend.MATH]


def test_buckets_are_few_and_pad_at_most_an_eighth():
    """1024-token steps up to 8K, then an eighth of the power of two: hand-counted values."""
    got = [M.attention_bucket(n) for n in (0, 1, 1024, 1025, 8191, 8192, 8193, 16_385, 87_571)]
    assert got == [0, 1024, 1024, 2048, 8192, 8192, 9216, 18_432, 90_112]
    for n in range(1, 200_000, 997):
        b = M.attention_bucket(n)
        assert n <= b and (b - n) <= max(M.ATTENTION_BUCKET, n // 8)
    assert len({M.attention_bucket(n) for n in range(1, 131_073)}) == 8 + 8 * 4  # 1K steps to 8K, 8 per octave


@pytest.mark.parametrize(
    "Tq,Tk,H,KVH",
    [
        (300, 300, 4, 2),  # a whole prompt, padded to 1024
        (1024, 1024, 2, 2),  # already a bucket: no padding
        (700, 900, 4, 1),  # a suffix over a short prefix: run as a whole prompt
        (1100, 1100, 6, 2),
    ],
)
def test_the_bucketed_path_equals_the_replays_attention(Tq, Tk, H, KVH):
    g = torch.Generator().manual_seed(Tq * 7 + Tk)
    q = torch.randn(Tq, H, 32, generator=g)
    k = torch.randn(Tk, KVH, 32, generator=g)
    v = torch.randn(Tk, KVH, 32, generator=g)
    got = M.attend_bucketed(q, k, v, backends=MATH)
    ref = M._attend(q, k, v)
    assert got is not None and got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_short_suffix_over_a_long_prefix_stays_on_the_replays_path():
    """16 queries over 4,000 keys: a whole prompt would do ~60x the suffix's work."""
    q, k, v = torch.randn(16, 2, 8), torch.randn(4000, 1, 8), torch.randn(4000, 1, 8)
    assert M.attend_bucketed(q, k, v, backends=MATH) is None
    # the rule's edge: Tk^2 < 2 x ratio x Tq x (Tk - Tq / 2)
    Tk = 1000
    edge = next(t for t in range(1, Tk + 1) if Tk * Tk < 2 * M.WHOLE_PROMPT_RATIO * t * (Tk - t / 2))
    qe, ke = torch.randn(edge, 2, 8), torch.randn(Tk, 1, 8)
    assert M.attend_bucketed(qe, ke, ke, backends=MATH) is not None
    assert M.attend_bucketed(qe[1:], ke, ke, backends=MATH) is None


def test_cudnn_runs_as_sdpa_off_a_gpu_and_in_fp32():
    q, k, v = torch.randn(40, 2, 8), torch.randn(40, 2, 8), torch.randn(40, 2, 8)
    assert torch.equal(M.attend(q, k, v, "cudnn"), M._attend(q, k, v))
    assert torch.equal(M.attend(q, k, v, "sdpa"), M._attend(q, k, v))


def test_an_unknown_attention_backend_is_refused():
    with pytest.raises(UsageError, match="attention must be one of sdpa, cudnn, not 'flash'"):
        M.attention_backend("flash")
    assert M.attention_backend("cudnn") == "cudnn"


def test_a_timing_file_records_a_cudnn_fit_and_a_replay_on_the_other_backend_says_so(tmp_path):
    """A file fitted with ``--attention cudnn`` says so (``"attention": "cudnn"``; the default
    sdpa is not written: the committed files stay byte-equal); a GPU replay compared with a timing
    of the other backend says it in its time model line, one with the same says nothing."""
    from dataclasses import replace

    from sim.cost import default_timing, get_model, read_timing_file, timing_to_dict
    from sim.replay.calibration import replay_timing

    spec = get_model("qwen3.5-9b")
    base = default_timing("qwen3.5-9b", gpu="h100", tensor_parallel=1)
    assert base.attention == "sdpa" and "attention" not in timing_to_dict(base)
    cud = replace(base, attention="cudnn")
    assert timing_to_dict(cud)["attention"] == "cudnn"
    (tmp_path / "t.json").write_text(__import__("json").dumps(timing_to_dict(cud)))
    assert read_timing_file(tmp_path / "t.json").attention == "cudnn"
    h100 = "NVIDIA H100 80GB HBM3"
    _, note = replay_timing(None, spec, "bf16", "cuda", h100, 1000, 8, attention="cudnn")
    assert note == "the timing was fitted with sdpa attention, this replay runs cudnn"
    _, note = replay_timing(None, spec, "bf16", "cuda", h100, 1000, 8)
    assert note == ""
    _, note = replay_timing(cud, spec, "bf16", "cuda", h100, 1000, 8, attention="sdpa")
    assert note == "the timing was fitted with cudnn attention, this replay runs sdpa"
    _, note = replay_timing(cud, spec, "bf16", "cuda", h100, 1000, 8, attention="cudnn")
    assert note == ""


def test_a_model_off_a_gpu_runs_sdpa_whatever_was_asked():
    from sim.cost import get_model
    from sim.replay.model import HybridModel, ReplayShape

    shape = ReplayShape.from_spec(get_model("replay-tiny"), 1, vocab_rows=64)
    assert HybridModel(shape, attention="cudnn").attention == "sdpa"
    assert M.attention_backend("cudnn", "cuda", torch.bfloat16) == "cudnn"
    assert M.attention_backend("cudnn", "cuda", torch.float32) == "sdpa"
    assert M.attention_backend("cudnn", "cpu", torch.bfloat16) == "sdpa"
    assert M.attention_backend("cudnn") == "cudnn"
    with pytest.raises(UsageError):
        HybridModel(shape, attention="fa3")


def test_warm_up_plans_every_bucketed_length_up_to_the_longest_prompt(monkeypatch):
    """``warm_attention`` visits each bucket once, in order, up to the longest prompt's (planned by
    one call each: here the calls are counted; the CPU model runs sdpa, so a cudnn one is set)."""
    from sim.cost import get_model
    from sim.replay import warm as W
    from sim.replay.model import HybridModel, ReplayShape

    assert W.attention_lengths(0) == []
    assert W.attention_lengths(1) == [1024]
    assert W.attention_lengths(8193) == [1024 * i for i in range(1, 9)] + [9216]
    assert W.attention_lengths(87_571)[-1] == M.attention_bucket(87_571) == 90_112
    assert len(W.attention_lengths(87_571)) == 8 + 8 + 8 + 8 + 3  # 1K..8K, 9K..16K, 18K..32K, 36K..64K, 72K..88K
    shape = ReplayShape.from_spec(get_model("replay-tiny"), None, vocab_rows=64)
    assert shape.attn_layers > 0
    model = HybridModel(shape)
    assert W.warm_attention(model, 3000) == 0  # sdpa: nothing to plan
    seen = []
    monkeypatch.setattr(M, "attend_bucketed", lambda q, k, v: seen.append((q.shape, k.shape)))
    model.attention = "cudnn"
    assert W.warm_attention(model, 3000) == 3
    H, KVH, hd = shape.attn_heads, shape.attn_kv_heads, shape.attn_head_dim
    assert seen == [((n, H, hd), (n, KVH, hd)) for n in (1024, 2048, 3072)]


def _oracle_attention(q, k, v):
    """Causal attention written out per head (query i at absolute position Tk - Tq + i sees keys
    0..that position; query head h reads key / value head h // (H / KVH)), in float64."""
    Tq, H, hd = q.shape
    Tk, KVH, _ = k.shape
    out = torch.empty(Tq, H, hd, dtype=torch.float64)
    for h in range(H):
        kh, vh = k[:, h // (H // KVH)].double(), v[:, h // (H // KVH)].double()
        s = q[:, h].double() @ kh.T / hd**0.5
        mask = torch.arange(Tk)[None, :] > (Tk - Tq + torch.arange(Tq))[:, None]
        out[:, h] = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ vh
    return out


@pytest.mark.parametrize("start", [0, 37])
def test_an_attention_layer_equals_attention_written_out(start):
    """The model's attention layer (its q / k / v, the prefix's KV, the mask's alignment, the GQA
    head map) against ``_oracle_attention`` on the same inputs: a key and value swapped, or a mask
    shifted, would pass every replay check (hit and reference run the same layer) but not this."""
    from sim.cost import get_model
    from sim.replay.model import HybridModel, ReplayShape

    shape = ReplayShape.from_spec(get_model("replay-tiny"), None, vocab_rows=64)
    model = HybridModel(shape, seed=3)
    g = torch.Generator().manual_seed(start)
    x_pre = torch.randn(start, shape.hidden, generator=g)
    x = torch.randn(23, shape.hidden, generator=g)
    kv0 = None
    if start:
        _, _, kp, vp = model._attn_in(0, x_pre, model._rope_tables(0, start))
        kv0 = torch.stack([kp, vp])
    got, kv = model._attention(0, x, start, kv0)
    qg, q, k, v = model._attn_in(0, x, model._rope_tables(start, 23))
    keys = k if kv0 is None else torch.cat([kv0[0], k])
    vals = v if kv0 is None else torch.cat([kv0[1], v])
    assert torch.equal(kv[0], keys) and torch.equal(kv[1], vals)
    want = model._attn_out(0, x, qg, _oracle_attention(q, keys, vals).to(q.dtype))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_cudnn_path_pads_to_its_bucket_and_no_further(monkeypatch):
    """The padded length SDPA is called with is ``attention_bucket(Tk)``: a few cuDNN plans, and
    no more work than the bucket's."""
    seen = []
    real = M.F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[2], k.shape[2]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(M.F, "scaled_dot_product_attention", spy)
    for Tq, Tk in ((300, 300), (1500, 1600), (1024, 1024)):
        M.attend_bucketed(torch.randn(Tq, 2, 8), torch.randn(Tk, 1, 8), torch.randn(Tk, 1, 8), backends=MATH)
    assert seen == [(1024, 1024), (2048, 2048), (1024, 1024)]


def test_where_cudnn_cannot_run_the_model_is_refused_in_one_line(monkeypatch):
    """``cudnn_problem`` runs one 16-token call: where SDPA has no cuDNN kernel (here the CPU,
    which has none), torch's first line in the reason; with a kernel that runs, nothing. A model
    that would run cudnn and cannot is a ``UsageError`` (one line of the CLI, exit 2)."""
    from sim.cost import get_model
    from sim.replay.model import HybridModel, ReplayShape

    why = M.cudnn_problem("cpu", torch.float32, 2, 1, 8)
    assert why.startswith("--attention cudnn: SDPA's cuDNN kernel does not run here (") and why.endswith("use sdpa")
    assert "\n" not in why
    assert M.cudnn_problem("cpu", torch.float32, 2, 1, 8, backends=MATH) == ""
    shape = ReplayShape.from_spec(get_model("replay-tiny"), None, vocab_rows=64)
    monkeypatch.setattr(M, "cudnn_runs", lambda device, dtype: True)  # as on a GPU in bf16
    with pytest.raises(UsageError, match="cuDNN kernel does not run here"):
        HybridModel(shape, attention="cudnn")
    monkeypatch.setattr(M, "cudnn_problem", lambda *a, **k: "")
    assert HybridModel(shape, attention="cudnn").attention == "cudnn"


def test_a_whole_replay_through_the_bucketed_path_validates_every_hit(monkeypatch):
    """``marconi replay --attention cudnn`` end to end on the CPU, with SDPA's math kernel in
    cuDNN's place (``CUDNN_BACKENDS``) and the device check answered as on a GPU: every prefill's
    attention goes through ``attend_bucketed`` (whole prompts padded to their bucket, suffixes as
    whole prompts where that pays), every hit is validated with its KV and none fails; the header
    says which attention ran."""
    import json

    from click.testing import CliRunner

    from sim.cli import main

    calls = []
    real = M.attend_bucketed

    def counted(q, k, v, backends=None):
        out = real(q, k, v, backends)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(M, "CUDNN_BACKENDS", MATH)
    monkeypatch.setattr(M, "cudnn_runs", lambda device, dtype: True)
    monkeypatch.setattr(M, "attend_bucketed", counted)
    trace = "synthetic:chat:sessions=2,turns=3,prompt_tokens=300,user_tokens=40,output_tokens=16,prompts=1"
    args = ["replay", "--device", "cpu", "--model", "replay-tiny", "--trace", trace, "--no-progress"]
    res = CliRunner().invoke(main, [*args, "--attention", "cudnn", "--format", "json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["hits"] > 0 and s["hits"] == s["hits_validated"] == s["kv_hits_validated"] and s["failures"] == 0
    assert any(calls)  # the bucketed path ran (and fell back where a suffix is short)
    res = CliRunner().invoke(main, [*args, "--attention", "cudnn"])
    assert res.exit_code == 0 and res.stdout.splitlines()[0].endswith(" | attention cudnn"), res.output

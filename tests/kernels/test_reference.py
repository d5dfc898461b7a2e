"""The oracles themselves, against closed forms and an independently written chunked WY form.

Everything is fp32 plain torch on CPU; tolerances 1e-5 (summation-order differences only).
"""

import math

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from kernels.reference import (  # noqa: E402
    l2norm,
    naive_causal_conv1d,
    naive_gated_delta_rule,  # noqa: E402
    naive_gdn_gate,
    naive_recurrent_step,
)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def inputs(T, H=2, HV=4, K=8, V=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen))
    beta = torch.rand(1, T, HV, generator=gen)
    return q, k, v, g, beta


def chunked_wy(q, k, v, g, beta, scale, C=64):
    """The chunked WY form of the reference notes, one head at a time, HV == H, l2norm applied."""
    q, k = l2norm(q) * scale, l2norm(k)
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.zeros(B, T, H, V)
    states = []
    S = torch.zeros(H, K, V)
    for c0 in range(0, T, C):
        sl = slice(c0, min(T, c0 + C))
        n = sl.stop - sl.start
        for h in range(H):
            Q, Kc, Vc = q[0, sl, h], k[0, sl, h], v[0, sl, h]
            gam = torch.cumsum(g[0, sl, h], 0)
            bt = beta[0, sl, h]
            D = torch.exp(gam[:, None] - gam[None, :])
            L = torch.tril(bt[:, None] * (Kc @ Kc.T) * D, -1)
            A = torch.linalg.inv(torch.eye(n) + L)
            w = A @ ((bt * torch.exp(gam))[:, None] * Kc)
            u = A @ (bt[:, None] * Vc)
            vn = u - w @ S[h]
            o[0, sl, h] = torch.exp(gam)[:, None] * (Q @ S[h]) + torch.tril(Q @ Kc.T * D) @ vn
            S[h] = torch.exp(gam[-1]) * S[h] + (Kc * torch.exp(gam[-1] - gam)[:, None]).T @ vn
        if n == C:
            states.append(S.clone())
    return o, S, states


def test_oracle_equals_chunked_wy_form():
    q, k, v, g, beta = inputs(150, H=2, HV=2)
    ro, rf, rb, pos = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    co, cf, cb = chunked_wy(q, k, v, g, beta, scale=8**-0.5)
    close(ro, co, 1e-4)
    close(rf[0], cf, 1e-4)
    assert pos == [[64, 128]]
    close(rb, torch.stack(cb), 1e-4)


def test_beta_zero_is_pure_decay():
    q, k, v, g, beta = inputs(10)
    h0 = torch.randn(1, 4, 8, 8)
    o, f, _, _ = naive_gated_delta_rule(q, k, v, g, torch.zeros_like(beta), initial_state=h0)
    decay = torch.exp(g[0].sum(0))  # [HV]
    close(f[0], h0[0] * decay[:, None, None])
    qq = q.repeat_interleave(2, dim=2)[0, -1] * 8**-0.5
    close(o[0, -1], torch.einsum("hk,hkv->hv", qq, f[0]))


def test_single_write_and_decode_step():
    q, k, v, g, beta = inputs(1)
    o, f, _, _ = naive_gated_delta_rule(
        q, k, v, torch.zeros_like(g), torch.ones_like(beta), use_qk_l2norm=True, scale=1.0
    )
    kh = l2norm(k[0, 0]).repeat_interleave(2, 0)  # [HV, K]
    qh = l2norm(q[0, 0]).repeat_interleave(2, 0)
    close(f[0], kh[:, :, None] * v[0, 0][:, None, :])  # S = k v^T
    close(o[0, 0], (qh * kh).sum(-1)[:, None] * v[0, 0])
    o2, f2 = naive_recurrent_step(
        q[:, 0],
        k[:, 0],
        v[:, 0],
        torch.zeros_like(g[:, 0]),
        torch.ones_like(beta[:, 0]),
        torch.zeros_like(f),
        use_qk_l2norm=True,
        scale=1.0,
    )
    close(o2, o[:, 0])
    close(f2, f)


def test_grouped_heads_equal_repeated_heads_and_varlen_equals_split():
    q, k, v, g, beta = inputs(90, H=2, HV=4)
    o, f, b, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    o2, f2, b2, _ = naive_gated_delta_rule(
        q.repeat_interleave(2, 2), k.repeat_interleave(2, 2), v, g, beta, use_qk_l2norm=True
    )
    close(o, o2)
    close(f, f2)
    ov, fv, bv, pos = naive_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=[0, 20, 90], start_positions=[0, 44], use_qk_l2norm=True
    )
    oa, fa, _, _ = naive_gated_delta_rule(*(x[:, :20] for x in (q, k, v, g, beta)), use_qk_l2norm=True)
    ob, fb, bb, _ = naive_gated_delta_rule(
        *(x[:, 20:] for x in (q, k, v, g, beta)), start_positions=[44], use_qk_l2norm=True
    )
    close(ov[:, :20], oa)
    close(ov[:, 20:], ob)
    close(fv, torch.cat([fa, fb]))
    assert pos == [[], [64]] and torch.equal(bv, bb)


def test_gate_formula():
    a, A_log, dt_bias = torch.randn(3, 5), torch.randn(5), torch.randn(5)
    x = a + dt_bias
    close(naive_gdn_gate(a, A_log, dt_bias), -torch.exp(A_log) * torch.log1p(torch.exp(x)))
    assert math.isfinite(naive_gdn_gate(torch.tensor([100.0]), torch.zeros(1), torch.zeros(1)).item())


def test_conv_oracle_matches_a_direct_loop():
    gen = torch.Generator().manual_seed(4)
    D, T = 6, 70
    x, w, b = (torch.randn(1, T, D, generator=gen), torch.randn(D, 4, generator=gen), torch.randn(D, generator=gen))
    cs = torch.randn(1, D, 3, generator=gen)
    y, f, wins, pos = naive_causal_conv1d(x, w, b, conv_state=cs, activation=None)
    full = torch.cat([cs[0].T, x[0]])  # [3 + T, D]
    direct = torch.stack([b + (full[t : t + 4] * w.T).sum(0) for t in range(T)])
    close(y[0], direct)
    assert torch.equal(f[0], full[-3:].T)
    assert pos == [[64]] and torch.equal(wins[0], full[64:67].T)  # x[61..63]

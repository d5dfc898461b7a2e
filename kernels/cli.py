"""``marconi kernels ...``: correctness checks of the Triton kernels.

Imported by ``sim/cli/__init__.py`` at startup, so nothing here may import torch or triton at module level:
the simulator runs without the ``kernels`` extra.
"""

from __future__ import annotations

import os
import sys

import click

INSTALL_HINT = "the kernels need torch and triton: pip install 'marconi-sim[kernels]'"


def _checks(torch, on_gpu: bool):
    """Yield ``(name, error, tolerance)`` for each check; error is a max abs / relative error."""
    import torch.nn.functional as F

    from kernels.chunk_gdn import chunk_gated_delta_rule
    from kernels.conv import causal_conv1d
    from kernels.reference import naive_causal_conv1d, naive_gated_delta_rule

    dev = "cuda" if on_gpu else "cpu"
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dev)

    def err(a, b):
        return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0

    H, HV, K, V = 2, 4, 32, 32
    tol = 1e-4 if on_gpu else 1e-5  # fp32 either way (IEEE dots on the GPU)
    for T in (63, 130):
        q, k, v = rnd(1, T, H, K), rnd(1, T, H, K), rnd(1, T, HV, V)
        g, beta = F.logsigmoid(rnd(1, T, HV)), torch.sigmoid(rnd(1, T, HV))
        o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
        ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
        yield f"gdn fp32 T={T} output", err(o, ro), tol
        yield f"gdn fp32 T={T} final state", err(ht, rf), tol
        yield f"gdn fp32 T={T} boundary states ({hb.shape[0]})", err(hb, rb), tol
    full = q, k, v, g, beta, o, ht, hb  # T = 130: resumed at 64 below

    cu, starts = [0, 50, 114, 200], [0, 10, 64]
    q, k, v = rnd(1, 200, H, K), rnd(1, 200, H, K), rnd(1, 200, HV, V)
    g, beta = F.logsigmoid(rnd(1, 200, HV)), torch.sigmoid(rnd(1, 200, HV))
    h0 = 0.1 * rnd(3, HV, K, V)
    o, ht, hb = chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, start_positions=starts, use_qk_l2norm=True
    )
    ro, rf, rb, _ = naive_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, start_positions=starts, use_qk_l2norm=True
    )
    yield "gdn varlen x3, ragged starts: output", err(o, ro), tol
    yield "gdn varlen x3, ragged starts: states", max(err(ht, rf), err(hb, rb)), tol

    # the T = 130 run above resumed from its boundary state at 64 (one interpreted run less than
    # running the whole sequence again)
    q, k, v, g, beta, o, ht, hb = full
    o2, h2, _ = chunk_gated_delta_rule(
        *(x[:, 64:] for x in (q, k, v, g, beta)), initial_state=hb[:1], start_positions=[64], use_qk_l2norm=True
    )
    yield "gdn restore at 64: suffix output + state", max(err(o2, o[:, 64:]), err(h2, ht)), (1e-5 if on_gpu else 0.0)

    D = 48
    x, w, b, cs = rnd(1, 200, D), rnd(D, 4), rnd(D), rnd(3, D, 3)
    y, cf, cb = causal_conv1d(x, w, b, conv_state=cs, cu_seqlens=cu, start_positions=starts)
    ry, rcf, rcb, _ = naive_causal_conv1d(x, w, b, conv_state=cs, cu_seqlens=cu, start_positions=starts)
    yield "conv1d varlen: output", err(y, ry), tol
    yield "conv1d varlen: final + boundary windows", max(err(cf, rcf), err(cb, rcb)), tol

    yield from _ssd_checks(torch, rnd, err, on_gpu)

    if on_gpu:
        H, HV, K, V, T = 4, 8, 128, 128, 1000
        q, k, v = (rnd(1, T, H, K).bfloat16(), rnd(1, T, H, K).bfloat16(), rnd(1, T, HV, V).bfloat16())
        g, beta = F.logsigmoid(rnd(1, T, HV)) * 0.5, torch.sigmoid(rnd(1, T, HV)).bfloat16()
        o, ht, hb = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
        ro, rf, rb, _ = naive_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
        rel = max(((a.float() - r).norm() / r.norm()).item() for a, r in ((o, ro), (ht, rf), (hb, rb)))
        yield "gdn bf16 H=4 HV=8 K=V=128 T=1000 (rel)", rel, 2e-2


def _ssd_checks(torch, rnd, err, on_gpu: bool):
    """The chunked SSD (Mamba2) against its per-token oracle, and its resume at a boundary."""
    from kernels.ssd import chunk_ssd
    from kernels.ssd_reference import naive_ssd

    def rel(a, b):
        return err(a, b) / max(b.float().abs().max().item(), 1e-6) if b.numel() else 0.0

    H, P, N, G, T = 4, 32, 32, 2, 200
    cu, starts = [0, 50, 114, 200], [0, 10, 64]
    x, dt, B, C = rnd(1, T, H, P), rnd(1, T, H) - 1, rnd(1, T, G, N) / N**0.5, rnd(1, T, G, N)
    A, D, bias, h0 = -torch.rand(H).to(x.device) - 0.5, rnd(H), 0.5 * rnd(H), 0.5 * rnd(3, H, P, N)
    kw = dict(D=D, dt_bias=bias, initial_state=h0, cu_seqlens=cu, start_positions=starts)
    y, ht, hb = chunk_ssd(x, dt, A, B, C, **kw)
    ry, rf, rb, _ = naive_ssd(x, dt, A, B, C, **kw)
    yield "ssd varlen x3, ragged starts: output (rel)", rel(y, ry), 2e-4
    yield "ssd varlen x3, ragged starts: states (rel)", max(rel(ht, rf), rel(hb, rb)), 2e-4
    kw = dict(D=D, dt_bias=bias)
    y, ht, hb = chunk_ssd(x, dt, A, B, C, **kw)
    y2, h2, _ = chunk_ssd(
        x[:, 64:], dt[:, 64:], A, B[:, 64:], C[:, 64:], initial_state=hb[:1], start_positions=[64], **kw
    )
    yield "ssd restore at 64: suffix output + state", max(err(y2, y[:, 64:]), err(h2, ht)), 0.0
    if on_gpu:  # Nemotron-H 8B's Mamba2 layer: 128 heads x 64, d_state 128, 8 groups
        H, P, N, G, T = 128, 64, 128, 8, 1000
        x, dt = rnd(1, T, H, P).bfloat16(), (rnd(1, T, H) - 1).bfloat16()
        B, C = (rnd(1, T, G, N) / N**0.5).bfloat16(), rnd(1, T, G, N).bfloat16()
        A, D, bias = -torch.rand(H).to(x.device) - 0.5, rnd(H), 0.5 * rnd(H)
        y, ht, hb = chunk_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
        ry, rf, rb, _ = naive_ssd(x, dt, A, B, C, D=D, dt_bias=bias)
        yield "ssd bf16 H=128 P=64 N=128 G=8 T=1000 (rel)", max(rel(y, ry), rel(ht, rf), rel(hb, rb)), 2e-2


def register(main: click.Group) -> None:
    @main.group("kernels")
    def kernels_group() -> None:
        """Triton gated-delta and SSD (Mamba2) kernels (needs the `kernels` extra)."""

    @kernels_group.command("check")
    def check() -> None:
        """Run the kernels' correctness checks (interpreter on CPU, compiled on a GPU)."""
        try:
            import torch
        except ImportError:
            click.echo(f"Error: {INSTALL_HINT}", err=True)
            sys.exit(2)
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
                click.echo(
                    "Error: triton was imported before TRITON_INTERPRET=1 could be set; run with TRITON_INTERPRET=1",
                    err=True,
                )
                sys.exit(2)
            os.environ["TRITON_INTERPRET"] = "1"
        try:
            import triton
        except ImportError:
            click.echo(f"Error: {INSTALL_HINT}", err=True)
            sys.exit(2)
        mode = f"compiled on {torch.cuda.get_device_name()}" if on_gpu else "Triton interpreter on CPU"
        click.echo(f"marconi kernels check: torch {torch.__version__}, triton {triton.__version__}, {mode}")
        click.echo(f"{'check':<48} {'error':>10} {'tol':>8}  result")
        failed = 0
        for name, e, tol in _checks(torch, on_gpu):
            ok = e <= tol and e == e  # NaN never passes
            failed += not ok
            click.echo(f"{name:<48} {e:>10.2e} {tol:>8.0e}  {'PASS' if ok else 'FAIL'}")
        click.echo(f"{'all checks passed' if not failed else f'{failed} check(s) FAILED'}")
        sys.exit(1 if failed else 0)

"""Warm-up of a replay before anything is timed (``ReplaySettings.warmup``, on by default; GPU
runs): every kernel specialisation a replay meets compiled first, by untimed calls whose results
are thrown away, and the device memory its largest call needs reserved (``presize``). Needs
torch."""

from __future__ import annotations

import time

import torch

from kernels._common import CHUNK


def _warm_steps(model, boundaries: bool = False) -> None:
    """The step executor's batches: one varlen call per chunk-count bucket a step can reach (up
    to 256 chunks of a sequence: ``--max-num-batched-tokens`` 16K), each with a ragged chunk from
    a state, a sequence from scratch and decode tokens (untimed, thrown away). ``boundaries``:
    batched replay's calls too, which hand over boundary states and keep every layer's output."""
    for n in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        T = n * 64 - 10
        lens = [T, 70, 1, 1]
        starts = [10, 0, 5, 700]
        cu = [0]
        for L in lens:
            cu.append(cu[-1] + L)
        toks = torch.arange(cu[-1], device=model.device)
        model.forward_batch(toks, cu, starts, *_zero_batch(model, starts))
        if boundaries:
            model.forward_batch(
                toks,
                cu,
                starts,
                *_zero_batch(model, starts),
                keep_outputs=True,
                boundaries=[[], [64], [], []],
                on_state=lambda *a: None,
            )
    for N in (1, 16):  # decode-only steps (one token a sequence: total and count specialised)
        starts = [100] * N
        model.forward_batch(
            torch.arange(N, device=model.device), list(range(N + 1)), starts, *_zero_batch(model, starts)
        )


def _zero_batch(model, starts: list) -> tuple:
    """Zero recurrent states, conv windows and (with attention) KV of ``starts[n]`` tokens for a
    warm-up batch of ``len(starts)`` sequences."""
    s, N = model.shape, len(starts)
    rec0 = torch.zeros(s.layers, N, s.v_heads, s.head_k_dim, s.head_v_dim, device=model.device)
    conv0 = torch.zeros(s.layers, N, s.conv_dim, s.conv_width - 1, dtype=model.dtype, device=model.device)
    kv = None
    if s.attn_layers:
        kv = [
            torch.zeros(s.attn_layers, 2, p, s.attn_kv_heads, s.attn_head_dim, dtype=model.dtype, device=model.device)
            for p in starts
        ]
    return rec0, conv0, kv


def presize_tokens(longest_prompt: int) -> int:
    """The length of ``presize``'s from-scratch call: the longest prompt of the replayed trace
    (every from-scratch call, a reference or a miss's prefill, is at most that long), rounded up
    to a whole 64-token chunk; 0 (nothing to reserve) for an empty trace."""
    n = max(0, int(longest_prompt))
    return -(-n // CHUNK) * CHUNK


def presize(model, tokens: int) -> int:
    """Reserve the device memory of the replay's largest call before anything is timed: one
    untimed from-scratch prefill of ``tokens`` tokens, run as the hits' reference check runs it
    (a boundary state captured below its end), its results thrown away. The caching allocator
    keeps the blocks it freed, and every later call (shorter) takes its large blocks from them:
    no large-pool ``cudaMalloc`` inside a timed call (the small pool's 2 MB segments may still
    grow by one when fragmented: 3 of 61 references on an H100 agent run). Without it the
    references allocated (41 of 61 on an H200 agent run, 2026-12-05: each new longest prompt's
    reference needs larger blocks than any call before it) and their early host issue times
    (40-200 ms) held the sleep ahead of them at its cap. Returns the tokens run (0: none, or the
    call did not fit: the replay then allocates as it goes)."""
    if tokens <= 0:
        return 0
    b = (tokens - 1) // CHUNK * CHUNK
    kept: list = []

    def capture(p, layer, r, c):
        kept.append((r.clone(), c.clone()))

    toks = torch.arange(tokens, device=model.device)
    try:
        model.run(toks, None, 0, [b] if b > 0 else [], capture)
    except torch.cuda.OutOfMemoryError:
        kept.clear()
        torch.cuda.empty_cache()
        return 0
    kept.clear()
    return tokens


def attention_lengths(longest: int) -> list[int]:
    """Every bucketed length (``sim.replay.model.attention_bucket``) a prompt of up to ``longest``
    tokens runs its cuDNN attention at."""
    from sim.replay.model import attention_bucket

    out: list[int] = []
    n = 1
    while longest > 0 and n <= longest:
        b = attention_bucket(n)
        out.append(b)
        n = b + 1
    return out


def warm_attention(model, longest_prompt: int) -> int:
    """With ``--attention cudnn``: cuDNN's plan for every bucketed length up to the longest prompt
    built before anything is timed (40-50 ms each on an H100; 35 lengths up to 87K tokens), one
    call of one attention layer's shape per length. Returns the lengths planned (0: another
    backend or no attention layer)."""
    from sim.replay.model import attend_bucketed

    s = model.shape
    if getattr(model, "attention", "sdpa") != "cudnn" or not s.attn_layers:
        return 0
    lengths = attention_lengths(longest_prompt)
    for n in lengths:
        q = torch.zeros(n, s.attn_heads, s.attn_head_dim, device=model.device, dtype=model.dtype)
        k = torch.zeros(n, s.attn_kv_heads, s.attn_head_dim, device=model.device, dtype=model.dtype)
        attend_bucketed(q, k, k)
        del q, k
    return len(lengths)


def warm(model, device, steps: bool = False, batches: bool = False, longest_prompt: int = 0) -> float:
    """Compile every kernel specialisation a replay meets before anything is timed: the
    kernels' own ``warmup`` (Triton backend) at the stack's shapes and flags, then the stack
    itself from scratch and from a state, with and without boundary states and with a split (the
    stack's strided q/k/v/gate views are specialisations too); then reserve the memory of a
    from-scratch call of the trace's longest prompt (``presize``)."""
    t0 = time.perf_counter()
    s = model.shape
    kernel_warmup = None
    if model.kernel == "triton":  # kernels.warmup imports triton
        try:  # from the submodule: once it is imported, ``kernels.warmup`` is the module
            from kernels.warmup import warmup as kernel_warmup
        except ImportError:
            pass
    if kernel_warmup is not None:
        try:
            kernel_warmup(
                (63, 64, 200),
                num_heads=s.k_heads,
                num_v_heads=s.v_heads,
                head_k_dim=s.head_k_dim,
                head_v_dim=s.head_v_dim,
                dtype=model.dtype,
                device=device,
                use_gate_in_kernel=True,
                use_beta_sigmoid=True,
                conv_dim=s.conv_dim,
                conv_width=s.conv_width,
            )
        except (TypeError, ValueError, RuntimeError):  # another signature or a refused shape:
            pass  # the stack's own runs below cover it
    toks = torch.arange(300, device=model.device)
    model.run(toks[:200], None, 0, [64, 128], lambda *a: None, keep_outputs=True)
    st, _, _ = model.run(toks[:130], None, 0, [64, 100, 130], lambda *a: None, keep_outputs=True)
    model.run(toks[130:300], st, 130, [192, 250], lambda *a: None, keep_outputs=True)
    model.run(toks[:63], None, 0)
    model.run(toks[:64], None, 0, [64], lambda *a: None)
    if steps or batches:
        _warm_steps(model, boundaries=batches)
    warm_attention(model, longest_prompt)
    presize(model, presize_tokens(longest_prompt))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0

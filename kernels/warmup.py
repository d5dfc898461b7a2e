"""Compile the kernels ahead of the first real call.

The kernels use fixed launch configurations (no autotuning), so what triggers a compilation is a
new *specialisation*, not a new length: dtype, head dims, l2norm / gate / beta flags, whether an
initial state is passed, whether the call emits any boundary state, Triton's divisibility
specialisation of strides, the head counts and the keys' exact strides (the state loop takes them
as constants), and the state loop's V block (``chunk_gdn.state_wide``: wider once the sequences
times value heads fill the GPU). ``warmup`` runs each requested shape bucket with and without an
initial state so that a replay or a user's script pays every compilation once, up front.
Compiled kernels also land in Triton's on-disk cache (``TRITON_CACHE_DIR``), so a second process
with the same shapes only loads them.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable, Optional, Sequence, Union

import torch

from kernels.chunk_gdn import chunk_gated_delta_rule, state_wide
from kernels.conv import causal_conv1d

Bucket = Union[int, Sequence[int]]


def _lengths(bucket: Bucket) -> list[int]:
    return [int(bucket)] if isinstance(bucket, int) else [int(x) for x in bucket]


def warmup(
    buckets: Iterable[Bucket] = (63, 64),
    *,
    num_heads: int,
    num_v_heads: int,
    head_k_dim: int = 128,
    head_v_dim: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    device: Union[str, torch.device] = "cuda",
    use_qk_l2norm: bool = True,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid: bool = False,
    boundary_states: bool = True,
    state_dtype: torch.dtype = torch.float32,
    conv_dim: Optional[int] = None,
    conv_width: int = 4,
    conv_bias: bool = False,
    seed: int = 0,
    wide_batches: bool = True,
) -> float:
    """Run the kernels once per bucket (a token count, or a list of sequence lengths for one
    varlen call), with and without initial states; returns the seconds spent.

    The default buckets (63 and 64 tokens) cover a call without and with a boundary state; pass
    the lengths your workload uses if their strides or batch layout differ. Where a batch of
    enough sequences takes the state loop's wide V block (``state_wide``; one sequence does not),
    two varlen buckets of that many sequences (63 and 64 tokens each) are added, so that both
    blocks are compiled (``wide_batches=False``: not). The conv kernel is warmed with weights (and bias, if ``conv_bias``) in
    ``dtype``, as a model holds them.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    buckets = list(buckets) + (_wide_buckets(num_v_heads, head_v_dim, torch.device(device)) if wide_batches else [])
    H, HV, K, V = num_heads, num_v_heads, head_k_dim, head_v_dim
    start = time.perf_counter()

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dt)

    for bucket in buckets:
        lens = _lengths(bucket)
        T = sum(lens)
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        q, k, v = rnd(1, T, H, K), rnd(1, T, H, K), rnd(1, T, HV, V)
        g = torch.nn.functional.logsigmoid(rnd(1, T, HV, dt=torch.float32))
        beta = torch.rand(1, T, HV, generator=gen).to(device=device, dtype=dtype)
        gate = {}
        if use_gate_in_kernel:
            gate = dict(A_log=rnd(HV, dt=torch.float32), dt_bias=rnd(HV, dt=torch.float32), use_gate_in_kernel=True)
        for h0 in (None, rnd(len(lens), HV, K, V, dt=torch.float32)):
            chunk_gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                cu_seqlens=cu,
                initial_state=h0,
                use_qk_l2norm=use_qk_l2norm,
                use_beta_sigmoid=use_beta_sigmoid,
                boundary_states=boundary_states,
                state_dtype=state_dtype,
                **gate,
            )
            if conv_dim:
                cs = None if h0 is None else rnd(len(lens), conv_dim, conv_width - 1)
                causal_conv1d(
                    rnd(1, T, conv_dim),
                    rnd(conv_dim, conv_width),
                    rnd(conv_dim) if conv_bias else None,
                    conv_state=cs,
                    cu_seqlens=cu,
                    boundary_conv_states=boundary_states,
                )
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


#: the most sequences a warm-up batch takes to reach the wide state block
MAX_WIDE_SEQUENCES = 256


def _wide_buckets(HV: int, V: int, device: torch.device) -> list:
    """Two varlen buckets of the fewest sequences (at most ``MAX_WIDE_SEQUENCES``) whose calls
    take the wide state block, 63 and 64 tokens each (without and with a boundary state); none
    where one sequence already does or none up to the cap does."""
    if state_wide(1, HV, V, device):
        return []
    for n in range(2, MAX_WIDE_SEQUENCES + 1):
        if state_wide(n, HV, V, device):
            return [[63] * n, [64] * n]
    return []


def _warm_one(kwargs: dict) -> float:
    kwargs = dict(kwargs)
    if isinstance(kwargs.get("dtype"), str):
        kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    return warmup(**kwargs)


def warmup_in_processes(configs: Sequence[dict], processes: Optional[int] = None) -> float:
    """Run ``warmup(**config)`` for each config in parallel worker processes (spawned, so each
    has its own CUDA context) and return the wall seconds.

    Compilation is CPU work; the workers fill Triton's on-disk cache, and this process (and any
    later one with the same ``TRITON_CACHE_DIR``) then only loads the binaries. ``dtype`` may be
    given as a torch dtype or its name."""
    start = time.perf_counter()
    configs = [dict(c, dtype=str(c["dtype"]).replace("torch.", "")) if "dtype" in c else dict(c) for c in configs]
    if not configs:
        return 0.0
    workers = processes or max(1, min(len(configs), (os.cpu_count() or 2) - 1, 8))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        list(ex.map(_warm_one, configs))
    return time.perf_counter() - start

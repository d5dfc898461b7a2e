"""A Mamba2 layer for replay: its shapes from a preset, weights from a seed, its forward over a
segment or a varlen batch with the fp32 SSD state and the conv window at every requested
64-token boundary (``kernels.ssd.chunk_ssd`` and ``kernels.conv.causal_conv1d`` on one chunk
metadata), so that a restored prefix can be checked against a from-scratch run as the
gated-delta layers are.

The layer (Mamba2 as mamba_ssm and Nemotron-H write it; z gating in the norm):

    h = rmsnorm(x); [z | xBC | dt] = h W_in            (z: d_inner, xBC: d_inner + 2 G N, dt: H)
    xBC -> causal conv1d (width W, bias) + SiLU -> x [T, H, P], B, C [T, G, N]
    y = chunk_ssd(x, dt, -exp(A_log), B, C, D, dt_bias, dt softplus)      (fp32 state [H, P, N])
    x <- x + (rmsnorm_grouped(y * silu(z)) * w_norm) W_out    (groups of d_inner / G channels)

Its states have the gated-delta layer's form: a recurrent ``[H, P, N]`` fp32 tensor and a conv
window ``[conv_dim, W-1]``; ``Mamba2Model`` is ``HybridModel`` with these layers in the linear
layers' place (its shape from ``replay_shape``), so replay's store, restores, varlen steps and
validation apply unchanged. Needs torch, and triton for the ``triton`` backend only.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from sim.errors import UsageError
from sim.replay.backends import resolve_kernel
from sim.replay.model import (
    GDN,
    HybridModel,
    ReplayShape,
    attention_weights,
    mlp_weights,
    model_attention,
    subsample,
)

#: the Mamba2 head dim where a preset does not give its head count (mamba_ssm's default)
DEFAULT_HEAD_DIM = 64

#: backend name -> ("module:function" of the causal conv1d, of the chunked SSD)
MAMBA2_BACKENDS = {
    "triton": ("kernels.conv:causal_conv1d", "kernels.ssd:chunk_ssd"),
    "torch": ("kernels.torch_gdn:causal_conv1d", "kernels.torch_ssd:chunk_ssd"),
}


def load_backend(name: str) -> tuple[Callable, Callable]:
    """``(conv, ssd)`` of backend ``name`` (``MAMBA2_BACKENDS``), imported on first use."""
    if name not in MAMBA2_BACKENDS:
        raise ValueError(f"unknown Mamba2 backend {name!r} (one of {', '.join(MAMBA2_BACKENDS)})")
    out = []
    for path in MAMBA2_BACKENDS[name]:
        mod, _, fn = path.partition(":")
        out.append(getattr(importlib.import_module(mod), fn))
    return out[0], out[1]


@dataclass(frozen=True)
class Mamba2Shape:
    hidden: int
    heads: int
    head_dim: int
    d_state: int
    groups: int = 1
    conv_width: int = 4

    def __post_init__(self) -> None:
        if min(self.hidden, self.heads, self.head_dim, self.d_state, self.groups) < 1 or self.heads % self.groups:
            raise ValueError(f"bad Mamba2 shape {self} (positive sizes, heads a multiple of groups)")
        if self.conv_width < 2:
            raise ValueError("the Mamba2 conv width must be at least 2")

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.groups * self.d_state

    @property
    def proj_dim(self) -> int:
        return self.d_inner + self.conv_dim + self.heads

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return (self.heads, self.head_dim, self.d_state)

    @classmethod
    def from_spec(cls, spec, head_dim: Optional[int] = None) -> "Mamba2Shape":
        """The Mamba2 layer of a ``sim.cost.ModelSpec``: d_inner, d_state, groups, conv width;
        heads from ``mamba_heads`` where the preset has them, else d_inner / ``head_dim`` (64)."""
        if not getattr(spec, "n_mamba", 0) or getattr(spec, "mamba_version", 2) != 2:
            raise ValueError(f"model {getattr(spec, 'name', spec)!r} has no Mamba2 layers")
        di = spec.mamba_d_inner
        heads = getattr(spec, "mamba_heads", 0) or 0
        if not heads:
            heads = di // (head_dim or DEFAULT_HEAD_DIM)
        if di % heads:
            raise ValueError(f"Mamba2 d_inner {di} is not a multiple of its {heads} heads")
        return cls(
            hidden=spec.d_model,
            heads=heads,
            head_dim=di // heads,
            d_state=spec.mamba_d_state,
            groups=spec.mamba_n_groups,
            conv_width=spec.mamba_conv_width,
        )


def init_weights(shape: Mamba2Shape, gen: torch.Generator, device, dtype: torch.dtype) -> dict:
    """One layer's weights from ``gen`` (mamba_ssm's initialisation ranges: A in [1, 16], dt in
    [1e-3, 0.1] through dt_bias = softplus^-1(dt), D = 1)."""
    s = shape

    def randn(*size, std):
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32).mul_(std).to(dtype)

    u = torch.rand(s.heads, generator=gen, device=device)
    dt = torch.exp(math.log(1e-3) + u * (math.log(0.1) - math.log(1e-3)))
    return dict(
        w_in=randn(s.hidden, s.proj_dim, std=s.hidden**-0.5),
        conv_w=randn(s.conv_dim, s.conv_width, std=0.5),
        conv_b=randn(s.conv_dim, std=0.1),
        A_log=torch.log(1 + 15 * torch.rand(s.heads, generator=gen, device=device)),
        dt_bias=dt + torch.log(-torch.expm1(-dt)),
        D=torch.ones(s.heads, device=device, dtype=torch.float32),
        norm_w=torch.ones(s.d_inner, device=device, dtype=torch.float32),
        w_out=randn(s.d_inner, s.hidden, std=0.5 * s.d_inner**-0.5),
    )


def mamba2_mixer(
    xbc,
    dt,
    w: dict,
    shape: Mamba2Shape,
    *,
    rec0,
    conv0,
    meta,
    boundaries: bool,
    backend: tuple[Callable, Callable],
    varlen: bool = False,
):
    """The layer's conv + chunked SSD over ``T`` tokens (``xbc [T, conv_dim]``, raw ``dt [T, H]``)
    from ``rec0 [H, P, N]`` fp32 / ``conv0 [conv_dim, W-1]`` (None: zeros; ``varlen``: one per
    sequence of ``meta``, ``[S, ...]``). Returns ``(y [T, H, P], rec_end, conv_end, boundary
    states [NB, H, P, N], boundary conv windows [NB, conv_dim, W-1])``, end states per sequence
    when ``varlen``."""
    conv, ssd = backend
    s = shape
    T = xbc.shape[0]

    def per_seq(state):
        return None if state is None else state if varlen else state[None]

    u, conv_end, conv_b = conv(
        xbc[None],
        w["conv_w"],
        w["conv_b"],
        conv_state=per_seq(conv0),
        chunk_metadata=meta,
        activation="silu",
        boundary_conv_states=boundaries,
    )
    u = u[0]
    di, gn = s.d_inner, s.groups * s.d_state
    x = u[:, :di].view(1, T, s.heads, s.head_dim)
    B = u[:, di : di + gn].view(1, T, s.groups, s.d_state)
    C = u[:, di + gn :].view(1, T, s.groups, s.d_state)
    y, rec_end, rec_b = ssd(
        x,
        dt[None],
        -torch.exp(w["A_log"].float()),
        B,
        C,
        D=w["D"],
        dt_bias=w["dt_bias"],
        dt_softplus=True,
        initial_state=per_seq(rec0),
        chunk_metadata=meta,
        boundary_states=boundaries,
    )
    if varlen:
        return y[0], rec_end, conv_end, rec_b, conv_b
    return y[0], rec_end[0], conv_end[0], rec_b, conv_b


def mamba2_block(
    x,
    w: dict,
    shape: Mamba2Shape,
    *,
    dtype: torch.dtype,
    meta,
    rec0=None,
    conv0=None,
    boundaries: bool = False,
    backend: tuple[Callable, Callable],
    varlen: bool = False,
):
    """The residual Mamba2 layer on the fp32 residual stream ``x [T, hidden]`` (matmuls and
    kernel inputs in ``dtype``). Returns ``(x_out, rec_end, conv_end, boundary states, boundary
    conv windows)`` as ``mamba2_mixer``."""
    s = shape
    T = x.shape[0]
    h = F.rms_norm(x, (s.hidden,), eps=1e-6).to(dtype)
    proj = h @ w["w_in"]
    di, cd = s.d_inner, s.conv_dim
    z = proj[:, :di]
    y, rec_end, conv_end, rec_b, conv_b = mamba2_mixer(
        proj[:, di : di + cd],
        proj[:, di + cd :],
        w,
        s,
        rec0=rec0,
        conv0=conv0,
        meta=meta,
        boundaries=boundaries,
        backend=backend,
        varlen=varlen,
    )
    g = (y.float().reshape(T, di) * F.silu(z.float())).view(T, s.groups, di // s.groups)
    g = F.rms_norm(g, (di // s.groups,), eps=1e-5).reshape(T, di) * w["norm_w"]
    return x + g.to(dtype) @ w["w_out"], rec_end, conv_end, rec_b, conv_b


# ---- the replayed model with Mamba2 layers --------------------------------------------------
#
# ``sim.replay.model.HybridModel`` runs its linear layers through ``_gdn``; a Mamba2 model is the
# same stack with that method running ``mamba2_block``. Its ``ReplayShape`` carries the Mamba2
# sizes in the gated-delta fields, so that every consumer of the shape (the checkpoint store's
# slot sizes, ``state_bytes``, the conv window's width) sees the Mamba2 layer's true sizes:
#
#   k_heads = G, head_k_dim = N, v_heads = H, head_v_dim = P
#   conv_dim = 2 k_heads head_k_dim + v_heads head_v_dim = 2 G N + H P       (Mamba2's xBC)
#   recurrent state [v_heads, head_k_dim, head_v_dim] = [H, N, P]             (H P N fp32 values)
#
# The replay stack keeps states as ``[H, N, P]`` (the gated-delta ``[Hv, K, V]`` order); the
# kernels' ``[H, P, N]`` is its transpose, taken on the way in and out (exact: a copy).


def replay_shape(spec, layers: Optional[int] = None, vocab_rows: int = 1 << 16, head_dim: Optional[int] = None):
    """The ``ReplayShape`` of a preset with Mamba2 layers (its attention and MLP layers as
    ``ReplayShape.from_spec`` takes them; ``layers``: mixer layers, subsampled per type)."""
    import dataclasses

    m = Mamba2Shape.from_spec(spec, head_dim)
    base = ReplayShape.from_spec(dataclasses.replace(spec, n_gdn=spec.n_mamba), layers, vocab_rows=vocab_rows)
    a, g = subsample(spec.n_attn, spec.n_mamba, layers)
    return dataclasses.replace(
        base,
        layers=g,
        attn_layers=a,
        k_heads=m.groups,
        v_heads=m.heads,
        head_k_dim=m.d_state,
        head_v_dim=m.head_dim,
        conv_width=m.conv_width,
    )


def mamba2_of(shape) -> Mamba2Shape:
    """The Mamba2 layer a ``replay_shape`` describes."""
    return Mamba2Shape(
        hidden=shape.hidden,
        heads=shape.v_heads,
        head_dim=shape.head_v_dim,
        d_state=shape.head_k_dim,
        groups=shape.k_heads,
        conv_width=shape.conv_width,
    )


#: the gated-delta backend names replay accepts (``--kernel``) -> the Mamba2 backend they mean
KERNEL_TO_MAMBA2 = {"triton": "triton", "ours": "triton", "torch": "torch"}


class Mamba2Model(HybridModel):
    """``HybridModel`` whose linear layers are Mamba2 layers (``mamba2_block``); its shape is
    a ``replay_shape``. Attention, MLPs, states, boundaries, restores and the varlen batch are
    the parent's."""

    def __init__(
        self,
        shape,
        *,
        device="cpu",
        dtype=torch.float32,
        seed: int = 0,
        kernel=None,
        attention: str = "sdpa",
        elementwise: str = "torch",
    ) -> None:
        self.attention = model_attention(attention, device, dtype, shape)
        self.shape = shape
        self._set_elementwise(elementwise, device)  # its attention and MLPs: the parent's
        self.mamba = mamba2_of(shape)
        self.device = torch.device(device)
        self.dtype = dtype
        self.kernel = resolve_kernel(kernel, self.device)
        if self.kernel not in KERNEL_TO_MAMBA2:
            raise UsageError(
                f"--kernel {self.kernel} has no Mamba2 kernel; Mamba2 layers run on "
                f"{' or '.join(sorted(set(KERNEL_TO_MAMBA2.values())))}"
            )
        self._backend = None  # the gated-delta backend: unused
        self._mamba_backend = load_backend(KERNEL_TO_MAMBA2[self.kernel])
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        s = shape

        def randn(*size, std):
            return torch.randn(*size, generator=gen, device=self.device, dtype=torch.float32).mul_(std).to(dtype)

        self.embedding = randn(s.vocab_rows, s.hidden, std=1.0)
        self.layers, self.attn, self.mlp = [], [], []
        for kind in s.order:
            if kind == GDN:
                self.layers.append(init_weights(self.mamba, gen, self.device, dtype))
            else:
                self.attn.append(attention_weights(s, randn, self.device))
            if s.mlp_inter:
                self.mlp.append(mlp_weights(s, randn))

    def upcast(self, dtype: torch.dtype = torch.float32):
        m = object.__new__(type(self))
        m.__dict__.update(self.__dict__)
        m.dtype = dtype

        def up(d: dict) -> dict:
            return {k: v.to(dtype) if v.is_floating_point() else v for k, v in d.items()}

        m.embedding = self.embedding.to(dtype)
        m.layers = [up(w) for w in self.layers]
        m.attn = [up(w) for w in self.attn]
        m.mlp = [up(w) for w in self.mlp]
        return m

    def _gdn(self, l, x, meta, rec0, conv0, want_boundaries, varlen=False):
        r0 = None if rec0 is None else rec0.transpose(-1, -2)  # [.., H, N, P] -> the kernels' [.., H, P, N]
        x, rec_end, conv_end, rec_b, conv_b = mamba2_block(
            x, self.layers[l], self.mamba, dtype=self.dtype, meta=meta, rec0=r0, conv0=conv0,
            boundaries=want_boundaries, backend=self._mamba_backend, varlen=varlen,
        )  # fmt: skip
        rec_b = None if rec_b is None else rec_b.transpose(-1, -2)
        return x, rec_end.transpose(-1, -2), conv_end, rec_b, conv_b

"""The gated-delta backends replay can run (torch-free: the CLI lists them for ``--kernel``).

A backend is one implementation of a gated-delta layer's two calls: ``conv`` with the signature
of ``kernels.conv.causal_conv1d`` and ``core`` with that of
``kernels.chunk_gdn.chunk_gated_delta_rule`` (chunk metadata, boundary states at the metadata's
absolute 64-multiples, in-kernel gate, beta sigmoid and q/k l2norm, fp32 states). Both are
``module:function`` paths imported on first use, so choosing one backend never imports another's
dependencies (``torch`` needs no triton).

  triton    the project's Triton kernels: compiled on a CUDA GPU, Triton's interpreter on a CPU
            (TRITON_INTERPRET=1, set before triton is first imported; one program at a time: slow);
            also accepted as ``ours`` (issue 24's name for it)
  torch     the same chunked math in plain torch ops (``kernels.torch_gdn``): a CPU's default
  fla       FLA's ``chunk_gated_delta_rule`` (flash-linear-attention, optional; CUDA only)
  flashqla  QwenLM's FlashQLA ``chunk_gated_delta_rule`` (flash-qla, optional; Hopper / Blackwell,
            bf16 / fp16, K = V = 128)

The two peers run through the adapters of ``sim.replay.peers`` (their boundary states, cost and
limits are described there); both keep the project's conv kernel. A backend's ``check``
(``module:function``, called with the device, the dtype and the head dims before ``load``)
returns one line when the backend cannot run there (a peer not installed, the wrong GPU), which
``HybridModel`` raises as a usage error.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

#: widest preset a CPU replays on one torch thread, and without a warning of its time
#: (sim.replay.session.cpu_threads, sim.cli.replay.cpu_time_warning)
CPU_SMALL_D_MODEL = 1024


@dataclass(frozen=True)
class GDNBackend:
    name: str
    conv: str  # "module:function", the causal conv1d
    core: str  # "module:function", the chunked gated delta rule
    triton: bool  # runs Triton kernels (on a CPU: in the interpreter)
    about: str
    cuda_only: bool = False  # refused with --device cpu (checked without torch: ``device_problem``)
    check: Optional[str] = None  # "module:function" (device, dtype, head_k_dim, head_v_dim) -> line | None

    def problem(self, device, dtype, head_k_dim: int, head_v_dim: int) -> Optional[str]:
        """One line saying why this backend cannot run on ``device`` at ``dtype`` and these head
        dims (a peer not installed, a GPU it does not support), or None. Imports the check's
        module (not the peer's kernels unless the check needs them)."""
        if self.check is None:
            return None
        mod, fn = self.check.split(":")
        return getattr(importlib.import_module(mod), fn)(device, dtype, head_k_dim, head_v_dim)

    def load(self) -> tuple[Callable, Callable]:
        """``(conv, core)``, imported now."""
        fns = []
        for path in (self.conv, self.core):
            mod, fn = path.split(":")
            fns.append(getattr(importlib.import_module(mod), fn))
        return fns[0], fns[1]


GDN_BACKENDS: dict[str, GDNBackend] = {}


def register_backend(backend: GDNBackend) -> None:
    """Make ``backend`` available as ``HybridModel(kernel=name)`` (``marconi replay --kernel``
    lists the backends registered when the CLI is imported)."""
    GDN_BACKENDS[backend.name] = backend


register_backend(
    GDNBackend(
        "triton",
        "kernels.conv:causal_conv1d",
        "kernels.chunk_gdn:chunk_gated_delta_rule",
        triton=True,
        about="the project's Triton kernels (the interpreter on a CPU)",
    )
)
register_backend(
    GDNBackend(
        "torch",
        "kernels.torch_gdn:causal_conv1d",
        "kernels.torch_gdn:chunk_gated_delta_rule",
        triton=False,
        about="the same chunked math in plain torch ops (kernels.torch_gdn)",
    )
)
# the peers: the project's conv kernel beside their chunked core (engines run their own conv; the
# conv is not what is compared), adapted in sim.replay.peers (which imports a peer on first use)
register_backend(
    GDNBackend(
        "fla",
        "kernels.conv:causal_conv1d",
        "sim.replay.peers:fla_chunk_gated_delta_rule",
        triton=True,
        about="FLA's chunk_gated_delta_rule (flash-linear-attention; boundary states by split calls)",
        cuda_only=True,
        check="sim.replay.peers:fla_problem",
    )
)
register_backend(
    GDNBackend(
        "flashqla",
        "kernels.conv:causal_conv1d",
        "sim.replay.peers:flashqla_chunk_gated_delta_rule",
        triton=True,
        about="QwenLM's FlashQLA (flash-qla; Hopper / Blackwell, bf16, K = V = 128; boundary states by split calls)",
        cuda_only=True,
        check="sim.replay.peers:flashqla_problem",
    )
)

#: other names ``--kernel`` accepts for a backend (issue 24 calls the project's kernels "ours")
KERNEL_ALIASES = {"ours": "triton"}


def kernel_choices() -> tuple[str, ...]:
    """What ``--kernel`` accepts: ``auto`` (the device's default), every registered backend and
    the aliases."""
    return ("auto", *GDN_BACKENDS, *KERNEL_ALIASES)


def device_problem(kernel: Optional[str], device) -> Optional[str]:
    """One line when ``kernel`` cannot run on ``device``'s kind at all (a CUDA-only peer on a CPU),
    else None; torch-free, so settings are refused before anything is loaded."""
    name = resolve_kernel(kernel, device)
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if GDN_BACKENDS[name].cuda_only and kind != "cuda":
        return (
            f"--kernel {name} needs a CUDA GPU (its kernels do not run on {kind}); use --kernel torch or triton there"
        )
    return None


def default_kernel(device) -> str:
    """The backend a device gets by default: the Triton kernels on CUDA, plain torch elsewhere
    (``device``: a torch.device or its string, e.g. "cuda:0")."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return "triton" if kind == "cuda" else "torch"


def resolve_kernel(kernel: Optional[str], device) -> str:
    """``kernel`` (None or "auto": the device's default), checked against the registry."""
    name = default_kernel(device) if kernel in (None, "auto") else KERNEL_ALIASES.get(kernel, kernel)
    if name not in GDN_BACKENDS:
        raise ValueError(f"unknown gated-delta kernel {kernel!r}; valid: {', '.join(kernel_choices())}")
    return name

"""The gated-delta backends replay can run (torch-free: the CLI lists them for ``--kernel``).

A backend is one implementation of a gated-delta layer's two calls: ``conv`` with the signature
of ``kernels.conv.causal_conv1d`` and ``core`` with that of
``kernels.chunk_gdn.chunk_gated_delta_rule`` (chunk metadata, boundary states at the metadata's
absolute 64-multiples, in-kernel gate, beta sigmoid and q/k l2norm, fp32 states). Both are
``module:function`` paths imported on first use, so choosing one backend never imports another's
dependencies (``torch`` needs no triton).

  triton  the project's Triton kernels: compiled on a CUDA GPU, Triton's interpreter on a CPU
          (TRITON_INTERPRET=1, set before triton is first imported; one program at a time: slow)
  torch   the same chunked math in plain torch ops (``kernels.torch_gdn``): a CPU's default

Other implementations of the same math (FLA's ``chunk_gated_delta_rule``, FlashQLA) plug in
through ``register_backend`` with an adapter module whose two functions take and return what the
project's kernels do.
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
# hook: register_backend(GDNBackend("fla", "sim.replay.fla_adapter:causal_conv1d", ...)) once an
# adapter maps FLA's (or FlashQLA's) calls and boundary states onto the signatures above


def kernel_choices() -> tuple[str, ...]:
    """What ``--kernel`` accepts: ``auto`` (the device's default) and every registered backend."""
    return ("auto", *GDN_BACKENDS)


def default_kernel(device) -> str:
    """The backend a device gets by default: the Triton kernels on CUDA, plain torch elsewhere
    (``device``: a torch.device or its string, e.g. "cuda:0")."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return "triton" if kind == "cuda" else "torch"


def resolve_kernel(kernel: Optional[str], device) -> str:
    """``kernel`` (None or "auto": the device's default), checked against the registry."""
    name = default_kernel(device) if kernel in (None, "auto") else kernel
    if name not in GDN_BACKENDS:
        raise ValueError(f"unknown gated-delta kernel {kernel!r}; valid: {', '.join(kernel_choices())}")
    return name

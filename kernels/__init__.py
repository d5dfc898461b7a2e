"""Triton kernels (chunked gated delta rule with chunk-boundary states, causal conv1d with
boundary conv windows, the chunked SSD of Mamba2 layers: ``chunk_ssd``), the same in plain torch
(``kernels.torch_gdn``, ``kernels.torch_ssd``: no triton, fast on a CPU), their naive reference
oracles, and ``warmup``.

    from kernels import chunk_gated_delta_rule, causal_conv1d, prepare_chunk_metadata, warmup
    from kernels import torch_chunk_gated_delta_rule, torch_causal_conv1d
    from kernels import chunk_ssd, torch_chunk_ssd

The functions need the ``kernels`` extra (torch, and triton for the Triton ones). ``import
kernels`` itself does not: the simulator imports ``kernels.cli`` without torch, so the names below
are resolved lazily and raise a one-line ImportError naming the extra only when used.
"""

from __future__ import annotations

import importlib

INSTALL_HINT = "pip install 'marconi-sim[kernels]'"

_EXPORTS = {
    "chunk_gated_delta_rule": "kernels.chunk_gdn",
    "check_args": "kernels.chunk_gdn",
    "workspace_bytes": "kernels.chunk_gdn",
    "prepare_chunk_metadata": "kernels._common",
    "ChunkMetadata": "kernels._common",
    "causal_conv1d": "kernels.conv",
    "torch_chunk_gated_delta_rule": "kernels.torch_gdn",
    "torch_causal_conv1d": "kernels.torch_gdn",
    "warmup": "kernels.warmup",
    "naive_gated_delta_rule": "kernels.reference",
    "naive_recurrent_step": "kernels.reference",
    "naive_causal_conv1d": "kernels.reference",
    "naive_gdn_gate": "kernels.reference",
    "chunk_ssd": "kernels.ssd",
    "torch_chunk_ssd": "kernels.torch_ssd",
    "naive_ssd": "kernels.ssd_reference",
}

TORCH_ONLY = {
    "kernels._common",
    "kernels.torch_gdn",
    "kernels.reference",
    "kernels.torch_ssd",
    "kernels.ssd_reference",
}  # no triton import

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] in ("torch", "triton"):
            needs = "torch" if module in TORCH_ONLY else "torch and triton"
            raise ImportError(f"kernels.{name} needs {needs}: {INSTALL_HINT}") from exc
        raise
    value = getattr(mod, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))

"""Triton kernels (chunked gated delta rule with chunk-boundary states, causal conv1d with
boundary conv windows), their plain-torch reference oracles, and ``warmup``.

    from kernels import chunk_gated_delta_rule, causal_conv1d, prepare_chunk_metadata, warmup

The functions need the ``kernels`` extra (torch, triton). ``import kernels`` itself does not:
the simulator imports ``kernels.cli`` without torch, so the names below are resolved lazily and
raise a one-line ImportError naming the extra only when used.
"""

from __future__ import annotations

import importlib

INSTALL_HINT = "pip install 'marconi-sim[kernels]'"

_EXPORTS = {
    "chunk_gated_delta_rule": "kernels.chunk_gdn",
    "check_args": "kernels.chunk_gdn",
    "prepare_chunk_metadata": "kernels._common",
    "ChunkMetadata": "kernels._common",
    "causal_conv1d": "kernels.conv",
    "warmup": "kernels.warmup",
    "naive_gated_delta_rule": "kernels.reference",
    "naive_recurrent_step": "kernels.reference",
    "naive_causal_conv1d": "kernels.reference",
    "naive_gdn_gate": "kernels.reference",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] in ("torch", "triton"):
            raise ImportError(f"kernels.{name} needs torch and triton: {INSTALL_HINT}") from exc
        raise
    value = getattr(mod, name)
    globals()[name] = value          # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))

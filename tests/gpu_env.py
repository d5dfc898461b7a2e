"""Which Triton backend the kernel and replay tests run on: compiled on a CUDA GPU, otherwise
the interpreter (``TRITON_INTERPRET=1``), which must be chosen before triton is first imported.
The root conftest skips ``gpu`` / ``gpu_long`` tests when the backend is not a compiled GPU."""

import os

try:
    import torch
except ImportError:  # torch-free test modules still run; the torch ones call importorskip
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available()


def use_interpreter_without_cuda() -> None:
    if not HAS_CUDA:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def compiled_gpu() -> bool:
    return HAS_CUDA and os.environ.get("TRITON_INTERPRET", "0") != "1"

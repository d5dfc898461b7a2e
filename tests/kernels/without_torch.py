"""Run Python code in a fresh interpreter in which ``import torch`` / ``import triton`` fail, as
on a machine with the simulator but not the ``kernels`` extra."""

import subprocess
import sys

BLOCK = (
    "import builtins\n"
    "real = builtins.__import__\n"
    "def imp(name, *a, **k):\n"
    "    if name.split('.')[0] in ('torch', 'triton'):\n"
    "        raise ImportError(name, name=name.split('.')[0])\n"
    "    return real(name, *a, **k)\n"
    "builtins.__import__ = imp\n"
)


def run_without_torch(code: str) -> str:
    """stdout of ``code`` run with torch and triton unimportable (fails on a nonzero exit)."""
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, check=True).stdout

"""Launching a compiled Triton kernel through Triton's C launcher, below its Python wrapper.

``CompiledKernel.run`` is a ``CudaLauncher``: a Python ``__call__`` that allocates the kernel's
global and profile scratch (none for our kernels), then calls the C ``launch`` function that the
launcher compiled for the kernel's signature. The wrapper costs a few microseconds a launch on a
slow host; a call of ``chunk_gated_delta_rule`` launches four kernels. ``raw_launcher`` returns a
function that calls the C ``launch`` directly with exactly the arguments ``__call__`` would pass,
for the two argument forms Triton has used:

- triton 3.6: ``launch(gx, gy, gz, stream, function, cooperative, pdl, global_scratch,
  profile_scratch, kernel_metadata, launch_metadata, enter_hook, exit_hook, *kernel_args)``
- triton 3.9: ``launch(gx, gy, gz, stream, function, cooperative, pdl, kernel_metadata,
  launch_metadata, enter_hook, exit_hook, global_scratch, profile_scratch, arg_annotations,
  kernel_signature, kernel_args)``

The form is recognised by the wrapper's signature and attributes; anything else (another form, a
kernel that needs scratch, Triton's GPU sanitizer) gets None, and the caller keeps ``ck.run``.
``tests/kernels/test_launch.py`` checks, on each installed Triton, that the raw call equals what
the wrapper passes. Launch hooks are never passed: callers take Triton's path when one is set.
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional

#: parameters of ``CudaLauncher.__call__`` (after ``self``) in each form
_FORM_36 = ("gridX", "gridY", "gridZ", "stream", "function", "args")
_FORM_39 = (
    "gridX",
    "gridY",
    "gridZ",
    "stream",
    "function",
    "kernel_metadata",
    "launch_metadata",
    "launch_enter_hook",
    "launch_exit_hook",
    "args",
)


def _form(run) -> Optional[str]:
    try:
        params = tuple(inspect.signature(type(run).__call__).parameters)[1:]
    except (TypeError, ValueError):
        return None
    if params == _FORM_36 and not hasattr(run, "arg_annotations"):
        return "3.6"
    if params == _FORM_39 and hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature"):
        return "3.9"
    return None


def raw_launcher(ck) -> Optional[Callable]:
    """``launch(gx, gy, gz, stream, args)`` for compiled kernel ``ck`` (``args``: the kernel's
    arguments in order, constexprs included, as ``ck.run`` takes them), or None where only
    ``ck.run`` can launch it."""
    run = getattr(ck, "run", None)
    c_launch = getattr(run, "launch", None)
    if c_launch is None or not all(hasattr(ck, a) for a in ("function", "packed_metadata")):
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    if getattr(run, "gsan_enabled", False):
        return None
    form = _form(run)
    fn, meta = ck.function, ck.packed_metadata
    coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    if form == "3.6":

        def launch(gx, gy, gz, stream, args):
            c_launch(gx, gy, gz, stream, fn, coop, pdl, None, None, meta, None, None, None, *args)

        return launch
    if form == "3.9":
        ann, sig = run.arg_annotations, run.kernel_signature

        def launch(gx, gy, gz, stream, args):
            c_launch(gx, gy, gz, stream, fn, coop, pdl, meta, None, None, None, None, None, ann, sig, args)

        return launch
    return None

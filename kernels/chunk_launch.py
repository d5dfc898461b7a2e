"""The launches of the chunked gated delta rule: Triton's launch path (``triton_launches``, which
compiles a specialisation), and the direct path: plans remembered from it, calls bound to their
chunk metadata, the caller's buffers.

A call's host time was ~200-500 us, most of it Triton's generic launch path run four times
(argument binding and specialisation, cache-key hashing, launch metadata), ten scratch
allocations and the argument bookkeeping. The first call of a "plan" (launch table, device,
dtypes, head counts, strides, pointer alignments: all that Triton specialises a compiled kernel
on) goes through Triton and keeps the four compiled kernels with their argument lists; later
calls of the plan (one sequence batch, metadata prepared) gather each kernel's arguments from the
per-call values (addresses, flags, scale) and the plan's fixed ones with one ``itemgetter`` and
call Triton's C launcher directly (``_launch.raw_launcher``; ``ck.run`` where its form is not
known). Scratch is one byte buffer: the kernels get addresses into it (Triton's launcher takes
an int as a pointer). ``KERNELS_LAUNCH=triton`` turns the direct path off.
"""

from __future__ import annotations

import operator
import warnings

import torch

from kernels import chunk_plan as _plan
from kernels._common import ChunkMetadata
from kernels._launch import raw_launcher
from kernels.chunk_plan import (
    _GLUON_KERNELS,
    _KERNEL_KEYS,
    _KERNELS,
    _PER_CALL,
    _PER_CALL_ORDER,
    LAUNCH_OPTIONS,
    SCRATCH_ARGS,
    _call_args,
    _config_envs,
    _gluon_solve_kernel,
    _grids,
    _kernel_fns,
    _scratch_layout,
)

#: what a bound call takes from each call, in the order ``_Bound.launch`` builds it: the addresses
#: of the inputs, the gate parameters, the outputs and states, and has_h0; then the nine scratch
#: buffers' (``SCRATCH_ARGS``)
_VARYING = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "o", "h0", "ht", "hb", "has_h0")
_SCRATCH_NAMES = frozenset(name for names in SCRATCH_ARGS for name in names)
#: the per-call arguments a bound call fixes (the metadata's addresses, scale, l2norm), in the
#: kernels' order
_BOUND_CONSTS = tuple(n for n in _PER_CALL_ORDER if n not in _VARYING and n not in _SCRATCH_NAMES)
#: each per-call argument's place among a bound call's values: ``_VARYING``, the scratch buffers
#: (a buffer's names share one place), ``_BOUND_CONSTS``; the plan's fixed values follow them
_PLACE = {
    **{name: i for i, name in enumerate(_VARYING)},
    **{name: len(_VARYING) + j for j, names in enumerate(SCRATCH_ARGS) for name in names},
    **{name: len(_VARYING) + len(SCRATCH_ARGS) + c for c, name in enumerate(_BOUND_CONSTS)},
}
_N_PLACES = len(_VARYING) + len(SCRATCH_ARGS) + len(_BOUND_CONSTS)
if set(_PLACE) != _PER_CALL:  # the kernels' signatures gained or lost a per-call argument
    raise RuntimeError(f"per-call arguments without a place, or places without one: {sorted(set(_PLACE) ^ _PER_CALL)}")


def _bound_values(named: dict) -> tuple:
    """The per-call values ``named`` (``_call_args``) in their places (``_PLACE``)."""
    return tuple(named[name] for name in (*_VARYING, *(names[0] for names in SCRATCH_ARGS), *_BOUND_CONSTS))


_PLANS: dict = {}
_MAX_PLANS = 64
_RUNTIME: list = []  # [get_current_stream, knobs.runtime], resolved on first use


def _runtime():
    if not _RUNTIME:
        from triton import knobs
        from triton.runtime.driver import driver

        _RUNTIME.extend([driver.active.get_current_stream, knobs.runtime])
    return _RUNTIME


def _hooks_active(rt) -> bool:
    """A launch hook is installed (a profiler): it wants Triton's launch metadata, so use its path."""
    enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook  # no generator: this runs every call
    return bool(getattr(enter, "calls", enter is not None)) or bool(getattr(exit_, "calls", exit_ is not None))


def _addresses(q, k, v, g, beta, h0=None, a_log=None, dt_bias=None) -> tuple:
    """The device addresses of a call's inputs (0 for None), read once: the plan key takes their
    alignment, the direct path's launches the addresses themselves."""
    return tuple(0 if t is None else t.data_ptr() for t in (q, k, v, g, beta, h0, a_log, dt_bias))


def _plan_key(lp, dev, dt, hb_dtype, H, HV, use_gate, beta_sig, q, k, v, g, beta, ptrs) -> tuple:
    """Everything the four compiled kernels of a one-batch call depend on: the launch table
    (constexprs and launch options, by identity), device, dtypes (``hb_dtype`` None: no boundary
    stores, the state loop's ``STORE_B``), head counts (Triton specialises ints on == 1 and
    divisibility by 16; the state loop takes them as constants), the strides the kernels take
    (one batch: the batch stride is never read), and the 16-byte alignment of every pointer that is not a fresh
    allocation (scratch and outputs always are): ``ptrs``, from ``_addresses``."""
    return (
        id(lp), dev.index, dt, hb_dtype, H, HV, bool(use_gate), bool(beta_sig),
        q.stride()[1:], k.stride()[1:], v.stride()[1:], g.stride()[1:], beta.stride()[1:], g.dtype, beta.dtype,
        *(p % 16 == 0 for p in ptrs),
    )  # fmt: skip


class _Plan:
    """One plan: per kernel, its launch function (``raw_launcher``, or ``ck.run`` bound to the
    kernel) and an ``itemgetter`` that picks the kernel's arguments, in its signature's order, out of
    a call's per-call values in their places (``_PLACE``) followed by the plan's fixed values
    (``fixed``)."""

    __slots__ = ("launches", "getters", "fixed", "lp")

    def __init__(self, launches, getters, fixed, lp):
        self.launches, self.getters, self.fixed, self.lp = launches, getters, fixed, lp


def _run_launch(ck):
    """``launch(gx, gy, gz, stream, args)`` through Triton's launcher wrapper ``ck.run``."""
    run, fn, meta = ck.run, ck.function, ck.packed_metadata

    def launch(gx, gy, gz, stream, args):
        run(gx, gy, gz, stream, fn, meta, None, None, None, *args)

    return launch


def _remember_plan(compiled, fns, lists, lp, key) -> None:
    if not all(hasattr(ck, "run") and hasattr(ck, "function") and hasattr(ck, "packed_metadata") for ck in compiled):
        return
    fixed, getters = [], []
    for fn, args in zip(fns, lists):
        picks = []
        for name, arg in zip(fn.arg_names, args):
            if name in _PLACE:
                picks.append(_PLACE[name])
            elif torch.is_tensor(arg):  # a buffer missing from _PER_CALL: never cache it
                return
            else:
                picks.append(_N_PLACES + len(fixed))
                fixed.append(arg)
        getters.append(operator.itemgetter(*picks))
    launches = tuple(raw_launcher(ck) or _run_launch(ck) for ck in compiled)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = _Plan(launches, tuple(getters), tuple(fixed), lp)


def triton_launches(lp, grids_of, shared: dict, triton_table) -> tuple:
    """The kernels of launch table ``lp`` launched through Triton's launch path, each with its
    arguments by name from ``shared`` (the call's per-call and layout values) and its table entry,
    on the grids ``grids_of(lp)``. Returns ``(compiled, fns, lists, lp, fallback)``: the compiled
    kernels, the kernels and argument lists that ran, the table that ran, and whether a Gluon kernel
    failed to compile (a Triton whose Gluon API differs from the one these kernels were written
    for): then the process never tries Gluon again, and the call runs again from its first kernel on
    ``triton_table()`` (no Gluon kernels), so that it has the bits of every later call (a Gluon solve
    that ran before a failed Gluon loop would not: its A differs in the last place); every kernel
    writes only scratch and outputs, so what ran is overwritten. The output runs after the loop
    (``OVL`` 0)."""
    fns = _kernel_fns(lp)
    compiled, lists = [], []
    grids = grids_of(lp)
    fallback = False
    i = 0
    while i < len(fns):  # where a Gluon kernel falls back, the table changes and i restarts
        fn, grid, name = fns[i], grids[i], _KERNEL_KEYS[i]
        i += 1
        vals = {**shared, **lp[name]}
        opts = {key: val for key, val in lp[name].items() if key in LAUNCH_OPTIONS}
        args = [vals[n] for n in fn.arg_names]
        try:
            ck = fn[grid](*args, **opts)
        except Exception as exc:  # noqa: BLE001 - any compile error of a Gluon kernel: fall back
            if fn not in _GLUON_KERNELS:
                raise
            first = (str(exc).strip().splitlines() or [""])[-1]
            what = "solve" if fn is _gluon_solve_kernel else "state loop"
            warnings.warn(  # at the caller of chunk_gated_delta_rule
                f"the Gluon {what} did not compile ({type(exc).__name__}: {first}); using the Triton kernels",
                stacklevel=4,
            )
            _plan._GLUON_FAILED.append(exc)
            lp, fns, fallback = triton_table(), _KERNELS, True
            grids, compiled, lists, i = grids_of(lp), [], [], 0
            continue
        lists.append(args)
        compiled.append(ck)
    return compiled, fns, lists, lp, fallback


#: byte alignment of a caller's ``workspace`` on a GPU (the scratch layout aligns every tensor to it)
WORKSPACE_ALIGN = 256


def workspace_bytes(q, v, chunk_metadata: ChunkMetadata) -> int:
    """Bytes of scratch one call of ``chunk_gated_delta_rule`` on these inputs and metadata uses:
    the least ``numel`` of a ``workspace`` (uint8) that a caller keeps and passes to every call, so
    that a call allocates no scratch of its own."""
    B, T = q.shape[0], q.shape[1]
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    return _scratch_layout(B * T, chunk_metadata.num_chunks, HV, K, V, q.element_size())[1]


def _device_index(dev) -> int:
    """``Tensor.get_device()`` of a tensor on ``dev`` (-1 on a CPU)."""
    return -1 if dev.type == "cpu" else dev.index


def _workspace_align(dev) -> int:
    """The byte alignment a caller's workspace needs: a GPU's allocations are 512-byte aligned, a
    CPU's (the interpreter's) 64."""
    return WORKSPACE_ALIGN if dev.type == "cuda" else 16


def _fits(t, shape, dtype, index: int, align: int) -> bool:
    """Whether a caller's buffer can be written as is: ``shape``, ``dtype``, on the device of
    ``Tensor.get_device()`` ``index``, contiguous, its address ``align``-byte aligned (the compiled
    kernels take outputs and scratch as aligned fresh allocations). The one rule of both paths:
    ``_given`` says what is wrong where it fails, the bound call falls back to it."""
    return (
        t.shape == shape
        and t.dtype == dtype
        and t.get_device() == index
        and t.is_contiguous()
        and not t.data_ptr() % align
    )


def _given(name: str, t, shape: tuple, dtype, dev, align: int = 16):
    """A caller's preallocated buffer, checked (``_fits``); one-line ValueError naming it."""
    if _fits(t, shape, dtype, _device_index(dev), align):
        return t
    if t.shape != shape or t.dtype != dtype or t.device != dev:
        raise ValueError(f"{name} must be {shape} {dtype} on {dev}, got {tuple(t.shape)} {t.dtype} on {t.device}")
    if not t.is_contiguous() or t.data_ptr() % align:
        raise ValueError(f"{name} must be contiguous and {align}-byte aligned (a fresh allocation is)")
    return t


def _buffers(
    out, final_state_out, boundary_out, workspace, *, B, T, N, NB, HV, K, V, dt, state_dtype, store_b, dev, nbytes
):
    """``(o [B*T, HV, V], ht, hb or None, scratch uint8 [nbytes])``: the caller's buffers where
    given (checked: ``out`` [B, T, HV, V] in the inputs' dtype, ``final_state_out`` [N, HV, K, V]
    fp32, ``boundary_out`` [NB, HV, K, V] in ``state_dtype``, ``workspace`` uint8 of at least
    ``nbytes``), fresh allocations otherwise."""
    if out is None:
        o = torch.empty(B * T, HV, V, dtype=dt, device=dev)
    else:
        o = _given("out", out, (B, T, HV, V), dt, dev).view(B * T, HV, V)
    if final_state_out is None:
        ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    else:
        ht = _given("final_state_out", final_state_out, (N, HV, K, V), torch.float32, dev)
    hb = None
    if store_b:
        if boundary_out is None:
            hb = torch.empty(NB, HV, K, V, dtype=state_dtype, device=dev)
        else:
            hb = _given("boundary_out", boundary_out, (NB, HV, K, V), state_dtype, dev)
    if workspace is None:
        return o, ht, hb, torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if workspace.dim() != 1 or workspace.numel() < nbytes:
        raise ValueError(
            f"workspace must be 1-d uint8 with at least {nbytes} elements (kernels.workspace_bytes), "
            f"got {tuple(workspace.shape)}"
        )
    return o, ht, hb, _given("workspace", workspace, tuple(workspace.shape), torch.uint8, dev, _workspace_align(dev))


def _fp32_vector(x, dev) -> bool:
    return x is not None and x.dtype == torch.float32 and x.is_contiguous() and x.device == dev


def _direct_call(
    q, k, v, g, beta, scale, initial_state, store_b, state_dtype, meta, l2norm, lp, gate, beta_sig, given,
    input_precision=None,
):  # fmt: skip
    """The call on a remembered plan, launched directly; None where no plan applies. ``gate``:
    (A_log, dt_bias) fp32 for the in-kernel gate, or None; ``given``: the caller's buffers
    (out, final_state_out, boundary_out, workspace; each None or a tensor); ``lp``: the launch
    table for this call's shapes and ``input_precision``. Binds the call to ``meta``
    (``_Bound``) so that the next call of this layout on it skips the launch table and plan key."""
    H, HV = q.shape[2], v.shape[2]
    dt, dev = q.dtype, q.device
    # None: the state loop compiled without boundary stores (``STORE_B``)
    hb_dtype = state_dtype if store_b and meta.num_boundaries > 0 else None
    a_log, dt_bias = gate if gate is not None else (None, None)
    # every address read once: the plan key's alignments and the launches' arguments (Triton's
    # launcher takes an int as is; a tensor costs it a data_ptr call and a driver query per kernel)
    ptrs = _addresses(q, k, v, g, beta, initial_state, a_log, dt_bias)
    key = _plan_key(lp, dev, dt, hb_dtype, H, HV, gate is not None, beta_sig, q, k, v, g, beta, ptrs)
    plan = _PLANS.get(key)
    rt = _runtime()
    if plan is None or plan.lp is not lp or _hooks_active(rt[1]):
        return None
    options = _bound_key(scale, l2norm, store_b, state_dtype, gate is not None, beta_sig, dt, input_precision)
    bound = _Bound(plan, options, q, k, v, g, beta, scale, store_b, state_dtype, meta, l2norm)
    if all(p % 16 == 0 for p in ptrs):  # the bound check takes every pointer as aligned
        meta.calls[options] = bound
    return bound.launch(rt, ptrs, initial_state is not None, given)


def _bound_key(scale: float, l2norm: int, store_b: bool, state_dtype, use_gate: bool, beta_sig: bool, dtype,
               input_precision) -> tuple:  # fmt: skip
    """The key of a bound call in ``ChunkMetadata.calls``: the call's options and everything that
    picks its launch table besides what the bound call checks itself (shapes, device): the
    inputs' dtype, the fp32 precision, the ``KERNELS_CONFIG_*`` values now, and whether a Gluon
    compile has failed in this process (the table then has no Gluon kernels). A few hundred
    nanoseconds, where building the table and the plan key costs a call several microseconds."""
    return (
        scale, l2norm, store_b, state_dtype, use_gate, beta_sig, dtype, input_precision, _config_envs(),
        bool(_plan._GLUON_FAILED),
    )  # fmt: skip


class _Bound:
    """A call layout bound to one chunk metadata (``ChunkMetadata.calls``, keyed by
    ``_bound_key``): the plan, grids, scratch layout and launch values fixed for every call of
    this layout on the metadata, as a model step's layers make them. ``run`` checks that a call
    has the bound layout (shapes, strides, dtypes, device, aligned addresses: with the key,
    everything the launch table and plan key hold) and launches it; None sends the call to the
    full path instead."""

    __slots__ = (
        "plan", "lp", "options", "layout", "dtypes", "dev", "index", "h0_shape", "grids", "nbytes", "out_shapes",
        "state_dtype", "store_b", "store", "scratch_offs", "fd_off", "tail", "empties", "ws_align",
    )  # fmt: skip

    def __init__(self, plan, options, q, k, v, g, beta, scale, store_b, state_dtype, meta, l2norm):
        self.plan, self.lp, self.options = plan, plan.lp, options
        self._bind_layout(q, k, v, g, beta, store_b, state_dtype, meta)
        self.grids = _grids(self.lp, meta.num_seqs, meta.num_chunks, v.shape[2], v.shape[3])
        # the per-call values this binding fixes (``_BOUND_CONSTS``), then the plan's own
        named = _call_args(
            **dict.fromkeys(_VARYING), scratch=(None,) * len(SCRATCH_ARGS), chunk_info=meta.chunk_info.data_ptr(),
            seq_info=meta.seq_info.data_ptr(), store_slot=meta.store_slot.data_ptr(), scale=scale, l2norm=l2norm,
        )  # fmt: skip
        self.tail = tuple(named[name] for name in _BOUND_CONSTS) + plan.fixed

    def _bind_layout(self, q, k, v, g, beta, store_b, state_dtype, meta) -> None:
        """What ``run``, ``outputs`` and ``values`` read: the call's layout, outputs and scratch."""
        _, T, _, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        N, NT = meta.num_seqs, meta.num_chunks
        self.dtypes = (q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype)
        self.dev = q.device
        self.index = q.get_device()  # -1 on a CPU (the stand-in tests), the CUDA index otherwise
        self.ws_align = _workspace_align(self.dev)
        # what ``run`` compares a call's inputs with, in one tuple: shapes, strides, dtypes, devices
        self.layout = (
            q.shape, k.shape, v.shape, g.shape, beta.shape, q.stride(), k.stride(), v.stride(), g.stride(),
            beta.stride(), *self.dtypes, *(self.index,) * 5,
        )  # fmt: skip
        self.h0_shape = (N, HV, K, V)
        offs, self.nbytes = _scratch_layout(T, NT, HV, K, V, q.element_size())
        # the scratch tensors' offsets (``SCRATCH_ARGS``' order), and the chunk-end factors' (the
        # stand-in for absent gate parameters: any fp32 buffer, never read)
        self.scratch_offs, self.fd_off = offs, offs[5]
        self.out_shapes = ((1, T, HV, V), (N, HV, K, V), (meta.num_boundaries, HV, K, V))
        # ``store_b``: the call returns boundary states; ``store``: it has any to store
        self.state_dtype, self.store_b, self.store = state_dtype, store_b, store_b and meta.num_boundaries > 0
        # empty tensors of the outputs' and the scratch's dtypes on the device: ``new_empty`` of
        # one allocates without parsing a dtype and a device (H200 host: 3.1 us a tensor against
        # 4.9 for ``torch.empty(shape, dtype=, device=)``, medians of 15 runs; the CPU shows no
        # difference)
        self.empties = tuple(
            torch.empty(0, dtype=t, device=self.dev) for t in (q.dtype, torch.float32, state_dtype, torch.uint8)
        )

    def run(self, q, k, v, g, beta, initial_state, gate, given):
        """The call if it has the bound layout (launched; ``(o, ht, hb)``), else None."""
        if (
            q.shape, k.shape, v.shape, g.shape, beta.shape, q.stride(), k.stride(), v.stride(), g.stride(),
            beta.stride(), q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype, q.get_device(), k.get_device(),
            v.get_device(), g.get_device(), beta.get_device(),
        ) != self.layout:  # fmt: skip
            return None
        h0 = 0
        if initial_state is not None:
            if not (
                initial_state.dtype == torch.float32
                and initial_state.is_contiguous()
                and initial_state.get_device() == self.index
                and initial_state.shape == self.h0_shape
            ):
                return None
            h0 = initial_state.data_ptr()
        a, d = 0, 0
        if gate is not None:
            a_log, dt_bias, index = gate[0], gate[1], self.index
            if not (
                a_log is not None
                and dt_bias is not None
                and a_log.dtype == dt_bias.dtype == torch.float32
                and a_log.is_contiguous()
                and dt_bias.is_contiguous()
                and a_log.get_device() == dt_bias.get_device() == index
            ):
                return None
            a, d = a_log.data_ptr(), dt_bias.data_ptr()
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), h0, a, d)
        rt = _runtime()
        if (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | h0 | a | d) & 15 or _hooks_active(rt[1]):
            return None
        return self.launch(rt, ptrs, initial_state is not None, given)

    def _given(self, given) -> tuple:
        """The caller's four buffers where all are given and fit this layout (``_fits``), else
        four Nones (``_buffers`` then allocates the missing ones, or says in one line what is
        wrong with one)."""
        out, final_state_out, boundary_out, workspace = given
        index, (o_shape, ht_shape, hb_shape) = self.index, self.out_shapes
        if (
            out is not None
            and final_state_out is not None
            and workspace is not None
            and _fits(out, o_shape, self.dtypes[0], index, 16)
            and _fits(final_state_out, ht_shape, torch.float32, index, 16)
            and workspace.dim() == 1
            and workspace.numel() >= self.nbytes
            and _fits(workspace, workspace.shape, torch.uint8, index, self.ws_align)
        ):
            if not self.store_b:
                return out, final_state_out, None, workspace
            if boundary_out is not None and _fits(boundary_out, hb_shape, self.state_dtype, index, 16):
                return out, final_state_out, boundary_out, workspace
        return None, None, None, None

    def launch(self, rt, ptrs, has_h0: bool, given):
        """Allocate (or check the caller's buffers), then the plan's launches on the current
        stream. ``ptrs``: the addresses of q, k, v, g, beta, the initial state, A_log, dt_bias
        (0: absent)."""
        o, ht, hb, scratch = self.outputs(given)
        # ``scratch`` lives until the launches are issued: no allocation (another thread's on this
        # stream) can take its block before them
        stream = rt[0](self.dev.index)
        vals = self.values(ptrs, has_h0, o, ht, hb, scratch) + self.tail
        plan = self.plan
        for launch, grid, getter in zip(plan.launches, self.grids, plan.getters):
            launch(*grid, stream, getter(vals))
        return o, ht, hb

    def values(self, ptrs, has_h0: bool, o, ht, hb, scratch) -> tuple:
        """The call's values in their places (``_PLACE``): ``_VARYING``, then the scratch buffers."""
        base = scratch.data_ptr()
        ht_ptr = ht.data_ptr()
        fd = base + self.fd_off
        return (
            ptrs[:5]
            + ((ptrs[6], ptrs[7]) if ptrs[6] else (fd, fd))
            + (o.data_ptr(), ptrs[5] or ht_ptr, ht_ptr, hb.data_ptr() if self.store else ht_ptr, int(has_h0))
            + tuple(map(base.__add__, self.scratch_offs))
        )

    def outputs(self, given) -> tuple:
        """``(o, ht, hb, scratch)``: fresh, or the caller's buffers (checked)."""
        dev, (o_shape, ht_shape, hb_shape) = self.dev, self.out_shapes
        if given is None:  # the common call: ``_buffers``'s fresh allocations, without its call and checks
            e_o, e_f32, e_state, e_u8 = self.empties
            o = e_o.new_empty(o_shape)
            ht = e_f32.new_empty(ht_shape)
            hb = e_state.new_empty(hb_shape) if self.store_b else None
            scratch = e_u8.new_empty(self.nbytes)
        else:
            o, ht, hb, scratch = self._given(given)
        if o is None:
            o, ht, hb, scratch = _buffers(
                *given, B=1, T=o_shape[1], N=ht_shape[0], NB=hb_shape[0], HV=o_shape[2], K=ht_shape[2],
                V=o_shape[3], dt=self.dtypes[0], state_dtype=self.state_dtype, store_b=self.store_b, dev=dev,
                nbytes=self.nbytes,
            )  # fmt: skip
            o = given[0] if given[0] is not None else o.view(o_shape)
        return o, ht, hb, scratch

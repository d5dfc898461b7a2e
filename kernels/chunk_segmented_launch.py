"""The segmented state pass's calls bound to their chunk metadata: a plain call at graphed speed.

The segmented pass (``kernels.chunk_segmented``) launches six kernels (solve, w / u, the segment
pass, the combine, the state loop over the segments, the output) and gathers the final states.
Through Triton's launch path that cost 430-920 us of host time a call on the H200 host (session
10, ``benchmarks/results/2026-12-05-gpu-s10-h200/kernel-host-profile.txt``), where the serial
loop's bound call costs 40-100 us: at 4/8 heads and 8K tokens a plain call took 0.375 ms against
0.200 graphed.

So, as the serial loop's direct path does (``kernels.chunk_launch``), the first segmented call of
a layout on a metadata goes through Triton's path and, where the direct path applies (compiled
kernels on a GPU, one sequence batch, the inputs' own strides, 16-byte aligned addresses), binds
itself to the metadata (``ChunkMetadata.calls``, under ``bound_key``): the compiled kernels with
their C launchers, the grids, each kernel's arguments picked (one ``itemgetter``) out of the call's
values in their places (``PLACE``) and the values the binding fixes (constexprs, the metadata's
and the segment tables' addresses, scale, ``has_h0`` of the loop over the segments), the passes'
buffer layout. A later call of the layout on that metadata checks its layout (the serial binding's
``_Bound.run``), allocates its outputs, scratch and the passes' buffers, issues the six launches
and one ``index_select``: no launch table, no segment tables, no plan key, no host sync and no
per-call chunk or segment index computed on the host.
"""

from __future__ import annotations

import operator

import torch

from kernels import chunk_launch as _cl
from kernels.chunk_plan import SCRATCH_ARGS
from kernels.chunk_segmented import pass_layout

#: the values a segmented binding takes from each call, in the order ``SegmentedBound.launch``
#: builds them: the serial binding's (``chunk_launch._VARYING``, then the scratch buffers), then
#: the passes' buffers (the segments' zero-start end states, transitions, entering states, end states)
PASS_BUFFERS = ("Z", "P", "sin", "seg_ht")
PLACE = {
    **{name: i for i, name in enumerate(_cl._VARYING)},
    **{name: len(_cl._VARYING) + j for j, names in enumerate(SCRATCH_ARGS) for name in names},
    **{name: len(_cl._VARYING) + len(SCRATCH_ARGS) + i for i, name in enumerate(PASS_BUFFERS)},
}
N_PLACES = len(_cl._VARYING) + len(SCRATCH_ARGS) + len(PASS_BUFFERS)
#: the loop over the segments reads its initial states from ``sin`` and writes the segments' end
#: states (its ``has_h0`` is 1 whatever the call's: a fixed value)
STATE_PLACES = {**PLACE, "h0": PLACE["sin"], "ht": PLACE["seg_ht"]}
del STATE_PLACES["has_h0"]

#: bindings made (``bind`` returned one): what a test counts to see a second call not re-plan
BINDINGS = [0]


def bound_key(state_segments, options: tuple) -> tuple:
    """The key of a segmented binding in ``ChunkMetadata.calls``: ``state_segments`` as the call
    gave it (None: ``KERNELS_CONFIG_STATE``'s, which ``options`` holds) and the serial binding's
    key (``chunk_launch._bound_key``); never equal to a serial binding's key."""
    return ("segmented", state_segments, *options)


def make_launcher(ck):
    """``launch(gx, gy, gz, stream, args)`` for a compiled kernel, or None (the interpreter's
    launches return no compiled kernel: no binding)."""
    if not all(hasattr(ck, a) for a in ("run", "function", "packed_metadata")):
        return None
    return _cl.raw_launcher(ck) or _cl._run_launch(ck)


class SegmentedBound(_cl._Bound):
    """A segmented call layout bound to one chunk metadata (``_Bound``'s layout check, outputs
    and values; ``launch`` issues the segmented pass's launches)."""

    __slots__ = ("launches", "getters", "fixed", "pass_offs", "pass_nbytes", "seg_ht_shape", "last", "tables")

    def __init__(self, options, launches, grids, getters, fixed, tables, q, k, v, g, beta, store_b, state_dtype, meta):
        self.plan, self.lp, self.options = None, None, options
        self._bind_layout(q, k, v, g, beta, store_b, state_dtype, meta)
        HV, K, V = v.shape[2], q.shape[3], v.shape[3]
        self.launches, self.grids, self.getters, self.fixed = launches, grids, getters, fixed
        self.pass_offs, self.pass_nbytes = pass_layout(tables.num, HV, K, V)
        self.seg_ht_shape = (tables.num, HV, K, V)
        self.tables, self.last = tables, tables.last  # the tables' addresses are in ``fixed``: kept alive
        self.tail = ()

    def launch(self, rt, ptrs, has_h0: bool, given):
        o, ht, hb, scratch = self.outputs(given)
        e_f32, e_u8 = self.empties[1], self.empties[3]
        passes = e_u8.new_empty(self.pass_nbytes)
        seg_ht = e_f32.new_empty(self.seg_ht_shape)
        vals = (
            self.values(ptrs, has_h0, o, ht, hb, scratch)
            + tuple(map(passes.data_ptr().__add__, self.pass_offs))
            + (seg_ht.data_ptr(),)
            + self.fixed
        )
        stream = rt[0](self.dev.index)
        for launch, grid, getter in zip(self.launches, self.grids, self.getters):
            launch(*grid, stream, getter(vals))
        if self.h0_shape[0]:
            torch.index_select(seg_ht, 0, self.last, out=ht)
        return o, ht, hb


def bind(record, tables, meta, options, q, k, v, g, beta, store_b, state_dtype):
    """A ``SegmentedBound`` of the segmented call that ran as ``record`` (``chunk_segmented.launches``'
    records) on ``meta`` and ``tables``, or None where one cannot be made: a kernel without a C
    launcher (the interpreter), or a tensor argument that is neither a per-call buffer nor one of
    the metadata's or the segment tables' (those stay fixed)."""
    fixed_tensors = {
        id(t): t for t in (meta.chunk_info, meta.seq_info, meta.store_slot, tables.info, tables.chunk, tables.seq_segs)
    }
    fixed, getters, launches, grids = [], [], [], []
    for role, fn, grid, args, ck in record:
        places = STATE_PLACES if role == "state" else PLACE
        picks = []
        for name, arg in zip(fn.arg_names, args):
            place = places.get(name)
            if place is not None:
                picks.append(place)
                continue
            if torch.is_tensor(arg):
                if id(arg) not in fixed_tensors:
                    return None
                arg = arg.data_ptr()
            picks.append(N_PLACES + len(fixed))
            fixed.append(arg)
        launch = make_launcher(ck)
        if launch is None:
            return None
        getters.append(operator.itemgetter(*picks))
        launches.append(launch)
        grids.append(grid)
    BINDINGS[0] += 1
    return SegmentedBound(
        options, tuple(launches), tuple(grids), tuple(getters), tuple(fixed), tables, q, k, v, g, beta, store_b,
        state_dtype, meta,
    )  # fmt: skip


__all__ = ["bind", "bound_key", "SegmentedBound"]

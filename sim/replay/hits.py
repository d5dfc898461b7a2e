"""The checks of every hit replay restores (``sim.replay.checks`` holds the measures). Needs torch.

``HitChecker`` is the ``Replayer``'s collaborator for correctness: at a lookup, the bookkeeping
check (the stored position and prefix hash, the KV pages' keys, against the prompt), the
integrity check (a slot written whole; with ``exact`` validation the restored bits against the
produced ones) and the restore; after the suffix prefill, the numerical check against one
unsplit from-scratch prefill (``validate``, timed: the request's ``full`` time), judged by
``judge`` (which the batched replay calls too, on its batched references). It owns the failures
and the counts of hits, integrity checks and KV hits validated.
"""

from __future__ import annotations

from typing import Optional

import torch

from sim.replay.checks import VALIDATE_MODES, Failure, rel_error, rel_error_t, state_error, tolerance_for
from sim.replay.flight import Flight
from sim.replay.model import CHUNK, HybridModel, Marks, StackState
from sim.replay.store import CheckpointStore
from sim.replay.tokens import page_keys, prefix_hash


def check_boundary(hit: int) -> int:
    """The kernel boundary a hit's from-scratch reference stops at (the chunk multiple at or below
    the hit): its state there is carried to the hit and compared with the restored one."""
    return hit // CHUNK * CHUNK


def reference_bounds(hit: int) -> list:
    """The from-scratch reference's kernel boundaries: the check's boundary, none at 0."""
    b = check_boundary(hit)
    return [b] if b > 0 else []


def output_groups(layers, rows: int, hidden: int, budget: Optional[int]) -> list:
    """``layers`` (mixer layer indices) in the groups a hit's check holds the suffix outputs of at
    once: one group where every layer's ``rows`` fp32 rows of width ``hidden`` fit ``budget``
    bytes (None: no bound), else consecutive groups of as many layers as fit, one at least
    (``HitChecker.compare_rest`` runs the suffix and the reference again for each)."""
    layers = list(layers)
    per = rows * hidden * 4
    if budget is None or per * len(layers) <= budget:
        return [layers] if layers else []
    k = max(1, budget // max(per, 1))
    return [layers[i : i + k] for i in range(0, len(layers), k)]


class SuffixOutputs:
    """A hit's suffix outputs (``outs[layer]``: rows of positions ``[hit, end)``; None for a
    layer not held now), compared with a from-scratch run's layer by layer as that run makes them
    (``compare``): each layer's pair is measured (``rel_error``, on the device: no sync inside the
    timed call) and let go, so neither side holds layers x suffix rows at once (issue 41: 34 GB a
    side for an 87K-token suffix at qwen3-next-80b-a3b's 48 layers). A layer not held is left for
    a later group (``hold``, ``missing``). ``error()``: the worst over the layers, once every
    layer was compared exactly once."""

    def __init__(self, outs: list, hit: int) -> None:
        self.outs = list(outs)
        self.hit = hit
        self._err = None
        self.done = [False] * len(self.outs)

    @property
    def compared(self) -> int:
        return sum(self.done)

    def missing(self) -> list:
        """The layers compared with nothing yet and not held."""
        return [l for l, (o, d) in enumerate(zip(self.outs, self.done)) if o is None and not d]

    def hold(self, outs: list) -> None:
        """Take one group's suffix outputs (``outs[layer]``, None for the others)."""
        for l, o in enumerate(outs):
            if o is not None:
                if self.done[l] or self.outs[l] is not None:
                    raise RuntimeError(f"layer {l}'s suffix outputs held twice")
                self.outs[l] = o

    def compare(self, layer: int, ref_rows: torch.Tensor) -> None:
        """Layer ``layer``'s suffix outputs against ``ref_rows`` (the reference's rows of the
        same positions), where they are held; the suffix's tensor is released."""
        o = self.outs[layer]
        if o is None:
            return
        self.outs[layer] = None
        e = rel_error_t(o, ref_rows)
        self._err = e if self._err is None else torch.maximum(self._err, e)
        self.done[layer] = True

    def error(self) -> float:
        if not all(self.done):
            raise RuntimeError(f"{self.compared} of {len(self.outs)} layers' outputs compared")
        return 0.0 if self._err is None else float(self._err)


class HitChecker:
    """Checks ``model``'s restores from ``store`` (the ``Replayer``'s arguments of the same
    names: ``validate``, ``validate_every``, ``tolerance``, ``check_hash``); ``clock`` times the
    from-scratch references. ``output_bytes``: the device bytes a check may hold of a suffix's
    per-layer outputs at once (None: no bound; a callable: of the call's tokens, asked per check,
    as replay on a GPU asks what is free there); a hit whose outputs exceed it is compared in groups
    of layers (``output_groups``): the timed calls hold the first group, and the suffix and the
    reference run again, untimed, for each other group (``compare_rest``)."""

    def __init__(
        self,
        model: HybridModel,
        store: CheckpointStore,
        clock,
        *,
        validate: str = "exact",
        validate_every: int = 1,
        tolerance: Optional[float] = None,
        check_hash: bool = True,
        output_bytes=None,
    ) -> None:
        if validate_every < 1:
            raise ValueError("validate_every must be >= 1")
        if validate not in VALIDATE_MODES:
            raise ValueError(f"validate must be one of {', '.join(VALIDATE_MODES)}, not {validate!r}")
        self.mode = validate
        self.exact = validate != "tolerance"
        if self.exact:
            if len(store):
                raise ValueError("exact validation needs a store that digests from its first write")
            store.digests = True
        self.model = model
        self.store = store
        self.clock = clock
        self.validate_every = validate_every
        # (recurrent states, outputs + conv windows); one number given applies to both
        self.tolerance = (tolerance, tolerance) if tolerance is not None else tolerance_for(model.dtype)
        self.check_hash = check_hash
        if isinstance(output_bytes, int) and output_bytes < 1:
            raise ValueError("output_bytes must be >= 1 (None: no bound)")
        self.output_bytes = output_bytes
        self.grouped = 0  # checks whose outputs were compared in groups of layers
        self.failures: list[Failure] = []
        self.hits = 0
        self.kv_hits_validated = 0
        self.integrity_checked = 0

    def fail(self, kind, f: Flight, checkpoint, stored, hit, detail) -> None:
        f.record.failed = True
        self.failures.append(Failure(kind, f.rid, int(checkpoint), int(stored), int(hit), detail))

    def groups(self, f: Flight, end: int, layers=None) -> list:
        """``output_groups`` of a check of ``f``'s suffix ``[f.hit, end)`` (``layers``: those
        still to compare; None: every mixer layer)."""
        s = self.model.shape
        budget = self.output_bytes(end) if callable(self.output_bytes) else self.output_bytes
        return output_groups(range(len(s.order)) if layers is None else layers, end - f.hit, s.hidden, budget)

    def keeps(self, f: Flight, end: int):
        """What ``f``'s timed suffix call to ``end`` keeps for its check: True (every layer's
        outputs) where they fit ``output_bytes``, else the first group's layers."""
        g = self.groups(f, end)
        return True if len(g) <= 1 else g[0]

    def compare_rest(self, f: Flight, suffix: SuffixOutputs, end: int, cuts=()) -> None:
        """The layers of ``suffix`` the timed calls did not compare (``SuffixOutputs.missing``),
        group by group (``groups``): the suffix ``[f.hit, end)`` again from the restored state
        ``f.start`` (split at ``cuts``, positions inside it, as the timed call was; its states to
        no one), holding the group's outputs, then the from-scratch reference of ``[0, end)``
        again, comparing them as it makes them; both untimed. Nothing to do where every layer
        was compared."""
        rest = suffix.missing()
        if not rest:
            return
        self.grouped += 1
        groups = self.groups(f, end, rest)
        f.record.output_groups = (suffix.compared > 0) + len(groups)  # the timed calls' group, if any
        model = self.model
        tok = f.ids(model.device)[:end]
        none = lambda *a: None  # noqa: E731 (the states go to no one)

        def compare(layer, x, start):
            suffix.compare(layer, x[f.hit :])

        for group in groups:
            _, outs, _ = model.run(tok[f.hit :], f.start, f.hit, cuts, none, keep_outputs=group, keep_from=f.hit)
            suffix.hold(outs)
            del outs
            model.run(tok, None, 0, reference_bounds(f.hit), none, on_output=compare)

    def restore(self, f: Flight, checkpoint: int) -> bool:
        """A hit of ``f`` on ``checkpoint`` (its producer has run): count it, check its
        bookkeeping and integrity and restore its state into ``f`` (chosen for the numerical
        check every ``validate_every``-th hit). False: a check failed, ``f`` runs from scratch."""
        rec = f.record
        self.hits += 1
        store = self.store
        if checkpoint not in store:
            self.fail("missing", f, checkpoint, -1, rec.hit_tokens, "not in the store")
            return False
        info = store.info(checkpoint)
        p = rec.hit_tokens
        if self.check_hash:
            want = prefix_hash(f.tokens, p) if p <= len(f.tokens) else b""
            if info.position != p or info.prefix_hash != want:
                self.fail(
                    "hash",
                    f,
                    checkpoint,
                    info.position,
                    p,
                    "position differs" if info.position != p else "prefix hash differs",
                )
                return False
            if store.has_kv and store.page_keys_of(checkpoint) != page_keys(f.tokens, p, store.page_tokens):
                self.fail("kv-hash", f, checkpoint, info.position, p, "KV page keys differ from the prompt's prefix")
                return False
        if not info.filled:  # a partly written slot is never restored (any mode)
            missing = [f"layer {i}" for i in store.unwritten(checkpoint)]
            if not info.kv_written and store.has_kv:
                missing.append("KV")
            self.fail("integrity", f, checkpoint, info.position, p, "never written: " + ", ".join(missing))
            return False
        validate = (self.hits - 1) % self.validate_every == 0
        start = store.restore(checkpoint)
        if validate and self.exact:
            bad = store.verify(checkpoint, start)
            self.integrity_checked += 1
            rec.integrity_checked = True
            if bad:
                kind = "kv-integrity" if all(b.startswith("KV") for b in bad) else "integrity"
                more = f" (+{len(bad) - 8} more)" if len(bad) > 8 else ""
                self.fail(
                    kind,
                    f,
                    checkpoint,
                    info.position,
                    p,
                    "restored bits differ from the produced ones: " + ", ".join(bad[:8]) + more,
                )
                return False
        f.start = start
        f.hit = f.pos = p
        f.checkpoint = int(checkpoint)
        rec.restored = True
        f.validate = validate
        if not validate:
            rec.unvalidated = "validate-every"
        return True

    def restore_again(self, f: Flight) -> Optional[StackState]:
        """A parked flight's hit restored again (its state was given back while it waited);
        None (and a failure) when the checkpoint left the store meanwhile."""
        cp = f.checkpoint
        if cp not in self.store or self.store.info(cp).position != f.hit:
            f.start = None
            f.hit = f.pos = 0
            f.record.restored = False
            self.fail("missing", f, cp, -1, f.record.hit_tokens, "left the store while its request waited")
            return None
        f.start = self.store.restore(cp)
        if self.exact and self.store.verify(cp, f.start):
            self.fail("integrity", f, cp, f.hit, f.hit, "restored bits changed while its request waited")
        return f.start

    def validate(self, f: Flight, outs, cuts=()) -> None:
        """Restore + suffix prefill (already run, ``outs``: its per-layer outputs, ``cuts``: where
        it was split) against one unsplit from-scratch prefill of the whole prompt (timed: the
        request's ``full`` time): every layer's final recurrent and conv state and every layer's
        suffix outputs (in groups of layers where they do not fit at once: ``compare_rest``). The
        restored state itself is compared with the reference's state at the hit (its boundary
        state at the 64-multiple below the hit, carried to the hit by a short untimed call when
        the hit is not 64-aligned): a per-head RMS norm after the core and decay along the suffix
        can hide a small state error from the outputs, never from the state."""
        rec = f.record
        model = self.model
        tok = f.ids(model.device)
        L = model.shape.layers
        at_b: dict = {}
        b = check_boundary(f.hit)

        def capture(p, layer, r, c):
            at_b[layer] = (r.clone(), c.clone())

        suffix = SuffixOutputs(outs, f.hit)

        def compare(layer, x, start):
            if start != 0 or x.shape[0] != f.n_in:  # one unsplit call ([b]: a kernel boundary)
                raise RuntimeError("the from-scratch reference ran split")
            suffix.compare(layer, x[f.hit :])

        marks = Marks(model.device)
        t0 = self.clock.start(kind="reference")  # its own sleep window: not the suffix calls'
        bounds = reference_bounds(f.hit)
        ref, _, _ = model.run(  # each layer's suffix rows compared as they come, none kept
            tok[: f.n_in], None, 0, bounds, capture, marks=marks, on_output=compare
        )
        h = self.clock.stop(t0)
        f.times.full = h
        f.times.full_marks = marks
        rec.full_segments = [(0, f.n_in)]
        rec.validated = True
        kv_b = ref.kv[:, :, :b] if ref.kv is not None else None
        base = (
            StackState(
                b,
                torch.stack([at_b[i][0] for i in range(L)]) if L else ref.rec,
                torch.stack([at_b[i][1] for i in range(L)]) if L else ref.conv,
                kv_b,
            )
            if b > 0
            else None
        )
        if f.hit > b:
            base, _, _ = model.run(tok[b : f.hit], base, b)
        ref_kv = ref.kv[:, :, : f.hit] if ref.kv is not None else None
        # the layers the timed calls did not hold (outputs over ``output_bytes``), group by group
        self.compare_rest(f, suffix, f.n_in, cuts)
        self.judge(f, f.running, suffix.error(), ref, base, ref_kv)
        # its host issue outran its sleep, or (the check synced: no wait) it stalled outside its layers
        if self.clock.outran(h) or self.clock.stalled(h, marks):
            # timed again once the check has let the first call's results go: one reference's
            # activations, states and KV in memory at a time
            del ref, base, ref_kv, kv_b
            at_b.clear()
            f.times.full, f.times.full_marks = self._retime_reference(f, tok, bounds, h)

    def time_reference(self, f: Flight, tok) -> tuple:
        """The hit's from-scratch reference timed once more (``--saved-timing alternate``): the
        whole prompt in one call with the check's boundary (the 64-multiple below the hit), behind
        a sleep of its kind, nothing captured or compared. Returns ``(handle, marks)``."""
        marks = Marks(self.model.device)
        t0 = self.clock.start(kind="reference")
        self._unchecked(f, tok, reference_bounds(f.hit), marks)
        return self.clock.stop(t0), marks

    def _unchecked(self, f: Flight, tok, bounds: list, marks: Marks) -> None:
        """The hit's from-scratch reference run for its time alone: the whole prompt in one call
        with the check's boundaries, nothing captured or compared, its states handed to no one."""
        self.model.run(tok[: f.n_in], None, 0, bounds, lambda *a: None, marks=marks)

    def _retime_reference(self, f: Flight, tok, bounds: list, first):
        """The reference's host issue outran the sleep queued ahead of it (``Stopwatch.outran``,
        as a suffix call's can: ``Replayer._retime``), or it stalled outside its layers
        (``Stopwatch.stalled``): its device time may hold a gap that a from-scratch prefill does
        not cost, and the time saved would be measured high.
        Run it again, after the hit's check (the same tokens and boundary ``bounds``, nothing captured or
        compared, its states handed to no one), behind a sleep of its kind with the first call's
        issue taken out of the window; the second time is the request's ``full`` time, the first kept in
        ``f.times.full_first``. Returns ``(handle, marks)`` of the second call."""
        marks = Marks(self.model.device)
        h = self.clock.again(first, lambda: self._unchecked(f, tok, bounds, marks))
        f.times.full_first = first
        return h, marks

    def judge(self, f: Flight, end, e_out: float, ref_end, base, ref_kv) -> None:
        """The hit's check once both sides ran: the end state (``end`` against the from-scratch
        ``ref_end``), the suffix's per-layer outputs (``e_out``: their worst error against the
        reference's rows of the same positions, ``SuffixOutputs``), the restored state against
        ``base`` (the reference's state at the hit) and the restored KV against ``ref_kv``; a
        miss is a failure."""
        rec = f.record
        L = self.model.shape.layers
        e_rec, e_conv = state_error(end.rec, end.conv, ref_end.rec, ref_end.conv) if L else (0.0, 0.0)
        a, c = state_error(f.start.rec, f.start.conv, base.rec, base.conv) if L else (0.0, 0.0)
        e_rec, e_conv = max(e_rec, a), max(e_conv, c)
        # the restored keys and values against the from-scratch prefill's, every layer and head
        e_kv = rel_error(f.start.kv, ref_kv) if ref_kv is not None else 0.0
        rec.judged(e_rec, e_conv, e_out, e_kv, ref_kv is not None)
        if ref_kv is not None:
            self.kv_hits_validated += 1
        tol_state, tol_out = self.tolerance
        if not (e_rec <= tol_state and max(e_conv, e_out, e_kv) <= tol_out):
            kind = "kv-numerics" if e_kv > tol_out and e_rec <= tol_state and e_conv <= tol_out else "numerics"
            self.fail(
                kind,
                f,
                rec.hit_checkpoint,
                f.start.pos,
                f.hit,
                f"relative error recurrent {e_rec:.3g} (tolerance {tol_state:.3g}), conv "
                f"{e_conv:.3g}, KV {e_kv:.3g}, outputs {e_out:.3g} (tolerance {tol_out:.3g})",
            )

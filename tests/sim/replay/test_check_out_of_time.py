"""A hit check's work is not timed as the from-scratch reference's (session 26).

The reference prefill of a validated hit compares each layer's outputs with the suffix's as it
makes them (``on_output``), inside its timed call. That work was timed as the next layer's: on
the H200's Mooncake rows a resumed gated-delta or Mamba2 layer looked 4-6 % cheaper a token than
its reference and the measured time saved was twice the skipped layers' time (the compare costs
~13 ns a token and layer at qwen3-next-80b-a3b's width; the MLPs, before which nothing is
compared, matched). Now the check has its own bucket (``CHECK``) in the call's marks and is taken
out of the reference's ``full_ms``; the per-type times the timing fit reads hold none of it.

Also here: the marks of a call split into several ``forward_segment`` pieces keep each label on
its own interval (the second piece's ``start`` shifted every later label by one and dropped the
last interval).
"""

import time
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim.replay import model as model_mod  # noqa: E402
from sim.replay.flight import PendingTimes, checked_out  # noqa: E402
from sim.replay.model import HybridModel, Marks, ReplayShape  # noqa: E402
from sim.replay.records import CHECK, RequestRecord  # noqa: E402
from sim.replay.runner import Replayer  # noqa: E402
from sim.replay.store import CheckpointStore  # noqa: E402

SHAPE = ReplayShape(
    hidden=32, layers=2, k_heads=1, v_heads=2, head_k_dim=16, head_v_dim=16, conv_width=4, vocab_rows=512,
    attn_layers=1, attn_heads=2, attn_kv_heads=1, attn_head_dim=16, mlp_inter=48,
)  # fmt: skip
rng = np.random.default_rng(26)
P0, O0, U1 = rng.integers(0, 10_000, 100), rng.integers(0, 10_000, 30), rng.integers(0, 10_000, 40)
REQS = {
    0: (np.concatenate([P0, O0]), 100),
    1: (np.concatenate([P0, O0, U1]), 170),
    2: (rng.integers(0, 10_000, 70), 60),  # a miss, batched beside request 1's suffix
}
#: the compare's stand-in cost a layer (s): far above a tiny layer's time on a CPU
SLOW = 0.25


@pytest.fixture
def slow_compare(monkeypatch):
    """Each hit check's per-layer compare sleeps ``SLOW`` first (a stand-in for its GPU work)."""
    from sim.replay import hits

    real = hits.SuffixOutputs.compare

    def slow(self, layer, rows):
        time.sleep(SLOW)
        return real(self, layer, rows)

    monkeypatch.setattr(hits.SuffixOutputs, "compare", slow)


def _ticks(monkeypatch, values):
    it = iter(values)
    monkeypatch.setattr(model_mod, "timestamp", lambda cuda: next(it))


def test_marks_of_a_split_call_keep_each_label_on_its_own_interval(monkeypatch):
    # piece 1: start 0, a at 1, b at 3; piece 2: start at 6 (the gap 3 -> 6 is "other"), c at 10
    _ticks(monkeypatch, [0.0, 1.0, 3.0, 6.0, 10.0])
    m = Marks(torch.device("cpu"))
    m.start()
    m.mark("attention")
    m.mark("mlp")
    m.start()
    m.mark("gated_delta")
    ms = m.ms_by_type()
    assert ms == {"attention": 1e3, "mlp": 2e3, "other": 3e3, "gated_delta": 4e3, CHECK: 0.0}
    assert sum(ms.values()) == 10e3  # the whole span, the last interval included


def test_the_check_bucket_is_its_own():
    _ticks_marks = Marks(torch.device("cpu"))
    _ticks_marks.start()
    time.sleep(0.001)
    _ticks_marks.mark(CHECK)
    by = _ticks_marks.ms_by_type()
    assert by[CHECK] > 0 and by["other"] == 0.0


@pytest.mark.parametrize("by, want", [(None, 9.0), ({}, 9.0), ({"mlp": 1.0}, 9.0), ({CHECK: 2.5}, 6.5)])
def test_checked_out_takes_the_check_bucket_out(by, want):
    assert checked_out(9.0, by) == want


def test_resolving_takes_the_check_out_of_the_reference_and_the_suffix():
    clock = SimpleNamespace(
        ms=lambda h: h[0], host_ms=lambda h: h[1], slack_ms=lambda h: h[2], sleep_ms=lambda h: 10 * h[0]
    )
    plain = SimpleNamespace(ms_by_type=lambda: {"gated_delta": 1.0, CHECK: 0.0})
    checked = SimpleNamespace(ms_by_type=lambda: {"gated_delta": 5.0, CHECK: 2.0})
    t = PendingTimes(suffix=(4.0, 1.0, 0.5), suffix_marks=checked, full=(9.0, 7.0, 2.0), full_marks=checked)
    r = RequestRecord(request=1, input_tokens=170, output_tokens=5)
    t.resolve(r, clock)
    assert (r.suffix_ms, r.full_ms, r.full_host_ms) == (2.0, 7.0, 7.0)
    assert r.full_ms_by_type[CHECK] == 2.0
    t = PendingTimes(full=(9.0, 7.0, 2.0), full_marks=plain)
    t.resolve(r, clock)
    assert r.full_ms == 9.0


@pytest.mark.parametrize("kernel", ["torch"])
def test_a_slow_compare_lands_in_the_check_bucket_not_in_the_reference(slow_compare, kernel):
    """A validated hit's reference with a compare that sleeps ``SLOW`` a layer: the sleeps are its
    ``full_ms_check`` (each layer's, 3 here), every layer type's time and ``full_ms`` hold none."""
    model = HybridModel(SHAPE, device="cpu", dtype=torch.float32, seed=3, kernel=kernel)
    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r])
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 100)
    rp.admit(3, 0, 100, "prompt end")
    rp.decode(0)
    rp.admit(4, 0, 130, "tail")
    rp.lookup(1, 4, 130)
    rp.decode(1)
    rp.finish()
    r = rp.records[1]
    assert rp.failures == [] and r.validated
    n = len(model.shape.order)
    by = r.full_ms_by_type
    rest = sum(v for k, v in by.items() if k != CHECK)  # the prefill's own buckets
    assert by[CHECK] >= n * SLOW * 1e3
    # the reference's time is its own buckets' (the sleeps would add n x SLOW; a loaded CPU's
    # layers may take long, so no absolute bound)
    assert rest - 0.5 * SLOW * 1e3 < r.full_ms < rest + 0.5 * SLOW * 1e3


def test_a_batched_references_check_is_out_of_its_time(slow_compare):
    """Batched replay (``--batch``): the reference call that checks queued hits takes its
    compares out of its logged ``ms`` the same way (its marks' ``CHECK`` bucket)."""
    model = HybridModel(SHAPE, device="cpu", dtype=torch.float32, seed=3, kernel="torch")
    store = CheckpointStore(SHAPE, model.dtype, device="cpu", page_tokens=16)
    rp = Replayer(model, store, lambda r: REQS[r], batch=8, eager=False)
    rp.lookup(0, None, 0)
    rp.prefill(0, 0, 100)
    rp.decode(0)
    rp.admit(4, 0, 130, "tail")
    rp.lookup(1, 4, 130)
    rp.prefill(1, 130, 170)
    rp.decode(1)
    rp.lookup(2, None, 0)
    rp.prefill(2, 0, 60)
    rp.decode(2)
    rp.finish()
    assert rp.failures == [] and rp.records[1].validated
    (ref,) = [c for c in rp.batch_log if c.kind == "reference"]
    n = len(model.shape.order)
    by = ref.marks.ms_by_type()
    rest = sum(v for k, v in by.items() if k != CHECK)
    assert by[CHECK] >= n * SLOW * 1e3 and rest - 0.5 * SLOW * 1e3 < ref.ms < rest + 0.5 * SLOW * 1e3
    # the batch that ran request 1's suffix beside request 2 kept request 1's rows for the check
    # (copied out of each layer's output): those copies are the call's check bucket, out of its ms
    (sfx,) = [c for c in rp.batch_log if c.kind == "suffix" and (130, 170) in c.segments]
    assert sfx.segments == [(130, 170), (0, 60)]
    assert sfx.marks is not None and sfx.marks.ms_by_type()[CHECK] > 0 and sfx.ms > 0
    # the host's issue time resolved beside (mutation run, session 26: its line dropped survived)
    assert ref.host_ms > 0 and sfx.host_ms > 0

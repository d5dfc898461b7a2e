"""The metrics recorder: the occupancy series keeps a uniform stride and its span when it halves."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import SimConfig
from sim.engine import metrics
from sim.simulate import build
from traces.base import Request, Trace


@pytest.mark.parametrize("samples", [10, 4 * 2000, 9 * 2000 + 7])
def test_occupancy_series_keeps_every_stride_th_sample(samples):
    sim = build(Trace("one", [Request(0, 0, np.arange(10), np.arange(10, 12))]), SimConfig())
    for k in range(samples):
        sim.rec.occupancy(float(k), 10 * k, 20 * k)
    occ = sim.rec.result(sim.trace, sim.tree, "marconi").occupancy
    t = occ["t_s"].to_numpy()
    stride = 1
    while samples > (2 * metrics._OCCUPANCY_POINTS - 1) * stride:  # halvings so far
        stride *= 2
    assert t[0] == 0 and np.all(np.diff(t) == stride)  # uniform: samples 0, s, 2s, ...
    assert t[-1] > samples - 1 - stride  # the span reaches the last stride
    assert len(t) < 2 * metrics._OCCUPANCY_POINTS
    assert list(occ["kv_bytes"]) == list(10 * t) and list(occ["state_bytes"]) == list(20 * t)

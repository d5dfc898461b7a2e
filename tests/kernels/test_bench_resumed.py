"""``benchmarks/kernel_bench.py --resumed``: its rows are the calls they are named for (the
replay's resumed gated-delta layers run 11-21 % slower per chunk than from scratch on the H100 and
H200; these rows tell whether the kernel is where). Run on the interpreter at a toy shape."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels import chunk_gated_delta_rule, prepare_chunk_metadata  # noqa: E402
from test_chunk_gdn import close, make_inputs  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_resumed_rows_are_the_calls_they_name(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    bench = __import__("kernel_bench")
    try:
        T = 128
        q, k, v, g, beta = make_inputs(T, h=1, hv=2, dk=16, dv=16, seed=3)
        fns = bench.resumed_calls(torch, chunk_gated_delta_rule, prepare_chunk_metadata, q, k, v, g, beta)
        assert list(fns) == ["h0", "start512", "resumed", "resumed-nostates"]
        o0, s0, b0 = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)  # from scratch, at 0
        oh, sh, bh = fns["h0"]()
        os_, ss, bs = fns["start512"]()
        orr, sr, br = fns["resumed"]()
        on, sn, bn = fns["resumed-nostates"]()
        # the initial state is used (and is a real state's scale: it moves the output) ...
        assert (oh - o0).abs().max() > 1e-3
        # ... a chunk-aligned start moves nothing but where the boundaries are numbered
        close(os_, o0)
        close(ss, s0)
        close(orr, oh)
        close(sr, sh)
        # states at every 64-token boundary of the call in both layouts, none without
        assert b0.shape[0] == bs.shape[0] == br.shape[0] == T // 64  # the end, a 64-multiple, too
        close(br, bh)
        assert bn is None
        close(on, orr)
        close(sn, sr)
        assert bench.RESUME_AT % 64 == 0
        # where each starts and what it starts from
        metas = {n: f.keywords["chunk_metadata"] for n, f in fns.items()}
        assert [metas[n].start_positions for n in fns] == [[0], [512], [512], [512]]
        assert metas["resumed"].boundary_positions == [[576, 640]]
        assert fns["h0"].keywords["initial_state"] is fns["resumed"].keywords["initial_state"]
        assert fns["start512"].keywords["initial_state"] is None
    finally:
        sys.modules.pop("kernel_bench", None)

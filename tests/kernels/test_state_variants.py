"""State-loop variants selected by the state launch config, against the per-token fp32 oracle and
the default kernel: the state held as 64-row blocks (``KSPLIT=1``, ``_state_kernel_split``) and
the 1-d grid with a head's V blocks adjacent (``VFAST=1``).

Head dims where the split applies (padded K of 128 or 256: two or four blocks), a K that is not a
power of two (masked last block), K != V both ways, varlen with initial states and boundary states.
Interpreter, fp32, atol = rtol = 1e-5 as in test_chunk_gdn.py.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels import chunk_gdn  # noqa: E402
from kernels.chunk_gdn import chunk_gated_delta_rule  # noqa: E402
from kernels.reference import naive_gated_delta_rule  # noqa: E402
from test_chunk_gdn import close, make_inputs, rand_state  # noqa: E402


@pytest.mark.parametrize(
    "dk,dv",
    [(128, 32), (100, 16), (256, 16), (128, 128)],
)
def test_split_state_matches_oracle_and_one_tile_kernel(dk, dv, monkeypatch):
    cu = [0, 70, 200]
    q, k, v, g, beta = make_inputs(200, h=1, hv=2, dk=dk, dv=dv, seed=dk + dv)
    h0 = rand_state(2, hv=2, dk=dk, dv=dv, seed=3)
    monkeypatch.setenv("KERNELS_CONFIG_STATE", "KSPLIT=1")
    assert chunk_gdn.launch_params(dk, dv, torch.float32)[chunk_gdn.STATE_KERNEL] == "_state_kernel_split"
    o, ht, hb = chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, start_positions=[0, 30], use_qk_l2norm=True
    )
    monkeypatch.delenv("KERNELS_CONFIG_STATE")
    assert chunk_gdn.launch_params(dk, dv, torch.float32)[chunk_gdn.STATE_KERNEL] == "_state_kernel"
    o1, ht1, hb1 = chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, start_positions=[0, 30], use_qk_l2norm=True
    )
    close(o, o1)
    close(ht, ht1)
    close(hb, hb1)
    for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        ro, rf, _, _ = naive_gated_delta_rule(
            q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], initial_state=h0[n : n + 1], use_qk_l2norm=True
        )
        close(o[:, a:b], ro)
        close(ht[n], rf[0])


def test_split_applies_only_above_64(monkeypatch):
    monkeypatch.setenv("KERNELS_CONFIG_STATE", "KSPLIT=1")
    assert chunk_gdn.launch_params(64, 64, torch.float32)[chunk_gdn.STATE_KERNEL] == "_state_kernel"
    assert "KSPLIT" not in chunk_gdn.launch_params(128, 64, torch.float32)["state"]


@pytest.mark.parametrize("cfg", ["VFAST=1", "VFAST=1,BV=32", "VFAST=1,KSPLIT=1"])
def test_vfast_grid_matches_default(cfg, monkeypatch):
    cu = [0, 70, 200]
    q, k, v, g, beta = make_inputs(200, h=1, hv=2, dk=128, dv=64, seed=9)
    h0 = rand_state(2, hv=2, dk=128, dv=64, seed=4)
    kw = dict(initial_state=h0, cu_seqlens=cu, start_positions=[0, 30], use_qk_l2norm=True)
    ref = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    monkeypatch.setenv("KERNELS_CONFIG_STATE", cfg)
    got = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    for a, b in zip(got, ref):
        close(a, b)

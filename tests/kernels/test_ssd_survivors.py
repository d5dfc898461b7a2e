"""Mutation survivors of ``kernels.ssd`` (session 17, ``benchmarks/mutation.py -m ssd --seed 17``
and ``--changed-since 7c1ba78``): the launch configuration's choice ("half-ovl" where the output
runs beside the loop, ``maxnreg`` only where set), whether a device overlaps (``_overlaps``), and
the output kernel's C tile masked to the state's width where the state dim is not a power of two
(a C or B that is a slice of a wider projection: its columns past N must not be read)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import kernels.ssd as ssd  # noqa: E402
from kernels.ssd import SSD_CONFIGS, chunk_ssd  # noqa: E402

COMPAT = pytest.mark.triton_compat


def test_the_overlapped_loop_config_only_for_16_bit_state_loops_that_overlap(monkeypatch):
    monkeypatch.delenv("KERNELS_CONFIG_SSD_STATE", raising=False)
    monkeypatch.delenv("KERNELS_CONFIG_SSD_OUT", raising=False)
    state = SSD_CONFIGS["state"]
    assert ssd._config("state", False) == state["half"]  # overlaps defaults to False
    assert ssd._config("state", False, True) == state["half-ovl"]
    assert ssd._config("state", False, True)["OVL"] == 1 and state["half"]["OVL"] == 0
    assert ssd._config("state", True, True) == state["fp32"]  # fp32 never overlaps
    assert ssd._config("out", False, True) == SSD_CONFIGS["out"]["half"]  # the output has no "half-ovl"
    assert ssd._config("out", True, True) == SSD_CONFIGS["out"]["fp32"]
    assert all("maxnreg" not in ssd._config(k, f) for k in ("state", "out") for f in (False, True))


def test_maxnreg_is_passed_only_where_the_environment_sets_it(monkeypatch):
    monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", "maxnreg=128,num_stages=2")
    cfg = ssd._config("state", False, True)
    assert cfg == dict(SSD_CONFIGS["state"]["half-ovl"], num_stages=2, maxnreg=128)
    monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", "maxnreg=0")  # 0: no cap, not a cap of 0
    assert ssd._config("state", False) == SSD_CONFIGS["state"]["half"]
    monkeypatch.setenv("KERNELS_CONFIG_SSD_OUT", "maxnreg=96")
    assert ssd._config("out", True)["maxnreg"] == 96
    monkeypatch.setenv("KERNELS_CONFIG_SSD_OUT", "maxreg=96")
    with pytest.raises(ValueError, match="unknown key 'maxreg'"):
        ssd._config("out", True)


def test_the_output_overlaps_on_compute_capability_9_on_and_never_in_the_interpreter(monkeypatch):
    caps = {0: (9, 0), 1: (8, 9), 2: (10, 0)}
    monkeypatch.setattr(ssd, "_capability", lambda index: caps[index])
    monkeypatch.setattr(ssd, "INTERPRET", False)
    cuda = [ssd._overlaps(torch.device("cuda", i)) for i in range(3)]
    assert cuda == [True, False, True]
    assert not ssd._overlaps(torch.device("cpu"))
    monkeypatch.setattr(ssd, "INTERPRET", True)
    assert not ssd._overlaps(torch.device("cuda", 0))


def test_the_capability_is_the_devices_and_asked_once(monkeypatch):
    asked = []

    def cap(index):
        asked.append(index)
        return (9, 0)

    monkeypatch.setattr(torch.cuda, "get_device_capability", cap)
    ssd._capability.cache_clear()
    try:
        assert ssd._capability(3) == (9, 0) and ssd._capability(3) == (9, 0)
        assert asked == [3]
    finally:
        ssd._capability.cache_clear()


@COMPAT
@pytest.mark.parametrize("N", [40, 48])
def test_b_and_c_sliced_from_a_wider_projection_read_only_their_state_dim(N):
    """B and C as the first N columns of a 64-wide tensor (unit-strided, so passed as they are)
    whose other columns are NaN: the kernels' tiles are a power of two wide (64) and must mask
    the columns past N, so the outputs and states are the contiguous inputs' bits."""
    gen = torch.Generator().manual_seed(17)
    H, P, G, T = 2, 32, 2, 150
    x = torch.randn(1, T, H, P, generator=gen)
    dt = torch.randn(1, T, H, generator=gen) - 1.0
    A = -torch.rand(H, generator=gen) * 4 - 1
    B = torch.randn(1, T, G, N, generator=gen) / N**0.5
    C = torch.randn(1, T, G, N, generator=gen)
    D = torch.randn(H, generator=gen)

    def padded(t):
        wide = torch.full((*t.shape[:-1], 64), float("nan"))
        wide[..., :N] = t
        view = wide[..., :N]
        assert view.stride(-1) == 1 and not view.is_contiguous()
        return view

    h0 = 0.5 * torch.randn(1, H, P, N, generator=gen)
    kw = dict(D=D, initial_state=h0, start_positions=[5])
    want = chunk_ssd(x, dt, A, B, C, **kw)
    got = chunk_ssd(x, dt, A, padded(B), padded(C), **kw)
    assert all(torch.isfinite(t).all() for t in got)
    assert all(torch.equal(a, b) for a, b in zip(want, got))

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


class _Launches:
    """A kernel stand-in recording each launch's grid, arguments and options (nothing runs)."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def __getitem__(self, grid):
        return lambda *args, **kw: self.log.append((self.name, grid, args, kw))


KERNELS = ("_ssd_prep_kernel", "_ssd_state_kernel", "_ssd_output_kernel")


def _launches(monkeypatch, overlaps: bool, dtype, env: str = "", out_env: str = ""):
    """chunk_ssd's launches (prep, state loop, output) for 3 sequences of 70, 130 and 64 tokens,
    4 heads of 128 (two P blocks of 64 in the loop and in the output) and a state dim of 64, on a
    device whose ``_overlaps`` is ``overlaps``."""
    if env:
        monkeypatch.setenv("KERNELS_CONFIG_SSD_STATE", env)
    else:
        monkeypatch.delenv("KERNELS_CONFIG_SSD_STATE", raising=False)
    if out_env:
        monkeypatch.setenv("KERNELS_CONFIG_SSD_OUT", out_env)
    else:
        monkeypatch.delenv("KERNELS_CONFIG_SSD_OUT", raising=False)
    monkeypatch.setattr(ssd, "_overlaps", lambda dev: overlaps)
    log: list = []
    for name in KERNELS:
        monkeypatch.setattr(ssd, name, _Launches(log, name))
    gen = torch.Generator().manual_seed(5)
    T, H, P, N = 264, 4, 128, 64
    x = torch.randn(1, T, H, P, generator=gen).to(dtype)
    dt = torch.randn(1, T, H, generator=gen).to(dtype)
    B = torch.randn(1, T, 1, N, generator=gen).to(dtype)
    chunk_ssd(x, dt, -torch.ones(H), B, B.clone(), cu_seqlens=[0, 70, 200, 264])
    return {name: (grid, args, kw) for name, grid, args, kw in log}


def test_the_overlapped_output_is_launched_beside_the_loop_with_its_progress_counters(monkeypatch):
    """On a device that overlaps (Hopper on; here ``_overlaps`` patched: the kernels never run),
    16-bit inputs: the loop's "half-ovl" config (P blocks of 64, a release every 4 chunks), one
    int32 progress counter per (sequence, head, loop program) handed to all three kernels, the
    output on a 1-d grid of chunks x heads x P blocks launched programmatically dependent
    (``launch_pdl``). The GPU test checks the bits (tests/kernels/test_ssd.py
    ``test_gpu_overlapped_output_gives_the_plain_bits``); this one the host's launch."""
    got = _launches(monkeypatch, True, torch.float16)
    (pgrid, pargs, pkw), (sgrid, _, skw), (ogrid, _, okw) = (got[k] for k in KERNELS)
    NT = 2 + 3 + 1  # chunks: 70 tokens -> 2, 130 -> 3, 64 -> 1
    assert pgrid == (NT, 4)
    prog = pargs[7]
    assert prog.dtype == torch.int32 and prog.numel() == 3 * 4 * 2
    assert (pkw["OVL"], pkw["NPS"]) == (True, 2)
    assert sgrid == (3, 4, 2) and skw["prog"] is prog
    assert (skw["OVL"], skw["SIG"], skw["NPS"], skw["BP"], skw["num_stages"]) == (True, 4, 2, 64, 3)
    assert ogrid == (NT * 4 * 2, 1, 1) and okw["prog"] is prog and okw["launch_pdl"] is True
    assert (okw["OVL"], okw["NPS"], okw["NPO"]) == (True, 2, 2)
    # a release every chunk asked as 0 is every chunk (1), not a division by 0
    assert _launches(monkeypatch, True, torch.float16, "SIG=0")["_ssd_state_kernel"][2]["SIG"] == 1


@pytest.mark.parametrize("overlaps, dtype", [(False, torch.float16), (True, torch.float32)])
def test_without_the_overlap_the_output_runs_after_the_loop_on_its_3d_grid(monkeypatch, overlaps, dtype):
    """A device that cannot overlap, or fp32 inputs (no "half-ovl"): no counters (the final-state
    buffer stands in as the argument), the output's (chunks, heads, P blocks) grid, launched plainly."""
    got = _launches(monkeypatch, overlaps, dtype)
    _, sargs, skw = got["_ssd_state_kernel"]
    ogrid, _, okw = got["_ssd_output_kernel"]
    assert skw["OVL"] is False and skw["prog"] is sargs[12]  # ht
    assert ogrid == (2 + 3 + 1, 4, 128 // okw["BP"])  # chunks, heads, P blocks of the output's config
    assert okw["OVL"] is False and "launch_pdl" not in okw and okw["prog"] is sargs[12]


def test_discard_applies_on_a_gpu_to_whole_copies_of_whole_lines(monkeypatch):
    """``DISCARD``'s host gate (``_discarded_lines``, mutation survivors of session 18: the kernel
    side only runs on a GPU): the line count of one chunk-start copy where one output program reads
    a whole copy of a power-of-two count of whole 128-byte lines on a compiled CUDA GPU of compute
    capability 8.0 on; 0 elsewhere."""
    monkeypatch.setattr(ssd, "INTERPRET", False)
    monkeypatch.setattr(ssd, "_capability", lambda index: (9, 0))
    gpu = torch.device("cuda", 0)
    assert ssd._discarded_lines(gpu, 1, 64 * 128 * 2) == 128  # Mamba2's 64 x 128 bf16 copy
    assert type(ssd._discarded_lines(gpu, 1, 64 * 128 * 2)) is int  # a constexpr of tl.arange
    assert ssd._discarded_lines(gpu, 1, 128) == 1
    assert ssd._discarded_lines(gpu, 2, 64 * 128 * 2) == 0  # two readers of a copy
    assert ssd._discarded_lines(torch.device("cpu"), 1, 64 * 128 * 2) == 0
    assert ssd._discarded_lines(gpu, 1, 48 * 40 * 2) == 0  # 30 lines: not a power of two
    assert ssd._discarded_lines(gpu, 1, 128 * 128 + 64) == 0  # 128 whole lines and a part one
    assert ssd._discarded_lines(gpu, 1, 64) == 0
    monkeypatch.setattr(ssd, "_capability", lambda index: (7, 5))
    assert ssd._discarded_lines(gpu, 1, 64 * 128 * 2) == 0  # no discard.global.L2 before sm_80
    monkeypatch.setattr(ssd, "_capability", lambda index: (8, 0))
    assert ssd._discarded_lines(gpu, 1, 64 * 128 * 2) == 128
    monkeypatch.setattr(ssd, "INTERPRET", True)
    assert ssd._discarded_lines(gpu, 1, 64 * 128 * 2) == 0


def test_discard_reaches_the_output_launch_with_its_line_count(monkeypatch):
    """``KERNELS_CONFIG_SSD_OUT=DISCARD=1``: the launcher asks ``_discarded_lines`` about one
    chunk-start copy (P x N in the input dtype, the output's P blocks) and launches the output with
    ``DISCARD`` and the line count it gives (one line included); not asked, or 0 lines: off."""
    seen = []
    monkeypatch.setattr(ssd, "_discarded_lines", lambda dev, npo, nbytes: seen.append((npo, nbytes)) or 1)
    okw = _launches(monkeypatch, True, torch.float16, out_env="DISCARD=1")["_ssd_output_kernel"][2]
    assert seen == [(2, 128 * 64 * 2)] and okw["DISCARD"] is True and okw["LINES"] == 1
    seen.clear()
    okw = _launches(monkeypatch, True, torch.float16)["_ssd_output_kernel"][2]
    assert seen == [] and okw["DISCARD"] is False and okw["LINES"] == 1
    monkeypatch.setattr(ssd, "_discarded_lines", lambda dev, npo, nbytes: 0)
    okw = _launches(monkeypatch, False, torch.float16, out_env="DISCARD=1")["_ssd_output_kernel"][2]
    assert okw["DISCARD"] is False and okw["LINES"] == 1

"""Causal conv1d kernel vs the F.conv1d oracle: outputs, final conv state, boundary windows.

CPU tests run under TRITON_INTERPRET=1 in fp32. Tolerance atol = rtol = 1e-5: a 4-tap fp32 dot
product differs from F.conv1d only by summation order (~1e-7 observed). The windows are copies
of inputs and must match exactly.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.triton_compat  # `make test` runs this module on the newest Triton too

from kernels.conv import causal_conv1d  # noqa: E402
from kernels.reference import naive_causal_conv1d  # noqa: E402


def rnd(gen, *shape):
    return torch.randn(*shape, generator=gen)


def close(a, b):
    torch.testing.assert_close(a.float(), b.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130, 200])
def test_single_sequence(T):
    gen = torch.Generator().manual_seed(T)
    D = 40
    x, w, b = rnd(gen, 1, T, D), rnd(gen, D, 4), rnd(gen, D)
    y, cf, cb = causal_conv1d(x, w, b)
    ry, rcf, rcb, pos = naive_causal_conv1d(x, w, b)
    close(y, ry)
    assert torch.equal(cf, rcf) and torch.equal(cb, rcb)
    assert cb.shape == (T // 64, D, 3) and pos == [[64 * (i + 1) for i in range(T // 64)]]


def test_varlen_with_state_ragged_starts_no_activation():
    gen = torch.Generator().manual_seed(1)
    D, cu, starts = 72, [0, 2, 70, 71, 200], [0, 62, 5, 100]
    x, w = rnd(gen, 1, 200, D), rnd(gen, D, 4)
    cs = rnd(gen, 4, D, 3)
    y, cf, cb = causal_conv1d(x, w, conv_state=cs, cu_seqlens=cu, start_positions=starts, activation=None)
    ry, rcf, rcb, pos = naive_causal_conv1d(x, w, conv_state=cs, cu_seqlens=cu, start_positions=starts, activation=None)
    # the 2-token sequence ends inside its incoming state window: part of the final state and
    # of the window at boundary 64 of sequence 1 come from the incoming conv state
    assert pos == [[], [64, 128], [], [128, 192]]
    close(y, ry)
    assert torch.equal(cf, rcf) and torch.equal(cb, rcb)


def test_windows_restore_the_conv():
    """Resuming at a boundary with its window as conv state reproduces the suffix exactly."""
    gen = torch.Generator().manual_seed(2)
    D, T = 24, 200
    x, w, b = rnd(gen, 1, T, D), rnd(gen, D, 4), rnd(gen, D)
    y, cf, cb = causal_conv1d(x, w, b)
    for i, p in enumerate((64, 128, 192)):
        y2, cf2, cb2 = causal_conv1d(x[:, p:], w, b, conv_state=cb[i : i + 1], start_positions=[p])
        assert torch.equal(y2, y[:, p:]) and torch.equal(cf2, cf)
        assert torch.equal(cb2, cb[i + 1 :])


def test_strided_input_stride_and_empty_sequence():
    gen = torch.Generator().manual_seed(3)
    D = 32
    big = rnd(gen, 1, 130, 3 * D)
    x = big[..., D : 2 * D]  # a view into a fused projection
    w = rnd(gen, D, 4)
    cs = rnd(gen, 3, D, 3)
    cu = [0, 60, 60, 130]  # the middle sequence is empty
    y, cf, cb = causal_conv1d(x, w, conv_state=cs, cu_seqlens=cu, boundary_stride=2)
    ry, rcf, _, _ = naive_causal_conv1d(x, w, conv_state=cs, cu_seqlens=cu)
    close(y, ry)
    assert torch.equal(cf, rcf)  # the empty sequence keeps its incoming state
    assert cb.shape[0] == 0  # boundary 64 of seq 2 is odd: stride 2 skips it
    with pytest.raises(ValueError):
        causal_conv1d(x, w[:, :1])


def test_empty_sequence_without_a_state_ends_at_zeros():
    """An empty sequence of a call without incoming conv states: its final state is W - 1 zeros a
    channel, the shape every other sequence's has (mutation run, session 24: the zeros' width
    survived)."""
    gen = torch.Generator().manual_seed(4)
    D = 32
    x = rnd(gen, 1, 90, D)
    w = rnd(gen, D, 4)
    y, cf, _ = causal_conv1d(x, w, cu_seqlens=[0, 40, 40, 90])
    _, rcf, _, _ = naive_causal_conv1d(x, w, cu_seqlens=[0, 40, 40, 90])
    assert cf.shape == (3, D, 3)
    assert torch.equal(cf[1], torch.zeros(D, 3, dtype=cf.dtype))
    assert torch.equal(cf, rcf)


def test_noncontiguous_conv_state_is_read_by_its_strides():
    """A conv state that is a view (a transposed [N, W-1, D] buffer, as an engine's state pool may
    hold it) gives the same outputs and states as its contiguous copy and the reference."""
    gen = torch.Generator().manual_seed(4)
    D = 32
    x, w = rnd(gen, 1, 100, D), rnd(gen, D, 4)
    cs = rnd(gen, 2, 3, D).transpose(1, 2)  # [2, D, 3], not contiguous
    assert not cs.is_contiguous()
    cu = [0, 40, 100]
    y, cf, cb = causal_conv1d(x, w, conv_state=cs, cu_seqlens=cu, start_positions=[10, 30])
    y2, cf2, cb2 = causal_conv1d(x, w, conv_state=cs.contiguous(), cu_seqlens=cu, start_positions=[10, 30])
    ry, rcf, _, _ = naive_causal_conv1d(x, w, conv_state=cs, cu_seqlens=cu, start_positions=[10, 30])
    assert torch.equal(y, y2) and torch.equal(cf, cf2) and torch.equal(cb, cb2)
    close(y, ry)
    close(cf, rcf)


def _gpu():
    import os

    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU and compiled Triton (TRITON_INTERPRET unset)")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_conv_from_a_state_matches_the_oracle_and_resumes_exactly(dtype):
    """Compiled, at a replay's width (qwen3-next's 8192 channels, 4 taps, silu): from incoming conv
    states read only where a chunk's taps reach before its sequence (a first chunk, and a second
    behind a 1- or 2-token first), varlen with ragged starts and sequences shorter than the state
    window; outputs against the oracle, final states and windows exact, and a call resumed from an
    emitted window equal to the run through (session 24's state read path)."""
    _gpu()
    gen = torch.Generator().manual_seed(24)
    D, cu, starts = 8192, [0, 2, 70, 71, 200, 600], [0, 62, 5, 100, 63]
    x = rnd(gen, 1, 600, D).to("cuda", dtype)
    w = (rnd(gen, D, 4) * 0.5).to("cuda", dtype)
    cs = rnd(gen, 5, D, 3).to("cuda", dtype)
    y, cf, cb = causal_conv1d(x, w, conv_state=cs, cu_seqlens=cu, start_positions=starts)
    ry, rcf, rcb, _ = naive_causal_conv1d(
        x.float().cpu(), w.float().cpu(), conv_state=cs.float().cpu(), cu_seqlens=cu, start_positions=starts
    )
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.float().cpu(), ry, atol=tol, rtol=tol)
    assert torch.equal(cf.float().cpu(), rcf) and torch.equal(cb.float().cpu(), rcb)
    # the last sequence (positions 63..462) through, and resumed from its window at position 128
    # (its second emitted boundary, 65 tokens in)
    y1, cf1, cb1 = causal_conv1d(x[:, 200:], w, conv_state=cs[4:], start_positions=[63])
    y2, cf2, _ = causal_conv1d(x[:, 265:], w, conv_state=cb1[1:2], start_positions=[128])
    assert torch.equal(y2, y1[:, 65:]) and torch.equal(cf2, cf1)


def test_a_launch_config_from_the_environment_gives_the_same_bits(monkeypatch):
    """``KERNELS_CONFIG_CONV`` (session 26: the conv's launch sweeps) changes the launch, not the
    result: a 64-channel block over 200 channels (four blocks, the last partial) gives the default's
    bits; an unknown key is refused."""
    gen = torch.Generator().manual_seed(26)
    D = 200
    x, w, b = rnd(gen, 1, 130, D), rnd(gen, D, 4), rnd(gen, D)
    cs = rnd(gen, 1, D, 3)
    base = causal_conv1d(x, w, b, conv_state=cs)
    monkeypatch.setenv("KERNELS_CONFIG_CONV", "BD=64,num_warps=4")
    got = causal_conv1d(x, w, b, conv_state=cs)
    assert all(torch.equal(u, v) for u, v in zip(base, got))
    ry, rcf, _, _ = naive_causal_conv1d(torch.cat([cs.transpose(1, 2), x], 1), w, b)
    close(got[0], ry[:, 3:])
    # from zeros: the binary of a call from a state (``ONE_BINARY``, the default) and its own give
    # the same bits
    zero = causal_conv1d(x, w, b)
    monkeypatch.setenv("KERNELS_CONFIG_CONV", "ONE_BINARY=0")
    assert all(torch.equal(u, v) for u, v in zip(zero, causal_conv1d(x, w, b)))
    ry0, _, _, _ = naive_causal_conv1d(x, w, b)
    close(zero[0], ry0)
    monkeypatch.setenv("KERNELS_CONFIG_CONV", "BT=32")
    with pytest.raises(ValueError, match="KERNELS_CONFIG_CONV"):
        causal_conv1d(x, w, b)


@pytest.mark.parametrize(
    "env, with_state, has_state, use_state",
    [
        (None, False, True, 0),  # from zeros on the state's binary (ONE_BINARY, the default)
        (None, True, True, 1),
        ("ONE_BINARY=0", False, False, 0),  # the zeros' own binary
        ("ONE_BINARY=0", True, True, 1),
    ],
)
def test_which_binary_a_call_launches(monkeypatch, env, with_state, has_state, use_state):
    """The launch's ``HAS_STATE`` (the binary) and ``use_state`` (the runtime flag) per call kind
    and ``ONE_BINARY`` (mutation run, session 26: ``one or ...`` -> ``one and ...`` ran the slow
    binary from zeros with the same bits, unseen)."""
    from kernels import conv

    seen = []
    real = conv._conv_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append((kw["HAS_STATE"], int(args[12])))
                return real[grid](*args, **kw)

            return launch

    monkeypatch.setattr(conv, "_conv_kernel", Spy())
    if env:
        monkeypatch.setenv("KERNELS_CONFIG_CONV", env)
    gen = torch.Generator().manual_seed(7)
    x, w = rnd(gen, 1, 70, 24), rnd(gen, 24, 4)
    cs = rnd(gen, 1, 24, 3) if with_state else None
    y, _, _ = causal_conv1d(x, w, conv_state=cs)
    assert seen == [(has_state, use_state)]
    full = x if cs is None else torch.cat([cs.transpose(1, 2), x], 1)
    ry, _, _, _ = naive_causal_conv1d(full, w, None)
    close(y, ry[:, full.shape[1] - 70 :])

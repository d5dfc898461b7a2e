"""tests/interp_patch_once.py, the test suite's interpreter speed-up, computes what the Triton
interpreter computes without it: the same bits from the kernels with the most device-function
calls (the solve's ``_sub_row``, ``tl.sum`` from ``triton.language.standard``), and it really
skips the repeats. Runs on both Tritons `make test` runs (``triton_compat``)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import os  # noqa: E402

import interp_patch_once  # noqa: E402
from kernels.chunk_gdn import chunk_gated_delta_rule  # noqa: E402

pytestmark = [
    pytest.mark.triton_compat,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's patching only"),
]


def _call():
    gen = torch.Generator().manual_seed(5)
    T, H, HV, K, V = 130, 1, 2, 16, 32
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen)) * 0.01
    beta = torch.rand(1, T, HV, generator=gen) * 0.2
    h0 = 0.1 * torch.randn(1, HV, K, V, generator=gen)
    return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True, state_segments=2)


def test_same_bits_with_and_without_and_the_repeats_skipped():
    assert interp_patch_once.install()  # installed by tests/conftest.py: a no-op here
    before = dict(interp_patch_once.COUNTS)
    fast = _call()
    skipped = interp_patch_once.COUNTS["skipped"] - before["skipped"]
    assert skipped > 1000  # device-function calls whose patching was a repeat
    assert not interp_patch_once._ACTIVE  # every launch ended its scope
    interp_patch_once.uninstall()
    try:
        plain = _call()
    finally:
        assert interp_patch_once.install()
    assert interp_patch_once.COUNTS["skipped"] - before["skipped"] == skipped  # off meant off
    for a, b in zip(fast, plain):
        assert torch.equal(a, b)

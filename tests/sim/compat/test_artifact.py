"""The artifact's cost-model bug as ``sim.compat`` reproduces it (marconi.md §10), against hand
computation; the artifact's whole replay is checked against its own results in
tests/policies/test_golden.py."""

import pytest

from sim.compat.artifact import ArtifactCost
from sim.cost import get_model

D, N = 4096, 128


@pytest.fixture
def m7():
    return get_model("marconi-7b")


def test_bug1_subtracts_an_attention_layer_where_an_mlp_layer_belongs(m7):
    def attn(L): return 8 * L * D**2 + 4 * L**2 * D
    def mlp(L): return 16 * L * D**2
    def mamba(L): return 12 * L * D**2 + 16 * L * D * N + 10 * L * D
    Lp, Ln = 5000, 5300
    bug = 24 * mamba(Ln - Lp) + 4 * (attn(Ln) - attn(Lp)) + 28 * (mlp(Ln) - attn(Lp))
    assert ArtifactCost(m7).node_flops(Lp, Ln) == pytest.approx(bug, rel=1e-12)
    assert ArtifactCost(m7).node_bytes(Ln) == m7.node_bytes(Ln)


def test_bug1_term_sign_flips_at_2d(m7):
    def bug_term(Lp):  # what the artifact adds on top of the corrected marginal
        return ArtifactCost(m7).node_flops(Lp, Lp + 1) - m7.node_flops(Lp, Lp + 1)
    assert bug_term(0) == 0
    assert bug_term(4_000) > 0          # short parent: savings overstated
    assert bug_term(8_192) == pytest.approx(0, abs=1e3)  # 4Ld(2d - L) = 0
    assert bug_term(10_000) < 0 and bug_term(30_000) < 0
    assert ArtifactCost(m7).node_flops(30_000, 30_100) < 0  # the whole marginal goes negative

"""sim.analysis.report's maths on a hand-made table: pairing per configuration, the ratio table,
the paper's two headline numbers and the best-alpha condensing, each against values worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sim.analysis import report

# token hit rate per (trace, capacity): vllm+, sglang+, marconi
HAND = {
    ("t1", 1): (0.20, 0.25, 0.30),
    ("t1", 2): (0.40, 0.50, 0.45),
    ("t2", 1): (0.00, 0.10, 0.12),  # vllm+ 0: counted apart in the ratios
    ("t2", 2): (0.50, 0.40, 0.60),
}


def hand_frame() -> pd.DataFrame:
    rows = []
    for (trace, cap), rates in HAND.items():
        for variant, rate in zip(("vllm+", "sglang+", "marconi"), rates):
            rows.append(
                {
                    "config_id": f"{trace}-{cap}-{variant}",
                    "trace": trace,
                    "capacity_bytes": cap * 10**9,
                    "sessions_per_second": 1.0,
                    "policy": variant,
                    "alpha": float("nan"),
                    "alpha_mode": "none",
                    "variant": variant,
                    "token_hit_rate": rate,
                }
            )
    # rows in an order unrelated to the configurations, as files are read
    return pd.DataFrame(rows).sample(frac=1.0, random_state=3).reset_index(drop=True)


def test_paired_matches_each_configuration_with_itself():
    p = report.paired(hand_frame(), "marconi", "vllm+")
    assert len(p) == 4  # one row per configuration, not a cross join (16)
    got = {(r.trace, r.capacity_bytes // 10**9): (r.token_hit_rate_num, r.token_hit_rate_den) for r in p.itertuples()}
    assert got == {k: (v[2], v[0]) for k, v in HAND.items()}


def test_ratio_table_by_hand():
    t = report.ratio_table(hand_frame(), den="vllm+").set_index(["variant", "trace"])
    col = "mean_ratio_vs_vllm+"
    # marconi / vllm+: t1 0.30/0.20 = 1.5, 0.45/0.40 = 1.125; t2 0.60/0.50 = 1.2 (and one 0 denominator)
    assert t.loc[("marconi", "all"), col] == pytest.approx((1.5 + 1.125 + 1.2) / 3)
    assert t.loc[("marconi", "t1"), col] == pytest.approx((1.5 + 1.125) / 2)
    assert t.loc[("marconi", "t2"), col] == pytest.approx(1.2)
    # sglang+ / vllm+: 1.25, 1.25, 0.8
    assert t.loc[("sglang+", "all"), col] == pytest.approx((1.25 + 1.25 + 0.8) / 3)
    assert t.loc[("marconi", "all"), "configs"] == 4 and t.loc[("marconi", "all"), "den_zero"] == 1
    assert t.loc[("marconi", "t2"), "configs"] == 2 and t.loc[("marconi", "t2"), "den_zero"] == 1
    assert t.loc[("marconi", "t1"), "den_zero"] == 0
    assert "vllm+" not in t.index.get_level_values("variant")


def test_headline_by_hand():
    h = report.headline(hand_frame())
    assert h["marconi"] == "marconi" and h["configs"] == 4
    assert h["ratio_vs_vllm+"] == pytest.approx(1.275)
    # gains over sglang+: 0.2, -0.1, 0.2, 0.5 -> sorted [-0.1, 0.2, 0.2, 0.5]; the 95th percentile
    # (linear between order statistics) sits at 0.95 * 3 = 2.85: 0.2 + 0.85 * (0.5 - 0.2) = 0.455
    assert h["p95_gain_vs_sglang+"] == pytest.approx(0.455)


def test_headline_prefers_the_auto_tuned_variant_and_handles_no_marconi():
    df = hand_frame()
    auto = df[df["variant"] == "marconi"].assign(variant="marconi (auto α)", token_hit_rate=0.5)
    h = report.headline(pd.concat([df, auto], ignore_index=True))
    assert h["marconi"] == "marconi (auto α)"
    # 0.5 / vllm+ over the three non-zero denominators: 2.5, 1.25, 1.0
    assert h["ratio_vs_vllm+"] == pytest.approx((2.5 + 1.25 + 1.0) / 3)
    none = report.headline(df[df["variant"] != "marconi"])
    assert none == {"marconi": None}


def test_condense_keeps_the_best_static_alpha_per_configuration():
    rows = []
    for cap, rates in ((1, (0.1, 0.3, 0.2)), (2, (0.5, 0.4, 0.45))):
        for alpha, rate in zip((0.0, 1.0, 2.0), rates):
            rows.append(
                {
                    "config_id": f"{cap}-{alpha}",
                    "trace": "t",
                    "capacity_bytes": cap,
                    "policy": "marconi",
                    "alpha": alpha,
                    "alpha_mode": "static",
                    "variant": f"marconi α={alpha:g}",
                    "token_hit_rate": rate,
                }
            )
    best = report.condense(pd.DataFrame(rows)).set_index("capacity_bytes")
    assert set(best["variant"]) == {"marconi (best α)"}
    assert best.loc[1, "alpha"] == 1.0 and best.loc[2, "alpha"] == 0.0
    one = report.condense(pd.DataFrame(rows), static=2.0)
    assert list(one["token_hit_rate"]) == [0.2, 0.45]
    # no vllm+ / sglang+ rows to pair with: the headline says so with NaN, not a crash
    h = report.headline(best.reset_index())
    assert h["marconi"] == "marconi (best α)" and h["configs"] == 0
    assert math.isnan(h["ratio_vs_vllm+"]) and math.isnan(h["p95_gain_vs_sglang+"])


def test_headline_falls_back_to_any_marconi_variant():
    df = hand_frame()
    df.loc[df["variant"] == "marconi", "variant"] = "marconi α=1"  # condense(static="all") labels
    h = report.headline(df)
    assert h["marconi"] == "marconi α=1" and h["ratio_vs_vllm+"] == pytest.approx(1.275)


def test_auto_alphas_and_alpha_grid_by_hand():
    rows = []
    for policy, mode, alpha, cap, tuned, rate in [
        ("marconi", "auto", float("nan"), 1, 0.5, 0.30),
        ("marconi", "auto", float("nan"), 1, 1.5, 0.40),
        ("marconi", "auto", float("nan"), 2, 2.0, 0.60),
        ("other", "auto", float("nan"), 1, 9.0, 0.90),
        ("marconi", "static", 0.0, 1, float("nan"), 0.10),
        ("marconi", "static", 0.0, 1, float("nan"), 0.20),
        ("marconi", "static", 1.0, 1, float("nan"), 0.50),
        ("marconi", "static", 1.0, 2, float("nan"), 0.70),
    ]:
        rows.append(
            {
                "policy": policy,
                "alpha_mode": mode,
                "alpha": alpha,
                "capacity_gb": cap,
                "tuned_alpha": tuned,
                "token_hit_rate": rate,
                "flops_saved_frac": rate / 2,
            }
        )
    df = pd.DataFrame(rows)
    auto = report.auto_alphas(df).set_index("capacity_gb")
    # marconi's auto rows only (the other policy's 9.0 is not mixed in), averaged per capacity
    assert auto.loc[1, "alpha_chosen"] == pytest.approx(1.0) and auto.loc[2, "alpha_chosen"] == pytest.approx(2.0)
    assert auto.loc[1, "token_hit_rate"] == pytest.approx(0.35) and auto.loc[1, "flops_saved_frac"] == pytest.approx(
        0.175
    )
    grid = report.alpha_grid(df)  # static rows: mean per alpha (rows) and capacity (columns)
    assert grid.loc[0.0, 1] == pytest.approx(0.15) and grid.loc[1.0, 1] == pytest.approx(0.5)
    assert grid.loc[1.0, 2] == pytest.approx(0.7) and math.isnan(grid.loc[0.0, 2])


def test_order_variants_puts_the_paper_baselines_first():
    got = report.order_variants(["x", "marconi α=1", "vllm+", "belady", "vanilla", "sglang+", "marconi (auto α)", "x"])
    assert got == ["vanilla", "vllm+", "sglang+", "marconi α=1", "marconi (auto α)", "x", "belady"]


@pytest.mark.parametrize("spelled", ["h100", "H100", "nvidia-h100", "NVIDIA H100 SXM5 80GB"])
def test_where_reads_a_gpu_as_gpu_does(spelled):
    """--gpu H100 runs as h100, but `report --where gpu=H100` selected no rows (compared as text)."""
    df = pd.DataFrame({"policy": ["marconi", "marconi"], "gpu": ["h100", "b200"], "token_hit_rate": [0.5, 0.6]})
    assert report.select(df, [f"gpu={spelled}"])["token_hit_rate"].tolist() == [0.5]


def test_size_labels_pass_over_missing_capacities():
    """A results table's capacity column may hold NaN or None (a row of another kind): no label
    for them, the rest labelled as usual (mutation run, session 23: reading NaN as a size survived)."""
    from sim.analysis.report import size_labels

    assert size_labels([5 * 10**9, float("nan"), None, 5 * 10**9]) == {5 * 10**9: "5GB"}
    assert size_labels([float("nan")]) == {}

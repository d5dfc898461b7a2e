"""Golden cross-check: `--compat paper` against the public Marconi artifact's own results.

``golden/expected.jsonl`` in the ``shared`` folder beside the checkout (not part of the repository)
holds what the artifact (ruipeterpan/marconi) reports on two small
pre-tokenized traces (tiny_chat: 240 requests, tiny_agent: 168) at 0.5 / 1 / 2 GB for vllm+, sglang+ and
marconi (static alpha 0 and 1, and its one-shot tuner "auto"), both as published and with exactly its two
bugs fixed. We replay each trace in `sequential` mode on `marconi-7b` with

- ``compat=paper`` for ``variant: published`` (the artifact's replay, logical clock and both bugs), and
- ``compat=paper-fixed`` for ``variant: bugs-fixed``: the same replay with only the two bugs fixed. The
  default ``compat=corrected`` is *not* compared: it differs from the artifact by much more than the two
  bugs (wall-clock recency instead of the logical clock, exact capacity with the matched path pinned,
  branch states clamped to the input, no over-eviction from the artifact's byte estimate, SGLang+ path
  refresh without the split edge, vLLM+ as hashed 32-token blocks). A user comparing "paper numbers with
  the bugs fixed" wants the artifact's semantics, so that is its own mode.

What paper mode reproduces of the artifact (learned from its code, none copied; docs/presets.md §2-§5):

- clock: +1 per lookup, +1 per insert call, +1 for the insert's own match of input + output, +1 per
  eviction call; new nodes take the time after the eviction;
- refresh: Marconi touches only the deepest matched node, on the lookup *and* on the insert's match;
  SGLang+ touches the matched path plus the edge the match ends inside, then the inserted path;
- room is made for the artifact's *estimate* of an insert (2 states if it splits an edge, else 1, even
  when nothing new is stored; vLLM+: (tokens beyond the matched blocks, root counted as a block) / 32
  states, possibly negative), and eviction stops on the bytes it credits, so capacity may be exceeded;
- every split gets a branch state (the artifact always passes one), the branch lands where
  input + output diverges (possibly inside the output), nothing is pinned, inserts are never refused;
- Marconi's candidates are enumerated depth-first, children in insertion order: a score tie goes to the
  first, and bug 2 credits the edge of the *last* one; a merged node keeps the newer access time;
- vLLM+ is a token tree with a state every 32 tokens and at the end: a trailing partial block matches
  as a prefix and a longer insert fills it (its state moves), as the artifact's block tree does.

Agreement: all 48 static rows match to the last printed digit (token and request hit rate, FLOPs
saved); the tolerance below (1e-4 absolute on rates, i.e. 0.01 percentage point, far below one request
of 168-240, and 1e-4 relative on FLOPs) leaves room only for float rounding in the eviction scores. The
12 "auto" rows (the artifact's one-shot tuner: FLOPs objective, window 5x, replay from an empty tree,
no LRU candidate in paper compat) match too, tuned alpha included, except one where every alpha ties
(see test_auto_rows_match_artifact).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
GOLDEN = SHARED / "golden"

pytestmark = pytest.mark.skipif(
    not (GOLDEN / "expected.jsonl").exists(), reason="the golden rows (a shared folder beside the checkout) are absent"
)

RATE_TOL = 1e-4
FLOPS_RTOL = 1e-4


def _rows():
    if not (GOLDEN / "expected.jsonl").exists():
        return []
    return [json.loads(line) for line in (GOLDEN / "expected.jsonl").read_text().splitlines() if line.strip()]


def _row_id(r):
    return f"{r['trace'].split('.')[0]}-{r['variant']}-{r['policy']}-a{r['alpha']}-{r['capacity_bytes'] / 1e9:g}GB"


_TRACES: dict = {}


def _trace(name):
    from traces.registry import load_trace

    if name not in _TRACES:
        _TRACES[name] = load_trace(f"marconi-jsonl:{GOLDEN / name}")
    return _TRACES[name]


def run_row(r, **extra):
    from sim.config import SimConfig
    from sim.simulate import simulate

    alpha = r["alpha"] if r["alpha"] is not None else 0.0
    cfg = SimConfig(
        policy=r["policy"],
        model="marconi-7b",
        capacity_bytes=r["capacity_bytes"],
        alpha=alpha,
        mode="sequential",
        compat="paper" if r["variant"] == "published" else "paper-fixed",
        **extra,
    )
    return simulate(_trace(r["trace"]), cfg).summary


def _check(r, s):
    assert s["requests"] == r["requests"]
    assert s["token_hit_rate"] == pytest.approx(r["token_hit_rate"], abs=RATE_TOL)
    assert s["request_hit_rate"] == pytest.approx(r["request_hit_rate"], abs=RATE_TOL)
    assert s["flops_saved"] == pytest.approx(r["flops_saved"], rel=FLOPS_RTOL)


@pytest.mark.parametrize("r", [r for r in _rows() if r["alpha"] != "auto"], ids=_row_id)
def test_static_rows_match_artifact(r):
    _check(r, run_row(r))


@pytest.mark.parametrize("r", [r for r in _rows() if r["alpha"] == "auto"], ids=_row_id)
def test_auto_rows_match_artifact(r):
    s = run_row(r, tuning_workers=1)
    assert s["tuned_at_request"] is not None
    if s["tuned_alpha"] != pytest.approx(float(r["tuned_alpha"])):
        # a tie in the replay objective: the artifact takes the first replay to *finish*
        # (as_completed), we take the smallest alpha; both alphas must then give the same run
        # (tiny_agent bugs-fixed 0.5 GB: every alpha ties, the artifact reports 0.1, we 0.0)
        alt = run_row({**r, "alpha": float(r["tuned_alpha"])})
        assert alt["token_hit_rate"] == pytest.approx(s["token_hit_rate"], abs=RATE_TOL)
    _check(r, s)


def test_paper_mode_reports_overshoot_and_fixed_mode_does_not_lose_bytes():
    """Bug 2 credits the wrong edge: published Marconi can end an insert above capacity; paper-fixed
    still follows the artifact's byte estimate, so it may also overshoot, but less often and less
    far; the corrected engine never does. (The in-repo hand-worked case: tests/sim/compat.)"""
    rows = [
        r
        for r in _rows()
        if r["policy"] == "marconi"
        and r["alpha"] == 1.0
        and r["capacity_bytes"] == 500_000_000
        and r["trace"] == "tiny_chat.jsonl.gz"
    ]
    pub = run_row(next(r for r in rows if r["variant"] == "published"))
    fix = run_row(next(r for r in rows if r["variant"] == "bugs-fixed"))
    cap = 500_000_000
    assert pub["capacity_overshoots"] > fix["capacity_overshoots"]
    assert pub["peak_bytes"] > cap and pub["peak_bytes"] > fix["peak_bytes"]
    from sim.config import SimConfig
    from sim.simulate import simulate

    cor = simulate(
        _trace("tiny_chat.jsonl.gz"),
        SimConfig(policy="marconi", model="marconi-7b", capacity_bytes=cap, alpha=1.0, mode="sequential"),
    ).summary
    assert cor["capacity_overshoots"] == 0 and cor["peak_bytes"] <= cap

"""``marconi-oracle``: the best static alpha in hindsight (a bound for the tuners, not a policy).

Runs any preset whose ``PolicyPreset.hindsight`` is ``"oracle"``: one simulation of its
``hindsight_of`` preset per alpha of ``--alpha-grid``."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ProcessPoolExecutor

from policies.base import get_preset
from sim.engine.drivers import run
from sim.engine.metrics import OracleTuning, SimResult
from sim.tuning.replay import Builder, default_workers
from sim.tuning_options import parse_grid, tuner_params


def _oracle_one(args) -> tuple[float, SimResult]:
    trace, cfg, policy, alpha, build = args
    return alpha, run(build(trace, dataclasses.replace(cfg, policy=policy, alpha=alpha)))


def run_oracle(trace, config, build: Builder, progress=None) -> SimResult:
    """Best static alpha in hindsight over the grid, by token hit rate (ties: smallest alpha); each
    run simulates the preset the policy's ``hindsight_of`` names."""
    policy = get_preset(config.policy).hindsight_of
    grid = parse_grid(tuner_params(config).alpha_grid)
    workers = min(default_workers(config), len(grid))
    jobs = [(trace, config, policy, a, build) for a in grid]
    if workers <= 1:
        results = [_oracle_one(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            results = list(ex.map(_oracle_one, jobs))
    best_alpha, best = results[0]
    for a, res in results[1:]:
        if res.summary.token_hit_rate > best.summary.token_hit_rate:
            best_alpha, best = a, res
    tuning = OracleTuning(
        tuned_alpha=float(best_alpha),
        tuned_choice=f"{best_alpha:g}",
        tuned_at_request=None,
        oracle_hit_rates={f"{a:g}": r.summary.token_hit_rate for a, r in results},
    )
    summary = dataclasses.replace(best.summary, policy=config.policy, tuning=tuning)
    if progress is not None:
        progress.update(len(trace.requests))
    return dataclasses.replace(best, summary=summary)

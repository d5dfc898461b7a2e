"""Mutation testing: plant one-line bugs in the core modules and count how many the tests catch.

    python benchmarks/mutation.py                       # every module, 12 mutants each, seed 0
    python benchmarks/mutation.py -m tree -m cost --per-module 5
    python benchmarks/mutation.py --list                # candidate counts only, runs nothing
    python benchmarks/mutation.py -m ssd --changed-since 7c1ba78   # only lines changed since a commit

How it works
------------
1. The repository at ``--rev`` (default HEAD; ``--worktree`` takes the working tree instead) is
   copied into a fresh temporary folder, ``TMP/repo``. Nothing sits beside it, so ``../shared``
   (real traces, golden rows) is absent, as on a fresh clone, and the repository the command is
   run from is never written to (other people may be using it).
2. For each module of ``MODULES`` (below) every mutation site is listed from the module's syntax
   tree (``ast``): operator swaps (``+``/``-``, ``*``/``/``, ``<``/``<=``, ``==``/``!=``,
   ``and``/``or``, ``min``/``max``), constant tweaks (``0``/``1``, ``n`` -> ``n + 1``,
   ``True``/``False``), negated conditions, dropped statements, ``return x`` -> ``return None``,
   and swapped call arguments. A seeded sample of ``--per-module`` sites (one per line where
   possible) is drawn, so a run is repeatable and the next seed probes other lines. With
   ``--changed-since REV`` only sites on lines that ``git diff REV`` adds or changes are drawn
   (a session's new code, which a sample of the whole module seldom reaches).
3. The module's tests are run once unmutated (they must pass; their time sets the per-mutant
   timeout), then once per mutant with ``pytest -x``: a mutant is *caught* when a test fails or
   the run times out, and *survives* when every test passes. Only the mutated expression's
   source text is replaced, so line numbers in a failing traceback are the original ones.
4. The score per module and every survivor (``file:line``, original -> mutant) are printed.

Tests run with ``MARCONI_CACHE_DIR`` set to a private temporary folder, ``TRITON_INTERPRET=1``
and ``PYTHONPATH`` pointing at the copy (an editable install of the package cannot shadow it).

What is not mutated: code outside functions (tables of model presets, registries), docstrings,
strings and f-strings, ``raise`` / ``assert`` statements (error text and internal checks),
``if TYPE_CHECKING`` blocks, ``__repr__`` and lines marked ``pragma: no cover``. Some survivors
are equivalent mutants (e.g. ``<`` -> ``<=`` where equality cannot happen); read them before
writing a test.
"""

from __future__ import annotations

import argparse
import ast
import glob
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# --------------------------------------------------------------------------- what is mutated
# name -> (source globs, test paths). Globs and test paths are relative to the repository root;
# those that do not exist are skipped, so one table serves the layout before and after the move
# of sim/ into sub-packages. A test path may name one test (``path::test``). Tests run in the
# order listed, with -x: put the most direct first.
MODULES: dict[str, tuple[list[str], list[str]]] = {
    "tree": (
        ["sim/cache/tree.py", "sim/tree.py"],
        [
            "tests/sim/cache",
            "tests/policies/test_eviction.py",
            "tests/sim/engine",
            "tests/sim/compat",
            "tests/policies",
            "tests/sim/test_tree.py",
            "tests/sim/test_engine.py",
        ],
    ),
    "engine": (
        ["sim/engine/*.py", "sim/simulate.py", "sim/engine.py"],
        [
            "tests/sim/engine",
            "tests/sim/compat",
            "tests/policies",
            "tests/sim/tuning",
            "tests/sim/cli",
            "tests/sim/test_engine.py",
            "tests/sim/test_cli_run.py",
        ],
    ),
    "compat": (
        ["sim/compat/*.py"],
        ["tests/sim/compat", "tests/sim/test_cost.py", "tests/policies", "tests/sim/tuning"],
    ),
    "eviction": (
        ["policies/eviction.py"],
        [
            "tests/policies/test_eviction.py",
            "tests/sim/cache",
            "tests/policies",
            "tests/sim/engine",
            "tests/sim/compat",
            "tests/sim/test_tree.py",
            "tests/sim/test_engine.py",
        ],
    ),
    "admission": (
        ["policies/admission.py"],
        [
            "tests/sim/engine",
            "tests/policies",
            "tests/sim/compat",
            "tests/sim/cache",
            "tests/sim/test_engine.py",
            "tests/sim/test_tree.py",
        ],
    ),
    "engines": (
        [
            "policies/engines.py",
            "policies/engine_common.py",
            "policies/vllm.py",
            "policies/sglang.py",
            "policies/sglang_pathrefresh.py",
            "policies/lmdeploy.py",
            "policies/belady.py",
            "policies/*_current.py",
            "policies/*_0_*.py",
            "policies/trtllm_1_2.py",
            "policies/gdsf.py",
            "sim/cache/engine_tree.py",
            "sim/cache/future.py",
        ],
        ["tests/policies", "tests/sim/cache", "tests/sim/engine", "tests/sim/test_engine.py"],
    ),
    # the newest code, one module each with its most direct tests (issue 20's planted-bug classes)
    "vllm": (["policies/vllm.py"], ["tests/policies/test_vllm.py", "tests/policies/test_engine_presets.py"]),
    "sglang": (
        ["policies/sglang.py"],
        [
            "tests/policies/test_sglang.py",
            "tests/policies/test_engine_presets.py",
            "tests/policies/test_sglang_engine_rules.py",
        ],
    ),
    "engine_tree": (
        ["sim/cache/engine_tree.py"],
        [
            "tests/sim/cache/test_older_tree_rules.py",
            "tests/sim/cache/test_engine_tree.py",
            "tests/policies/test_engine_tree_survivors.py",
            "tests/policies/test_trtllm_partial_match.py",
            "tests/policies/test_sglang.py",
            "tests/policies/test_lmdeploy.py",
            "tests/policies/test_vllm.py",
            "tests/policies/test_engine_presets.py",
            "tests/policies/test_vllm_block_pool.py",
            "tests/policies/test_trtllm_pools.py",
            "tests/policies/test_sglang_engine_rules.py",
            "tests/policies/test_current_rules.py",
            "tests/sim/cache/test_hash_block_extent.py",
            "tests/sim/cache/test_evictable_totals.py",
            "tests/policies/test_belady.py",
        ],
    ),
    "events": (["sim/engine/events.py"], ["tests/sim/engine/test_events.py"]),
    "gdsf": (["policies/gdsf.py"], ["tests/policies/test_gdsf.py"]),
    "belady": (["policies/belady.py"], ["tests/policies/test_belady.py"]),
    "metrics": (["sim/engine/metrics.py"], ["tests/sim/engine/test_metrics.py", "tests/sim/engine"]),
    "cost": (
        ["sim/cost.py"],
        [
            "tests/sim/test_cost.py",
            "tests/sim/test_cost_rules.py",
            "tests/sim/replay/test_resume_term.py",  # session 17: gdn_resume_ms_per_chunk
            "tests/sim/replay/test_overlap_form.py",  # session 27: layer_form, kv_query_heads
            "tests/sim/test_step_time_memo.py",
            "tests/sim/test_gpus.py",
            "tests/sim/test_model_config_exact.py",
            "tests/sim/engine",
            "tests/sim/compat",
            "tests/policies",
            "tests/sim/test_engine.py",
        ],
    ),
    "sweep": (
        ["sim/experiments/*.py", "sim/sweep.py"],
        [
            "tests/sim/experiments/test_grid.py",
            "tests/sim/experiments/test_resume.py",
            "tests/sim/experiments/test_runners.py",
            "tests/sim/experiments",
            "tests/sweep/test_grid.py",
            "tests/sweep/test_resume.py",
            "tests/sweep",
        ],
    ),
    "report": (
        ["sim/analysis/report.py", "sim/report.py"],
        [
            "tests/sim/analysis",
            "tests/sim/experiments/test_plot_notebooks.py",
            "tests/sweep/test_plot_notebooks.py",
            "tests/sim/cli/test_cli_reliability_s23.py",
        ],
    ),
    # hash-block traces and their spelling as tokens (--hash-block-tokens)
    "hashblock": (
        ["traces/hashblock.py"],
        ["tests/traces/test_hash_block_tokens.py", "tests/traces/test_hashblock.py", "tests/traces"],
    ),
    # session 25: the text-trace loaders, the session slice, arrivals and the CLI's trace options,
    # each with its direct tests first, then the rest of tests/traces (about 40 s in all)
    "sharegpt": (
        ["traces/sharegpt.py"],
        [
            "tests/traces/test_loader_survivors_s25.py",  # session 25: the survivors' tests
            "tests/traces/test_sharegpt.py",
            "tests/traces/test_sharegpt_s24.py",
            "tests/traces/test_encoding_s24.py",
            "tests/traces/test_limits.py",
            "tests/sim/cli/test_trace_files_s24.py",
            "tests/traces",
        ],
    ),
    "lmsys": (
        ["traces/lmsys.py"],
        [
            "tests/traces/test_loader_survivors_s25.py",  # session 25: the survivors' tests
            "tests/traces/test_lmsys.py",
            "tests/traces/test_lmsys_s24.py",
            "tests/traces/test_encoding_s24.py",
            "tests/sim/cli/test_trace_files_s24.py",
            "tests/traces",
        ],
    ),
    "swebench": (
        ["traces/swebench.py"],
        [
            "tests/traces/test_loader_survivors_s25.py",  # session 25: the survivors' tests
            "tests/traces/test_swebench_s24.py",
            "tests/traces/test_swebench.py",
            "tests/traces/test_encoding_s24.py",
            "tests/sim/cli/test_trace_files_s24.py",
            "tests/traces",
        ],
    ),
    "jsonl": (
        ["traces/jsonl.py"],
        [
            "tests/traces/test_loader_survivors_s25.py",  # session 25: the survivors' tests
            "tests/traces/test_jsonl_s24.py",
            "tests/traces/test_marconi_jsonl.py",
            "tests/traces/test_encoding_s24.py",
            "tests/traces/test_limits.py",
            "tests/sim/cli/test_trace_files_s24.py",
            "tests/traces",
        ],
    ),
    "marconi_jsonl": (
        ["traces/marconi_jsonl.py"],
        [
            "tests/traces/test_loader_survivors_s25.py",  # session 25: the survivors' tests
            "tests/traces/test_marconi_jsonl.py",
            "tests/traces/test_jsonl_s24.py",
            "tests/sim/cli/test_trace_files_s24.py",
            "tests/traces",
        ],
    ),
    "sessions": (
        ["traces/sessions.py"],
        [
            "tests/traces/test_loader_survivors_s25.py",  # session 25: the survivors' tests
            "tests/traces/test_cli_traces.py",
            "tests/sim/cli/test_bad_input_round7.py",
            "tests/sim/experiments/test_advise_rules.py",
        ],
    ),
    "arrivals": (
        ["traces/arrivals.py"],
        ["tests/traces/test_loader_survivors_s25.py", "tests/traces/test_arrivals.py", "tests/traces"],
    ),
    "trace_options": (
        ["sim/trace_options.py"],
        [
            "tests/sim/test_trace_options_s25.py",  # session 25: the survivors' tests
            "tests/traces/test_cli_traces.py",
            "tests/sim/cli/test_option_fuzz.py",
            "tests/sim/cli/test_trace_files_s24.py",
        ],
    ),
    # issue 44's areas: the newest code, each with its rule tests first, then its direct tests
    "batching": (
        ["sim/engine/batching.py"],
        [
            "tests/sim/engine/test_batching_rules.py",
            "tests/sim/engine/test_batching.py",
            "tests/policies/test_current_rules.py",
            "tests/policies/test_sglang_engine_rules.py",
            "tests/sim/engine/test_misses.py",
            "tests/policies/test_vllm_block_pool.py",
            "tests/policies/test_trtllm_pools.py",
        ],
    ),
    "timing": (
        ["sim/cost.py"],
        [
            "tests/sim/test_cost_rules.py",
            "tests/sim/cli/test_new_user_replay_s23.py",  # session 23: a config fit from another folder
            "tests/sim/replay/test_resume_term.py",  # session 17: gdn_resume_ms_per_chunk
            "tests/sim/test_step_time_memo.py",
            "tests/sim/test_cost.py",
            "tests/sim/replay/test_timing_carry.py",
            "tests/sim/test_model_config.py",
            "tests/sim/test_gpus.py",
            "tests/sim/engine/test_batching.py",
            "tests/sim/replay/test_replay_calibrate.py",
        ],
    ),
    "calibration": (
        ["sim/replay/calibration.py"],
        [
            "tests/sim/replay/test_resume_term.py",  # session 17: fit_resume / resume_extras
            "tests/sim/replay/test_timing_carry.py",
            "tests/sim/replay/test_overlap_form.py",  # session 27: fit_overlap, fit_across(form=)
            "tests/sim/test_cost_rules.py",
            "tests/sim/replay/test_host_term.py",
            "tests/sim/replay/test_replay_calibrate.py",
            "tests/sim/replay/test_saved_error.py",  # session 28: saved_error
        ],
    ),
    "measure": (
        ["sim/replay/measure.py"],
        [
            "tests/sim/test_cost_rules.py",
            "tests/sim/replay/test_replay_measure.py",
            "tests/sim/replay/test_retime.py",  # session 17: outran_sleep, suffix_retimed, retimed_prefills
            "tests/sim/replay/test_resume_term.py",  # session 19: calibrate's resumed-call term
            "tests/sim/replay/test_host_term.py",
            "tests/sim/replay/test_replay_calibrate.py",
            "tests/sim/replay/test_replay_step_model.py",
            "tests/sim/cli/test_new_user_replay_s23.py",  # session 23: aborted runs, standard JSON, KV reasons
            "tests/sim/replay/test_saved_error.py",  # session 28: saved_interval, the summary field
            "tests/sim/replay/test_saved_timing.py",  # session 33: saved_spread, the line's spread
        ],
    ),
    "replay_store": (
        ["sim/replay/tokens.py", "sim/replay/checks.py", "sim/replay/store.py", "sim/replay/runner.py"],
        [
            "tests/sim/replay/test_store_rules.py",
            "tests/sim/replay/test_replay_tokens.py",
            "tests/sim/replay/test_replay_store.py",
            "tests/sim/replay/test_replay_kv.py",
            "tests/sim/replay/test_replay_runner.py",
            "tests/sim/replay/test_replay_validate.py",
            "tests/sim/replay/test_replay_flights.py",
            "tests/sim/replay/test_retime.py",  # session 17: Replayer._retime
            "tests/sim/replay/test_saved_timing.py",  # session 28: Replayer._time_again
        ],
    ),
    # issue 46: the replayer's collaborators (hit checks, batched replay, flights) and the typed summary
    "replay_parts": (
        [
            "sim/replay/hits.py",
            "sim/replay/batched.py",
            "sim/replay/flight.py",
            "sim/replay/summary.py",
            "sim/replay/records.py",
        ],
        [
            "tests/sim/replay/test_replay_summary.py",
            "tests/sim/replay/test_replay_records.py",
            "tests/sim/replay/test_store_rules.py",
            "tests/sim/replay/test_replay_flights.py",
            "tests/sim/replay/test_replay_runner.py",
            "tests/sim/replay/test_replay_validate.py",
            "tests/sim/replay/test_replay_batch.py",
            "tests/sim/replay/test_retime.py",  # session 17: PendingTimes.suffix_first, RequestRecord.timed(first=)
            "tests/sim/replay/test_saved_timing.py",  # session 28: --saved-timing alternate
        ],
    ),
    "current": (
        ["policies/*_current.py", "sim/engine/simulation.py"],
        [
            "tests/policies/test_current_rules.py",
            "tests/policies/test_current_presets.py",
            "tests/sim/engine/test_simulation.py",
            "tests/sim/engine/test_batching.py",
            "tests/policies/test_engine_rules_schedulers.py",
            "tests/policies/test_vllm_block_pool.py",
            "tests/policies/test_trtllm_pools.py",
            "tests/policies/test_sglang_engine_rules.py",
            "tests/sim/engine/test_simulation_hooks.py",
            "tests/sim/engine/test_events.py",
            "tests/sim/engine/test_lookup_memo.py",
            "tests/policies/test_lmdeploy.py",
            "tests/sim/tuning/test_tuning.py",  # the duel tuner's shadow caches (shadow_finish)
        ],
    ),
    # the drivers (sequential, des / fcfs, continuous): a lookup at the server's start for an
    # admission that rematches_waiting, the request end's insert or end_without_insert
    "drivers": (
        ["sim/engine/drivers.py"],
        [
            "tests/policies/test_trtllm_pools.py",  # fcfs with TensorRT-LLM's pools: running requests charged
            "tests/sim/cache/test_older_tree_rules.py",
            "tests/policies/test_sglang_engine_rules.py",
            "tests/policies/test_vllm_block_pool.py",
            "tests/policies/test_engine_rules_schedulers.py",
            "tests/sim/engine/test_events.py",
            "tests/sim/engine/test_simulation.py",
            "tests/policies/test_current_rules.py",
            "tests/sim/tuning/test_tuning.py",
        ],
    ),
    "advise": (
        ["sim/experiments/advise/space.py", "sim/experiments/advise/search.py"],
        ["tests/sim/experiments/test_advise_rules.py", "tests/sim/experiments/test_advise.py"],
    ),
    "outdir": (
        ["sim/cli/outdir.py", "sim/experiments/store.py"],
        [
            "tests/sim/cli/test_outdir_rules.py",
            "tests/sim/cli/test_default_output.py",
            "tests/sim/cli/test_no_data_loss.py",
            "tests/sim/experiments/test_resume.py",
            "tests/sim/cli/test_cli_reliability_s23.py",  # session 23: files renamed together, non-UTF-8 names
        ],
    ),
    "config": (
        ["sim/config.py", "sim/cli/options.py"],
        [
            "tests/sim/test_config_groups.py",
            "tests/sim/test_config.py",
            "tests/sim/tuning/test_tuning_params.py",
            "tests/sim/cli/test_run_help.py",
            "tests/sim/experiments/test_old_results.py",
            "tests/sim/cli/test_new_user_gpus_s22.py",  # session 22: --gpu-memory's too-large line
            "tests/sim/cli/test_open_decisions_s23.py",  # session 23: GB / GiB
            "tests/sim/cli/test_cli_reliability_s23.py",  # session 23: sizes that tell apart
        ],
    ),
    "ssd_args": (["kernels/ssd_args.py"], ["tests/kernels/test_ssd.py"]),
    # session 16: the SSD kernel's launcher and its dt-ahead-of-the-loop kernel (PREP)
    # session 17: the overlapped output (OVL) compiled for sm_90a (kernel_resources --ssd --check:
    # spills, the loop's cp.async and the overlap's handshake; its bits need a GPU)
    "ssd": (
        ["kernels/ssd.py"],
        [
            "tests/kernels/test_ssd_survivors.py",  # _config / _overlaps, B and C sliced from wider tensors
            "tests/kernels/test_ssd.py",
            "tests/kernels/test_resources.py::test_ssd_kernels_spill_free_pipelined_and_overlapped",
            "tests/sim/replay/test_replay_mamba2.py",
        ],
    ),
    # session 16: `marconi replay`'s command (its out-of-memory line among its checks and summary lines)
    "replay_cli": (
        ["sim/cli/replay.py"],
        [
            "tests/sim/cli/test_replay_out_of_memory.py",
            "tests/sim/cli/test_replay_lines.py",
            "tests/sim/replay/test_replay_flops.py",
            "tests/sim/replay/test_replay_cli.py",
            "tests/sim/replay/test_retime.py",  # session 17: the "timed again" note of the time-model line
            "tests/sim/replay/test_replay_batch.py",
            "tests/sim/cli/test_bad_input_round2.py",
            "tests/sim/cli/test_bad_input_round4.py",
            "tests/sim/cli/test_bad_input_round3.py",
            "tests/sim/cli/test_bad_input_round6b.py",
            "tests/sim/cli/test_new_user_replay_s23.py",  # session 23: interrupts, the saved line, --seed
        ],
    ),
    "chunk_segmented": (["kernels/chunk_segmented.py"], ["tests/kernels/test_state_segmented.py"]),
    "chunk_segmented_launch": (["kernels/chunk_segmented_launch.py"], ["tests/kernels/test_state_segmented.py"]),
    # session 10's replay memory and host-term changes, one module each with its most direct tests first
    "store": (
        ["sim/replay/store.py"],
        [
            "tests/sim/replay/test_store_rules.py",
            "tests/sim/replay/test_replay_store.py",
            "tests/sim/replay/test_replay_memory.py",
            "tests/sim/replay/test_replay_kv.py",
            "tests/sim/replay/test_replay_runner.py",
            "tests/sim/replay/test_replay_batch.py",
            "tests/sim/replay/test_replay_validate.py",
        ],
    ),
    "batched": (
        ["sim/replay/batched.py"],
        [
            "tests/sim/replay/test_replay_memory.py",
            "tests/sim/replay/test_replay_batch.py",
            "tests/sim/replay/test_store_rules.py",
            "tests/sim/replay/test_replay_runner.py",
            "tests/sim/replay/test_replay_validate.py",
        ],
    ),
    "hits": (
        ["sim/replay/hits.py"],
        [
            "tests/sim/replay/test_replay_flights.py",
            "tests/sim/replay/test_replay_memory.py",
            "tests/sim/replay/test_replay_validate.py",
            "tests/sim/replay/test_store_rules.py",
            "tests/sim/replay/test_replay_runner.py",
            "tests/sim/replay/test_replay_batch.py",
            "tests/sim/replay/test_retime.py",  # session 20: HitChecker._retime_reference
        ],
    ),
    "pipeline": (
        ["sim/replay/pipeline.py"],
        [
            "tests/sim/replay/test_replay_memory.py",
            "tests/sim/replay/test_replay_session.py",
            "tests/sim/replay/test_replay_batch.py",
            "tests/sim/replay/test_store_rules.py",
            "tests/sim/cli/test_new_user_replay_s23.py",  # session 23: the store named, the MLP note
            "tests/sim/cli/test_replay_out_of_memory.py",  # session 31: the run's error carries its request
            # session 33: the shadow replayer's assembly and its records (--validate shadow end to end)
            "tests/sim/replay/test_replay_cli.py::test_check_memory_compares_outputs_in_groups_and_says_so",
        ],
    ),
    # session 32: continuous replay's memory (the executor's KV grown as it runs, the open flights
    # bounded in bytes, the plan's running requests sized on the simulation's events)
    "running_memory": (
        ["sim/replay/stepper.py", "sim/replay/runner.py", "sim/replay/flight.py", "sim/replay/pipeline.py"],
        [
            "tests/sim/replay/test_replay_steps.py",
            "tests/sim/replay/test_replay_flights.py",
            "tests/sim/replay/test_replay_memory.py",
            "tests/sim/replay/test_replay_matrix.py::test_running_flights_past_their_byte_bound_keep_the_contract",
            # session 33: seed 7's survivors there were caught by these (batched eviction, a late
            # admit's writes, the alternated mean's check bucket)
            "tests/sim/replay/test_replay_batch.py",
            "tests/sim/replay/test_replay_runner.py",
            "tests/sim/replay/test_saved_timing.py",
        ],
    ),
    # session 33: what a replay that ran out of memory says it held (the event, the store as
    # allocated, the running requests, the open flights), the plan's store by the pool's chunks
    # and a grown buffer counted twice while it is copied
    "memory_failure": (
        [
            "sim/replay/pipeline.py",
            "sim/replay/observer.py",
            "sim/replay/store.py",
            "sim/replay/stepper.py",
            "sim/replay/runner.py",
            "sim/cli/replay.py",
        ],
        [
            "tests/sim/cli/test_replay_out_of_memory.py",
            "tests/sim/replay/test_replay_memory.py",
            "tests/sim/replay/test_replay_steps.py",
        ],
    ),
    # session 31: replay's event observer (the progress bar: each request once, at its end)
    "observer": (
        ["sim/replay/observer.py"],
        [
            "tests/sim/replay/test_replay_matrix.py::test_a_request_preempted_and_hit_again_counts_its_kv_check_once",
            "tests/sim/replay/test_replay_session.py",
            "tests/sim/replay/test_replay_observer.py",
        ],
    ),
    # session 31: a check's suffix outputs held in groups of layers where they would not fit
    "check_groups": (
        [
            "sim/replay/hits.py",
            "sim/replay/batched.py",
            "sim/replay/model.py",
            "sim/replay/runner.py",
            "sim/replay/pipeline.py",
            "sim/replay/session.py",
            "sim/replay/measure.py",
            "sim/cli/replay.py",
        ],
        [
            "tests/sim/replay/test_replay_memory.py",
            "tests/sim/replay/test_replay_cli.py::test_check_memory_compares_outputs_in_groups_and_says_so",
        ],
    ),
    # session 26: a hit check's compares out of the timed reference (the marks' CHECK bucket) and
    # the marks of a split call
    "check_time": (
        [
            "sim/replay/flight.py",
            "sim/replay/batched.py",
            "sim/replay/model.py",
            "sim/replay/measure.py",
            "sim/replay/records.py",
        ],
        [
            "tests/sim/replay/test_check_out_of_time.py",
            "tests/sim/replay/test_retime.py",
            "tests/sim/replay/test_replay_batch.py",
            "tests/sim/replay/test_replay_measure.py",
            "tests/sim/replay/test_replay_memory.py",  # session 27: a one-call suffix's outputs not copied
            "tests/sim/replay/test_host_term.py",  # session 27: the sleep recorded, priced off the host's issue
        ],
    ),
    # session 27: the per-sequence step fit's guard (seq_fittable)
    "steps": (
        ["sim/replay/steps.py"],
        [
            "tests/sim/replay/test_replay_step_model.py",
            "tests/sim/replay/test_overlap_form.py",
            # the step table's per-kind work (session 33: its mutant survived the two above)
            "tests/sim/replay/test_replay_steps.py",
        ],
    ),
    # session 21: replay --attention (the cuDNN path's buckets, padding and whole-prompt rule, the
    # warm-up's plans, the timing file's attention and its note)
    "attention": (
        ["sim/replay/model.py", "sim/replay/warm.py", "sim/replay/calibration.py", "sim/cost.py"],
        [
            "tests/sim/replay/test_attention_backend.py",
            "tests/sim/replay/test_replay_model.py",
            "tests/sim/replay/test_replay_warm.py",
            "tests/sim/replay/test_timing_carry.py",
        ],
    ),
    # session 22: replay --elementwise fused (kernels.norms, the model's fused paths, the choice and
    # its timing-file field and note)
    "elementwise": (
        ["kernels/norms.py", "sim/replay/model.py", "sim/replay/calibration.py", "sim/cost.py"],
        [
            "tests/kernels/test_norms.py",
            "tests/sim/replay/test_elementwise.py",
            "tests/sim/replay/test_timing_carry.py",
        ],
    ),
    "host_term": (
        ["sim/replay/measure.py", "sim/replay/calibration.py", "sim/replay/summary.py"],
        [
            "tests/sim/replay/test_host_term.py",
            "tests/sim/replay/test_replay_summary.py",
            "tests/sim/replay/test_timing_carry.py",
            "tests/sim/test_cost_rules.py",
            "tests/sim/replay/test_replay_measure.py",
            "tests/sim/replay/test_replay_calibrate.py",
            "tests/sim/replay/test_retime.py",  # session 17: outran_sleep, retimed_prefills
            "tests/sim/replay/test_resume_term.py",  # session 17: fit_resume / resume_extras
        ],
    ),
    # the sleep ahead of a queued timed call, per call kind and segment count, and its measured rate
    "clock": (
        ["sim/replay/clock.py", "sim/replay/warm.py"],
        [
            "tests/sim/replay/test_replay_clock.py",
            "tests/sim/replay/test_retime.py",  # session 17: SleepWindows.drop, Stopwatch.outran / forget
            "tests/sim/replay/test_replay_warm.py",
            "tests/sim/replay/test_replay_runner.py",
            "tests/sim/replay/test_saved_timing.py",  # session 28: the collector paused (test_replay_clock too)
        ],
    ),
    # why a request missed, and the hits of preempted requests counted apart (issue 43 item 3)
    "misses": (["sim/engine/misses.py"], ["tests/sim/engine/test_misses.py", "tests/sim/engine/test_summary.py"]),
    # run's refusals and notes (the trace's blocks, reuse after preemptions)
    "run_cli": (
        ["sim/cli/run.py"],
        [
            "tests/sim/cli/test_run.py",
            "tests/sim/cli/test_run_help.py",
            "tests/sim/engine/test_misses.py",
            "tests/sim/cli/test_bad_input_round5.py",
            "tests/sim/cli/test_cli_reliability_s23.py",  # session 23: interrupted while writing, headers, notes
        ],
    ),
    # the CLI's options built from settings fields, and an option given twice (bad input round 6)
    "cli_options": (
        ["sim/cli/options.py"],
        [
            "tests/sim/cli/test_bad_input_round6.py",
            "tests/sim/cli/test_bad_input_round6b.py",
            "tests/sim/cli/test_run_help.py",
            "tests/sim/cli/test_option_fuzz.py",
            "tests/sim/cli/test_bad_input.py",
            "tests/sim/test_config_groups.py",
        ],
    ),
    # options that cannot act, numbers out of range, GPUs and memory (bad input rounds 3 to 6)
    "cli_checks": (
        ["sim/cli/checks.py"],
        [
            "tests/sim/cli/test_bad_input_round6.py",
            "tests/sim/cli/test_bad_input_round6b.py",
            "tests/sim/cli/test_bad_input_round3.py",
            "tests/sim/cli/test_bad_input_round5.py",
            "tests/sim/cli/test_bad_input_round4.py",
            "tests/sim/cli/test_bad_input_round2.py",
            "tests/sim/cli/test_bad_input.py",
            "tests/sim/cli/test_option_fuzz.py",
            "tests/sim/cli/test_cli_reliability_s23.py",  # session 23: synthetic specs' own options, missing grid paths, --events
            "tests/sim/cli/test_open_decisions_s23.py",
            "tests/sim/cli/test_new_user_replay_s23.py",  # session 23: timing files checked before any work
        ],
    ),
    # the sweep engines: local pool and Ray, how each stops on a signal, and the resume they serve
    "runners": (
        ["sim/experiments/runners.py"],
        [
            "tests/sim/experiments/test_runners.py",
            "tests/sim/experiments/test_resume.py",
            "tests/sim/cli/test_sweep_interrupt.py",
            "tests/sim/cli/test_stop_signals.py",
            "tests/sim/cli/test_new_user_gpus_s22.py",  # session 22: ray_init's one line
        ],
    ),
    # executed FLOPs and the chunks' padding (issue 41's FLOPs contract)
    "flops": (
        ["sim/replay/flops.py"],
        [
            "tests/sim/replay/test_replay_flops.py",
            "tests/sim/replay/test_host_term.py",
            "tests/sim/replay/test_replay_measure.py",
        ],
    ),
    "kernels_common": (
        ["kernels/_common.py"],
        ["tests/kernels/test_metadata.py", "tests/kernels/test_state_segmented.py", "tests/kernels/test_api.py"],
    ),
    # session 23: modules no entry owned, each with the tests that pin them
    "plot": (
        ["sim/analysis/plot.py", "sim/cli/plot.py"],
        [
            "tests/sim/cli/test_cli_reliability_s23.py",
            "tests/sim/cli/test_open_decisions_s23.py",
            "tests/sim/analysis/test_plot_labels.py",
            "tests/sim/experiments/test_plot_notebooks.py",
        ],
    ),
    "sweep_cli": (
        ["sim/cli/sweep.py"],
        [
            "tests/sim/cli/test_cli_reliability_s23.py",
            "tests/sim/cli/test_open_decisions_s23.py",
            "tests/sim/cli/test_sweep_interrupt.py",
            "tests/sim/cli/test_bad_input_round7.py",
            "tests/sim/experiments/test_resume.py",
        ],
    ),
    "table": (
        ["sim/analysis/table.py"],
        ["tests/sim/cli/test_cli_reliability_s23.py", "tests/sim/analysis/test_table.py", "tests/sim/cli/test_run.py"],
    ),
    # session 23: replay's checks before any work and its outputs written as one set
    "replay_session": (
        ["sim/replay/session.py", "sim/replay/output.py"],
        [
            "tests/sim/cli/test_new_user_replay_s23.py",
            "tests/sim/replay/test_replay_session.py",
            "tests/sim/replay/test_replay_output.py",
        ],
    ),
    "hf_config": (
        ["sim/hf_config.py"],
        [
            "tests/sim/test_model_config_exact.py",
            "tests/sim/test_model_config.py",
            "tests/sim/test_hf_config_defaults.py",  # session 22: the families' defaults, dtypes, quantization
            "tests/sim/cli/test_bad_input_round5.py",
            "tests/sim/cli/test_new_user_models_s22.py",
            "tests/sim/cli/test_open_decisions_s23.py",  # session 23: Granite, Nemotron-H, qwen3_moe
        ],
    ),
    "gpus": (
        ["sim/gpus.py"],
        [
            "tests/sim/test_gpus.py",
            "tests/sim/cli/test_bad_input_round5.py",
            "tests/sim/cli/test_new_user_gpus_s22.py",  # session 22: NVL / GH200 entries, --gpu-memory
            "tests/sim/cli/test_open_decisions_s23.py",  # session 23: GiB sizes, NVL bridge groups, unknown GPUs
        ],
    ),
    # the causal conv (session 24: the incoming state read as [N, W-1, D], only where a chunk reaches it)
    "conv": (
        ["kernels/conv.py"],
        [
            "tests/kernels/test_conv.py",
            "tests/kernels/test_resources.py::test_conv_from_a_state_converts_no_layouts_and_spills_nothing",
        ],
    ),
    "reference": (
        ["kernels/reference.py"],
        ["tests/kernels/test_reference.py", "tests/kernels/test_conv.py", "tests/kernels/test_chunk_gdn.py"],
    ),
    # the tokenizer pool's Ctrl-C / error path (session 20: _abandon_pool)
    "chat_pool": (["traces/chat.py"], ["tests/traces/test_interrupt.py", "tests/traces/test_tokenizers.py"]),
    # the script that writes the committed timing files (sim/data/<gpu>-timing.json); their exact refits
    "timing_fit": (
        ["benchmarks/timing_fit.py"],
        [
            "tests/sim/test_cost_rules.py",
            "tests/test_benchmarks.py::test_benchmark_runs_at_its_smallest_size[timing_fit.py]",
        ],
    ),
}
SKIP_FILES = ("__init__.py",)


# --------------------------------------------------------------------------- mutation sites
@dataclass
class Mutant:
    module: str
    path: str  # relative to the repository root
    line: int
    col: int
    end_line: int
    end_col: int
    kind: str
    original: str  # source text of the replaced span
    replacement: str
    status: str = ""  # caught | timeout | survived | error
    seconds: float = 0.0
    detail: str = ""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


_BINOP_SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}
_CMP_SWAP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


def _tweak_constant(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return {0: 1, 1: 0}.get(value, value + 1)
    if isinstance(value, float):
        return {0.0: 1.0, 1.0: 0.0}.get(value, value * 2 if value else 1.0)
    return None


def _is_stringy(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))


class _Sites(ast.NodeVisitor):
    """Collects (node, replacement text, kind) for every mutation site inside functions."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines()
        self.sites: list[tuple[ast.AST, str, str]] = []
        self._in_function = 0
        self._init = False  # inside __init__ / __post_init__ / attach
        self._bound: list[set[str]] = []  # names bound so far in each enclosing function

    # ---- scopes and exclusions
    def _excluded_line(self, node: ast.AST) -> bool:
        line = self.lines[node.lineno - 1] if node.lineno - 1 < len(self.lines) else ""
        return "pragma: no cover" in line

    def visit_FunctionDef(self, node):
        if node.name == "__repr__" or self._excluded_line(node):
            return
        self._in_function += 1
        args = node.args
        names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        self._bound.append(names)
        outer_init, self._init = self._init, node.name in ("__init__", "__post_init__", "attach")
        for d in args.defaults + args.kw_defaults:  # defaults are part of the function's behaviour
            if d is not None:
                self.visit(d)
        for i, stmt in enumerate(node.body):
            if i == 0 and isinstance(stmt, ast.Expr) and _is_stringy(stmt.value):
                continue  # docstring
            self.visit(stmt)
        self._bound.pop()
        self._init = outer_init
        self._in_function -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        for stmt in node.body:  # methods only: class-level data is configuration
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.visit(stmt)

    def visit_If(self, node):
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            return
        if self._in_function and not self._excluded_line(node) and not isinstance(test, ast.Constant):
            self._add(test, f"not ({self._text(test)})", "negate-condition")
        self.generic_visit(node)

    def visit_Raise(self, node):
        return  # error text and the raise itself: a dropped raise is a different kind of test

    def visit_Assert(self, node):
        return  # internal checks, not behaviour

    def visit_JoinedStr(self, node):
        return

    # ---- statements
    def _body_visit(self, node):
        self._drop_stmt(node)
        self.generic_visit(node)
        self._bind(node)

    def _bind(self, node):
        if not self._bound:
            return
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                self._bound[-1].add(n.id)

    def _drop_stmt(self, node):
        if not self._in_function or self._excluded_line(node):
            return
        if self._init and isinstance(node, (ast.Assign, ast.AnnAssign)):
            return  # a dropped first assignment of an attribute only raises AttributeError
        if isinstance(node, (ast.AugAssign, ast.Delete)):
            self._add(node, "pass", "drop-statement")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            self._add(node, "pass", "drop-statement")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and getattr(node, "value", None) is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            # a dropped first binding of a local only raises NameError: not an interesting bug
            rebinding = all(not isinstance(t, ast.Name) or t.id in self._bound[-1] for t in targets)
            if rebinding:
                self._add(node, "pass", "drop-statement")

    def visit_Assign(self, node):
        self._body_visit(node)

    visit_AnnAssign = visit_Assign
    visit_Expr = visit_Assign
    visit_Delete = visit_Assign

    def visit_For(self, node):
        self._bind(node.target)
        self.generic_visit(node)

    def visit_While(self, node):
        if self._in_function and not self._excluded_line(node) and not isinstance(node.test, ast.Constant):
            self._add(node.test, f"not ({self._text(node.test)})", "negate-condition")
        self.generic_visit(node)

    def visit_Return(self, node):
        if (
            self._in_function
            and node.value is not None
            and not self._excluded_line(node)
            and not (isinstance(node.value, ast.Constant) and node.value.value is None)
        ):
            self._add(node, "return None", "drop-return")
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._body_visit(node)
        if type(node.op) in _BINOP_SWAP and self._in_function:
            new = ast.AugAssign(target=node.target, op=_BINOP_SWAP[type(node.op)](), value=node.value)
            self._add(node, ast.unparse(new), "operator")

    # ---- expressions
    def visit_BinOp(self, node):
        if (
            self._in_function
            and type(node.op) in _BINOP_SWAP
            and not (_is_stringy(node.left) or _is_stringy(node.right))
        ):
            new = ast.BinOp(left=node.left, op=_BINOP_SWAP[type(node.op)](), right=node.right)
            self._add(node, f"({ast.unparse(new)})", "operator")
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        if self._in_function and isinstance(node.op, (ast.Not, ast.USub)):
            self._add(node, f"({self._text(node.operand)})", "drop-unary")
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        if self._in_function:
            op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            self._add(node, f"({ast.unparse(ast.BoolOp(op=op, values=node.values))})", "operator")
        self.generic_visit(node)

    def visit_Compare(self, node):
        if self._in_function and type(node.ops[0]) in _CMP_SWAP and not _is_stringy(node.comparators[0]):
            ops = [_CMP_SWAP[type(node.ops[0])]()] + node.ops[1:]
            new = ast.Compare(left=node.left, ops=ops, comparators=node.comparators)
            self._add(node, f"({ast.unparse(new)})", "comparison")
        self.generic_visit(node)

    def visit_IfExp(self, node):
        if self._in_function:
            self._add(node.test, f"not ({self._text(node.test)})", "negate-condition")
        self.generic_visit(node)

    def visit_Constant(self, node):
        if not self._in_function:
            return
        new = _tweak_constant(node.value)
        if new is not None:
            self._add(node, repr(new) if not isinstance(new, float) or new >= 0 else f"({new!r})", "constant")

    def visit_Call(self, node):
        if self._in_function:
            f = node.func
            if isinstance(f, ast.Name) and f.id in ("min", "max"):
                self._add(f, "max" if f.id == "min" else "min", "min-max")
            pos = [a for a in node.args if not isinstance(a, ast.Starred)]
            commutative = isinstance(f, ast.Name) and f.id in ("min", "max")
            if len(pos) == len(node.args) >= 2 and not commutative:
                a, b = self._text(pos[0]), self._text(pos[1])
                if a != b:
                    args = [b, a] + [self._text(x) for x in pos[2:]]
                    kws = [ast.unparse(k) for k in node.keywords]
                    self._add(node, f"{self._text(node.func)}({', '.join(args + kws)})", "swap-args")
        self.generic_visit(node)

    # ---- helpers
    def _text(self, node) -> str:
        return ast.get_source_segment(self.source, node) or ast.unparse(node)

    def _add(self, node, replacement: str, kind: str) -> None:
        if getattr(node, "end_lineno", None) is None:
            return
        self.sites.append((node, replacement, kind))


def list_mutants(root: Path, module: str, files: list[str]) -> list[Mutant]:
    out: list[Mutant] = []
    for rel in files:
        source = (root / rel).read_text()
        tree = ast.parse(source)
        finder = _Sites(source)
        finder.visit(tree)
        seen = set()
        for node, repl, kind in finder.sites:
            orig = ast.get_source_segment(source, node)
            if orig is None or orig.strip() == repl.strip():
                continue
            key = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, repl)
            if key in seen:
                continue
            seen.add(key)
            m = Mutant(
                module, rel, node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, kind, orig, repl
            )
            if _compiles(apply(source, m)):
                out.append(m)
    out.sort(key=lambda m: (m.path, m.line, m.col, m.kind, m.replacement))
    return out


def changed_lines(repo: Path, since: str, rev: str | None, files: list[str]) -> dict[str, set[int]]:
    """Per file, the line numbers (as at ``rev``; None: the working tree) that ``git diff since``
    adds or changes."""
    cmd = ["git", "-C", str(repo), "diff", "-U0", "--no-color", "--no-ext-diff", since, *([rev] if rev else [])]
    out = subprocess.run([*cmd, "--", *files], capture_output=True, text=True, check=True).stdout
    lines: dict[str, set[int]] = {}
    path = None
    for ln in out.splitlines():
        if ln.startswith("+++ "):
            path = ln[6:] if ln.startswith("+++ b/") else None
        elif ln.startswith("@@") and path is not None:
            start, _, count = ln.split()[2][1:].partition(",")  # "+start[,count]"
            lines.setdefault(path, set()).update(range(int(start), int(start) + (int(count) if count else 1)))
    return lines


def apply(source: str, m: Mutant) -> str:
    """``source`` with the mutant's span replaced (columns are UTF-8 byte offsets, as ast gives)."""
    lines = source.splitlines(keepends=True)
    first = lines[m.line - 1].encode()
    last = lines[m.end_line - 1].encode()
    new_line = first[: m.col].decode() + m.replacement + last[m.end_col :].decode()
    return "".join(lines[: m.line - 1]) + new_line + "".join(lines[m.end_line :])


def _compiles(source: str) -> bool:
    try:
        compile(source, "<mutant>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def sample(mutants: list[Mutant], k: int, seed: int, module: str) -> list[Mutant]:
    """A deterministic sample of ``k`` mutants, one per source line while lines last."""
    rng = random.Random(f"{seed}/{module}")
    order = list(mutants)
    rng.shuffle(order)
    chosen, lines = [], set()
    for m in order:
        if len(chosen) < k and (m.path, m.line) not in lines:
            chosen.append(m)
            lines.add((m.path, m.line))
    for m in order:
        if len(chosen) >= k:
            break
        if m not in chosen:
            chosen.append(m)
    return sorted(chosen, key=lambda m: (m.path, m.line, m.col))


# --------------------------------------------------------------------------- the copy and the runs
def copy_repo(src: Path, dest: Path, rev: str | None) -> None:
    """The tree at ``rev`` (git archive), or the working tree's tracked + unignored files."""
    dest.mkdir(parents=True)
    if rev is not None:
        data = subprocess.run(["git", "-C", str(src), "archive", rev], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(dest)
        return
    files = (
        subprocess.run(
            ["git", "-C", str(src), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, files):
        p = src / rel
        if p.is_file() and not p.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest / rel)


def resolve(root: Path, globs: list[str], tests: list[str]) -> tuple[list[str], list[str]]:
    files: list[str] = []
    for g in globs:
        for p in sorted(glob.glob(str(root / g))):
            rel = os.path.relpath(p, root)
            if os.path.basename(rel) not in SKIP_FILES and rel not in files:
                files.append(rel)
    return files, [t for t in tests if (root / t.split("::")[0]).exists()]  # a path or a test's node id


def run_tests(root: Path, tests: list[str], env: dict, timeout: float, python: str) -> tuple[str, float, str]:
    """('pass' | 'fail' | 'timeout', seconds, last lines of output)."""
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=", *tests]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the pytest we started and its workers, nothing else
        out, _ = proc.communicate()
        return "timeout", time.monotonic() - t0, _tail(out)
    status = "pass" if proc.returncode == 0 else "fail"
    if proc.returncode == 5:  # no tests collected
        status = "empty"
    return status, time.monotonic() - t0, _tail(out)


def _tail(text: str, n: int = 3) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-400:]


@dataclass
class ModuleResult:
    module: str
    files: list[str]
    tests: list[str]
    candidates: int = 0
    baseline_s: float = 0.0
    note: str = ""
    mutants: list[Mutant] = field(default_factory=list)

    @property
    def caught(self) -> int:
        return sum(m.status in ("caught", "timeout") for m in self.mutants)

    @property
    def scored(self) -> int:
        return sum(m.status in ("caught", "timeout", "survived") for m in self.mutants)

    @property
    def score(self) -> float:
        return self.caught / self.scored if self.scored else float("nan")


def run_module(name: str, root: Path, env: dict, args, log) -> ModuleResult:
    globs, tests = MODULES[name]
    files, tests = resolve(root, globs, tests)
    if args.tests:
        tests = args.tests
    res = ModuleResult(name, files, tests)
    if not files or not tests:
        res.note = "no source files" if not files else "no tests found"
        log(f"[{name}] skipped: {res.note}")
        return res
    all_mutants = list_mutants(root, name, files)
    if args.changed_since:
        changed = changed_lines(Path(args.repo), args.changed_since, None if args.worktree else args.rev, files)
        all_mutants = [m for m in all_mutants if changed.get(m.path, set()) & set(range(m.line, m.end_line + 1))]
    res.candidates = len(all_mutants)
    chosen = sample(all_mutants, args.per_module, args.seed, name)
    log(f"[{name}] {', '.join(files)}: {len(all_mutants)} sites, {len(chosen)} sampled; tests: {' '.join(tests)}")
    if args.list:
        res.mutants = chosen
        for m in chosen:
            log(f"    {m.where} [{m.kind}] {m.original!r} -> {m.replacement!r}")
        return res
    status, secs, tail = run_tests(root, tests, env, args.baseline_timeout, args.python)
    res.baseline_s = secs
    if status != "pass":
        res.note = f"baseline {status} ({tail})"
        log(f"[{name}] tests do not pass unmutated, module skipped: {tail}")
        return res
    timeout = max(args.min_timeout, args.timeout_factor * secs)
    log(f"[{name}] baseline {secs:.1f}s; per-mutant timeout {timeout:.0f}s")
    originals = {f: (root / f).read_text() for f in files}
    try:
        for i, m in enumerate(chosen, 1):
            src = originals[m.path]
            (root / m.path).write_text(apply(src, m))
            try:
                status, m.seconds, tail = run_tests(root, tests, env, timeout, args.python)
            finally:
                (root / m.path).write_text(src)
            m.status = {"fail": "caught", "pass": "survived", "timeout": "timeout"}.get(status, "error")
            m.detail = tail if m.status != "survived" else ""
            log(
                f"[{name}] {i:>2}/{len(chosen)} {m.status:<8} {m.seconds:5.1f}s {m.where} "
                f"[{m.kind}] {_short(m.original)} -> {_short(m.replacement)}"
            )
            res.mutants.append(m)
    finally:
        for f, src in originals.items():
            (root / f).write_text(src)
    return res


def _short(text: str, n: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def report(results: list[ModuleResult], out=sys.stdout) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p("\nmutation score (caught = a test failed or the run timed out)")
    p(f"{'module':<10} {'sites':>6} {'run':>4} {'caught':>7} {'survived':>9} {'score':>7}  note")
    tc = ts = 0
    for r in results:
        surv = sum(m.status == "survived" for m in r.mutants)
        tc += r.caught
        ts += r.scored
        score = f"{r.score:.0%}" if r.scored else "-"
        p(f"{r.module:<10} {r.candidates:>6} {r.scored:>4} {r.caught:>7} {surv:>9} {score:>7}  {r.note}")
    if ts:
        p(f"{'total':<10} {'':>6} {ts:>4} {tc:>7} {ts - tc:>9} {tc / ts:>7.0%}")
    survivors = [m for r in results for m in r.mutants if m.status == "survived"]
    if survivors:
        p("\nsurvivors (file:line [kind] original -> mutant)")
        for m in survivors:
            p(f"  {m.where} [{m.kind}] {_short(m.original, 90)} -> {_short(m.replacement, 90)}")
    errors = [m for r in results for m in r.mutants if m.status == "error"]
    for m in errors:
        p(f"  error: {m.where} {m.detail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "-m",
        "--module",
        action="append",
        choices=sorted(MODULES),
        help="module(s) to mutate (repeatable; default: all)",
    )
    ap.add_argument("--per-module", type=int, default=12, help="mutants sampled per module (default 12)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    ap.add_argument("--rev", default="HEAD", help="git revision to copy (default HEAD)")
    ap.add_argument(
        "--worktree", action="store_true", help="copy the working tree (uncommitted files too) instead of --rev"
    )
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]), help="repository to copy")
    ap.add_argument("--tests", nargs="+", help="override the module's test paths")
    ap.add_argument(
        "--changed-since",
        metavar="REV",
        help="draw only sites on lines that git diff REV adds or changes (against --rev, or the working tree)",
    )
    ap.add_argument("--min-timeout", type=float, default=60.0, help="per-mutant timeout floor in seconds (default 60)")
    ap.add_argument(
        "--timeout-factor", type=float, default=3.0, help="per-mutant timeout = factor x baseline (default 3)"
    )
    ap.add_argument(
        "--baseline-timeout", type=float, default=900.0, help="timeout of the unmutated run (default 900 s)"
    )
    ap.add_argument("--python", default=sys.executable, help="interpreter with pytest and the package's deps")
    ap.add_argument("--json", help="write every mutant and its outcome to this file")
    ap.add_argument("--list", action="store_true", help="list the sampled mutants; run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    args = ap.parse_args(argv)
    if args.per_module < 1:
        print("mutation: --per-module must be >= 1", file=sys.stderr)
        return 2
    names = args.module or list(MODULES)

    def log(msg: str) -> None:
        print(msg, flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="marconi-mutation-"))
    root = tmp / "repo"
    try:
        try:
            copy_repo(Path(args.repo), root, None if args.worktree else args.rev)
        except subprocess.CalledProcessError as exc:
            print(f"mutation: cannot copy {args.repo} at {args.rev}: {exc.stderr.decode().strip()}", file=sys.stderr)
            return 2
        assert not (tmp / "shared").exists()  # the copy must not see ../shared
        (tmp / "cache").mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("RESULTS_DIR", "SMALL_SWEEP_DIR")}
        env.update(
            PYTHONPATH=str(root),
            MARCONI_CACHE_DIR=str(tmp / "cache"),
            PYTHONDONTWRITEBYTECODE="1",
            TRITON_INTERPRET="1",
            MPLBACKEND="Agg",
        )
        src = "worktree" if args.worktree else args.rev
        log(f"copy of {args.repo} ({src}) at {root}; no ../shared; seed {args.seed}, {args.per_module} per module")
        results = [run_module(n, root, env, args, log) for n in names]
    finally:
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.list:
        return 0
    report(results)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [
                    {
                        "module": r.module,
                        "files": r.files,
                        "tests": r.tests,
                        "candidates": r.candidates,
                        "baseline_s": r.baseline_s,
                        "note": r.note,
                        "score": r.score,
                        "mutants": [asdict(m) for m in r.mutants],
                    }
                    for r in results
                ],
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

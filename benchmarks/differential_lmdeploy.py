"""Differential check: LMDeploy's own prefix cache (``block_trie``) against the ``lmdeploy`` preset.

The same request stream (a real ShareGPT slice, Qwen3.5 tokens) goes through InternLM/lmdeploy's
PyTorch-engine scheduler on the CPU (``Scheduler``, ``BlockTrie.match`` / ``allocate``,
``state_checkpoints.reserve_save`` / ``publish_save``: the calls its
``tests/pytorch/paging/test_block_trie`` tests make) and through the simulator's preset in
sequential mode; the hit tokens of every request are compared. Nothing of LMDeploy is copied here:
the script imports it from a checkout given on the command line (``git archive`` of a fetched
bare repository, plus a folder of its pure-Python dependencies installed with
``pip install --no-deps --target``; transformers, mmengine, xgrammar, ...).

Engine side, per request (each its own session, in the simulator's sequential order): the prompt
is matched (``num_history_ids`` = hit), its blocks allocated, a checkpoint saved at the prompt end
(one prefill forward: ``--prefill-chunk`` is unlimited on both sides), then decode: the tokens up to
the last one are computed and their full blocks cached, the last sampled token never is. The
cache is large enough that nothing is evicted: this checks placement, matching and the stored
extent, not eviction order.

    python benchmarks/differential_lmdeploy.py --lmdeploy /tmp/lmd --deps /tmp/lmd-deps --sessions 40

Prints, for each preset compared, how many requests get the same hit as the engine.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from tqdm import tqdm

from sim.config import UNLIMITED, SimConfig
from traces.registry import TraceOptions, load_trace
from differential_report import Agreement, served_hits  # this folder

MODEL = "qwen3.5-9b"


def engine_hits(order, requests, block: int) -> list[int]:
    """Hit tokens of each request in ``order`` through LMDeploy's scheduler and block trie."""
    import torch  # noqa: PLC0415 (LMDeploy's config types want torch dtypes)
    from lmdeploy.pytorch.config import CacheConfig, SchedulerConfig  # noqa: PLC0415
    from lmdeploy.pytorch.messages import SequenceMeta, UpdateTokenMode  # noqa: PLC0415
    from lmdeploy.pytorch.paging import Scheduler  # noqa: PLC0415
    from lmdeploy.pytorch.strategies.ar.sequence import ARSequenceStrategy  # noqa: PLC0415

    total = sum(len(r.input_tokens) + len(r.output_tokens) for r in requests)
    longest = max(len(r.input_tokens) + len(r.output_tokens) for r in requests)
    budget = len(requests) + 8
    n_blocks = total // block + 3 * len(requests) + 64  # never evicts: partial, frozen and private blocks
    cache = CacheConfig(
        max_batches=4,
        block_size=block,
        num_cpu_blocks=4,
        num_gpu_blocks=n_blocks,
        enable_prefix_caching=True,
        num_state_caches=4 + 1 + budget,
        prefix_cache_state_budget=budget,
        states_shapes=[((1,), torch.float32)],
    )
    sched = Scheduler(
        scheduler_config=SchedulerConfig(
            max_batches=4, max_session_len=longest + 8, max_request_output_len=longest, eviction_type="recompute"
        ),
        cache_config=cache,
        seq_meta=SequenceMeta(block, strategy=ARSequenceStrategy()),
    )
    trie, blocks = sched.block_trie, sched.block_manager
    hits = []
    for k, i in enumerate(tqdm(order, desc="lmdeploy", unit="req")):
        r = requests[i]
        sess = sched.add_session(k)
        seq = sess.add_sequence(np.asarray(r.input_tokens, dtype=np.int64))
        trie.match(seq)
        hits.append(int(seq.num_history_ids))
        blocks.allocate(seq)
        trie.allocate(seq)
        if trie.state_checkpoints.reserve_save(seq, step=len(r.input_tokens)) >= 0:
            trie.state_checkpoints.publish_save(seq)
        out = np.asarray(r.output_tokens, dtype=np.int64)
        if len(out) >= 2:  # compute every output token but the last, cache their full blocks
            seq.update_token_ids(out[:1], mode=UpdateTokenMode.DECODE)
            seq.update_token_ids(out[1:-1], mode=UpdateTokenMode.DECODE)
            blocks.allocate(seq)
            trie.allocate(seq)
        sched.end_session(k)
    return hits


def sim_hits(trace, policy: str, block: int) -> tuple[list[int], np.ndarray]:
    """Hit tokens per request of ``policy`` in sequential mode (no eviction), in arrival order."""
    config = SimConfig(
        policy=policy,
        model=MODEL,
        capacity_bytes=UNLIMITED,
        mode="sequential",
        block_size=block,
        prefill_chunk_tokens=10**9,
    )
    hits, order, _ = served_hits(trace, config)
    return hits, order


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lmdeploy", required=True, help="folder holding LMDeploy's lmdeploy/ package (a checkout)")
    ap.add_argument("--deps", default="", help="folder of LMDeploy's pure-Python dependencies (pip --target)")
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--policies", default="lmdeploy,lmdeploy-0.16-pytorch")
    args = ap.parse_args()
    sys.path[:0] = [p for p in (args.lmdeploy, args.deps) if p]
    trace = load_trace("sharegpt", TraceOptions(sessions=args.sessions))
    print(f"trace: {len(trace.requests)} requests, {trace.n_sessions} ShareGPT sessions, block {args.block_size}")
    results = {}
    order = None
    for policy in args.policies.split(","):
        results[policy], order = sim_hits(trace, policy, args.block_size)
    engine = engine_hits(order, trace.requests, args.block_size)
    for policy, hits in results.items():
        agreement = Agreement.of(hits, engine)
        print(agreement.line(policy, 24))
        for k in agreement.differing[:5]:
            r = trace.requests[order[k]]
            print(
                f"  request {order[k]} (input {len(r.input_tokens)}, output {len(r.output_tokens)}): "
                f"simulator {hits[k]}, engine {engine[k]}"
            )


if __name__ == "__main__":
    main()

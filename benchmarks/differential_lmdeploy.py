"""Differential check: LMDeploy's own prefix cache (``block_trie``) against the ``lmdeploy`` preset.

The same request stream (a real ShareGPT slice with Qwen3.5 tokens, or ``mooncake:sample``) goes
through InternLM/lmdeploy's PyTorch-engine scheduler on the CPU (``Scheduler``, its prefill
admission ``_PrefillAdmissionAttempt``: ``BlockTrie.match``, the restore pin, eviction, block and
state allocation, ``BlockTrie.allocate``; ``state_checkpoints.reserve_save`` / ``publish_save``:
the calls its ``tests/pytorch/paging/test_block_trie`` tests make) and through the simulator's
preset in sequential mode; the hit tokens of every request are compared. On a hash-block trace
the preset sees the 512-token symbols (a block of the trie or a state ends where the tree can put
it: ``policies/lmdeploy.py``) and the engine the symbols spelled out as tokens
(``traces.hashblock.spell``); with ``--hash-block-tokens`` the trace itself is spelled out and both
sides see the same tokens. Nothing of LMDeploy is copied here: the script imports it from a
checkout given on the command line (``git archive`` of a fetched bare repository, plus a folder of
its pure-Python dependencies installed with ``pip install --no-deps --target``: mmengine, yapf,
addict, termcolor, xgrammar, shortuuid, transformers, ...).

Engine side, per request (each its own session, in the simulator's sequential order): the prompt
goes through the scheduler's prefill admission (``num_history_ids`` after it = hit), a checkpoint
is saved at the prompt end (one prefill forward: ``--prefill-chunk`` is unlimited on both sides,
the engine's ``max_prefill_token_num`` above the longest request), the restore pin is released,
then decode: the tokens up to the last one are computed and their full blocks cached (the
decode scheduler's eviction first), the last sampled token never is.

Memory. ``--capacity 0`` (default): ample, nothing evicted (placement, matching and the stored
extent are compared, not eviction order). ``--capacity C --state-pool N``: the simulator gets
that capacity and state pool; the engine gets the simulator's KV
pool, ``(C - N x state_bytes) // (B x kv_bytes_per_token)`` blocks (``--headroom`` adds engine
blocks on top; the simulator's capacity is rounded down to those whole blocks), and N checkpoint
rows (``engine_hits``): LMDeploy sizes its state cache first and its KV blocks from the rest.
Eviction is the engine's own (the SSM eviction helper's ``BlockTrie.evict``, checkpoint-only
eviction of ``state_checkpoints``), on a clock one second per recency stamp (``--engine-clock
steps``, ``step_clock``): the engine keeps a block's recency in whole seconds, so on the wall clock
(``--engine-clock wall``) this harness's blocks all tie and their eviction order follows memory
addresses.

    python benchmarks/differential_lmdeploy.py --lmdeploy /tmp/lmd --deps /tmp/lmd-deps --sessions 40
    python benchmarks/differential_lmdeploy.py --lmdeploy /tmp/lmd --deps /tmp/lmd-deps --trace mooncake:sample \\
        --hash-block-tokens --capacity 16GB --state-pool 40

Prints, for each preset compared, how many requests get the same hit as the engine; ``--out``
writes one CSV row per request.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np
from tqdm import tqdm

from sim.config import UNLIMITED, SimConfig, format_size, parse_size
from sim.simulate import build
from traces.hashblock import spell
from traces.registry import TraceOptions, load_trace
from differential_report import Agreement, add_hash_block_tokens, served_hits  # this folder

MODEL = "qwen3.5-9b"


class EngineFull(RuntimeError):
    """The engine cannot admit a request (its pools hold less than the request needs)."""


def step_clock() -> None:
    """Give LMDeploy's recency stamps a clock one second per stamp. The engine stamps a block's
    recency with ``time.perf_counter()`` into an int64 array (block_manager/base_block_manager.py
    L17, L158-L161: whole seconds) and breaks equal stamps by ``id(node)``
    (block_trie/kv_lifecycle.py L102, L126), so on the wall clock every block this harness touches
    (in far less than a second) ties and KV eviction follows memory addresses, run to run. With
    this clock each stamp is later than the one before, as requests seconds apart are."""
    import itertools  # noqa: PLC0415
    import types  # noqa: PLC0415

    import lmdeploy.pytorch.paging.block_manager.base_block_manager as blocks  # noqa: PLC0415
    import lmdeploy.pytorch.paging.block_trie.checkpoint_lifecycle as checkpoints  # noqa: PLC0415

    ticks = itertools.count(1)
    blocks.time = checkpoints.time = types.SimpleNamespace(perf_counter=lambda: float(next(ticks)))


def engine_hits(reqs, block: int, chunk: int = 0, n_blocks: int | None = None, budget: int | None = None) -> list[int]:
    """Hit tokens of each (prompt, output) of ``reqs``, in order, through LMDeploy's scheduler and
    block trie. ``chunk``: ``max_prefill_token_num`` (0: above the longest request, one prefill
    forward); ``n_blocks`` / ``budget``: the KV blocks and the checkpoint rows (None: ample).

    The state rows are sized as the engine sizes them (``ExecutorBase._get_state_cache_mem``:
    ``max_batches + 2 + prefix_cache_state_budget``, one reserved) with ``max_batches`` 1 (one
    request at a time): checkpoints share one allocator with the runtime rows and take idle ones
    (``StateManager.get_num_free_checkpoint`` is the raw free count), so with one request running
    the checkpoints hold up to ``prefix_cache_state_budget + 1`` rows: ``budget`` is that, the
    simulator's ``--state-pool``."""
    import torch  # noqa: PLC0415 (LMDeploy's config types want torch dtypes)
    from lmdeploy.pytorch.config import CacheConfig, SchedulerConfig  # noqa: PLC0415
    from lmdeploy.pytorch.messages import SequenceMeta, UpdateTokenMode  # noqa: PLC0415
    from lmdeploy.pytorch.paging import Scheduler  # noqa: PLC0415
    from lmdeploy.pytorch.paging.scheduler import _PrefillAdmissionAttempt  # noqa: PLC0415
    from lmdeploy.pytorch.strategies.ar.sequence import ARSequenceStrategy  # noqa: PLC0415

    longest = max(len(p) + len(o) for p, o in reqs)
    if budget is None:  # a slot for every prefill forward's checkpoint
        budget = sum(len(p) // chunk + 1 if chunk else 1 for p, _ in reqs) + 8
    ample = sum(len(p) + len(o) for p, o in reqs) // block + 3 * len(reqs) + budget + 64  # partial, frozen, private
    n_blocks = ample if n_blocks is None else min(n_blocks, ample)  # more than ample evicts nothing either
    cache = CacheConfig(
        max_batches=1,
        block_size=block,
        num_cpu_blocks=4,
        num_gpu_blocks=n_blocks,
        max_prefill_token_num=chunk or longest + 8,
        enable_prefix_caching=True,
        num_state_caches=1 + 2 + budget - 1,  # the executor's max_batches + 2 + prefix_cache_state_budget
        prefix_cache_state_budget=budget - 1,
        states_shapes=[((1,), torch.float32)],
    )
    sched = Scheduler(
        scheduler_config=SchedulerConfig(
            max_batches=1, max_session_len=longest + 8, max_request_output_len=longest, eviction_type="recompute"
        ),
        cache_config=cache,
        seq_meta=SequenceMeta(block, strategy=ARSequenceStrategy()),
    )
    trie, blocks = sched.block_trie, sched.block_manager
    checkpoints = trie.state_checkpoints
    hits = []
    for k, (prompt, output) in enumerate(tqdm(reqs, desc="lmdeploy", unit="req")):
        sess = sched.add_session(k)
        seq = sess.add_sequence(np.asarray(prompt, dtype=np.int64))
        admitted = _PrefillAdmissionAttempt(
            sched,
            seq,
            evictable_waiting=[],
            prealloc_size=0,
            token_count=0,
            has_admitted=False,
            allow_long_prefill=True,
        ).run()
        if not admitted.admitted:
            raise EngineFull(f"request #{k} (input {len(prompt)}) is not admitted")
        seq.state.activate()  # _schedule_prefill's _to_running: WAITING -> READY (not its own victim)
        hits.append(int(seq.num_history_ids))
        first = True
        while True:  # the engine loop's prefill forwards (inputs_maker: one long-context chunk each)
            rest = seq.num_token_ids
            last = rest <= cache.max_prefill_token_num
            size = rest if last else cache.max_prefill_token_num
            if not first and not sched.reserve_long_context_chunk(seq, size, 0, is_last_chunk=last):
                raise EngineFull(f"request #{k} (input {len(prompt)}) cannot reserve its next chunk")
            end = seq.num_history_ids + size
            if checkpoints.reserve_save(seq, step=end) >= 0:  # a checkpoint at the forward's end
                checkpoints.publish_save(seq)
            checkpoints.unpin_restore(seq)  # the restore copy is queued with the first forward
            if last:
                break
            seq.set_step(end)  # LongContextChunker.update_step
            first = False
        out = np.asarray(output, dtype=np.int64)
        if len(out) >= 2:  # compute every output token but the last, cache their full blocks
            seq.update_token_ids(out[:1], mode=UpdateTokenMode.DECODE)
            seq.update_token_ids(out[1:-1], mode=UpdateTokenMode.DECODE)
            if not sched.eviction_helper.evict_for_seq(seq, [], 0):
                raise EngineFull(f"request #{k} (input {len(prompt)}, output {len(out)}) cannot decode")
            blocks.allocate(seq)
            trie.allocate(seq)
        sched.end_session(k)
    return hits


def sim_hits(
    trace, policy: str, block: int, chunk: int, capacity: int, state_pool: str
) -> tuple[list[int], np.ndarray]:
    """Hit tokens per request of ``policy`` in sequential mode, in arrival order."""
    knobs = {"state_pool": state_pool} if state_pool else {}
    config = SimConfig(
        policy=policy,
        model=MODEL,
        capacity_bytes=capacity or UNLIMITED,
        mode="sequential",
        block_size=block,
        prefill_chunk_tokens=chunk or 10**9,
        **knobs,
    )
    hits, order, _ = served_hits(trace, config)
    return hits, order


def kv_blocks(trace, policy: str, block: int, capacity: int, state_pool: str) -> tuple[int, int, int, int]:
    """The simulator's KV pool under ``capacity`` and ``state_pool`` in ``block``-token blocks; its
    state slots, bytes per state and KV bytes per token."""
    config = SimConfig(
        policy=policy,
        model=MODEL,
        capacity_bytes=capacity,
        mode="sequential",
        block_size=block,
        state_pool=state_pool,
    )
    tree = build(trace, config).tree
    per_token = int(tree.kv_bytes_per_token)
    return (
        int(tree.kv_capacity_bytes // (block * per_token)),
        int(tree.state_capacity),
        int(tree.state_bytes),
        per_token,
    )


def tokens_of(trace, r) -> tuple[np.ndarray, np.ndarray]:
    """A request's prompt and output as token ids: the tokens themselves, or, on a hash-block trace,
    each symbol spelled out as its block of distinct ids (``traces.hashblock.spell``)."""
    G = getattr(trace, "block_tokens", 1) or 1
    if G == 1:
        return np.asarray(r.input_tokens, dtype=np.int64), np.asarray(r.output_tokens, dtype=np.int64)
    return spell(r.input_tokens, G, r.n_input_tokens(G)), spell(r.output_tokens, G, r.n_output_tokens(G))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lmdeploy", required=True, help="folder holding LMDeploy's lmdeploy/ package (a checkout)")
    ap.add_argument(
        "--deps",
        default="",
        help="folder(s) of LMDeploy's pure-Python dependencies (pip --target; ':' between folders)",
    )
    ap.add_argument("--trace", default="sharegpt", help="sharegpt (Qwen3.5 tokens) or mooncake:sample")
    ap.add_argument("--sessions", type=int, default=40)
    add_hash_block_tokens(ap)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument(
        "--prefill-chunk",
        type=int,
        default=0,
        help="the preset's --prefill-chunk and the engine's max_prefill_token_num (0: unlimited, one forward)",
    )
    ap.add_argument("--capacity", default="0", help="simulator capacity (e.g. 16GB); 0: ample, nothing evicted")
    ap.add_argument("--state-pool", default="", help="with --capacity: checkpoint slots (prefix_cache_state_budget)")
    ap.add_argument("--headroom", type=int, default=0, help="engine KV blocks added to the capacity's (default 0)")
    ap.add_argument("--policies", default="lmdeploy,lmdeploy-0.16-pytorch")
    ap.add_argument(
        "--engine-clock",
        choices=("steps", "wall"),
        default="steps",
        help="steps: the engine's recency stamps one second apart (step_clock); wall: its own perf_counter",
    )
    ap.add_argument("--out", default="", help="CSV of per-request hits (serve order, request, input, output, ...)")
    args = ap.parse_args()
    capacity = parse_size(args.capacity) if args.capacity != "0" else 0
    if capacity and not args.state_pool:
        ap.error("--capacity needs --state-pool (the engine keeps its checkpoints in their own pool)")
    sys.path[:0] = [p for p in (args.lmdeploy, *args.deps.split(os.pathsep)) if p]
    if args.engine_clock == "steps":
        step_clock()
    trace = load_trace(args.trace, TraceOptions(sessions=args.sessions, hash_block_tokens=args.hash_block_tokens))
    print(
        f"trace {args.trace}: {len(trace.requests)} requests, {trace.n_sessions} sessions, "
        f"{trace.block_tokens}-token symbols; block {args.block_size}; prefill chunk {args.prefill_chunk or 'unlimited'}"
    )
    policies = args.policies.split(",")
    n_blocks = budget = None
    if capacity:
        n_blocks, budget, state_bytes, per_token = kv_blocks(
            trace, policies[0], args.block_size, capacity, args.state_pool
        )
        if capacity < UNLIMITED:  # the simulator's KV pool in whole blocks, as the engine's
            capacity = n_blocks * args.block_size * per_token + budget * state_bytes
            n_blocks += args.headroom
            kv = f"KV pool in whole blocks; engine KV blocks {n_blocks:,} (headroom {args.headroom})"
        else:
            n_blocks, kv = None, "KV ample"
        print(
            f"capacity {format_size(capacity)} ({kv}), state pool {budget} ({format_size(state_bytes)} a state): "
            f"the engine's checkpoint rows {budget} (prefix_cache_state_budget {budget - 1})"
        )
    results = {}
    order = None
    for policy in policies:
        results[policy], order = sim_hits(trace, policy, args.block_size, args.prefill_chunk, capacity, args.state_pool)
    reqs = [tokens_of(trace, trace.requests[i]) for i in order]
    try:
        engine = engine_hits(reqs, args.block_size, args.prefill_chunk, n_blocks, budget)
    except EngineFull as e:
        print(f"--capacity {args.capacity}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    for policy, hits in results.items():
        agreement = Agreement.of(hits, engine)
        print(agreement.line(policy, 24))
        for k in agreement.differing[:5]:
            p, o = reqs[k]
            print(
                f"  #{k} request {order[k]} (input {len(p)}, output {len(o)}): simulator {hits[k]}, engine {engine[k]}"
            )
    if args.out:
        with open(args.out, "x", newline="") as f:
            w = csv.writer(f)
            w.writerow(["serve_order", "request", "input", "output", "engine", *results])
            for k, i in enumerate(order):
                p, o = reqs[k]
                w.writerow([k, int(i), len(p), len(o), engine[k], *(results[x][k] for x in results)])


if __name__ == "__main__":
    main()

"""The advise notebook's Mooncake halves under ``sglang`` (``--model qwen3.5-27b --gpu-memory
9360000000``, continuous): which requests rule 18 aborts, and the run with the abort off (the
``input_limit`` set to None), as before it. ``python aborted_requests.py 0:150`` (or ``150:``)."""

import sys

from sim.config import SimConfig
from sim.engine.drivers import run
from sim.engine.simulation import Simulation
from sim.trace_options import TraceOptions
from traces.registry import load_trace

KEYS = (
    "token_hit_rate",
    "ttft_p95_ms",
    "preemptions",
    "memory_overshoots",
    "aborted_requests",
    "input_tokens",
    "hit_tokens",
)
trace = load_trace("mooncake:sample", TraceOptions(time_scale=5.0, session_range=sys.argv[1]))
cfg = SimConfig(policy="sglang", model="qwen3.5-27b", gpu_memory="9360000000")
for label, off in (("rule 18", False), ("abort off (before)", True)):
    sim = Simulation(trace, cfg)
    if off:
        sim.input_limit = None
    else:
        pool = sim.tree.kv_capacity_bytes // sim.tree.kv_bytes_per_token
        print(f"KV pool {pool} tokens, input limit (max_req_input_len) {sim.input_limit}")
    res = run(sim)
    print(label, {k: getattr(res.summary, k) for k in KEYS})
    df = res.requests
    if not off:
        print(df[df.aborted][["request_id", "input_tokens", "arrival_s"]].to_string(index=False))

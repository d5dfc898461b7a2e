"""Rule 17's test case (``tests/policies/test_sglang_engine_rules.py``
``test_every_32nd_pass_touches_the_waiting_requests_prefixes``) through SGLang 0.5.23's own cache:
the simulator's steps (``Step`` events) and its waiting-prefix touches, in the order it made them,
replayed with ``benchmarks/differential_sglang.py``'s driver; a touch is SGLang's own
``touch_waiting_prefix`` (``mem_cache/common.py`` L215-L218) on a request built as the scheduler
builds it. The engine's pools: the test's 34 mamba slots (running requests take theirs from it) and
ample KV. Prints the engine's hits with and without the touches, and the simulator's.

    python benchmarks/results/2026-12-05-sglang-admission/verify_rule17.py ENGINES/sglang-0.5.23 ENGINES/deps
"""

from __future__ import annotations

import sys
from array import array
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests" / "policies"), sys.argv[1], sys.argv[2]]

import differential_sglang as ds  # noqa: E402
from engine_cases import BIG, TIMING, TINY, cat, toks  # noqa: E402

from sim.config import SimConfig  # noqa: E402
from sim.engine.drivers import run as drive  # noqa: E402
from sim.engine.events import EventLog, Step  # noqa: E402
from sim.engine.simulation import Simulation  # noqa: E402
from sim.simulate import build  # noqa: E402
from traces.base import Request, Trace  # noqa: E402

sys.meta_path.insert(0, ds._StubFinder())


def trace() -> Trace:
    p = toks(0, 8)
    rows = [
        (p, 1, 0.0),
        (toks(100, 8), 1, 1.0),
        (toks(1000, 256), 2, 2.0),
        (toks(500, 3), 1, 2.0),
        (cat(p, toks(300, 2)), 1, 2.0),
    ]
    reqs = [
        Request(session_id=k, turn=0, input_tokens=inp, output_tokens=toks(9000 + 1000 * k, n), arrival=t)
        for k, (inp, n, t) in enumerate(rows)
    ]
    return Trace("t", reqs, closed_loop=False)


def simulate(tr: Trace):
    config = SimConfig(
        policy="sglang",
        model="qwen3.5-9b",
        capacity_bytes=BIG,
        mode="des",
        scheduler="continuous",
        mamba_radix_cache_strategy="no_buffer",
        max_mamba_cache_size=34,
        prefill_chunk_tokens=8,
        max_num_batched_tokens=8,
    )
    log = EventLog()
    events = log.events
    touch = Simulation.touch_prefix

    def recorded(self, r, t, tokens):
        events.append(("touch", int(r.request_id)))
        touch(self, r, t, tokens)

    Simulation.touch_prefix = recorded
    try:
        res = drive(build(tr, config, spec=TINY, timing=TIMING, observers=(log,)))
    finally:
        Simulation.touch_prefix = touch
    hits = [int(h) for h in res.requests.sort_values("request_id")["hit_tokens"]]
    return hits, [e for e in events if isinstance(e, (Step, tuple))]


def replay(tr: Trace, events, touches: bool) -> list[int]:
    from sglang.srt.managers.schedule_batch import Req  # noqa: PLC0415
    from sglang.srt.mem_cache.common import touch_waiting_prefix  # noqa: PLC0415
    from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: PLC0415

    tokens = {int(r.request_id): (np.asarray(r.input_tokens), np.asarray(r.output_tokens)) for r in tr.requests}
    setup = ds.EngineSetup("no_buffer", 100_000, 34, prefill_chunk=8, max_running=len(tokens))
    driver = ds.SGLangDriver(setup, 300)
    live, hits = {}, {}
    for ev in events:
        if isinstance(ev, tuple):
            if touches:
                prompt = tokens[ev[1]][0]
                req = Req(
                    rid=f"w{ev[1]}",
                    origin_input_text="",
                    origin_input_ids=array("q", prompt.tolist()),
                    sampling_params=SamplingParams(temperature=0, max_new_tokens=len(tokens[ev[1]][1])),
                )
                req.output_ids = array("q")
                touch_waiting_prefix(req, driver.tree)
            continue
        for _ in range(ev.steps):
            ran = []
            for rid, _a, b in ev.prefills:
                if rid in live:
                    driver.extend(live[rid], b)
                    ran.append((rid, live[rid]))
            decodes = [(rid, live[rid]) for rid, _ctx in ev.decodes]
            for _rid, req in decodes:
                driver.decode_slot(req)
            for rid, _a, b in ev.prefills:
                if rid in live:
                    continue
                req, hits[rid] = driver.begin(*tokens[rid], first_end=b)
                live[rid] = req
                driver.extend(req, req.extend_end)
                ran.append((rid, req))
            for rid, req in ran:
                if driver.extended(req):
                    del live[rid]
            for rid, req in decodes:
                if driver.decoded(req):
                    del live[rid]
    return [hits[i] for i in sorted(hits)]


if __name__ == "__main__":
    tr = trace()
    sim_hits, events = simulate(tr)
    print("touches (request ids, in order):", [e[1] for e in events if isinstance(e, tuple)])
    print("simulator:", sim_hits)
    print("SGLang 0.5.23, with the touches:", replay(tr, events, True))
    print("SGLang 0.5.23, without them:", replay(tr, events, False))

"""The engine's event stream: the exact events of a tiny hand-worked trace, and (hypothesis) that
the admits minus the evicts alone reproduce the tree's checkpoints and state bytes after every
insert, in both modes, for several policies and capacities."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.config import SimConfig
from sim.cost import default_timing, get_model
from sim.engine.drivers import run
from sim.engine.events import Admit, Decode, EventLog, Evict, EvictKV, Lookup, Prefill, Reject
from sim.simulate import build
from traces.base import Request, Trace

M7 = get_model("marconi-7b")
S, K = M7.state_bytes(), M7.kv_bytes_per_token()  # 26,787,840 B per state, 65,536 B per KV token


def toks(start, n):
    return np.arange(start, start + n, dtype=np.int64)


def three_requests() -> Trace:
    """Three single-turn sessions (one per second): a shared 100-token prefix, 20 own prompt tokens
    and 10 output tokens each."""
    reqs = [
        Request(
            session_id=i,
            turn=0,
            input_tokens=np.concatenate((toks(0, 100), toks(1000 + 100 * i, 20))),
            output_tokens=toks(5000 + 100 * i, 10),
        )
        for i in range(3)
    ]
    return Trace("three", reqs)


def test_hand_worked_event_list_with_a_branch_a_hit_and_an_eviction():
    # Capacity 100 MB. r0 leaves 130 KV tokens + its tail state (35.3 MB). r1 matches 100 tokens
    # of r0's edge: the split at 100 gets r1's branch state (a prefill branch), then its own tail:
    # 160 KV tokens + 3 states = 90.8 MB. r2 hits the branch state (checkpoint 1, 100 tokens) and
    # needs 30 KV tokens + 1 state = 28.8 MB: LRU over leaves evicts r0's leaf (the oldest: its
    # tail state and 30 KV tokens), then admits r2's tail state as checkpoint 3.
    trace = three_requests()
    cfg = SimConfig(policy="sglang+", mode="sequential", capacity_bytes=100_000_000)
    log = EventLog()
    sim = build(trace, cfg, observers=(log,))
    run(sim)
    timing = default_timing("marconi-7b")
    r0, r1, r2 = trace.requests
    p = timing.prefill_time_s(M7, 0, 120)
    p2 = timing.prefill_time_s(M7, 100, 120)
    d = timing.decode_time_s(9)  # 10 output tokens: the prefill samples the first, 9 decode steps
    assert log.events == [
        Lookup(r0, 0.0, None, 0, 120),
        Prefill(r0, 0.0, p, 0, 120, p),
        Decode(r0, p, p + d, 120, 130, d),
        Admit(0.0, 0, r0, 130, "tail"),
        Lookup(r1, 1.0, None, 0, 120),
        Prefill(r1, 1.0, 1.0 + p, 0, 120, p),
        Decode(r1, 1.0 + p, 1.0 + p + d, 120, 130, d),
        Admit(1.0, 1, r1, 100, "prefill-branch"),
        Admit(1.0, 2, r1, 130, "tail"),
        Lookup(r2, 2.0, 1, 100, 120),
        Prefill(r2, 2.0, 2.0 + p2, 100, 120, p2),
        Decode(r2, 2.0 + p2, 2.0 + p2 + d, 120, 130, d),
        Evict(2.0, 0, 130),
        EvictKV(2.0, 30),
        Admit(2.0, 3, r2, 130, "tail"),
    ]
    assert sim.tree.checkpoints() == {1: 100, 2: 130, 3: 130}
    assert sim.tree.used_bytes == (100 + 30 + 30) * K + 3 * S  # shared prefix + r1 and r2 own tokens


def test_des_mode_admits_the_branch_at_prefill_end_and_the_tail_after_decode():
    trace = three_requests()
    log = EventLog()
    run(build(trace, SimConfig(policy="marconi", alpha=0.0, capacity_bytes=10**12, scheduler="fcfs"), observers=(log,)))
    r1 = trace.requests[1]
    mine = [e for e in log.events if getattr(e, "request", None) is r1]
    kinds = [type(e).__name__ for e in mine]
    assert kinds == ["Lookup", "Prefill", "Admit", "Decode", "Admit"]
    assert (mine[2].position, mine[2].phase) == (100, "prefill-branch")
    assert (mine[4].position, mine[4].phase) == (130, "tail")
    assert mine[2].t == mine[1].t_end and mine[4].t == mine[3].t_end  # emitted when they complete


class Replayer:
    """Rebuilds the live checkpoints from admits and evicts alone and compares them with the tree
    after every insert."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.sim = None
        self.checks = 0
        self.last_t = -1.0

    def admit(self, t, checkpoint, request, position, phase):
        assert checkpoint not in self.live and t >= self.last_t
        self.live[checkpoint] = position
        self.last_t = t

    def evict(self, t, checkpoint, position):
        assert self.live.pop(checkpoint) == position and t >= self.last_t
        self.last_t = t

    def occupancy(self, t, kv_bytes, state_bytes):
        tree = self.sim.tree
        assert self.live == tree.checkpoints()
        assert state_bytes == len(self.live) * tree.state_bytes
        self.checks += 1


@st.composite
def small_traces(draw):
    """Sessions over a 6-symbol alphabet (so prefixes are shared and edges split and merge)."""
    n_sessions = draw(st.integers(1, 4))
    reqs = []
    for s in range(n_sessions):
        history = np.array(draw(st.lists(st.integers(0, 5), min_size=1, max_size=30)), dtype=np.int64)
        for turn in range(draw(st.integers(1, 3))):
            user = np.array(draw(st.lists(st.integers(0, 5), min_size=1, max_size=40)), dtype=np.int64)
            out = np.array(draw(st.lists(st.integers(0, 5), min_size=1, max_size=20)), dtype=np.int64)
            inp = np.concatenate((history, user))
            reqs.append(
                Request(session_id=s, turn=turn, input_tokens=inp, output_tokens=out, think_time=draw(st.floats(0, 2)))
            )
            history = np.concatenate((inp, out))
    return Trace("hypothesis", reqs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=small_traces(),
    mode=st.sampled_from(["sequential", "des", "continuous"]),
    policy=st.sampled_from(["sglang+", "marconi", "vllm+", "sglang-v1", "lmdeploy", "trtllm"]),
    compat=st.sampled_from(["corrected", "corrected", "paper"]),
    states=st.integers(1, 6),
    kv=st.integers(0, 150),
)
def test_admits_minus_evicts_are_the_trees_checkpoints_after_every_insert(trace, mode, policy, compat, states, kv):
    if compat == "paper" and policy not in ("sglang+", "marconi", "vllm+"):
        compat = "corrected"
    if compat == "paper":
        mode = "sequential"  # the artifact's replay has no des mode (SimConfig refuses it)
    sched = "continuous" if mode == "continuous" else "fcfs"  # des with continuous batching
    cfg = SimConfig(
        policy=policy,
        mode="des" if sched == "continuous" else mode,
        scheduler=sched,
        compat=compat,
        alpha=1.0,
        capacity_bytes=states * S + kv * K,
        prefill_chunk_tokens=16,
        max_num_batched_tokens=24,
    )
    rep = Replayer()
    sim = build(trace, cfg, observers=(rep,))
    rep.sim = sim
    run(sim)
    # an SGLang preset aborts every prompt its KV pool cannot take (docs/presets-engines.md rule 18):
    # with no room for any, nothing is inserted
    assert rep.checks > 0 or bool(sim.rec.aborted.all())
    assert rep.live == sim.tree.checkpoints()


def test_events_file_as_jsonl_and_parquet(tmp_path):
    jl, pq = tmp_path / "ev.jsonl", tmp_path / "ev.parquet"
    for path in (jl, pq):
        res = CliRunner().invoke(
            main,
            [
                "run",
                "--trace",
                "synthetic:chat",
                "--sessions",
                "4",
                "--policy",
                "sglang+,marconi",
                "--capacity",
                "1GB",
                "--events",
                str(path),
                "--no-progress",
            ],
        )
        assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in jl.read_text().splitlines()]
    table = pd.read_parquet(pq)
    assert len(rows) == len(table) > 0
    assert {r["policy"] for r in rows} == {"sglang+", "marconi"}
    assert {"lookup", "prefill", "decode", "admit"} <= {r["event"] for r in rows}
    assert table["checkpoint"].dtype.name == "Int64"
    for policy in ("sglang+", "marconi"):  # per policy, checkpoint ids count up from 0 in admit order
        ids = [r["checkpoint"] for r in rows if r["policy"] == policy and r["event"] == "admit"]
        assert ids == list(range(len(ids)))


def test_events_file_with_a_wrong_suffix_is_one_line(tmp_path):
    res = CliRunner().invoke(main, ["run", "--events", str(tmp_path / "ev.txt"), "--no-progress"])
    assert res.exit_code == 2
    assert "must end in .jsonl or .parquet" in res.output


def test_an_insert_without_room_is_a_reject_event_and_admits_nothing():
    # capacity: one state + 50 KV tokens; the request needs 130 KV tokens + its tail state
    trace = Trace("one", three_requests().requests[:1])
    log = EventLog()
    res = run(build(trace, SimConfig(policy="sglang+", mode="sequential", capacity_bytes=S + 50 * K), observers=(log,)))
    r0 = trace.requests[0]
    assert [type(e).__name__ for e in log.events] == ["Lookup", "Prefill", "Decode", "Reject"]
    assert log.events[-1] == Reject(r0, 0.0, "no room")
    assert res.summary["rejected_inserts"] == 1


def test_event_log_keeps_every_field_under_its_name_and_rows_round_trip(tmp_path):
    """Each EventLog method stores each argument in the field of the same name (distinct values, so
    a swapped or dropped field shows), event_row flattens the request to its id, and both file
    formats give back the same rows (ids and positions as integers)."""
    from sim.engine.events import EVENTS, Observer, event_row, listeners, write_events

    r = Request(0, 0, toks(0, 4), toks(4, 2), request_id=7)
    log = EventLog()
    log.lookup(r, 1.5, 3, 40, 50)
    log.prefill(r, 2.0, 2.5, 40, 50, 0.5)
    log.decode(r, 2.5, 3.25, 50, 52, 0.75)
    log.admit(2.5, 11, r, 50, "prompt-end")
    log.evict(4.0, 11, 50)
    log.evict_kv(4.5, 17)
    log.reject(r, 5.0, "too big")
    rows = [event_row(ev, run="x") for ev in log.events]
    assert rows == [
        {
            "run": "x",
            "event": "lookup",
            "request_id": 7,
            "t": 1.5,
            "hit_checkpoint": 3,
            "hit_tokens": 40,
            "input_tokens": 50,
        },
        {
            "run": "x",
            "event": "prefill",
            "request_id": 7,
            "t_start": 2.0,
            "t_end": 2.5,
            "start_pos": 40,
            "end_pos": 50,
            "seconds": 0.5,
        },
        {
            "run": "x",
            "event": "decode",
            "request_id": 7,
            "t_start": 2.5,
            "t_end": 3.25,
            "start_pos": 50,
            "end_pos": 52,
            "seconds": 0.75,
        },
        {
            "run": "x",
            "event": "admit",
            "t": 2.5,
            "checkpoint": 11,
            "request_id": 7,
            "position": 50,
            "phase": "prompt-end",
        },
        {"run": "x", "event": "evict", "t": 4.0, "checkpoint": 11, "position": 50},
        {"run": "x", "event": "evict_kv", "t": 4.5, "tokens": 17},
        {"run": "x", "event": "reject", "request_id": 7, "t": 5.0, "reason": "too big"},
    ]
    write_events(rows, tmp_path / "e.jsonl")
    assert [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()] == rows
    write_events(rows, tmp_path / "e.parquet")
    table = pd.read_parquet(tmp_path / "e.parquet")
    import pyarrow.parquet as pq

    assert pq.read_schema(tmp_path / "e.parquet").names == list(dict.fromkeys(k for row in rows for k in row))
    assert list(table["event"]) == [row["event"] for row in rows]
    assert str(table["checkpoint"].dtype) == "Int64" and table["checkpoint"].iloc[3] == 11
    assert table["hit_checkpoint"].iloc[0] == 3 and table["tokens"].iloc[5] == 17

    class OnlyEvicts(Observer):
        def evict(self, t, checkpoint, position):
            pass

    plain = type("Plain", (), {"admit": lambda self, *a: None})()
    assert [fn.__name__ for fn in listeners([OnlyEvicts(), plain], "evict")] == ["evict"]
    assert listeners([OnlyEvicts()], "admit") == () and len(listeners([plain], "admit")) == 1
    assert set(EVENTS) >= {"lookup", "prefill", "decode", "admit", "evict", "evict_kv", "reject"}


def test_event_log_records_arrivals_and_engine_steps():
    """``arrive`` and ``step`` (the batching scheduler's events) are kept in order with every
    field under its name; a step's batch stays as given (prefills as (request, start, end),
    decodes as (request, context), preempted ids)."""
    from sim.engine.events import Arrive, Step, event_row

    r = Request(0, 0, toks(0, 4), toks(4, 2), request_id=3)
    log = EventLog()
    log.arrive(r, 0.25)
    log.step(1.0, 1.5, 0.5, 2, ((3, 0, 4),), ((5, 9),), 6, (8,))
    assert log.events == [Arrive(r, 0.25), Step(1.0, 1.5, 0.5, 2, ((3, 0, 4),), ((5, 9),), 6, (8,))]
    assert [event_row(ev) for ev in log.events] == [
        {"event": "arrive", "request_id": 3, "t": 0.25},
        {
            "event": "step",
            "t_start": 1.0,
            "t_end": 1.5,
            "seconds": 0.5,
            "steps": 2,
            "prefills": ((3, 0, 4),),
            "decodes": ((5, 9),),
            "tokens": 6,
            "preempted": (8,),
        },
    ]


def test_an_engine_presets_decode_event_ends_at_every_token_served_in_both_modes():
    """An engine stores one token less than it serves (the last sampled token's KV is never
    written): the three 120 + 10 requests store 129 tokens each, but their decode events end at
    token 130, in sequential mode (``served_at_once``) as in des mode."""
    for policy in ("sglang", "vllm"):
        for mode in ("sequential", "des"):
            log = EventLog()
            run(build(three_requests(), SimConfig(policy=policy, mode=mode, capacity_bytes=10**12), observers=(log,)))
            ends = [(e.start_pos, e.end_pos) for e in log.events if isinstance(e, Decode)]
            assert ends == [(120, 130)] * 3, (policy, mode)

"""Replay's contract on every path (issue 41), on the CPU: for every trace kind the loaders accept
(ShareGPT, LMSys, SWE-bench agent, Mooncake, Bailian, synthetic chat / agent), both schedulers
(fcfs and continuous; sequential mode too), both state alignments and capacities from tight to
ample, on ``replay-tiny`` (and its MoE twin ``replay-tiny-moe``):

- the run completes (no exception), with 0 failures;
- every hit validated, its KV too (hits = hits_validated = kv_hits_validated; no hit without a
  reason: ``hits_unvalidated`` is empty);
- executed FLOPs saved equal to the simulated ones within 0.1 %;
- under the continuous scheduler, every executed step's batched forward cross-checked against
  its per-sequence forwards, 0 mismatches.

Not a full cartesian product (it would take minutes): each value of each axis appears, with the
pairs that broke (hash-block traces under both schedulers, tight capacity under continuous
batching, exact alignment with preemption). The hash-block fixtures are written here: short
prompts (a few 512-token Mooncake blocks, or 16-token Bailian blocks) with shared prefixes, prompt
lengths off the block grid, a prompt that is a whole earlier prompt (a whole-prompt hit) and
arrivals together (requests wait, more than the replayer keeps tensors for).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from sim.config import SimConfig  # noqa: E402
from sim.cost import get_model  # noqa: E402
from sim.replay.session import ReplaySettings, run_replay  # noqa: E402
from sim.simulate import build  # noqa: E402
from traces.registry import TraceOptions, load_trace  # noqa: E402

TIGHT, AMPLE = "tight", 10**10
# tight: a few prompts' KV and states (replay-tiny: 64 bytes of KV a token, 12 KiB a state), so
# entries are evicted while later turns still hit
TIGHT_BYTES = {"mooncake": 400_000}
CHECK_STEPS = 12  # continuous: the first steps' batched forwards against per-sequence ones

# Mooncake rows (512-token blocks): shared prefixes of whole blocks, a partial last block with its
# own hash (as Mooncake hashes a block's content), lengths off the block grid, a whole-prompt repeat
# (row 8 repeats row 7), and arrivals in groups (a queue forms)
MOONCAKE = [
    (0, 1300, 40, [0, 1, 50]),
    (0, 1800, 30, [0, 1, 2, 51]),
    (0, 1100, 20, [0, 1, 52]),
    (2000, 2300, 24, [0, 1, 2, 3, 53]),
    (2000, 1300, 16, [0, 1, 59]),
    (2000, 700, 8, [0, 54]),
    (4000, 2600, 30, [0, 1, 2, 3, 4, 55]),
    (4000, 1024, 12, [0, 1]),
    (4000, 1024, 12, [0, 1]),
    (6000, 1900, 20, [0, 1, 2, 56]),
    (6000, 2400, 18, [0, 1, 2, 3, 57]),
    (6000, 600, 6, [0, 58]),
]


def _mooncake(tmp) -> str:
    p = tmp / "mooncake.jsonl"
    p.write_text(
        "".join(
            json.dumps(dict(timestamp=t, input_length=n, output_length=o, hash_ids=h)) + "\n" for t, n, o, h in MOONCAKE
        )
    )
    return f"mooncake:{p}"


def _bailian(tmp) -> str:
    rows, cid = [], 0
    for s in range(4):  # four conversations of four turns over a shared system prompt (blocks 0-2)
        parent, hashes = -1, [0, 1, 2]
        for turn in range(1, 5):
            hashes = hashes + [100 * s + 10 * turn + k for k in range(3)]
            n = 16 * len(hashes) - 5 * (turn % 3)  # off the 16-token grid on most turns
            # (a partial last block is hashed on its own: the next turn's full block is another)
            hashes_in = hashes if n % 16 == 0 else hashes[:-1] + [9000 + cid]
            rows.append(
                dict(
                    chat_id=cid,
                    parent_chat_id=parent,
                    timestamp=0.4 * s + 1.5 * turn,
                    input_length=n,
                    output_length=6 + turn,
                    type="text",
                    turn=turn,
                    hash_ids=list(hashes_in),
                )
            )
            parent, cid = cid, cid + 1
    rows.sort(key=lambda r: r["timestamp"])
    p = tmp / "bailian.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"bailian:{p}"


def _lmsys(tmp) -> str:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    schema = pa.schema(
        [
            ("conversation_id", pa.string()),
            ("model", pa.string()),
            ("conversation", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
            ("turn", pa.int64()),
            ("language", pa.string()),
            ("openai_moderation", pa.list_(pa.struct([("flagged", pa.bool_())]))),
            ("redacted", pa.bool_()),
        ]
    )
    rows = []
    for c in range(3):
        conv = []
        for k in range(4):
            conv.append({"role": "user", "content": f"conversation {c} question {k}: " + "why is the sky blue? " * 6})
            conv.append({"role": "assistant", "content": f"answer {k}: " + "because of scattering. " * 5})
        rows.append(
            dict(
                conversation_id=f"c{c}",
                model="vicuna-13b",
                conversation=conv,
                turn=4,
                language="English",
                openai_moderation=[{"flagged": False}] * 8,
                redacted=False,
            )
        )
    d = tmp / "lmsys"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), d / "train-00000-of-00001.parquet")
    return f"lmsys:{d}"


def _swebench(tmp) -> str:
    from pathlib import Path

    p = Path(__file__).resolve().parents[2] / "traces" / "swebench_fixtures" / "fc__marshmallow-1867.traj"
    if not p.exists():
        pytest.skip("SWE-bench fixture not found")
    return f"swebench:{p}"


TRACES = {
    "sharegpt": lambda tmp: "sharegpt",
    "lmsys": _lmsys,
    "swebench": _swebench,
    "mooncake": _mooncake,
    "bailian": _bailian,
    "chat": lambda tmp: "synthetic:chat:sessions=4,turns=4,prompt_tokens=300,user_tokens=40,output_tokens=12,prompts=2",
    "agent": lambda tmp: (
        "synthetic:agent:sessions=2,turns=6,prompt_tokens=400,task_tokens=120,output_tokens=10,obs_tokens=60,prompts=1"
    ),
}
OPTIONS = {
    "sharegpt": TraceOptions(sessions=8, max_tokens=600, min_rounds=2),
    "lmsys": TraceOptions(sessions=0, min_rounds=2),
    "swebench": TraceOptions(max_turns=6, keep_observations=2),
}

_loaded: dict = {}


def trace_of(kind: str, tmp_path_factory):
    if kind not in _loaded:
        spec = TRACES[kind](tmp_path_factory.mktemp(kind))
        try:
            _loaded[kind] = load_trace(spec, OPTIONS.get(kind, TraceOptions()))
        except Exception as exc:  # noqa: BLE001 - a dataset package or the tokenizer may be absent
            if kind in ("sharegpt", "lmsys", "swebench"):
                pytest.skip(f"{kind} not available: {exc}")
            raise
    return _loaded[kind]


def replay(trace, *, scheduler="fcfs", alignment="exact", capacity=AMPLE, mode="des", requests=16, model="replay-tiny"):
    config = SimConfig(
        policy="marconi",
        model=model,
        capacity_bytes=capacity,
        state_alignment=alignment,
        mode=mode,
        scheduler=scheduler if mode == "des" else "auto",
        max_num_batched_tokens=1024,
        sessions_per_second=50.0,
    )
    settings = ReplaySettings(device="cpu", dtype="fp32", requests=requests, check_steps=CHECK_STEPS, coast_steps=2)
    return run_replay(trace, config, settings, build=build)


def check_contract(res, *, continuous: bool, want_hits: bool = True) -> dict:
    s = res.summary
    assert res.failures == [], [f.message() for f in res.failures[:5]]
    assert s["failures"] == 0
    if want_hits:
        assert s["hits"] > 0
    assert s["hits_validated"] == s["hits"] == s["kv_hits_validated"], s.get("hits_unvalidated")
    assert s["hits_unvalidated"] == {}
    sim_saved, exe_saved = s["simulated_flops_saved"], s["measured_flops_saved"]
    # the cost model charges the gated-delta core per token, the kernel per 64-token chunk: a
    # hit off a 64-multiple saves a ragged chunk less than claimed, and each exact-alignment split
    # pads one more (at most a chunk of every gated-delta layer per hit and per split; at ShareGPT
    # scale < 0.1 %, on these prompts of a few hundred tokens a few %); nothing else may differ
    spec = get_model(res.settings["model"])
    df = res.requests
    hits = df[df["hit_tokens"] > 0]
    pad = spec.n_gdn * spec.gdn_chunk_flops * float((1 + hits["splits"]).sum() + df["splits"].sum())
    assert abs(exe_saved - sim_saved) <= max(1e-3 * abs(sim_saved), pad, 1.0), (exe_saved, sim_saved, pad)
    # and exactly: the difference is the chunks' padding (sim.replay.flops.padding_flops), nothing else
    assert exe_saved - sim_saved - s["padding_flops_saved"] == pytest.approx(0.0, abs=1e-9 * abs(sim_saved) + 1.0)
    if continuous:
        assert s["steps_cross_checked"] > 0 and s["step_check_failures"] == 0
        assert s["steps_cross_checked"] == min(CHECK_STEPS, s["steps_executed"])
    return s


# (trace, scheduler, alignment, capacity, mode): every trace under both schedulers (hash-block
# ones under both alignments and capacities), each alignment, capacity and mode on several traces
CASES = [
    ("sharegpt", "fcfs", "exact", AMPLE, "des"),
    ("sharegpt", "continuous", "chunk", AMPLE, "des"),
    ("sharegpt", None, "exact", TIGHT, "sequential"),
    ("lmsys", "fcfs", "chunk", TIGHT, "des"),
    ("lmsys", "continuous", "exact", AMPLE, "des"),
    ("swebench", "fcfs", "exact", TIGHT, "des"),
    ("swebench", "continuous", "chunk", AMPLE, "des"),
    ("mooncake", "fcfs", "exact", AMPLE, "des"),
    ("mooncake", "fcfs", "chunk", TIGHT, "des"),
    ("mooncake", "continuous", "exact", TIGHT, "des"),
    ("mooncake", "continuous", "chunk", AMPLE, "des"),
    ("mooncake", None, "exact", AMPLE, "sequential"),
    ("bailian", "fcfs", "chunk", AMPLE, "des"),
    ("bailian", "continuous", "exact", TIGHT, "des"),
    ("bailian", None, "chunk", AMPLE, "sequential"),
    ("chat", "fcfs", "chunk", TIGHT, "des"),
    ("chat", "continuous", "exact", TIGHT, "des"),
    ("agent", "fcfs", "exact", TIGHT, "des"),
    ("agent", "continuous", "chunk", AMPLE, "des"),
    ("agent", None, "chunk", AMPLE, "sequential"),
]


@pytest.mark.parametrize(
    "kind, scheduler, alignment, capacity, mode",
    CASES,
    ids=[f"{k}-{s or 'seq'}-{a}-{'tight' if c == TIGHT else 'ample'}" for k, s, a, c, m in CASES],
)
def test_contract(kind, scheduler, alignment, capacity, mode, tmp_path_factory):
    trace = trace_of(kind, tmp_path_factory)
    capacity = TIGHT_BYTES.get(kind, 60_000) if capacity == TIGHT else capacity
    res = replay(trace, scheduler=scheduler, alignment=alignment, capacity=capacity, mode=mode)
    check_contract(res, continuous=scheduler == "continuous")


@pytest.mark.parametrize("scheduler", ["fcfs", "continuous"])
def test_contract_moe_preset(scheduler, tmp_path_factory):
    """The MoE twin of replay-tiny (a wider active MLP, grouped KV heads as the MoE presets)."""
    trace = trace_of("mooncake", tmp_path_factory)
    res = replay(
        trace, scheduler=scheduler, alignment="exact", capacity=TIGHT_BYTES["mooncake"], model="replay-tiny-moe"
    )
    assert res.summary["mlp_moe_at_active_width"]
    check_contract(res, continuous=scheduler == "continuous")


def test_requests_waiting_past_the_open_flights_keep_their_hits(tmp_path_factory):
    """Mooncake's rows arrive together: 12 requests wait at once under fcfs, past the replayer's
    open flights when it keeps 2 of them (what 150 Mooncake requests did against 16 on the H200:
    22 hits ran from scratch, unchecked, and prompts ran twice)."""
    from sim.replay import session

    trace = trace_of("mooncake", tmp_path_factory)
    config = SimConfig(policy="marconi", model="replay-tiny", capacity_bytes=AMPLE, scheduler="fcfs")
    settings = ReplaySettings(device="cpu", dtype="fp32")
    seen = {}

    def small(replayer):
        replayer.max_open = 2
        seen["r"] = replayer

    res = session.run_replay(trace, config, settings, build=build, on_ready=small)
    s = check_contract(res, continuous=False)
    assert seen["r"].parked > 0
    df = res.requests
    # every request's prompt ran once, from its hit
    assert all(
        sum(e - a for a, e in segs) == n - h for segs, n, h in zip(df["segments"], df["input_tokens"], df["hit_tokens"])
    )
    assert s["hits"] >= 6


def test_repeated_prompt_with_a_partial_last_block(tmp_path):
    """A whole prompt of 1300 tokens (blocks 0, 1 and a partial 50) repeated. Request 2 finds
    request 0's edge [50, output] and splits it after the partial block: its prompt-end state sits
    at 1300, not at 3 x 512 = 1536 (the tree cut edges at whole blocks: the state lay past the
    request, issue 41). Request 3 reuses its whole prompt from it (Marconi: no last-token cap);
    requests 0 and 1 arrive together, so nothing holds a state at 1024 when request 2 looks up."""
    rows = [
        (0, 1300, 40, [0, 1, 50]),
        (0, 1100, 20, [0, 1, 52]),
        (2000, 1300, 16, [0, 1, 50]),
        (4000, 1300, 8, [0, 1, 50]),
    ]
    p = tmp_path / "repeat.jsonl"
    p.write_text(
        "".join(
            json.dumps(dict(timestamp=t, input_length=n, output_length=o, hash_ids=h)) + "\n" for t, n, o, h in rows
        )
    )
    trace = load_trace(f"mooncake:{p}", TraceOptions())
    res = replay(trace)
    check_contract(res, continuous=False)
    assert list(res.requests["hit_tokens"]) == [0, 0, 0, 1300]


def test_a_request_preempted_and_hit_again_counts_its_kv_check_once(tmp_path_factory):
    """ShareGPT under continuous batching at a tight capacity: a running request is preempted and
    looked up again, and hits again (request 11, the 3-token shared prefix both times). Its hit is
    checked at each lookup; its record is the last lookup's, so hits and hits_validated count it
    once, and kv_hits_validated counted it twice (10 against 9 hits: the contract's hits =
    hits_validated = kv_hits_validated broken by the bookkeeping alone). The progress bar counts
    each request once, at its end, and says the lookups again beside it (it counted every lookup:
    a Mooncake run of 40 requests read "replaying: 305req")."""

    class Bar:  # what the observer asks of tqdm
        n, postfix = 0, ""

        def update(self, k):
            self.n += k

        def set_postfix_str(self, s, refresh=True):
            self.postfix = s

    trace = trace_of("sharegpt", tmp_path_factory)
    config = SimConfig(
        policy="marconi", model="replay-tiny", capacity_bytes=60_000, state_alignment="exact", mode="des",
        scheduler="continuous", max_num_batched_tokens=8192, sessions_per_second=1.0,
    )  # fmt: skip
    settings = ReplaySettings(device="cpu", dtype="fp32", check_steps=CHECK_STEPS, coast_steps=2)
    bar = Bar()
    res = run_replay(trace, config, settings, build=build, progress=bar)
    df = res.requests
    assert bar.n == len(df) == len(trace.requests)
    assert bar.postfix == f"{int(df['lookups'].sum()) - len(df):,} lookups again (preempted)"
    again = df[(df["lookups"] > 1) & (df["hit_tokens"] > 0)]
    assert len(again) >= 1 and again["kv_validated"].all()
    s = check_contract(res, continuous=True)
    assert s["kv_hits_validated"] == int(df["kv_validated"].sum()) == s["hits"]


def test_a_hash_id_of_two_lengths_replays_with_every_hit_validated(tmp_path):
    """Hash id 0 as a whole 512-token prompt (no output), then as a 1-token prompt: the cache
    tree counted the block whole where the first path ends, so the second request's decode state
    was admitted at 515 of its 4 tokens and replay stopped with a ValueError (then refused the
    trace). Now it adds nothing past its tokens and has no state to hit; later prompts with the
    whole block hit request 0's state at 512, [2] taken as 1 token and then whole takes the
    shorter length, and every hit replays validated, under both schedulers and capacities."""
    p = tmp_path / "two-lengths.jsonl"
    rows = [
        (5000, 512, 0, [0]),
        (6000, 1, 3, [0]),
        (7000, 600, 2, [0, 1]),
        (8000, 1, 2, [2]),
        (9000, 1000, 2, [2, 3]),
        (10000, 1, 1, [2]),
        (11000, 1100, 1, [2, 3, 4]),
        (12000, 512, 1, [0]),
    ]
    p.write_text(
        "".join(
            json.dumps(dict(timestamp=t, input_length=n, output_length=o, hash_ids=h)) + "\n" for t, n, o, h in rows
        )
    )
    trace = load_trace(f"mooncake:{p}", TraceOptions())
    for scheduler in ("fcfs", "continuous"):
        for capacity in (300_000, AMPLE):
            res = replay(trace, scheduler=scheduler, capacity=capacity)
            s = check_contract(res, continuous=scheduler == "continuous")
            hits = [int(h) for h in res.requests["hit_tokens"]]
            assert hits[:4] == [0, 0, 512, 0] and hits[7] == 512, (scheduler, capacity, hits)
            assert s["hits"] == sum(h > 0 for h in hits) and hits[5] == 0


def test_running_flights_past_their_byte_bound_keep_the_contract(tmp_path_factory):
    """Under continuous batching every running request's flight is open; on a GPU their device
    bytes are bounded (``FLIGHT_BYTES``: marconi-7b ran an H100 out of memory at 20 GB without it).
    Bounded at one flight's worth here, flights give their states back (parked, or run and dropped)
    and the contract holds: every hit validated, each prompt run once from its hit."""
    from sim.replay import session

    trace = trace_of("mooncake", tmp_path_factory)
    config = SimConfig(
        policy="marconi",
        model="replay-tiny",
        capacity_bytes=AMPLE,
        scheduler="continuous",
        max_num_batched_tokens=1024,
        sessions_per_second=50.0,
    )
    settings = ReplaySettings(device="cpu", dtype="fp32", check_steps=CHECK_STEPS, coast_steps=2)
    seen = {}

    def small(replayer):
        replayer.max_open_bytes = 1
        seen["r"] = replayer

    res = session.run_replay(trace, config, settings, build=build, on_ready=small)
    check_contract(res, continuous=True)
    assert seen["r"].parked + seen["r"].dropped > 0
    assert res.summary["flights_parked"] == seen["r"].parked and res.summary["flights_dropped"] == seen["r"].dropped

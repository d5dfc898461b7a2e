"""``--hash-block-tokens``: a hash-block trace (Mooncake, Bailian) spelled out as tokens, each symbol
``s`` as ``(s + 2**40) * block + j`` (the spelling benchmarks/differential_vllm.py feeds the engines)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from traces.base import TraceError
from traces.hashblock import max_spelled_hash, spell, unspell
from traces.registry import TraceOptions, load_trace

OFF = 1 << 40
MOONCAKE = [
    {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 500, "input_length": 1024, "output_length": 513, "hash_ids": [0, 1]},
    {"timestamp": 2500, "input_length": 600, "output_length": 0, "hash_ids": [0, 3]},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ids(symbols, n, block=512):
    """The spelling written out by hand: symbol s -> (s + 2**40) * block + j, the first n."""
    return [(s + OFF) * block + j for s in symbols for j in range(block)][:n]


@pytest.fixture
def mooncake(tmp_path):
    return f"mooncake:{_write(tmp_path / 'm.jsonl', MOONCAKE)}"


def test_three_mooncake_rows_spelled_token_by_token(mooncake):
    blocks = load_trace(mooncake, TraceOptions())
    tr = load_trace(mooncake, TraceOptions(hash_block_tokens=True))
    assert tr.block_tokens == 1 and blocks.block_tokens == 512
    assert tr.meta["hash_block_tokens"] == 512 and "hash_block_tokens" not in blocks.meta
    r0, r1, r2 = tr.requests
    assert r0.input_tokens.tolist() == _ids([0, 1, 2], 1100)  # the last block partial: 76 of 512
    assert r0.output_tokens.tolist() == _ids([-1], 10)
    assert r1.input_tokens.tolist() == _ids([0, 1], 1024)
    assert r1.output_tokens.tolist() == _ids([-2, -3], 513)  # one token into the second output block
    assert r2.input_tokens.tolist() == _ids([0, 3], 600) and r2.output_tokens.tolist() == []
    assert r0.input_tokens[0] == OFF * 512 and r0.input_tokens[-1] == (2 + OFF) * 512 + 75
    assert r1.output_tokens[-1] == (OFF - 3) * 512  # below every input id, above 0
    assert tr.symbol_dtype == np.int64
    # what the trace says about itself is the same: lengths, totals, sessions, times
    for a, b in zip(tr.requests, blocks.requests, strict=True):
        assert (a.input_len, a.output_len, a.arrival, a.session_id) == (
            b.input_len,
            b.output_len,
            b.arrival,
            b.session_id,
        )
        assert len(a.input_tokens) == a.input_len and len(a.output_tokens) == a.output_len
    assert tr.input_tokens_total() == blocks.input_tokens_total() == 2724
    assert tr.output_tokens_total() == blocks.output_tokens_total() == 523


def test_inputs_and_outputs_never_share_an_id(mooncake):
    tr = load_trace(mooncake, TraceOptions(hash_block_tokens=True))
    ins = np.concatenate([r.input_tokens for r in tr.requests])
    outs = np.concatenate([r.output_tokens for r in tr.requests])
    assert outs.max() < ins.min() and outs.min() > 0
    assert len(np.unique(outs)) == len(outs)  # every answer is its own
    sym, j = unspell(ins, 512)
    assert set(sym.tolist()) == {0, 1, 2, 3} and j.max() == 511


def test_bailian_spelled_at_its_16_token_block(tmp_path):
    row = {
        "chat_id": 1,
        "parent_chat_id": -1,
        "timestamp": 0.0,
        "input_length": 20,
        "output_length": 3,
        "type": "text",
        "turn": 1,
        "hash_ids": [7, 9],
    }
    p = _write(tmp_path / "b.jsonl", [row])
    tr = load_trace(f"bailian:{p}", TraceOptions(hash_block_tokens=True))
    (r,) = tr.requests
    assert tr.block_tokens == 1 and tr.meta["hash_block_tokens"] == 16
    assert r.input_tokens.tolist() == _ids([7, 9], 20, 16) and r.output_tokens.tolist() == _ids([-1], 3, 16)


def test_a_hash_id_whose_tokens_overflow_an_int64_is_refused_naming_its_row(tmp_path):
    top = max_spelled_hash(512)
    assert (top + OFF) * 512 + 511 == 2**63 - 1 - ((2**63 - 1 - 511) % 512)  # fits, to the last block
    assert int(spell([top], 512, 512)[-1]) < 2**63
    ok = {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [top]}
    bad = {"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [top + 1]}
    p = _write(tmp_path / "m.jsonl", [ok, bad])
    assert len(load_trace(f"mooncake:{p}", TraceOptions()).requests) == 2  # the block spelling takes it
    with pytest.raises(TraceError, match=rf"m\.jsonl:2: hash id {top + 1} is too large for --hash-block-tokens"):
        load_trace(f"mooncake:{p}", TraceOptions(hash_block_tokens=True))
    tr = load_trace(f"mooncake:{p}", TraceOptions(hash_block_tokens=True, skip_bad_rows=True))
    assert len(tr.requests) == 1 and tr.requests[0].input_tokens[-1] == (top + OFF) * 512 + 511


def test_the_memory_check_counts_spelled_tokens(mooncake, monkeypatch):
    """The memory check runs row by row before the buffer is made: spelled, it counts tokens (the
    first row alone is 1,110, 8,880 bytes), the blocks their symbols (10 in all, 80 bytes)."""
    import traces.base as base

    monkeypatch.setattr(base, "available_memory", lambda: 8 * 1000)
    assert len(load_trace(mooncake, TraceOptions()).requests) == 3
    with pytest.raises(TraceError, match="would need .* for its symbols up to this row"):
        load_trace(mooncake, TraceOptions(hash_block_tokens=True))


def test_not_a_switch_is_refused():
    with pytest.raises(TraceError, match="--hash-block-tokens is a switch"):
        load_trace("mooncake:sample", TraceOptions(hash_block_tokens="yes"))


# ------------------------------------------------------------------ the simulator on both spellings

ALIGNED = [  # every prompt and output a whole number of 512-token blocks
    {"timestamp": 0, "input_length": 1536, "output_length": 512, "hash_ids": [0, 1, 2]},
    {"timestamp": 100, "input_length": 2560, "output_length": 512, "hash_ids": [0, 1, 2, 3, 4]},
    {"timestamp": 200, "input_length": 1024, "output_length": 512, "hash_ids": [0, 5]},
    {"timestamp": 300, "input_length": 3072, "output_length": 1024, "hash_ids": [0, 1, 2, 3, 4, 6]},
    {"timestamp": 400, "input_length": 2048, "output_length": 512, "hash_ids": [0, 5, 7, 8]},
]


def _hits(spec, policy, spelled, **knobs):
    from sim.config import UNLIMITED, SimConfig
    from sim.simulate import simulate

    tr = load_trace(spec, TraceOptions(hash_block_tokens=spelled))
    cfg = SimConfig(policy=policy, model="qwen3.5-9b", capacity_bytes=UNLIMITED, mode="sequential", **knobs)
    return simulate(tr, cfg).requests.sort_values("request_id")["hit_tokens"].tolist()


@pytest.mark.parametrize(
    "policy, knobs, hits",
    [
        ("marconi", {}, [0, 0, 0, 1536, 512]),
        ("sglang", {}, [0, 1536, 0, 2560, 512]),
        ("sglang", {"mamba_radix_cache_strategy": "extra_buffer"}, [0, 1536, 0, 2560, 512]),
        ("lmdeploy", {}, [0, 1536, 0, 2560, 1024]),
    ],
)
def test_hits_at_block_multiples_are_the_block_runs(tmp_path, policy, knobs, hits):
    """Where every position a preset keeps is a multiple of 512, the token spelling gives each
    request the hit of the block spelling."""
    spec = f"mooncake:{_write(tmp_path / 'a.jsonl', ALIGNED)}"
    assert _hits(spec, policy, False, **knobs) == hits
    assert _hits(spec, policy, True, **knobs) == hits


def test_a_preset_whose_block_is_not_a_hash_block_multiple_runs_spelled(tmp_path):
    """vllm's 528-token block cannot lie on 512-token symbols (refused), spelled out it can: its
    hits are whole 528-token blocks inside the shared hash blocks."""
    spec = f"mooncake:{_write(tmp_path / 'a.jsonl', ALIGNED)}"
    with pytest.raises(Exception, match="528 tokens, finer than .* the trace's 512-token blocks"):
        _hits(spec, "vllm", False)
    assert _hits(spec, "vllm", True) == [0, 1056, 0, 2112, 528]


# ------------------------------------------------------------------ replay, caches, the CLI


def test_replay_draws_the_block_spellings_tokens(mooncake):
    from sim.replay.session import token_source

    blocks = token_source(load_trace(mooncake, TraceOptions()), seed=3)
    spelled = token_source(load_trace(mooncake, TraceOptions(hash_block_tokens=True)), seed=3)
    for rid in range(3):
        (a, na), (b, nb) = blocks(rid), spelled(rid)
        assert na == nb and np.array_equal(a, b)
    assert not np.array_equal(token_source(load_trace(mooncake, TraceOptions()), seed=4)(0)[0], blocks(0)[0])


def test_a_process_keeps_either_spelling_apart(mooncake):
    """Sweep workers keep loaded traces by their options: one spelling is never served for the other."""
    from sim.experiments.runners import task_trace

    a = task_trace({"trace": mooncake})
    b = task_trace({"trace": mooncake, "hash_block_tokens": True})
    assert (a.block_tokens, b.block_tokens) == (512, 1)
    assert task_trace({"trace": mooncake, "hash_block_tokens": True}) is b


def test_the_config_id_names_the_spelling():
    from sim.experiments.grid import make_task

    a = make_task({"trace": "mooncake:sample"}, policy="sglang")
    b = make_task({"trace": "mooncake:sample", "hash_block_tokens": True}, policy="sglang")
    c = make_task({"trace": "mooncake:sample", "hash_block_tokens": False}, policy="sglang")
    assert a.config_id != b.config_id and a.config_id == c.config_id
    # a row's column only when set: rows at the default keep the columns of older results folders
    assert b.knobs["hash_block_tokens"] is True and "hash_block_tokens" not in a.knobs
    assert b.trace_kwargs["hash_block_tokens"] is True and a.trace_kwargs["hash_block_tokens"] is False


@pytest.fixture(scope="module")
def main():
    from sim.cli import main as marconi_main

    return marconi_main


def test_run_mooncake_sample_spelled_json(main):
    """sglang (no_buffer) keeps its states at 512-token multiples on this trace: the same hit rate
    either way; vllm's 528-token blocks are refused on the blocks and run spelled."""
    args = ["run", "--trace", "mooncake:sample", "--mode", "sequential", "--capacity", "40GB", "--format", "json"]
    args += ["--no-progress"]
    res = CliRunner().invoke(main, [*args, "--policy", "sglang", "--hash-block-tokens"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["policy"] == "sglang" and row["requests"] == 300 and row["token_hit_rate"] > 0.03
    blocks = CliRunner().invoke(main, [*args, "--policy", "sglang"])
    assert blocks.exit_code == 0, blocks.output
    assert row["token_hit_rate"] == json.loads(blocks.stdout)[0]["token_hit_rate"]
    res = CliRunner().invoke(main, [*args, "--policy", "vllm", "--hash-block-tokens"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["token_hit_rate"] > 0.03
    res = CliRunner().invoke(main, [*args, "--policy", "vllm"])
    assert res.exit_code == 2 and "finer than (or not a multiple of) the trace's 512-token blocks" in res.output


def test_stats_of_the_spelling(main):
    res = CliRunner().invoke(main, ["traces", "stats", "mooncake:sample", "--hash-block-tokens", "--format", "json"])
    assert res.exit_code == 0, res.output
    st = json.loads(res.stdout)
    assert st["block_tokens"] == 1 and st["input_tokens"] == 4_269_971 and st["output_tokens"] == 113_079


@pytest.mark.parametrize("spec", ["synthetic:chat", "marconi-jsonl:x.jsonl"])
def test_the_switch_on_a_trace_without_hash_blocks_is_one_line_exit_2(main, spec):
    res = CliRunner().invoke(main, ["run", "--trace", spec, "--hash-block-tokens"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith("Error: --hash-block-tokens does nothing for ") and "mooncake, bailian" in res.output


def test_replay_runs_on_the_spelling(main, tmp_path):
    """`marconi replay` (CPU, replay-tiny) on a spelled-out trace: the hits it executes are checked
    bit for bit against a from-scratch prefill, as on the blocks."""
    rows = [
        {"timestamp": 0, "input_length": 700, "output_length": 4, "hash_ids": [0, 1]},
        {"timestamp": 1, "input_length": 900, "output_length": 4, "hash_ids": [0, 1]},
        {"timestamp": 2, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]},
    ]
    spec = f"mooncake:{_write(tmp_path / 'r.jsonl', rows)}"
    out = tmp_path / "out"
    args = ["replay", "--model", "replay-tiny", "--device", "cpu", "--trace", spec, "--hash-block-tokens"]
    res = CliRunner().invoke(main, [*args, "--policy", "sglang", "--capacity", "40GB", "--out", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())["summary"]
    assert s["hits_validated"] >= 2 and s["failures"] == 0 and s["integrity_failures"] == 0

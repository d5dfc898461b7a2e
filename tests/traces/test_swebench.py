import json

import numpy as np
import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace

SYSTEM = "SETTING: You are an autonomous programmer working in a command line."
INSTANCE = "We're currently solving the following issue within our repository: fix the bug."


def _obs(i):
    return f"output of step {i}\nline two\nline three"


def _traj(n_steps, demo=True):
    history = [{"role": "system", "content": SYSTEM, "agent": "primary"}]
    if demo:
        history += [{"role": "user", "content": "demo task", "is_demo": True},
                    {"role": "assistant", "content": "demo action", "is_demo": True}]
    history.append({"role": "user", "content": INSTANCE, "agent": "primary"})
    trajectory = []
    for i in range(n_steps):
        resp = f"DISCUSSION\nI will run step {i}.\n```\nls -la dir{i}\n```"
        history.append({"role": "assistant", "content": resp, "thought": f"step {i}", "action": f"ls -la dir{i}"})
        history.append({"role": "user", "content": _obs(i)})
        trajectory.append({"response": resp, "thought": f"step {i}", "action": f"ls -la dir{i}",
                           "observation": _obs(i), "state": "{}"})
    return {"environment": "swe_main", "trajectory": trajectory, "history": history,
            "info": {"exit_status": "submitted"}}


@pytest.fixture
def trajs(tmp_path):
    d = tmp_path / "trajs"
    d.mkdir()
    (d / "b__repo-2.traj").write_text(json.dumps(_traj(4)))
    (d / "a__repo-1.traj").write_text(json.dumps(_traj(8)))
    return d


def _decode(qwen, arr):
    return qwen._qwen.decode(arr.tolist())


def test_requests_and_collapsing(trajs, qwen):
    tr = load_trace(f"swebench:{trajs}", TraceOptions())
    assert tr.closed_loop and tr.n_sessions == 2 and len(tr.requests) == 12
    assert tr.meta["trajectories"][0].endswith("a__repo-1.traj")  # sorted by file name
    s0 = tr.sessions()[0]
    assert len(s0) == 8
    # request k holds observations 0..k-1; the last 5 in full, older ones collapsed
    text7 = _decode(qwen, s0[7].input_tokens)
    assert text7.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\ndemo task")
    assert text7.count("Old environment output: (3 lines omitted)") == 2
    assert "output of step 0" not in text7 and "output of step 1" not in text7
    assert all(f"output of step {i}\nline two" in text7 for i in range(2, 7))
    assert text7.endswith("<|im_start|>assistant\n")
    assert _decode(qwen, s0[7].output_tokens) == "DISCUSSION\nI will run step 7.\n```\nls -la dir7\n```<|im_end|>"
    # up to 5 observations the history only grows; from then on the middle of the prefix changes
    for k in range(5):
        a, b = s0[k], s0[k + 1]
        assert np.array_equal(b.input_tokens[:len(a.input_tokens)], a.input_tokens)
    for k in range(5, 7):
        a, b = s0[k], s0[k + 1]
        seq = np.concatenate([a.input_tokens, a.output_tokens])
        n = len(seq)
        assert not np.array_equal(b.input_tokens[:n], seq)
        common = int(np.argmin(b.input_tokens[:n] == seq))
        assert common > 0  # branches off inside the shared prompt + history
    exact = [_decode(qwen, r.input_tokens) for r in s0]
    assert [t.count("Old environment output") for t in exact] == [0, 0, 0, 0, 0, 0, 1, 2]


def test_think_times_seeded(trajs):
    tr = load_trace(f"swebench:{trajs}", TraceOptions(response_time=5.0, seed=42))
    draws = np.random.RandomState(42).poisson(5.0, size=10).astype(float).tolist()
    thinks = [r.think_time for r in tr.requests]
    assert thinks[0] == 0.0 and thinks[8] == 0.0
    assert thinks[1:8] + thinks[9:] == draws
    again = load_trace(f"swebench:{trajs}", TraceOptions(response_time=5.0, seed=42, use_cache=False))
    assert [r.think_time for r in again.requests] == thinks


def test_caps(trajs):
    tr = load_trace(f"swebench:{trajs}", TraceOptions(max_turns=5))
    assert [len(v) for v in tr.sessions().values()] == [5, 4]
    full = load_trace(f"swebench:{trajs}", TraceOptions())
    cap = len(full.requests[3].input_tokens)
    tr = load_trace(f"swebench:{trajs}", TraceOptions(max_tokens=cap))
    assert [len(v) for v in tr.sessions().values()] == [4, 4]
    assert load_trace(f"swebench:{trajs}", TraceOptions(sessions=1)).n_sessions == 1


def test_dataset_forms(tmp_path, qwen):
    # JSON Lines of message lists (role/text, 'ai' assistant) and of trajectory-only records
    msgs = [{"role": "system", "text": SYSTEM}, {"role": "user", "text": INSTANCE}]
    for i in range(3):
        msgs += [{"role": "ai", "text": f"act {i}"}, {"role": "user", "text": _obs(i)}]
    steps = {"trajectory": [{"response": f"r{i}", "observation": "o", "query": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": INSTANCE}]} for i in range(2)]}
    p = tmp_path / "trajs.jsonl"
    p.write_text(json.dumps({"instance_id": "x", "trajectory": msgs}) + "\n" + json.dumps(steps) + "\n")
    tr = load_trace(f"swebench:{p}", TraceOptions())
    assert [len(v) for v in tr.sessions().values()] == [3, 2]
    assert _decode(qwen, tr.requests[2].input_tokens).endswith(
        "<|im_start|>assistant\nact 1<|im_end|>\n<|im_start|>user\n" + _obs(1) + "<|im_end|>\n<|im_start|>assistant\n")
    assert _decode(qwen, tr.requests[3].input_tokens).startswith(f"<|im_start|>system\n{SYSTEM}")


def test_bad_inputs(tmp_path, trajs):
    (trajs / "c__broken.traj").write_text('{"history": [')
    with pytest.raises(TraceError, match=r"c__broken\.traj:1: bad JSON"):
        load_trace(f"swebench:{trajs}", TraceOptions())
    tr = load_trace(f"swebench:{trajs}", TraceOptions(skip_bad_rows=True))
    assert tr.meta["skipped_rows"] == 1 and tr.n_sessions == 2
    d = tmp_path / "noassistant"
    d.mkdir()
    (d / "x.traj").write_text(json.dumps({"history": [{"role": "system", "content": "s"}]}))
    with pytest.raises(TraceError, match=r"x\.traj: no assistant step in the trajectory"):
        load_trace(f"swebench:{d}", TraceOptions())
    with pytest.raises(TraceError, match="SWE-bench trajectory path not found"):
        load_trace(f"swebench:{tmp_path / 'none'}", TraceOptions())
    with pytest.raises(TraceError, match="needs a path"):
        load_trace("swebench", TraceOptions())


def test_hub_dataset_of_trajectories_streams_rows(monkeypatch, qwen):
    """`swebench:hf:NAME[:SPLIT]` goes through datasets.load_dataset (streamed, token honoured);
    rows may hold their message lists as JSON strings, as hub datasets often do."""
    datasets = pytest.importorskip("datasets")
    calls = {}

    def fake_load_dataset(name, split=None, streaming=False, token=None):
        calls.update(name=name, split=split, streaming=streaming, token=token)
        return iter([{"instance_id": "a", "trajectory": json.dumps(_traj(3)["trajectory"])},
                     dict(_traj(2), instance_id="b")])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    tr = load_trace("swebench:hf:org/swe-trajs:test", TraceOptions(use_cache=False))
    assert calls == {"name": "org/swe-trajs", "split": "test", "streaming": True, "token": "hf_test"}
    assert tr.n_sessions == 2 and [len(s) for s in tr.sessions().values()] == [3, 2]


def test_hub_errors_are_one_line(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*a, **k):
        raise ConnectionError("no network\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(TraceError, match="cannot load org/x from the Hugging Face hub .*swebench:PATH"):
        load_trace("swebench:hf:org/x", TraceOptions(use_cache=False))

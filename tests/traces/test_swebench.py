"""Agent trajectories: SWE-agent .traj (function calling and 0.x), trajectory datasets (nebius,
SWE-Gym/OpenHands), Marconi's own construction, and hub access that fails fast.

Expected token ids come from an independent rendering: the Qwen3.5 chat template
(``chat_template.jinja`` of Qwen/Qwen3.5, non-thinking mode) written out below as string building,
encoded whole by the Qwen3.5 tokenizer with its special tokens parsed -- not by the loader's
piecewise, id-level rendering. Fixture files under ``swebench_fixtures/`` are hand-written in the
shapes of real files (SWE-agent 1.x function calling; SWE-agent 0.x with a demonstration).
"""

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces.base import TraceError
from traces.registry import TraceOptions, load_trace

FIXTURES = Path(__file__).parent / "swebench_fixtures"
FC = FIXTURES / "fc__marshmallow-1867.traj"
DEMO = FIXTURES / "demo_0x__humanevalfix-0.traj"
GEN = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # generation prompt, enable_thinking=False


# --------------------------------------------------------------------------------------------
# Independent rendering


def _text(content):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p.get("text") is not None)


def _param(v):
    if isinstance(v, str):
        return v
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


ROLE = {"ai": "assistant", "gpt": "assistant"}


def render(msgs, gen=True):
    """Qwen3.5's chat template on OpenAI-style messages (no tools block)."""
    msgs = [dict(m, role=ROLE.get(m["role"], m["role"])) for m in msgs]
    last_q = -1
    for i in range(len(msgs) - 1, -1, -1):
        t = _text(msgs[i].get("content")).strip()
        if msgs[i]["role"] == "user" and not (t.startswith("<tool_response>") and t.endswith("</tool_response>")):
            last_q = i
            break
    out = ""
    for i, m in enumerate(msgs):
        c = _text(m.get("content")).strip()
        if m["role"] in ("system", "user"):
            out += f"<|im_start|>{m['role']}\n{c}<|im_end|>\n"
        elif m["role"] == "assistant":
            out += "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if i > last_q else "") + c
            for j, tc in enumerate(m.get("tool_calls") or []):
                fn = tc["function"]
                args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
                out += (("\n\n" if c else "") if j == 0 else "\n") + f"<tool_call>\n<function={fn['name']}>\n"
                out += "".join(f"<parameter={k}>\n{_param(v)}\n</parameter>\n" for k, v in args.items())
                out += "</function>\n</tool_call>"
            out += "<|im_end|>\n"
        else:  # tool
            if i == 0 or msgs[i - 1]["role"] != "tool":
                out += "<|im_start|>user"
            out += f"\n<tool_response>\n{c}\n</tool_response>"
            if i == len(msgs) - 1 or msgs[i + 1]["role"] != "tool":
                out += "<|im_end|>\n"
    return out + (GEN if gen else "")


def _lines(content):
    if isinstance(content, str):
        return len(content.splitlines())
    return sum(len(p["text"].splitlines()) for p in content if p.get("type") == "text")


def request_view(history, k, keep=5):
    """The messages SWE-agent sends for step k, after its LastNObservations(n=keep)."""
    first = next(
        i for i, m in enumerate(history) if ROLE.get(m["role"], m["role"]) == "assistant" and not m.get("is_demo")
    )
    steps = [i for i in range(first, len(history)) if ROLE.get(history[i]["role"], history[i]["role"]) == "assistant"]
    hist = history[: steps[k]]
    typed = any("message_type" in m for m in history)

    def is_obs(m):
        if m.get("is_demo"):
            return False
        return m.get("message_type") == "observation" if typed else m["role"] in ("user", "tool")

    obs = [i for i, m in enumerate(hist) if is_obs(m)]
    omit = set(obs[1 : max(0, len(obs) - keep)])
    return [
        dict(m, content=f"Old environment output: ({_lines(m['content'])} lines omitted)") if i in omit else m
        for i, m in enumerate(hist)
    ], history[steps[k]]


def expected_requests(qwen, history, keep=5):
    """[(input ids, output ids)] of a trajectory, rendered independently."""
    n_steps = sum(ROLE.get(m["role"], m["role"]) == "assistant" and not m.get("is_demo") for m in history)
    out = []
    for k in range(n_steps):
        view, action = request_view(history, k, keep)
        inp = render(view)
        full = render(view + [action], gen=False)
        assert full.startswith(inp)  # the step renders after the last query: generation prompt + output
        out.append((qwen._qwen.encode(inp), qwen._qwen.encode(full[len(inp) :].removesuffix("\n"))))
    return out


def _history(path):
    return json.loads(Path(path).read_text())["history"]


def _decode(qwen, arr):
    return qwen._qwen.decode(arr.tolist())


def _one_file_dir(tmp_path, src, name=None):
    d = tmp_path / "trajs"
    d.mkdir(exist_ok=True)
    (d / (name or src.name)).write_text(src.read_text())
    return d


# --------------------------------------------------------------------------------------------
# SWE-agent 1.x, function calling


def test_function_calling_first_request_literal(qwen):
    """Request 0 of the function-calling fixture, written out by hand from the template."""
    tr = load_trace(f"swebench:{FC}", TraceOptions())
    r0 = tr.requests[0]
    system = (
        "SETTING: You are an autonomous programmer, and you're working directly in the command line with a "
        "special interface.\n\nYou can use the tools bash, open, goto, edit and submit."
    )
    instance = (
        "<uploaded_files>\n/testbed\n</uploaded_files>\nI've uploaded a python code repository in the "
        "directory /testbed. Consider the following PR description:\n\n<pr_description>\nTimeDelta "
        "serialization precision: 345 ms is serialized as 344.\n</pr_description>"
    )
    text = (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        "<|im_start|>user\nHere is a demonstration of how to correctly accomplish this task.<|im_end|>\n"
        "<|im_start|>assistant\nI'll list the repository first.\n\n<tool_call>\n<function=bash>\n"
        "<parameter=command>\nls\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsetup.py\nsrc\ntests\n</tool_response><|im_end|>\n"
        f"<|im_start|>user\n{instance}<|im_end|>\n" + GEN
    )
    out = (
        "Let me find the file that defines TimeDelta.\n\n<tool_call>\n<function=find_file>\n"
        "<parameter=file_name>\nfields.py\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    assert r0.input_tokens.tolist() == qwen._qwen.encode(text)
    assert r0.output_tokens.tolist() == qwen._qwen.encode(out)
    # <tool_call>, <tool_response>, <think> and their closers are single special tokens
    specials = {
        qwen._qwen.encode(s)[0]
        for s in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
    }
    assert len(specials) == 6 and specials <= set(r0.input_tokens.tolist())


def test_function_calling_tool_calls_and_tool_messages(qwen):
    tr = load_trace(f"swebench:{FC}", TraceOptions())
    s = tr.sessions()[0]
    assert len(s) == 8
    expected = expected_requests(qwen, _history(FC))
    assert [r.input_tokens.tolist() for r in s] == [e[0] for e in expected]
    assert [r.output_tokens.tolist() for r in s] == [e[1] for e in expected]
    assert tr.input_tokens_total() == sum(len(e[0]) for e in expected)
    assert tr.output_tokens_total() == sum(len(e[1]) for e in expected)
    # the action is in the output (it was dropped before): tool-call-only, parallel calls, typed args
    assert _decode(qwen, s[2].output_tokens) == (
        "<tool_call>\n<function=bash>\n<parameter=command>\npython "
        "reproduce.py\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    assert _decode(qwen, s[3].output_tokens) == (
        "Round instead of truncating, and check the file twice.\n\n<tool_call>\n<function=edit>\n"
        "<parameter=line_range>\n[1474, 1474]\n</parameter>\n<parameter=replacement>\n        return "
        "int(round(value.total_seconds() / base_unit.total_seconds()))\n</parameter>\n<parameter=dry_run>\n"
        "False\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=bash>\n<parameter=command>\n"
        "git diff --stat\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    assert _decode(qwen, s[7].output_tokens) == (
        "The fix is done; submit.\n\n<tool_call>\n<function=submit>\n</function>\n</tool_call><|im_end|>"
    )
    # two tool results of one step: one user turn, stripped contents
    assert _decode(qwen, s[4].input_tokens).endswith(
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nFile updated.\n</tool_response>\n"
        "<tool_response>\nsrc/marshmallow/fields.py | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)\n"
        "</tool_response><|im_end|>\n" + GEN
    )
    # no observation collapsed yet: each request extends the previous input + output
    for k in range(4):
        a, b = s[k], s[k + 1]
        seq = np.concatenate([a.input_tokens, a.output_tokens])
        assert np.array_equal(b.input_tokens[: len(seq)], seq)


def test_observation_collapse_counts_lines_like_sweagent(qwen):
    s = load_trace(f"swebench:{FC}", TraceOptions()).sessions()[0]
    text7 = _decode(qwen, s[7].input_tokens)
    # the observation "...)]\r\n1474: ...\r\n" is 2 lines by splitlines() (count('\n') + 1 would say 3)
    assert "<tool_response>\nOld environment output: (2 lines omitted)\n</tool_response>" in text7
    assert "(3 lines omitted)" not in text7
    assert text7.count("Old environment output") == 3  # observations of steps 0-2; the instance prompt stays
    assert "<pr_description>" in text7 and "setup.py\nsrc\ntests" in text7  # instance prompt, demo stay
    keep3 = load_trace(f"swebench:{FC}", TraceOptions(keep_observations=3)).sessions()[0]
    expected = expected_requests(qwen, _history(FC), keep=3)
    assert [r.input_tokens.tolist() for r in keep3] == [e[0] for e in expected]


# --------------------------------------------------------------------------------------------
# SWE-agent 0.x: a demonstration as one long user message, observations as user messages


def test_demonstration_0x(qwen):
    tr = load_trace(f"swebench:{DEMO}", TraceOptions())
    s = tr.sessions()[0]
    expected = expected_requests(qwen, _history(DEMO))
    assert len(s) == 8
    assert [r.input_tokens.tolist() for r in s] == [e[0] for e in expected]
    assert [r.output_tokens.tolist() for r in s] == [e[1] for e in expected]
    text7 = _decode(qwen, s[7].input_tokens)
    assert "--- DEMONSTRATION ---" in text7  # is_demo: never collapsed
    # step 0's observation ends with a newline: 11 lines by splitlines() (count('\n') + 1 would say 12)
    assert "<|im_start|>user\nOld environment output: (11 lines omitted)<|im_end|>" in text7
    # observations are user queries, so past steps lose the empty think block the generation prompt
    # had: request k+1 leaves request k's path where that block started
    think = len(qwen._qwen.encode("<think>\n\n</think>\n\n"))
    a, b = s[0], s[1]
    seq = np.concatenate([a.input_tokens, a.output_tokens])
    common = int(np.argmin(b.input_tokens[: len(seq)] == seq))
    assert common == len(a.input_tokens) - think


def test_requests_caps_and_order(tmp_path, qwen):
    d = tmp_path / "trajs"
    d.mkdir()
    (d / "b__fc.traj").write_text(FC.read_text())
    sub = d / "sub"
    sub.mkdir()
    (sub / "a__demo.traj").write_text(DEMO.read_text())
    tr = load_trace(f"swebench:{d}", TraceOptions())
    assert tr.meta["trajectories"][0].endswith("a__demo.traj")  # sorted by file name, recursive
    assert [len(v) for v in tr.sessions().values()] == [8, 8]
    assert [len(v) for v in load_trace(f"swebench:{d}", TraceOptions(max_turns=5)).sessions().values()] == [5, 5]
    full = load_trace(f"swebench:{d}", TraceOptions())
    cap = len(full.requests[3].input_tokens)
    tr = load_trace(f"swebench:{d}", TraceOptions(max_tokens=cap))
    assert len(tr.sessions()[0]) == 4
    assert load_trace(f"swebench:{d}", TraceOptions(sessions=1)).n_sessions == 1


def test_think_times_seeded(tmp_path):
    d = _one_file_dir(tmp_path, FC, "a.traj")
    (d / "b.traj").write_text(DEMO.read_text())
    tr = load_trace(f"swebench:{d}", TraceOptions(response_time=5.0, seed=42))
    draws = np.random.RandomState(42).poisson(5.0, size=14).astype(float).tolist()
    thinks = [r.think_time for r in tr.requests]
    assert thinks[0] == 0.0 and thinks[8] == 0.0
    assert thinks[1:8] + thinks[9:] == draws
    again = load_trace(f"swebench:{d}", TraceOptions(response_time=5.0, seed=42, use_cache=False))
    assert [r.think_time for r in again.requests] == thinks


# --------------------------------------------------------------------------------------------
# Datasets


NEBIUS_SCHEMA = pa.schema(
    [  # the dataset card's features
        ("instance_id", pa.string()),
        ("model_name", pa.string()),
        ("target", pa.bool_()),
        (
            "trajectory",
            pa.list_(
                pa.struct(
                    [
                        ("cutoff_date", pa.string()),
                        ("mask", pa.bool_()),
                        ("role", pa.string()),
                        ("system_prompt", pa.string()),
                        ("text", pa.string()),
                    ]
                )
            ),
        ),
        ("exit_status", pa.string()),
        ("generated_patch", pa.string()),
        ("eval_logs", pa.string()),
    ]
)
NEBIUS_SYSTEM = "SETTING: You are an autonomous programmer, and you're working directly in the command line."


def _nebius_row(iid, system_in_text):
    def msg(role, text=None, system_prompt=None, mask=False, cutoff=None):
        return {"cutoff_date": cutoff, "mask": mask, "role": role, "system_prompt": system_prompt, "text": text}

    first = (
        msg("system", text=NEBIUS_SYSTEM, cutoff="2024-10-01")
        if system_in_text
        else msg("system", system_prompt=NEBIUS_SYSTEM, cutoff="2024-10-01")
    )
    traj = [
        first,
        msg(
            "user",
            "We're currently solving the following issue within our repository:\nfix add()\n(Open file: n/a)\nbash-$",
        ),
    ]
    for i in range(3):
        traj += [
            msg("ai", f"DISCUSSION\nLook at file {i}.\n```\nopen f{i}.py\n```", mask=True),
            msg("user", f"[File: /repo/f{i}.py (2 lines total)]\n1:x = {i}\n(Open file: /repo/f{i}.py)\nbash-$"),
        ]
    return {
        "instance_id": iid,
        "model_name": "swe-agent-llama-70b",
        "target": False,
        "trajectory": traj,
        "exit_status": "submitted",
        "generated_patch": "",
        "eval_logs": "",
    }


def test_nebius_rows_system_prompt_both_layouts(tmp_path, qwen):
    """nebius/SWE-agent-trajectories: the system prompt sits in ``system_prompt`` with ``text`` null;
    rows with the prompt in ``text`` load the same."""
    p = tmp_path / "train-00000-of-00012.parquet"
    rows = [_nebius_row("a__a-1", system_in_text=False), _nebius_row("b__b-2", system_in_text=True)]
    pq.write_table(pa.Table.from_pylist(rows, schema=NEBIUS_SCHEMA), p)
    tr = load_trace(f"swebench:{p}", TraceOptions())
    s0, s1 = tr.sessions()[0], tr.sessions()[1]
    history = [{"role": m["role"], "content": m["text"] or m["system_prompt"]} for m in rows[1]["trajectory"]]
    expected = expected_requests(qwen, history)
    for s in (s0, s1):
        assert [r.input_tokens.tolist() for r in s] == [e[0] for e in expected]
        assert [r.output_tokens.tolist() for r in s] == [e[1] for e in expected]
    assert _decode(qwen, s0[0].input_tokens).startswith(f"<|im_start|>system\n{NEBIUS_SYSTEM}<|im_end|>\n")


def _openhands_row(iid):
    """SWE-Gym/OpenHands-Sampled-Trajectories: ``messages`` with list contents, tool_calls, tool messages."""

    def parts(t):
        return [{"type": "text", "text": t}]

    msgs = [
        {
            "role": "system",
            "content": parts(
                "You are OpenHands agent, a helpful AI assistant that can interact with a computer to solve tasks."
            ),
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
        },
        {
            "role": "user",
            "content": parts(
                "<uploaded_files>\n/workspace/getmoto__moto__4.1\n</uploaded_files>\n"
                "Fix the DynamoDB update expression bug."
            ),
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
        },
    ]
    for i, cmd in enumerate(["ls /workspace/getmoto__moto__4.1", "grep -n update_item moto/dynamodb/models/*.py"]):
        msgs.append(
            {
                "role": "assistant",
                "content": parts(f"Step {i}: let me look."),
                "tool_calls": [
                    {
                        "id": f"toolu_0{i}",
                        "type": "function",
                        "function": {"name": "execute_bash", "arguments": json.dumps({"command": cmd})},
                    }
                ],
                "tool_call_id": None,
                "name": None,
            }
        )
        msgs.append(
            {
                "role": "tool",
                "content": parts(f"output {i}\n[Command finished with exit code 0]"),
                "tool_calls": None,
                "tool_call_id": f"toolu_0{i}",
                "name": "execute_bash",
            }
        )
    msgs.append(
        {
            "role": "assistant",
            "content": parts("Done."),
            "tool_calls": [{"id": "toolu_09", "type": "function", "function": {"name": "finish", "arguments": "{}"}}],
            "tool_call_id": None,
            "name": None,
        }
    )
    return {"instance_id": iid, "resolved": False, "messages": msgs}


def test_openhands_rows_train_raw_split_through_load_dataset(tmp_path, qwen):
    """A local copy of a hub dataset whose only split is ``train.raw``: the split is chosen from the
    dataset's split list, rows stream through the real ``datasets.load_dataset``."""
    pytest.importorskip("datasets")
    d = tmp_path / "OpenHands-Sampled-Trajectories"
    (d / "data").mkdir(parents=True)
    rows = [_openhands_row("getmoto__moto-6226"), _openhands_row("getmoto__moto-5865")]
    pq.write_table(pa.Table.from_pylist(rows), d / "data" / "train.raw-00000-of-00001.parquet")
    tr = load_trace(f"swebench:hf:{d}", TraceOptions(use_cache=False))
    assert tr.n_sessions == 2 and [len(s) for s in tr.sessions().values()] == [3, 3]
    expected = expected_requests(qwen, rows[0]["messages"])
    s0 = tr.sessions()[0]
    assert [r.input_tokens.tolist() for r in s0] == [e[0] for e in expected]
    assert [r.output_tokens.tolist() for r in s0] == [e[1] for e in expected]
    assert _decode(qwen, s0[1].output_tokens).endswith(
        "<parameter=command>\ngrep -n update_item moto/dynamodb/models/*.py\n</parameter>\n</function>\n"
        "</tool_call><|im_end|>"
    )
    with pytest.raises(TraceError, match=r"cannot load .*OpenHands-Sampled-Trajectories from the Hugging Face hub"):
        load_trace(f"swebench:hf:{d}:train", TraceOptions(use_cache=False))


def test_dataset_forms(tmp_path, qwen):
    # JSON Lines of message lists (role/text, 'ai' assistant) and of trajectory-only records
    sys_, inst = "SYSTEM PROMPT", "the issue"
    msgs = [{"role": "system", "text": sys_}, {"role": "user", "text": inst}]
    for i in range(3):
        msgs += [{"role": "ai", "text": f"act {i}"}, {"role": "user", "text": f"obs {i}\nline"}]
    steps = {
        "trajectory": [
            {
                "response": f"r{i}",
                "observation": "o",
                "query": [{"role": "system", "content": sys_}, {"role": "user", "content": inst}],
            }
            for i in range(2)
        ]
    }
    p = tmp_path / "trajs.jsonl"
    p.write_text(json.dumps({"instance_id": "x", "trajectory": msgs}) + "\n" + json.dumps(steps) + "\n")
    tr = load_trace(f"swebench:{p}", TraceOptions())
    assert [len(v) for v in tr.sessions().values()] == [3, 2]
    hist = [{"role": m["role"], "content": m["text"]} for m in msgs]
    assert [r.input_tokens.tolist() for r in tr.sessions()[0]] == [e[0] for e in expected_requests(qwen, hist)]
    assert (
        _decode(qwen, tr.requests[3].input_tokens) == f"<|im_start|>system\n{sys_}<|im_end|>\n"
        f"<|im_start|>user\n{inst}<|im_end|>\n" + GEN
    )


# --------------------------------------------------------------------------------------------
# Marconi's construction


def _artifact_requests(enc, keep, max_turns, max_tokens):
    """The artifact's procedure as described: a list of [input, output] pairs; before appending a
    pair, once keep + 1 pairs are whole, the input of the pair ``keep`` from the end is popped."""
    pairs, out, attempted = [], [], 0
    for k in range(len(enc) // 2):
        attempted += 1
        if k > max_turns:
            break
        inp = [t for p in pairs for part in p for t in part] + enc[2 * k]
        if len(inp) > max_tokens:
            break
        out.append((inp, enc[2 * k + 1]))
        if sum(len(p) == 2 for p in pairs) >= keep + 1:
            pairs[-keep].pop(0)
        pairs.append([enc[2 * k], enc[2 * k + 1]])
    return out, attempted


def test_marconi_construction(tmp_path, qwen):
    d = tmp_path / "trajs"
    d.mkdir()
    long = []
    for i in range(60):
        long += [{"role": "user", "content": f"Observation {i}: ok"}, {"role": "assistant", "content": f"step {i}"}]
    big = [
        {"role": "user", "content": "start"},
        {"role": "assistant", "content": "a0"},
        {"role": "user", "content": "obs 1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "huge " * 3000},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "never"},
        {"role": "assistant", "content": "a3"},
    ]
    short = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "y"},
        {"role": "assistant", "content": "z"},
        {"role": "user", "content": "w"},
        {"role": "assistant"},
    ]
    (d / "a.json").write_text(json.dumps(long))
    (d / "b.json").write_text(json.dumps(big))
    (d / "c.traj").write_text(json.dumps({"history": short}))
    opts = TraceOptions(response_time=7.5, seed=42, max_tokens=2000)
    tr = load_trace(f"swebench:marconi:{d}", opts)
    assert tr.meta["construction"] == "marconi"
    draws = np.random.RandomState(42).poisson(7.5, size=200).astype(float).tolist()
    base = 0
    for sid, msgs in enumerate([long, big, short]):
        enc = [qwen.encode(json.dumps(m)) for m in msgs]
        want, attempted = _artifact_requests(enc, 5, 50, 2000)
        got = tr.sessions()[sid]
        assert [r.input_tokens.tolist() for r in got] == [w[0] for w in want]
        assert [r.output_tokens.tolist() for r in got] == [w[1] for w in want]
        assert [r.think_time for r in got] == [0.0] + draws[base : base + len(want) - 1]
        base += attempted - 1
    assert [len(s) for s in tr.sessions().values()] == [51, 2, 3]  # turns 0..50; token cap; 7 messages
    # request 7 of the long session: pair 0 whole, pair 1's input gone (no placeholder), pairs 2-6 whole
    text7 = _decode(qwen, tr.sessions()[0][7].input_tokens)
    assert "Observation 0" in text7 and "Observation 1:" not in text7 and "step 1" in text7
    assert "omitted" not in text7
    # --sessions counts trajectories read, as the artifact's first-N files
    assert load_trace(f"swebench:marconi:{d}", TraceOptions(sessions=2, max_tokens=2000)).n_sessions == 2


# --------------------------------------------------------------------------------------------
# Bad input and the hub


def test_bad_inputs(tmp_path):
    d = _one_file_dir(tmp_path, FC)
    (d / "c__broken.traj").write_text('{"history": [')
    with pytest.raises(TraceError, match=r"c__broken\.traj:1: bad JSON"):
        load_trace(f"swebench:{d}", TraceOptions())
    tr = load_trace(f"swebench:{d}", TraceOptions(skip_bad_rows=True))
    assert tr.meta["skipped_rows"] == 1 and tr.n_sessions == 1
    e = tmp_path / "noassistant"
    e.mkdir()
    (e / "x.traj").write_text(json.dumps({"history": [{"role": "system", "content": "s"}]}))
    with pytest.raises(TraceError, match=r"x\.traj: no assistant step in the trajectory"):
        load_trace(f"swebench:{e}", TraceOptions())
    (e / "x.traj").write_text(json.dumps({"history": [{"role": "narrator", "content": "s"}]}))
    with pytest.raises(TraceError, match=r"x\.traj: message 0 has an unknown role 'narrator'"):
        load_trace(f"swebench:{e}", TraceOptions())
    (e / "x.traj").write_text(json.dumps({"history": [{"role": "assistant", "content": "s", "tool_calls": [{}]}]}))
    with pytest.raises(TraceError, match=r"x\.traj: message 0: tool call without a function name"):
        load_trace(f"swebench:{e}", TraceOptions())
    with pytest.raises(TraceError, match="SWE-bench trajectory path not found"):
        load_trace(f"swebench:{tmp_path / 'none'}", TraceOptions())
    with pytest.raises(TraceError, match="needs a path"):
        load_trace("swebench", TraceOptions())
    with pytest.raises(TraceError, match=r"swebench:marconi: needs a path"):
        load_trace("swebench:marconi:", TraceOptions())


def test_hub_dataset_of_trajectories_streams_rows(monkeypatch, qwen):
    """`swebench:hf:NAME[:SPLIT]` goes through datasets.load_dataset (streamed, token honoured);
    rows may hold their message lists as JSON strings, as hub datasets often do."""
    datasets = pytest.importorskip("datasets")
    import traces.hub

    calls = {}
    hist = _history(FC)

    def fake_load_dataset(name, split=None, streaming=False, token=None):
        calls.update(name=name, split=split, streaming=streaming, token=token)
        return iter([{"instance_id": "a", "history": json.dumps(hist)}, {"instance_id": "b", "messages": hist}])

    monkeypatch.setattr(traces.hub, "hub_unusable", lambda: None)  # no network in tests
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    tr = load_trace("swebench:hf:org/swe-trajs:test", TraceOptions(use_cache=False))
    assert calls == {"name": "org/swe-trajs", "split": "test", "streaming": True, "token": "hf_test"}
    assert tr.n_sessions == 2 and [len(s) for s in tr.sessions().values()] == [8, 8]


def _never_called(*a, **k):
    raise AssertionError("the hub was asked although it is unusable")


def test_hub_offline_fails_fast(monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets, "load_dataset", _never_called)
    monkeypatch.setattr(datasets, "get_dataset_split_names", _never_called)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(
        TraceError,
        match=r"^cannot load org/x from the Hugging Face hub: offline mode "
        r"\(HF_HUB_OFFLINE=1\); download them and use --trace swebench:PATH$",
    ):
        load_trace("swebench:hf:org/x", TraceOptions(use_cache=False))
    assert time.perf_counter() - t0 < 1.0


def test_hub_unreachable_fails_fast(monkeypatch):
    """No retries: one HEAD request to the endpoint (here a closed local port) decides."""
    datasets = pytest.importorskip("datasets")
    from traces.hub import PROBE_TIMEOUT

    for var in (
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", _never_called)
    monkeypatch.setattr(datasets, "get_dataset_split_names", _never_called)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.perf_counter()
    with pytest.raises(
        TraceError,
        match=r"cannot load org/x from the Hugging Face hub: http://127\.0\.0\.1:9 is "
        r"unreachable \(.*\); download them",
    ):
        load_trace("swebench:hf:org/x", TraceOptions(use_cache=False))
    assert time.perf_counter() - t0 < PROBE_TIMEOUT + 1.0


@pytest.mark.parametrize("spec,name", [("swebench:hf:org/x", "org/x"), ("lmsys", "lmsys/lmsys-chat-1m")])
def test_cli_offline_hub_one_line_exit_2(monkeypatch, spec, name):
    pytest.importorskip("datasets")
    from click.testing import CliRunner

    from sim.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    res = CliRunner().invoke(main, ["traces", "stats", spec])
    assert time.perf_counter() - t0 < 5.0
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert (
        len(lines) == 1 and f"cannot load {name} from the Hugging Face hub: offline mode (HF_HUB_OFFLINE=1)" in lines[0]
    )


def test_request_and_memory_limits(tmp_path, monkeypatch):
    import traces.base

    with pytest.raises(
        TraceError,
        match=r"fc__marshmallow-1867\.traj: .* tokens in one request, more than the limit "
        r"of 300 \(max_request_tokens\)",
    ):
        load_trace(f"swebench:{FC}", TraceOptions(max_request_tokens=300, use_cache=False))
    d = _one_file_dir(tmp_path, FC)
    (d / "z__tiny.traj").write_text(
        json.dumps({"history": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]})
    )
    tr = load_trace(f"swebench:{d}", TraceOptions(max_request_tokens=300, skip_bad_rows=True, use_cache=False))
    assert tr.meta["skipped_rows"] == 1 and tr.meta["trajectories"] == [str(d / "z__tiny.traj")]
    monkeypatch.setattr(traces.base, "available_memory", lambda: 1000)
    with pytest.raises(TraceError, match=r"fc__marshmallow-1867\.traj: the trace would need .* more than the"):
        load_trace(f"swebench:{FC}", TraceOptions(use_cache=False))


@pytest.mark.parametrize(
    "body",
    ["[" * 100_000 + "]" * 100_000, '{"history": [' + "9" * 5000 + "]}"],
    ids=["nested-too-deep", "5000-digit-number"],
)
@pytest.mark.parametrize("suffix", [".traj", ".jsonl"])
def test_json_python_cannot_parse_is_one_trace_error(tmp_path, body, suffix):
    """Deep nesting raises RecursionError and a 5,000-digit number ValueError inside json: both must
    be a TraceError naming the file (the CLI prints it as one line), and --skip-bad-rows skips them."""
    if suffix == ".traj":  # a folder of .traj files: one good, one bad
        d = _one_file_dir(tmp_path, FC)
        (d / "z__bad.traj").write_text(body + "\n")
        spec, where = f"swebench:{d}", r"z__bad\.traj"
    else:  # one dataset file: a bad row, then a good one
        f = tmp_path / "rows.jsonl"
        f.write_text(body + "\n" + json.dumps(json.loads(FC.read_text())) + "\n")
        spec, where = f"swebench:{f}", r"rows\.jsonl:1"
    with pytest.raises(TraceError, match=rf"{where}: bad JSON"):
        load_trace(spec, TraceOptions())
    tr = load_trace(spec, TraceOptions(skip_bad_rows=True))
    assert tr.meta["skipped_rows"] == 1 and tr.n_sessions == 1


def test_a_dataset_folder_and_gzip_files_load(tmp_path):
    """A hub dataset downloaded as a folder of shards (data/train-0000k-of-00002.parquet) was 'no
    .traj files under DIR'; a gzip .jsonl.gz was 'not UTF-8 text (invalid start byte)', a gzip .traj
    likewise. Each loads as its plain copy does (shards in path order), and a cut gzip is one line."""
    import gzip

    rows = [_nebius_row(f"a__a-{i}", system_in_text=False) for i in range(3)]
    d = tmp_path / "ds"
    (d / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:2], schema=NEBIUS_SCHEMA), d / "data" / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[2:], schema=NEBIUS_SCHEMA), d / "data" / "train-00001-of-00002.parquet")
    whole = tmp_path / "whole.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=NEBIUS_SCHEMA), whole)
    opts = TraceOptions(use_cache=False)
    expected = [r.input_tokens.tolist() for r in load_trace(f"swebench:{whole}", opts).requests]
    assert len(expected) > 3
    assert [r.input_tokens.tolist() for r in load_trace(f"swebench:{d}", opts).requests] == expected
    traj = json.loads(FC.read_text())
    plain = tmp_path / "rows.jsonl"
    plain.write_text(json.dumps(traj) + "\n")
    want = [r.input_tokens.tolist() for r in load_trace(f"swebench:{plain}", opts).requests]
    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert [r.input_tokens.tolist() for r in load_trace(f"swebench:{packed}", opts).requests] == want
    g = tmp_path / "t" / "fc__marshmallow-1867.traj"
    g.parent.mkdir()
    g.write_bytes(gzip.compress(FC.read_bytes()))
    assert [r.input_tokens.tolist() for r in load_trace(f"swebench:{g.parent}", opts).requests] == want
    packed.write_bytes(gzip.compress(plain.read_bytes())[:100])
    with pytest.raises(TraceError, match=r"^cannot read .*rows\.jsonl\.gz: Compressed file ended"):
        load_trace(f"swebench:{packed}", opts)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match=r"^no \.traj, \.jsonl or \.parquet files under "):
        load_trace(f"swebench:{tmp_path / 'empty'}", opts)

"""SWE-agent trajectories (``swebench:PATH``): one trajectory = one session, one step = one request.

Sources: a folder of SWE-agent ``.traj`` files (sorted by name, searched recursively), a single
``.traj``, or a dataset of trajectories: ``.jsonl`` (one trajectory object per line) or
``.parquet`` (one per row; list or JSON-string columns), or a Hugging Face dataset of trajectories
(``swebench:hf:DATASET[:SPLIT]``, streamed; ``HF_TOKEN`` honoured). Accepted trajectory shapes:

- SWE-agent ``.traj``: ``history`` = the full message list (system prompt, demonstrations, the
  instance prompt, then assistant actions and user observations) next to ``trajectory`` =
  ``[{response, thought, action, observation, state, query}]``. The history is used; without
  one, the prompt is taken from the first step's ``query`` and the steps from ``trajectory``.
- a plain message list under ``messages``, ``history`` or ``trajectory`` with ``role`` and
  ``content`` (or ``text``); roles ``ai``/``assistant`` are steps, others context.

Request k's input is the prompt (every message before the first non-demo assistant message) + the
history of steps before k + the assistant header; its output is step k's response. Observations
are collapsed the way SWE-agent's ``LastNObservations`` processor does: the last
``keep_observations`` (5) stay in full, older ones become ``Old environment output: (N lines
omitted)``. That rewrites the middle of the prefix from one step to the next, so a session's
requests branch off each other. Caps: at most ``max_turns`` (50) steps; the session stops before
the first request whose input exceeds ``max_tokens`` (32,768). Think time: an integer Poisson draw
of mean ``response_time`` seconds per step after the first (the paper: numpy seed 42; here
``seed``), the first step 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from traces.arrivals import poisson_response_times
from traces.base import TraceError
from traces.hub import stream_dataset
from traces.packing import PackedTrace, TraceBuilder, file_identity
from traces.tokenizers import get_tokenizer

PLACEHOLDER = "Old environment output: ({n} lines omitted)"
ASSISTANT = {"assistant", "ai", "gpt", "model"}


HUB_PREFIX = "hf:"


def source_identity(path: str) -> dict:
    if path.startswith(HUB_PREFIX):
        return {"hub": path[len(HUB_PREFIX):]}
    p = Path(path).expanduser()
    if not p.exists():
        raise TraceError(f"SWE-bench trajectory path not found: {p}")
    return file_identity(p)


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts [{type: text, text: ...}]
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    if content is None:
        return ""
    raise ValueError(f"message content of type {type(content).__name__}")


def _message_list(items) -> list[dict]:
    out = []
    for k, m in enumerate(items):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"message {k} has no 'role'")
        out.append({"role": str(m["role"]).lower(),
                    "content": _text(m.get("content", m.get("text"))),
                    "is_demo": bool(m.get("is_demo", False))})
    return out


def _parse(obj) -> tuple[list[tuple[str, str]], list[tuple[str, str | None]]]:
    """(prompt messages, steps [(response, observation or None)]) of one trajectory."""
    if isinstance(obj, list):
        obj = {"messages": obj}
    if not isinstance(obj, dict):
        raise ValueError("trajectory is not a JSON object")
    msgs = None
    for key in ("history", "messages"):
        if isinstance(obj.get(key), list) and obj[key]:
            msgs = _message_list(obj[key])
            break
    traj = obj.get("trajectory")
    if msgs is None and isinstance(traj, list) and traj and isinstance(traj[0], dict) and "role" in traj[0]:
        msgs = _message_list(traj)
    if msgs is not None:
        first = next((i for i, m in enumerate(msgs) if m["role"] in ASSISTANT and not m["is_demo"]), None)
        if first is None:
            raise ValueError("no assistant step in the trajectory")
        prompt = [(m["role"], m["content"]) for m in msgs[:first]]
        steps: list[tuple[str, str | None]] = []
        for m in msgs[first:]:
            if m["role"] in ASSISTANT:
                steps.append((m["content"], None))
            elif steps:
                resp, obs = steps[-1]
                steps[-1] = (resp, m["content"] if obs is None else obs + "\n" + m["content"])
        return prompt, steps
    if isinstance(traj, list) and traj:
        prompt = []
        q = traj[0].get("query") if isinstance(traj[0], dict) else None
        if isinstance(q, list):
            ms = _message_list(q)
            prompt = [(m["role"], m["content"]) for m in ms if m["role"] not in ASSISTANT]
        steps = []
        for k, st in enumerate(traj):
            if not isinstance(st, dict) or "response" not in st:
                raise ValueError(f"trajectory step {k} has no 'response'")
            steps.append((_text(st["response"]), _text(st.get("observation"))))
        return prompt, steps
    raise ValueError("neither a 'history'/'messages' list nor 'trajectory' steps")


def _decode_json_columns(rec: dict) -> dict:
    """Datasets often store nested lists as JSON strings: decode those columns."""
    for k, v in list(rec.items()):
        if isinstance(v, str) and v[:1] in "[{":
            try:
                rec[k] = json.loads(v)
            except json.JSONDecodeError:
                pass
    return rec


def _iter_hub(spec: str) -> Iterator[tuple[str, object]]:
    name, _, split = spec.partition(":")
    hint = "download them and use --trace swebench:PATH"
    for row, rec in stream_dataset(name, split or "train", what="trajectories", local_hint=hint):
        yield f"{name}: row {row}", _decode_json_columns(dict(rec))


def iter_trajectories(path: str, skip_bad_rows: bool, stats: dict) -> Iterator[tuple[str, object]]:
    if path.startswith(HUB_PREFIX):
        yield from _iter_hub(path[len(HUB_PREFIX):])
        return
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted((q for q in p.rglob("*.traj") if q.is_file()), key=lambda q: q.name)
        if not files:
            raise TraceError(f"no .traj files under {p}")
    elif p.is_file():
        files = [p]
    else:
        raise TraceError(f"SWE-bench trajectory path not found: {p}")
    for f in files:
        if f.suffix == ".jsonl":
            with open(f, encoding="utf-8") as fh:
                for line_no, line in enumerate(fh, 1):
                    if line.strip():
                        try:
                            yield f"{f}:{line_no}", json.loads(line)
                        except json.JSONDecodeError as exc:
                            if not skip_bad_rows:
                                raise TraceError(f"{f}:{line_no}: bad JSON: {exc.msg}") from None
                            stats["skipped_rows"] += 1
        elif f.suffix == ".parquet":
            import pyarrow.parquet as pq

            for row, rec in enumerate(pq.read_table(f).to_pylist()):
                yield f"{f}: row {row}", _decode_json_columns(rec)
        else:
            try:
                with open(f, encoding="utf-8") as fh:
                    obj = json.load(fh)
            except json.JSONDecodeError as exc:
                if not skip_bad_rows:
                    raise TraceError(f"{f}:{exc.lineno}: bad JSON: {exc.msg}") from None
                stats["skipped_rows"] += 1
                continue
            yield str(f), obj


class _Renderer:
    def __init__(self, tok):
        self.tok = tok
        self.nl = tok.encode("\n")
        self.header = tok.im_start + tok.encode("assistant\n")

    def message(self, role: str, text: str) -> list[int]:
        return self.tok.im_start + self.tok.encode(f"{role}\n{text}") + self.tok.im_end + self.nl


def build_session(r: _Renderer, prompt, steps, keep: int, max_turns: int, max_tokens: int):
    """[(input ids, output ids)] of one trajectory."""
    prompt_ids: list[int] = []
    for role, text in prompt:
        role = "assistant" if role in ASSISTANT else role
        prompt_ids += r.message(role, text)
    resp_ids = [r.tok.encode(resp) + r.tok.im_end for resp, _ in steps]
    obs_full = [r.message("user", obs) if obs is not None else [] for _, obs in steps]
    obs_short = [r.message("user", PLACEHOLDER.format(n=obs.count("\n") + 1)) if obs is not None else []
                 for _, obs in steps]
    out = []
    for k in range(min(len(steps), max_turns)):
        ids = list(prompt_ids)
        for j in range(k):
            ids += r.header + resp_ids[j] + r.nl
            ids += obs_full[j] if j >= k - keep else obs_short[j]
        ids += r.header
        if len(ids) > max_tokens:
            break
        out.append((np.asarray(ids, dtype=np.int64), np.asarray(resp_ids[k], dtype=np.int64)))
    return out


def load_packed(path: str, options) -> PackedTrace:
    tok = get_tokenizer(options.tokenizer)
    r = _Renderer(tok)
    stats = {"skipped_rows": 0}
    name = f"swebench:{path}"
    builder = TraceBuilder(name, block_tokens=1, closed_loop=True)
    sessions: list[tuple[str, list]] = []
    dropped = 0
    for where, obj in iter_trajectories(path, options.skip_bad_rows, stats):
        try:
            prompt, steps = _parse(obj)
        except ValueError as exc:
            if not options.skip_bad_rows:
                raise TraceError(f"{where}: {exc}") from None
            stats["skipped_rows"] += 1
            continue
        reqs = build_session(r, prompt, steps, options.keep_observations, options.max_turns, options.max_tokens)
        if not reqs:
            dropped += 1
            continue
        sessions.append((where, reqs))
        if options.sessions and len(sessions) >= options.sessions:
            break
    n_draws = sum(len(reqs) - 1 for _, reqs in sessions)
    draws = poisson_response_times(n_draws, options.response_time, options.seed).tolist()
    d = 0
    for sid, (_, reqs) in enumerate(sessions):
        for k, (inp, out) in enumerate(reqs):
            think = 0.0
            if k:
                think = draws[d]
                d += 1
            builder.add_request(sid, k, inp, out, think)
    builder.meta.update(source=name, trajectories=[w for w, _ in sessions], dropped_sessions=dropped,
                        response_time=options.response_time, seed=options.seed,
                        keep_observations=options.keep_observations, max_turns=options.max_turns,
                        tokenizer=options.tokenizer, **stats)
    return builder.build()

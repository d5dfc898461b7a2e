"""Seeded synthetic workloads (``synthetic:KIND[:key=value,...]``), token ids drawn at random.

Kinds and their parameters (defaults in ``DEFAULTS``; ``sessions`` defaults to ``--sessions``):

- ``system-prompt``: single-request sessions; each starts with one of ``prompts`` shared system
  prompts of ``prompt_tokens`` tokens, then a unique user message of ~``user_tokens``.
- ``few-shot``: single-request sessions; one of ``prompts`` shared few-shot prefixes of ``shots``
  examples of ~``shot_tokens`` tokens each, then a unique query of ~``user_tokens``.
- ``chat``: multi-turn chat: a shared system prompt (one of ``prompts``), ``turns`` turns of
  ~``user_tokens`` user / ~``output_tokens`` assistant tokens, think time exponential with mean
  ``think`` seconds (first turn 0).
- ``agent``: long agentic sessions: shared system prompt + a task of ~``task_tokens``, then
  ``turns`` steps of ~``output_tokens`` actions and ~``obs_tokens`` observations, think time an
  integer Poisson draw of mean ``--response-time`` (first step 0).

"~n" means uniform in [n/2, 3n/2]. All draws come from ``numpy.random.default_rng(seed)`` with
``seed`` = ``--trace-seed`` (or ``seed=`` in the spec); sessions are closed loop and are started
by the simulator's session schedule.
"""

from __future__ import annotations

import math

import numpy as np

from traces.base import Trace, TraceError, available_memory
from traces.packing import TraceBuilder

KINDS = ("system-prompt", "few-shot", "chat", "agent")
DEFAULTS = {
    "system-prompt": dict(prompts=4, prompt_tokens=2000, user_tokens=200, output_tokens=150),
    "few-shot": dict(prompts=4, shots=8, shot_tokens=250, user_tokens=150, output_tokens=100),
    "chat": dict(prompts=3, prompt_tokens=500, turns=8, user_tokens=150, output_tokens=300, think=10.0),
    "agent": dict(prompts=2, prompt_tokens=3000, task_tokens=800, turns=30, output_tokens=150, obs_tokens=600),
}
COMMON = dict(vocab=50000)


def parse_spec(arg: str) -> tuple[str, dict]:
    kind, _, params = arg.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise TraceError(f"unknown synthetic kind {kind!r} (valid: {', '.join(KINDS)})")
    out: dict = {}
    allowed = set(DEFAULTS[kind]) | set(COMMON) | {"sessions", "seed"}
    for item in filter(None, (s.strip() for s in params.split(","))):
        key, eq, val = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in allowed:
            raise TraceError(f"synthetic:{kind}: bad parameter {item!r} (valid: {', '.join(sorted(allowed))})")
        if key in out:  # 'turns=3,turns=4' ran with 4, the 3 dropped without a word
            raise TraceError(
                f"synthetic:{kind}: {key} is given twice ({item!r} after {key}={out[key]:g}): give it once"
            )
        try:
            num = float(val)
        except ValueError:
            raise TraceError(f"synthetic:{kind}: {key} must be a number (got {val!r})") from None
        if not math.isfinite(num):
            raise TraceError(f"synthetic:{kind}: {key} must be a finite number (got {val})")
        if num < 0:  # the least the key takes (sessions=-1 said `>= 0`, then sessions=0 `>= 1`)
            raise TraceError(f"synthetic:{kind}: {key} must be >= {_AT_LEAST.get(key, 0)} (got {val})")
        if key == "vocab" and num > 2**31:
            raise TraceError(f"synthetic:{kind}: vocab must be <= 2^31 (got {val})")
        if key != "think" and num != int(num):  # 'turns=2.5' was read as 2
            raise TraceError(f"synthetic:{kind}: {key} must be a whole number (got {val})")
        least = _AT_LEAST.get(key, 0)
        if num < least:  # 'turns=0' was read as 1, 'vocab=1' as 2
            raise TraceError(f"synthetic:{kind}: {key} must be >= {least} (got {val})")
        out[key] = num if key == "think" else int(num)
    return kind, out


#: parameters a workload needs more than 0 of (a session has a turn, a trace a prompt, a vocabulary
#: two symbols)
_AT_LEAST = {"turns": 1, "prompts": 1, "vocab": 2, "sessions": 1}


def _session_tokens(kind: str, p: dict) -> tuple[int, int]:
    """Upper bounds of (tokens of one session, tokens of one shared prefix) for parameters ``p``
    ("~n" draws at most 3n/2; every message has at least one token)."""
    up = lambda n: n * 3 // 2 + 1  # noqa: E731
    if kind == "few-shot":
        prefix = p["shots"] * up(p["shot_tokens"])
    else:
        prefix = p["prompt_tokens"]
    if kind in ("system-prompt", "few-shot"):
        return prefix + up(p["user_tokens"]) + up(p["output_tokens"]), prefix
    turns = max(1, p["turns"])
    if kind == "chat":
        return prefix + turns * (up(p["user_tokens"]) + up(p["output_tokens"])), prefix
    return prefix + up(p["task_tokens"]) + turns * (up(p["obs_tokens"]) + up(p["output_tokens"])), prefix


def _check_size(kind: str, p: dict, max_request_tokens: int) -> None:
    """Refuses parameters whose requests or whole trace could not be held, before drawing any."""
    session, prefix = _session_tokens(kind, p)
    if session > max_request_tokens:
        raise TraceError(
            f"synthetic:{kind}: a request can reach {session:,} tokens, more than the limit of "
            f"{max_request_tokens:,} (max_request_tokens)"
        )
    need = (p["sessions"] * session + max(1, p["prompts"]) * prefix) * 8  # int64 while drawing
    memory = available_memory()
    if need > memory:
        raise TraceError(
            f"synthetic:{kind}: {p['sessions']:,} sessions need up to {need / 1e9:,.1f} GB, more "
            f"than the {memory / 1e9:,.1f} GB of memory available"
        )


def load(arg: str, options) -> Trace:
    kind, given = parse_spec(arg)
    p = {**COMMON, **DEFAULTS[kind], "sessions": options.sessions or 100, "seed": options.seed, **given}
    if p["sessions"] < 1:
        raise TraceError(f"synthetic:{kind}: sessions must be >= 1")
    _check_size(kind, p, options.max_request_tokens)
    rng = np.random.default_rng(p["seed"])
    vocab = max(2, p["vocab"])

    def toks(n: int) -> np.ndarray:
        return rng.integers(0, vocab, size=n, dtype=np.int64)

    def around(n: int) -> int:
        return int(rng.integers(n // 2, n * 3 // 2 + 1)) if n > 0 else 0

    b = TraceBuilder(f"synthetic:{kind}", block_tokens=1, closed_loop=True)
    n_prompts = max(1, p["prompts"])
    if kind == "few-shot":
        prompts = [
            np.concatenate([toks(around(p["shot_tokens"])) for _ in range(p["shots"])] or [toks(0)])
            for _ in range(n_prompts)
        ]
    else:
        prompts = [toks(p["prompt_tokens"]) for _ in range(n_prompts)]
    for sid in range(p["sessions"]):
        prefix = prompts[int(rng.integers(n_prompts))]
        if kind in ("system-prompt", "few-shot"):
            inp = np.concatenate([prefix, toks(max(1, around(p["user_tokens"])))])
            out = toks(max(1, around(p["output_tokens"])))
            b.add_chain(np.concatenate([inp, out]), sid, [(0, len(inp), len(inp) + len(out), 0.0, None, -1, -1)])
            continue
        parts = [prefix]
        size = len(prefix)
        turns = []
        n_turns = max(1, p["turns"])
        if kind == "chat":
            thinks = [0.0] + rng.exponential(p["think"], size=n_turns - 1).tolist()
            users = [max(1, around(p["user_tokens"])) for _ in range(n_turns)]
        else:
            thinks = [0.0] + rng.poisson(options.response_time, size=n_turns - 1).astype(float).tolist()
            users = [max(1, around(p["task_tokens"]))] + [max(1, around(p["obs_tokens"])) for _ in range(n_turns - 1)]
        for k in range(n_turns):
            msg = toks(users[k])
            out = toks(max(1, around(p["output_tokens"])))
            parts += [msg, out]
            ie = size + len(msg)
            size = ie + len(out)
            turns.append((k, ie, size, thinks[k], None, -1, -1))
        b.add_chain(np.concatenate(parts), sid, turns)
    b.meta.update(source=f"synthetic:{arg}", params=p)
    return b.build().to_trace()

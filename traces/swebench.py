"""Agent trajectories (``swebench:PATH``): one trajectory = one session, one agent step = one request.

Sources: a folder of SWE-agent ``.traj`` files (sorted by name, searched recursively), a single
``.traj`` (or ``.json``: one trajectory, or a JSON array of them), a dataset of trajectories:
``.jsonl`` (one trajectory per line) or ``.parquet`` (one per
row; list or JSON-string columns) or a folder of such files without ``.traj`` ones (a downloaded
dataset's shards, in path order; any of these files may be gzip, told by its first bytes), or a
Hugging Face dataset (``swebench:hf:DATASET[:SPLIT]``,
streamed; ``HF_TOKEN`` honoured; without a split the dataset's own split list decides: ``train``,
else its only split, e.g. ``train.raw`` of SWE-Gym/OpenHands-Sampled-Trajectories).

Accepted trajectory shapes (a trajectory is a JSON object, or a bare message list):

- SWE-agent ``.traj``: ``history`` is the full message list (system prompt, demonstrations, the
  instance prompt, then actions and observations). Messages carry ``role`` (system, user,
  assistant, tool), ``content`` (a string or a list of ``{type: text, text}`` parts),
  ``message_type`` (thought / action / observation), ``is_demo``, and with function calling
  (SWE-agent 1.x's default) ``tool_calls`` on the assistant message and ``tool`` messages for the
  observations. Without a history the steps come from ``trajectory`` (``response`` /
  ``observation``) and the prompt from the first step's ``query``.
- datasets: a message list under ``messages``, ``history`` or ``trajectory``; roles ``ai`` /
  ``gpt`` are the assistant; text in ``content`` or ``text``; a system message whose text is null
  takes its ``system_prompt`` field (nebius/SWE-agent-trajectories), and a row-level
  ``system_prompt`` becomes the system message when the list has none. OpenHands-style rows
  (SWE-Gym) carry ``tool_calls`` with JSON-string ``arguments`` and ``tool`` messages.

Two constructions:

**SWE-agent as served by Qwen3.5** (``swebench:PATH``, the default). The prompt is every message
before the first non-demo assistant message; each later assistant message is a step, the messages
after it are its observations. Request k's input is the Qwen3.5 chat template (non-thinking mode)
applied to the prompt and steps 0..k-1 with their observations, plus the generation prompt; its
output is step k's assistant message (content, then its tool calls) and ``<|im_end|>``. Template
rules followed (the Qwen3.5 ``chat_template.jinja``): every message's text is stripped; a tool call
is ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>``
(after ``\\n\\n`` when there is content, ``\\n`` between calls; JSON-string arguments parsed as an
engine's OpenAI server does; mapping/list values as JSON); consecutive ``tool`` messages form one
user turn of ``\\n<tool_response>\\n...\\n</tool_response>`` blocks; assistant messages after the
last real user query get an empty ``<think>\\n\\n</think>\\n\\n`` block, as does the generation
prompt (``enable_thinking=False``). ``<tool_call>``, ``<tool_response>``, ``<think>`` and their
closers are single special tokens. Tool schemas are not in trajectory files, so the template's
``# Tools`` system block is absent (a constant block shared by every request of a run).
Observations are collapsed as SWE-agent's ``LastNObservations`` does: among non-demo observation
messages (``message_type == "observation"``, or user/tool messages where the file has no
``message_type``) the first (the instance prompt) and the last ``keep_observations`` (5) stay,
the others become ``Old environment output: (N lines omitted)`` with N from ``splitlines()``.
Collapsing rewrites the middle of the prefix from one step to the next, so a session's requests
branch off each other. Caps: at most ``max_turns`` (50) steps; the session stops before the first
request whose input exceeds ``max_tokens`` (32,768). Think time: an integer Poisson draw of mean
``response_time`` seconds per step after the first (seeded), the first step 0.

**Marconi's SWE-bench construction** (``swebench:marconi:PATH``, for comparisons with the paper;
written from the description of the artifact's trace generator, built on SWE-bench/experiments
``evaluation/verified/20240820_honeycomb/trajs``). A folder is read as the artifact reads it:
every file in it (not recursive), sorted by name, and ``--sessions`` counts trajectories read,
kept or not. The trajectory's message list (a top-level list, else its
``history``/``messages``/``trajectory`` list) is paired by position: request k's "input message"
is message 2k, its output message 2k+1 (a trailing odd message is dropped), whatever the roles. Each
message is the JSON encoding of the whole message object, tokenized on its own (no template, no
special tokens; the artifact's Llama-2 tokenizer also put a BOS before each message, Qwen has
none). Request k's input is pairs 0..k-1 followed by message 2k, where the input message of pair
j is deleted (no placeholder) when 1 <= j <= k-1-keep: pair 0 and the last ``keep`` pairs stay
whole. Requests 0..``max_turns`` are kept (51 with the defaults); the session stops at the first
request whose input exceeds ``max_tokens``. Think times: one Poisson draw per request after the
first, drawn before the caps are checked, so the request that ends a session still consumes a
draw (one seeded stream across sessions, as the artifact's ``np.random.seed(42)``).
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.arrivals import poisson_response_times
from traces.base import SizeBudget, TraceError, open_binary
from traces.hub import stream_dataset
from traces.packing import PackedTrace, TraceBuilder, file_identity
from traces.tokenizers import get_tokenizer

PLACEHOLDER = "Old environment output: ({n} lines omitted)"
#: seconds a load runs before its progress bar shows (with ``progress``): a short one shows none
PROGRESS_DELAY = 1.0
HUB_PREFIX = "hf:"
MARCONI_PREFIX = "marconi:"
ROLES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
}


def split_spec(path: str) -> tuple[str, str]:
    """(construction, source) of a ``swebench:`` argument: ``marconi:SRC`` or ``SRC``."""
    if path.startswith(MARCONI_PREFIX):
        return "marconi", path[len(MARCONI_PREFIX) :]
    return "sweagent", path


def source_identity(path: str) -> dict:
    construction, src = split_spec(path)
    if not src:
        raise TraceError(f"swebench:{construction}: needs a path: --trace swebench:marconi:PATH")
    if src.startswith(HUB_PREFIX):
        name = src[len(HUB_PREFIX) :]
        if not name.split(":")[0].strip():  # 'swebench:hf:' or 'swebench:hf::test'
            raise TraceError("swebench:hf: needs a dataset name: --trace swebench:hf:DATASET[:SPLIT]")
        ident = {"hub": name}
    else:
        p = Path(src).expanduser()
        if not p.exists():
            raise TraceError(f"SWE-bench trajectory path not found: {p}")
        ident = file_identity(p)
    # the rendering changed with the Qwen3.5 tool-call template: never reuse an older cache entry
    return {**ident, "construction": construction, "rendering": 2}


# --------------------------------------------------------------------------------------------
# Parsing: every accepted shape -> (prompt messages, steps)


@dataclass(slots=True)
class Message:
    role: str  # system | user | assistant | tool
    text: str
    tool_calls: tuple = ()  # ((name, arguments dict or None), ...)
    is_demo: bool = False
    message_type: str | None = None
    n_lines: int = 0  # SWE-agent's line count of the content (text parts, splitlines())
    n_images: int = 0

    def is_observation(self) -> bool:
        """What SWE-agent's LastNObservations may elide."""
        if self.is_demo:
            return False
        if self.message_type is not None:
            return self.message_type == "observation"
        return self.role in ("user", "tool")


def _content(content) -> tuple[str, int, int]:
    """(text, lines, images) of a message content: a string or a list of parts."""
    if content is None:
        return "", 0, 0
    if isinstance(content, str):
        return content, len(content.splitlines()), 0
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, list):
        texts, lines, images = [], 0, 0
        for part in content:
            if isinstance(part, str):
                texts.append(part)
                lines += len(part.splitlines())
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    texts.append(part["text"])
                    lines += len(part["text"].splitlines())
                elif part.get("type") in ("image_url", "image") or "image_url" in part or "image" in part:
                    images += 1
        return "".join(texts), lines, images
    raise ValueError(f"message content of type {type(content).__name__}")


def _arguments(args):
    """Tool-call arguments as the template sees them: a mapping, or None (then no parameters are
    rendered). OpenAI-style JSON strings are parsed, as serving engines do before templating."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):  # bad JSON, a 5,000-digit number, nesting too deep
            return None
    return args if isinstance(args, dict) else None


def _tool_calls(calls, k: int) -> tuple:
    if calls is None:
        return ()
    if isinstance(calls, str):
        try:
            calls = json.loads(calls) if calls.strip() else []
        except RecursionError:  # surfaces as the row's ValueError, with its location
            raise ValueError(f"message {k}: tool_calls nested too deep") from None
    if not isinstance(calls, list):
        raise ValueError(f"message {k}: tool_calls is not a list")
    out = []
    for c in calls:
        fn = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"message {k}: tool call without a function name")
        out.append((fn["name"], _arguments(fn.get("arguments"))))
    return tuple(out)


def _message(m, k: int) -> Message:
    if not isinstance(m, dict) or "role" not in m:
        raise ValueError(f"message {k} has no 'role'")
    role = ROLES.get(str(m["role"]).lower())
    if role is None:
        raise ValueError(f"message {k} has an unknown role {m['role']!r}")
    content = m.get("content")
    if content is None:
        content = m.get("text")
    if content is None and role == "system":
        content = m.get("system_prompt")  # nebius/SWE-agent-trajectories: text null, prompt here
    text, lines, images = _content(content)
    mt = m.get("message_type")
    return Message(
        role,
        text,
        _tool_calls(m.get("tool_calls"), k),
        bool(m.get("is_demo") or False),
        mt if isinstance(mt, str) else None,
        lines,
        images,
    )


def _message_list(obj) -> list | None:
    """The raw message list of a trajectory object, or None when it has none."""
    if isinstance(obj, list):
        return obj
    for key in ("history", "messages"):
        if isinstance(obj.get(key), list) and obj[key]:
            return obj[key]
    traj = obj.get("trajectory")
    if isinstance(traj, list) and traj and isinstance(traj[0], dict) and "role" in traj[0]:
        return traj
    return None


def parse_trajectory(obj) -> tuple[list[Message], list[tuple[Message, list[Message]]]]:
    """(prompt messages, steps [(assistant message, observation messages)]) of one trajectory."""
    if not isinstance(obj, (dict, list)):
        raise ValueError("trajectory is not a JSON object")
    raw = _message_list(obj)
    if raw is not None:
        msgs = [_message(m, k) for k, m in enumerate(raw)]
        sp = obj.get("system_prompt") if isinstance(obj, dict) else None
        if isinstance(sp, str) and sp and not any(m.role == "system" for m in msgs):
            msgs.insert(0, Message("system", sp, n_lines=len(sp.splitlines())))
        first = next((i for i, m in enumerate(msgs) if m.role == "assistant" and not m.is_demo), None)
        if first is None:
            raise ValueError("no assistant step in the trajectory")
        steps: list[tuple[Message, list[Message]]] = []
        for m in msgs[first:]:
            if m.role == "assistant":
                steps.append((m, []))
            else:
                steps[-1][1].append(m)
        return msgs[:first], steps
    traj = obj.get("trajectory")
    if isinstance(traj, list) and traj:
        prompt: list[Message] = []
        q = traj[0].get("query") if isinstance(traj[0], dict) else None
        if isinstance(q, list):
            prompt = [m for m in (_message(x, k) for k, x in enumerate(q)) if m.role != "assistant"]
        steps = []
        for k, st in enumerate(traj):
            if not isinstance(st, dict) or "response" not in st:
                raise ValueError(f"trajectory step {k} has no 'response'")
            text, lines, _ = _content(st["response"])
            action = Message("assistant", text, _tool_calls(st.get("tool_calls"), k), n_lines=lines)
            obs_text, obs_lines, obs_images = _content(st.get("observation"))
            steps.append((action, [Message("user", obs_text, (), False, "observation", obs_lines, obs_images)]))
        return prompt, steps
    raise ValueError("neither a message list ('history', 'messages', 'trajectory') nor trajectory steps")


# --------------------------------------------------------------------------------------------
# Sources


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _decode_json_columns(rec: dict) -> dict:
    """Datasets often store nested lists as JSON strings: decode those columns."""
    for k, v in list(rec.items()):
        if isinstance(v, str) and v[:1] in "[{":
            try:
                rec[k] = json.loads(v)
            except (ValueError, RecursionError):  # not JSON after all: keep the string
                pass
    return rec


def _iter_hub(spec: str) -> Iterator[tuple[str, object]]:
    name, _, split = spec.partition(":")
    hint = "download them and use --trace swebench:PATH"
    for row, rec in stream_dataset(name, split or None, what="trajectories", local_hint=hint):
        yield f"{name}: row {row}", _decode_json_columns(dict(rec))


def _files(p: Path, construction: str) -> list[Path]:
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise TraceError(f"SWE-bench trajectory path not found: {p}")
    if construction == "marconi":  # the artifact: every file of the folder, sorted by name
        files = sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith("."))
    else:
        files = sorted((q for q in p.rglob("*.traj") if q.is_file()), key=lambda q: q.name)
        if not files:  # a dataset's folder (a hub download: data/train-00000-of-00002.parquet): its shards
            files = sorted(q for q in p.rglob("*") if q.is_file() and _dataset_suffix(q) in (".jsonl", ".parquet"))
    if not files:
        kinds = "" if construction == "marconi" else ".traj, .jsonl or .parquet "
        raise TraceError(f"no {kinds}files under {p}")
    return files


def _dataset_suffix(f: Path) -> str:
    """A file's kind by its name, a ``.gz`` after it left out (``d.jsonl.gz`` is JSON Lines)."""
    suffixes = [s.lower() for s in f.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def iter_trajectories(
    path: str, skip_bad_rows: bool, stats: dict, construction: str = "sweagent"
) -> Iterator[tuple[str, object]]:
    if path.startswith(HUB_PREFIX):
        yield from _iter_hub(path[len(HUB_PREFIX) :])
        return
    for f in _files(Path(path).expanduser(), construction):
        kind = _dataset_suffix(f)
        if kind == ".jsonl":
            # lines decoded one by one: a non-UTF-8 line is named, not a traceback; gzip read as it is
            try:
                with open_binary(f) as fh:
                    for line_no, raw in enumerate(fh, 1):
                        if raw.strip():
                            try:  # utf-8-sig on line 1: a byte-order mark (Windows tools write one) is no JSON
                                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
                                if not text.strip():  # the mark alone on line 1
                                    continue
                                yield f"{f}:{line_no}", json.loads(text)
                            except (ValueError, RecursionError) as exc:  # also a 5,000-digit number, deep nesting
                                if not skip_bad_rows:
                                    if isinstance(exc, UnicodeDecodeError):
                                        raise TraceError(f"{f}:{line_no}: not UTF-8 text ({exc.reason})") from None
                                    msg = exc.msg if isinstance(exc, json.JSONDecodeError) else _first_line(exc)
                                    raise TraceError(f"{f}:{line_no}: bad JSON: {msg}") from None
                                stats["skipped_rows"] += 1
            except (OSError, EOFError, zlib.error) as exc:  # a corrupt or cut .gz stream
                raise TraceError(f"cannot read {f}: {exc}") from None
        elif kind == ".parquet":
            import pyarrow.parquet as pq

            try:
                table = pq.read_table(f)
            except Exception as exc:  # noqa: BLE001 - pyarrow's ArrowInvalid, OSError... for a bad file
                raise TraceError(f"cannot read parquet file {f}: {_first_line(exc)}") from None
            for row, rec in enumerate(table.to_pylist()):
                yield f"{f}: row {row}", _decode_json_columns(rec)
        else:
            try:
                with io.TextIOWrapper(open_binary(f), encoding="utf-8-sig") as fh:  # a byte-order mark skipped
                    obj = json.load(fh)
            except TraceError:  # compressed in another format than gzip: said, or skipped as a bad file
                if not skip_bad_rows:
                    raise
                stats["skipped_rows"] += 1
                continue
            except (OSError, EOFError, zlib.error) as exc:  # a corrupt or cut .gz stream
                raise TraceError(f"cannot read {f}: {exc}") from None
            except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors, huge numbers, deep nesting
                if not skip_bad_rows:
                    if isinstance(exc, json.JSONDecodeError):
                        raise TraceError(f"{f}:{exc.lineno}: bad JSON: {exc.msg}") from None
                    if isinstance(exc, UnicodeDecodeError):
                        raise TraceError(f"{f}: not UTF-8 text ({exc.reason})") from None
                    raise TraceError(f"{f}: bad JSON: {_first_line(exc)}") from None
                stats["skipped_rows"] += 1
                continue
            if _is_trajectory_list(obj):  # a JSON array of trajectories (a dataset saved as one .json)
                for k, one in enumerate(obj):
                    yield f"{f}: trajectory {k}", one
                continue
            yield str(f), obj


def _is_trajectory_list(obj) -> bool:
    """A JSON array whose items are trajectories (objects with a message list and no ``role``), not
    one trajectory's bare message list."""
    return (
        isinstance(obj, list)
        and bool(obj)
        and all(
            isinstance(x, dict)
            and "role" not in x
            and (_message_list(x) is not None or isinstance(x.get("trajectory"), list))
            for x in obj
        )
    )


# --------------------------------------------------------------------------------------------
# The Qwen3.5 chat template, token by token


def special_ids(tok, text: str) -> list[int]:
    """Ids of a special token the template emits (``<tool_call>``, ``<think>``, ...). A tokenizer
    without it (the legacy Qwen vocabulary) gets the text instead."""
    enc = getattr(tok, "_enc", None)  # QwenTiktoken's tiktoken.Encoding
    if enc is not None and text in enc.special_tokens_set:
        return [enc.encode_single_token(text)]
    hf = getattr(tok, "_tok", None)  # HFTokenizer's tokenizers.Tokenizer
    if hf is not None and hf.token_to_id(text) is not None:
        return [hf.token_to_id(text)]
    return tok.encode(text)


class _Ids:
    """Accumulates template output: text is buffered and encoded in maximal runs between special
    tokens, which is what tokenizing the rendered string gives (BPE never crosses a special)."""

    __slots__ = ("tok", "ids", "buf")

    def __init__(self, tok):
        self.tok, self.ids, self.buf = tok, [], []

    def text(self, s: str) -> _Ids:
        self.buf.append(s)
        return self

    def special(self, ids: list[int]) -> _Ids:
        self._flush()
        self.ids += ids
        return self

    def _flush(self) -> None:
        if self.buf:
            s = "".join(self.buf)
            self.buf = []
            if s:
                self.ids += self.tok.encode(s)

    def done(self) -> np.ndarray:
        self._flush()
        return np.asarray(self.ids, dtype=np.int64)


def _param_value(v) -> str:
    # the template: mappings and sequences through tojson (ensure_ascii off), the rest through |string
    if isinstance(v, str):
        return v
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


class QwenAgentTemplate:
    """Qwen3.5's chat template for agent histories, as token ids per message."""

    def __init__(self, tok):
        self.tok = tok
        sp = {
            t: special_ids(tok, t)
            for t in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
        }
        self.sp = sp
        self.generation_prompt = (
            _Ids(tok)
            .special(tok.im_start)
            .text("assistant\n")
            .special(sp["<think>"])
            .text("\n\n")
            .special(sp["</think>"])
            .text("\n\n")
            .done()
        )
        self.plain_header = _Ids(tok).special(tok.im_start).text("assistant\n").done()
        self.newline = np.asarray(tok.encode("\n"), dtype=np.int64)  # ends every turn after <|im_end|>

    def output(self, m: Message) -> np.ndarray:
        """What the model generates after the generation prompt: content, tool calls, <|im_end|>."""
        b = _Ids(self.tok)
        content = m.text.strip()
        b.text(content)
        for i, (name, args) in enumerate(m.tool_calls):
            b.text(("\n\n" if content else "") if i == 0 else "\n").special(self.sp["<tool_call>"])
            b.text(f"\n<function={name}>\n")
            for key, value in (args or {}).items():
                b.text(f"<parameter={key}>\n{_param_value(value)}\n</parameter>\n")
            b.text("</function>\n").special(self.sp["</tool_call>"])
        return b.special(self.tok.im_end).done()

    def assistant(self, output: np.ndarray, think: bool) -> np.ndarray:
        """An assistant message in the history: with the empty think block when it follows the last
        user query (then it is exactly generation prompt + output), else without."""
        head = self.generation_prompt if think else self.plain_header
        return np.concatenate([head, output, self.newline])

    def message(self, role: str, text: str, prev_role: str | None, next_role: str | None) -> np.ndarray:
        """A system, user or tool message, followed by the newline that ends its turn."""
        b = _Ids(self.tok)
        text = text.strip()
        if role == "tool":
            if prev_role != "tool":
                b.special(self.tok.im_start).text("user")
            b.text("\n").special(self.sp["<tool_response>"]).text(f"\n{text}\n").special(self.sp["</tool_response>"])
            if next_role != "tool":
                b.special(self.tok.im_end).text("\n")
            return b.done()
        return b.special(self.tok.im_start).text(f"{role}\n{text}").special(self.tok.im_end).text("\n").done()


def _is_query(role: str, text: str) -> bool:
    """A user message that is not a bare tool response (the template's last_query_index)."""
    t = text.strip()
    return role == "user" and not (t.startswith("<tool_response>") and t.endswith("</tool_response>"))


def build_session(
    tpl: QwenAgentTemplate, prompt: list[Message], steps, keep: int, max_turns: int, max_tokens: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(input ids, output ids)] of one trajectory (the SWE-agent construction)."""
    steps = steps[:max_turns]
    seq: list[Message] = list(prompt)
    step_at: list[int] = []  # position in seq of each step's assistant message
    for action, obs in steps:
        step_at.append(len(seq))
        seq.append(action)
        seq.extend(obs)
    n = len(seq)
    roles = [m.role for m in seq]
    outputs: dict[int, np.ndarray] = {}
    full: list[np.ndarray | None] = [None] * n  # non-assistant messages as rendered in full
    short: list[np.ndarray | None] = [None] * n  # observation messages collapsed
    placeholder: list[str | None] = [None] * n
    for i, m in enumerate(seq):
        if m.role == "assistant":
            outputs[i] = tpl.output(m)
            continue
        prev_r, next_r = (roles[i - 1] if i else None), (roles[i + 1] if i + 1 < n else "assistant")
        full[i] = tpl.message(m.role, m.text, prev_r, next_r)
        if m.is_observation():
            text = PLACEHOLDER.format(n=m.n_lines) + (f" ({m.n_images} images omitted)" if m.n_images else "")
            placeholder[i] = text
            short[i] = tpl.message(m.role, text, prev_r, next_r)
    obs_pos = [i for i, m in enumerate(seq) if m.role != "assistant" and m.is_observation()]
    out = []
    for end in step_at:
        visible = [i for i in obs_pos if i < end]
        elided = set(visible[1 : max(1, len(visible) - keep)])
        last_query = -1
        for i in range(end - 1, -1, -1):
            if seq[i].role == "user" and _is_query("user", placeholder[i] if i in elided else seq[i].text):
                last_query = i
                break
        parts = []
        for i in range(end):
            if roles[i] == "assistant":
                parts.append(tpl.assistant(outputs[i], think=i > last_query))
            else:
                parts.append(short[i] if i in elided else full[i])
        parts.append(tpl.generation_prompt)
        ids = np.concatenate(parts)
        if len(ids) > max_tokens:
            break
        out.append((ids, outputs[end]))
    return out


# --------------------------------------------------------------------------------------------
# Marconi's construction


def build_marconi_session(tok, obj, keep: int, max_turns: int, max_tokens: int):
    """([(input ids, output ids)], requests attempted) of one trajectory, the artifact's way. A
    request is attempted (and draws its think time) before the caps are checked."""
    raw = _message_list(obj) if isinstance(obj, (dict, list)) else None
    if not raw:
        raise ValueError("no message list to pair ('history', 'messages', 'trajectory', or a top-level list)")
    if isinstance(raw[0], dict) and isinstance(raw[0].get("conversations"), list):
        raise ValueError("holds ShareGPT conversations, not one trajectory's messages (use --trace sharegpt:PATH)")
    enc = [np.asarray(tok.encode(json.dumps(m)), dtype=np.int64) for m in raw]
    empty = np.zeros(0, dtype=np.int64)
    out: list[tuple[np.ndarray, np.ndarray]] = []
    attempted = 0
    for k in range(len(raw) // 2):
        attempted += 1
        if k > max_turns:
            break
        parts = []
        for j in range(k):
            parts.append(empty if 1 <= j <= k - 1 - keep else enc[2 * j])
            parts.append(enc[2 * j + 1])
        parts.append(enc[2 * k])
        ids = np.concatenate(parts)
        if len(ids) > max_tokens:
            break
        out.append((ids, enc[2 * k + 1]))
    return out, attempted


# --------------------------------------------------------------------------------------------


def load_packed(path: str, options) -> PackedTrace:
    construction, src = split_spec(path)
    tok = get_tokenizer(options.tokenizer)
    tpl = QwenAgentTemplate(tok) if construction == "sweagent" else None
    stats = {"skipped_rows": 0}
    name = f"swebench:{path}"
    builder = TraceBuilder(name, block_tokens=1, closed_loop=True)
    sessions: list[tuple[str, list, int]] = []  # (where, requests, Poisson draws consumed)
    dropped = read = 0
    budget = SizeBudget(options.max_request_tokens)
    bar = None
    if options.progress:  # a folder of long trajectories tokenizes for minutes (4 MB/s on one core)
        from tqdm import tqdm  # noqa: PLC0415

        bar = tqdm(
            total=options.sessions or None,
            desc=f"tokenizing {name}",
            unit="traj",
            leave=False,
            dynamic_ncols=True,
            delay=PROGRESS_DELAY,
        )
    try:
        for where, obj in iter_trajectories(src, options.skip_bad_rows, stats, construction):
            if bar is not None:
                bar.update(1)
            try:
                if construction == "marconi":
                    reqs, attempted = build_marconi_session(
                        tok, obj, options.keep_observations, options.max_turns, options.max_tokens
                    )
                    draws = max(attempted - 1, 0)
                else:
                    prompt, steps = parse_trajectory(obj)
                    reqs = build_session(
                        tpl, prompt, steps, options.keep_observations, options.max_turns, options.max_tokens
                    )
                    draws = max(len(reqs) - 1, 0)
                for inp, out in reqs:
                    budget.check_request(len(inp) + len(out))
            except (ValueError, TypeError, AttributeError) as exc:
                if not options.skip_bad_rows:
                    raise TraceError(f"{where}: {exc}") from None
                stats["skipped_rows"] += 1
                continue
            read += 1
            # an upper bound of what the builder stores: requests that extend their predecessor share it
            budget.add(sum(len(inp) + len(out) for inp, out in reqs), where)
            if reqs:
                sessions.append((where, reqs, draws))
            else:
                dropped += 1
                if construction == "marconi":
                    sessions.append((where, reqs, draws))  # its draws still come off the stream
            # the artifact counts trajectories read; the default counts sessions kept
            if options.sessions and (read if construction == "marconi" else len(sessions)) >= options.sessions:
                break
    finally:
        if bar is not None:
            bar.close()
    if not any(reqs for _, reqs, _ in sessions):  # why no trajectory made a request
        skipped = stats["skipped_rows"]
        if read:
            which = "its trajectory makes no" if read == 1 else f"none of the {read:,} trajectories read makes a"
            why = (
                f"{which} request within --max-tokens {options.max_tokens:,} (the first request is longer, "
                "or there is no step)"
            )
        elif skipped:
            why = ("its only trajectory is" if skipped == 1 else f"all {skipped:,} of its trajectories are") + (
                " bad (skipped: --skip-bad-rows)"
            )
        else:
            why = "it holds no trajectories"
        raise TraceError(f"trace {name} has no requests: {why}")
    draws = poisson_response_times(sum(d for _, _, d in sessions), options.response_time, options.seed).tolist()
    base = 0
    kept: list[str] = []
    for where, reqs, n_draws in sessions:
        if reqs:
            sid = len(kept)
            kept.append(where)
            for k, (inp, out) in enumerate(reqs):
                builder.add_request(sid, k, inp, out, draws[base + k - 1] if k else 0.0)
        base += n_draws
    builder.meta.update(
        source=name,
        sessions_requested=options.sessions,
        construction=construction,
        trajectories=kept,
        dropped_sessions=dropped,
        response_time=options.response_time,
        seed=options.seed,
        keep_observations=options.keep_observations,
        max_turns=options.max_turns,
        tokenizer=options.tokenizer,
        **stats,
    )
    return builder.build()

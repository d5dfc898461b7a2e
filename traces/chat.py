"""Turning text conversations into a closed-loop chat trace (ShareGPT, LMSys-Chat-1M).

Each conversation becomes one session rendered with the Qwen chat template
(``traces.tokenizers.render_conversation``); all of its turns are views into one buffer. Think
times follow the Marconi paper: the user's typing time at 90 words per minute (number of spaces in
the user message / 1.5 s). The first turn's think time is 0: it arrives at its session's start
(the paper leaves this unstated; session start times are drawn at simulation time by
``traces.arrivals``).

Tokenization runs in a process pool (all cores by default) once there are enough conversations
to pay for starting it, in bounded batches, so a streamed source never sits whole in memory.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from multiprocessing import get_context
from multiprocessing.pool import TERMINATE

import numpy as np

from traces.base import TraceError
from traces.packing import PackedTrace, TraceBuilder
from traces.tokenizers import get_tokenizer, normalize_role, render_conversation, typing_time

# Below this many conversations a pool costs more than it saves.
POOL_MIN_CONVERSATIONS = 400
BATCH = 2048

_worker_state: dict = {}


def _init_worker(tokenizer_spec: str, max_input: int | None, max_total: int | None, wpm: float) -> None:
    _worker_state.update(tok=get_tokenizer(tokenizer_spec), max_input=max_input, max_total=max_total, wpm=wpm)


def _init_pool_worker(*args) -> None:
    # Ctrl-C in a terminal reaches the whole process group: only the parent reacts (it terminates
    # the pool); a worker that died of it would leave pool.map waiting forever for its task.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the parent's SIGTERM / SIGHUP handlers (the CLI's: raise an interrupt, for a clean line) are
    # not a worker's: pool.terminate() ends workers with SIGTERM, which must end them silently, not
    # print an interrupt's traceback from the middle of a tokenization
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    _init_worker(*args)


def _start_pool(procs: int, init_args: tuple):
    ctx = get_context("fork" if os.name == "posix" else "spawn")
    if threading.current_thread() is not threading.main_thread():
        return ctx.Pool(procs, initializer=_init_pool_worker, initargs=init_args)
    # forked workers inherit SIG_IGN at once (no window before their initializer runs)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return ctx.Pool(procs, initializer=_init_pool_worker, initargs=init_args)
    finally:
        signal.signal(signal.SIGINT, previous)


def _abandon_pool(pool) -> None:
    """End a pool mid-work (Ctrl-C, or an error) without ``Pool.terminate()``, whose clean-up can
    deadlock: it ends workers that may be writing a result, then joins its task handler, which
    can wait forever for the result queue's lock such a worker held (CPython issues #78178,
    #96995; seen here once as a Ctrl-C that hung for 30 s on a loaded 2-core runner). Here the
    worker handler is stopped first (it would start new workers for the dead ones), the workers
    are killed and reaped, and the pool's finalizer, which would run the same clean-up at exit, is
    cancelled; nothing of the pool's queues is used again, and its handler threads are daemons
    that end with the process. Falls back to ``terminate()`` on a pool without these parts."""
    handler = getattr(pool, "_worker_handler", None)
    finalizer = getattr(pool, "_terminate", None)
    workers = getattr(pool, "_pool", None)
    if handler is None or workers is None or not hasattr(finalizer, "cancel"):
        pool.terminate()
        pool.join()
        return
    pool._state = handler._state = TERMINATE
    notifier = getattr(pool, "_change_notifier", None)
    if notifier is not None:
        notifier.put(None)  # wake it from its wait: it sees TERMINATE and leaves its loop
    handler.join(timeout=5)
    for w in list(workers):
        if w.exitcode is None:
            w.kill()
    for w in list(workers):
        w.join(timeout=5)
    finalizer.cancel()


def _tokenize_one(messages: list[tuple[str, str]]):
    st = _worker_state
    buf, turns = render_conversation(st["tok"], messages, st["max_input"], st["max_total"])
    if buf.size and buf.max() <= np.iinfo(np.int32).max and buf.min() >= 0:
        buf = buf.astype(np.int32)  # halves what travels back from a worker
    rows = [
        (t.input_end, t.output_end, 0.0 if k == 0 else typing_time(t.user_text, st["wpm"])) for k, t in enumerate(turns)
    ]
    return buf, rows


def _answered(messages: list[tuple[str, str]]) -> bool:
    """A user message directly followed by an assistant message (what makes a request)."""
    roles = [normalize_role(r) for r, _ in messages]
    return any(a == "user" and b == "assistant" for a, b in zip(roles, roles[1:]))


def _why_empty(seen: int, unanswered: int, cap: int | None, none_selected: Callable[[], str] | None) -> str:
    """Why no conversation made a request: the loader's selection, no user message answered by
    an assistant, or a first request longer than the token cap."""
    if seen == 0:
        return none_selected() if none_selected is not None else "no conversation was selected"
    roles = "a user message followed by an assistant reply (roles: human / user, then gpt / assistant)"
    capped = f"a request longer than --max-tokens {cap:,}" if cap is not None else "no request"
    if unanswered == seen:
        return f"none of the {seen:,} conversations selected has {roles}"
    if not unanswered:
        return f"each of the {seen:,} conversations selected starts with {capped}"
    return (
        f"{unanswered:,} of the {seen:,} conversations selected have no {roles[2:]}; the other "
        f"{seen - unanswered:,} start with {capped}"
    )


def _batches(items: Iterable, n: int) -> Iterator[list]:
    batch: list = []
    for it in items:
        batch.append(it)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


def build_chat_trace(
    name: str,
    conversations: Iterable[tuple[str, list[tuple[str, str]]]],
    tokenizer: str,
    max_input_tokens: int | None = None,
    max_total_tokens: int | None = None,
    words_per_minute: float = 90.0,
    num_proc: int | None = None,
    expected: int | None = None,
    progress: bool = False,
    none_selected: Callable[[], str] | None = None,
) -> PackedTrace:
    """``conversations`` yields ``(conversation_id, [(role, text), ...])`` already filtered and
    limited; each becomes one session (sessions left with no request after the token cap are
    dropped and counted in ``meta['dropped_sessions']``). A trace left with no request is one
    TraceError saying why: ``none_selected()`` (the loader's filters) when ``conversations``
    yielded nothing, else how many had no user message answered or a first request over the cap."""
    builder = TraceBuilder(name, block_tokens=1, closed_loop=True)
    procs = num_proc if num_proc and num_proc > 0 else (os.cpu_count() or 1)
    init_args = (tokenizer, max_input_tokens, max_total_tokens, words_per_minute)
    bar = None
    if progress:
        from tqdm import tqdm

        # shown only when tokenizing takes more than a second
        bar = tqdm(total=expected, desc=f"tokenizing {name}", unit="conv", leave=False, dynamic_ncols=True, delay=1.0)
    ids: list[str] = []
    dropped = seen = unanswered = 0
    pool = None
    finished = False
    try:
        for batch in _batches(conversations, BATCH):
            if pool is None and procs > 1 and (len(batch) >= POOL_MIN_CONVERSATIONS):
                pool = _start_pool(procs, init_args)
            msgs = [m for _, m in batch]
            if pool is not None:
                results = pool.map(_tokenize_one, msgs, chunksize=max(1, len(msgs) // (procs * 8)))
            else:
                if not _worker_state or _worker_state.get("args") != init_args:
                    _init_worker(*init_args)
                    _worker_state["args"] = init_args
                results = [_tokenize_one(m) for m in msgs]
            seen += len(batch)
            for (cid, msgs), (buf, rows) in zip(batch, results):
                if not rows:
                    dropped += 1
                    unanswered += not _answered(msgs)
                    continue
                sid = len(ids)
                ids.append(cid)
                builder.add_chain(
                    buf, sid, [(k, ie, oe, think, None, -1, -1) for k, (ie, oe, think) in enumerate(rows)]
                )
            if bar is not None:
                bar.update(len(batch))
        finished = True
    finally:
        if pool is not None:
            if finished:
                pool.close()
                pool.join()
            else:  # Ctrl-C or an error: drop the queued work instead of waiting for it
                _abandon_pool(pool)
        if bar is not None:
            bar.close()
    if not ids:
        cap = max_input_tokens if max_input_tokens is not None else max_total_tokens
        raise TraceError(f"trace {name!r} has no requests: {_why_empty(seen, unanswered, cap, none_selected)}")
    builder.meta.update(
        conversation_ids=ids,
        dropped_sessions=dropped,
        tokenizer=tokenizer,
        max_input_tokens=max_input_tokens,
        max_total_tokens=max_total_tokens,
    )
    return builder.build()

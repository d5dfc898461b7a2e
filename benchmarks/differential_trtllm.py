"""Differential check: TensorRT-LLM's own hybrid prefix cache (``MambaHybridCacheManagerV2``) against
the ``trtllm`` preset (issue 43, item 1).

The same request stream (a real ShareGPT slice with Qwen3.5 tokens, or ``mooncake:sample`` with its
hash blocks drawn into tokens as ``sim.replay.tokens`` does) goes through TensorRT-LLM's cache code
on the CPU and through the simulator's preset in sequential mode; the hit tokens of every request
are compared. Nothing of TensorRT-LLM is copied here: the script loads it from a folder given on the
command line (``--trtllm DIR``) holding, as in NVIDIA/TensorRT-LLM,

- ``tensorrt_llm/runtime/kv_cache_manager_v2/_block_radix_tree.py``: the V2 manager's radix tree
  (``BlockRadixTree.match`` with partial matching and the SSM-snapshot pruning ``_prune_match``,
  ``Block`` insertion with the partial-sibling replacement and page adoption, and
  ``can_replace_page`` / ``replace_page``: one recurrent page per block, the deepest kept), imported
  as it is, its four small sibling modules (``rawref``, ``_common``, ``_life_cycle_registry``,
  ``_utils``) stubbed;
- ``tensorrt_llm/_torch/pyexecutor/kv_cache/mamba_cache_manager/common.py``
  (``MambaHybridCacheManager.prepare_expect_snapshot_points``) and ``.../mamba_cache_manager_v2.py``
  (``MambaHybridCacheManagerV2.update_context_resources``, ``try_commit_blocks``,
  ``_mark_context_position_as_history``): these methods are read out of the files (``ast``) and run
  with a stub ``self``, so the rest of those files (torch, Triton, the C++ bindings) is not needed.

The per-request ``_KVCache`` the manager commits into is C++ in today's TensorRT-LLM
(``cpp/tensorrt_llm/batch_manager/kv_cache_manager_v2/kvCache.cpp``, reached through nanobind; its
Python twin ``_core/_kv_cache.py`` needs CUDA), so its commit rule is reproduced here from that
source, and only that: ``EngineKvCache`` below (``commit``, ``_commitBlock``,
``_snapshotPartialBlockToTree``, ``_snapshotSsmToTreeBlock``, ``stopCommitting``,
``_setupForReuse``), with the tree calls going to the engine's own ``Block`` / ``BlockRadixTree``.

Engine side, per request (each its own session, in the simulator's sequential order): the snapshot
points are set (``prepare_expect_snapshot_points``), the prompt minus its last token is matched
(``BlockRadixTree.match(..., enable_partial_match=True)``; the hit is ``num_tokens``), the prefill
runs in chunks that end at every snapshot point, every ``--prefill-chunk`` tokens and at the prompt
end (the scheduler's FORCE_CHUNK), ``update_context_resources`` after each chunk, then
``free_resources``' last ``try_commit_blocks``. Decode commits nothing (``stop_committing`` at the
context's end). Memory is ample on both sides: this checks placement, matching and the stored
extent, not eviction order (the V2 storage manager's eviction is not driven).

    python benchmarks/differential_trtllm.py --trtllm /work/engines/trtllm --sessions 100 \\
        --periodic-snapshot-interval 256 --additional-snapshot-offsets-from-end 0

Prints, for each preset compared, how many requests get the same hit as the engine; ``--out``
writes the per-request hits (CSV).
"""

from __future__ import annotations

import argparse
import ast
import csv
import enum
import importlib.util
import sys
import types
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from sim.config import UNLIMITED, SimConfig
from sim.engine.drivers import run, timestamps
from sim.replay.tokens import request_tokens
from sim.simulate import build
from traces.registry import TraceOptions, load_trace

MODEL = "qwen3.5-9b"
RADIX = "tensorrt_llm/runtime/kv_cache_manager_v2/_block_radix_tree.py"
MANAGER = "tensorrt_llm/_torch/pyexecutor/kv_cache/mamba_cache_manager"
ATTN, SSM = 0, 1  # life cycles: one full-attention group, one recurrent (SSM) group


# ------------------------------------------------------------------ stubs of the radix tree's siblings


class _Ref:
    """``rawref.ref``: a callable reference (strong here: nothing is evicted, nothing must die)."""

    __slots__ = ("obj",)

    def __init__(self, obj=None) -> None:
        self.obj = obj

    def __call__(self):
        return self.obj

    def invalidate(self) -> None:
        self.obj = None

    def __class_getitem__(cls, item):
        return cls


class _Range(SimpleNamespace):
    pass


class _AttnLifeCycle:
    """Full attention: no window, no sinks, nothing stale."""

    window_size = None
    num_sink_blocks = 0

    def get_stale_range(self, num_tokens: int, tokens_per_block: int) -> _Range:
        return _Range(beg=0, end=0)


class _Registry:
    """``LifeCycleRegistry`` of a hybrid model: attention (0) and SSM (1)."""

    size = 2
    ssm_life_cycle_id = SSM

    def attention_life_cycles(self):
        yield ATTN, _AttnLifeCycle()


class _PageStatus(enum.Enum):
    LOCKED = 0
    HELD = 1
    DROPPABLE = 2


class Page:
    """A committed page: its life cycle and the tokens of its block it covers
    (``CommittedPage.num_tokens_in_block``); never scheduled for eviction here."""

    __slots__ = ("life_cycle", "num_tokens_in_block", "block", "status", "scheduled_for_eviction", "manager")

    def __init__(self, life_cycle: int, num_tokens_in_block: int) -> None:
        self.life_cycle = life_cycle
        self.num_tokens_in_block = num_tokens_in_block
        self.block = None
        self.status = _PageStatus.HELD
        self.scheduled_for_eviction = False
        self.manager = None


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def load_radix_tree(root: Path) -> types.ModuleType:
    """The engine's ``_block_radix_tree`` module, imported from ``root`` with stubbed siblings."""
    path = root / RADIX
    if not path.is_file():
        raise SystemExit(f"--trtllm {root}: no {RADIX} in it")
    pkg = "tensorrt_llm.runtime.kv_cache_manager_v2"
    for name in ("tensorrt_llm", "tensorrt_llm.runtime"):
        _module(name, __path__=[])
    package = _module(pkg, __path__=[str(path.parent)])
    package.rawref = _module(f"{pkg}.rawref", ref=_Ref, NULL=_Ref())
    _module(
        f"{pkg}._common",
        NDEBUG=False,  # run the engine's debug checks too
        BlockOrdinal=int,
        PageStatus=_PageStatus,
        TokenId=int,
        TokenIdExt=int,
    )
    _module(
        f"{pkg}._life_cycle_registry",
        AttnLifeCycle=_AttnLifeCycle,
        LifeCycle=object,
        LifeCycleId=int,
        LifeCycleRegistry=_Registry,
    )
    _module(
        f"{pkg}._utils",
        TypedIndexList=list,
        filled_list=lambda value, n: [value] * n,
        map_optional=lambda x, f: None if x is None else f(x),
        typed_range=range,
        unwrap_rawref=lambda r: r() if r() is not None else (_ for _ in ()).throw(ValueError("dangling rawref")),
    )
    spec = importlib.util.spec_from_file_location(f"{pkg}._block_radix_tree", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_methods(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """The functions ``names`` defined in ``path`` (inside any class), compiled in ``namespace``."""
    if not path.is_file():
        raise SystemExit(f"--trtllm: no {path}")
    tree = ast.parse(path.read_text(), filename=str(path))
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in names and node.name not in found:
            node.decorator_list = []
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
            found[node.name] = namespace[node.name]
    missing = set(names) - set(found)
    if missing:
        raise SystemExit(f"{path}: no {', '.join(sorted(missing))} in it")
    return found


# ------------------------------------------------------------------ the per-request KV cache (C++ rule)


class EngineKvCache:
    """The commit rule of TensorRT-LLM's ``KvCache`` (``kvCache.cpp``) with
    ``commit_min_snapshot`` (the V2 Mamba manager sets it): what a request puts into the engine's
    radix tree. Tree blocks are the engine's own (``Block``); pages are ``Page`` records."""

    ALLOWED, VIRTUAL_STOP, USER_STOP = "allowed", "virtual_stop", "user_stop"

    def __init__(self, rt, tree, tokens_per_block: int, match) -> None:
        self.rt, self.tree, self.tpb = rt, tree, tokens_per_block
        self.root = tree.add_or_get_existing(rt.ReuseScope())
        # _setupForReuse: committed = the matched tokens, whole blocks counted as committed
        self.committed: list[int] = []
        remaining = match.num_tokens
        for block in match.blocks:
            take = min(remaining, len(block.tokens))
            self.committed.extend(block.tokens[:take])
            remaining -= take
        self.num_committed_blocks = match.num_tokens // tokens_per_block
        # resume() clears the partial last matched block: it is recomputed into a private page
        self.tree_blocks = dict(enumerate(match.blocks[: self.num_committed_blocks]))
        self.state = self.ALLOWED
        self.history_length = self.capacity = match.num_tokens
        self.is_active = True
        self.enable_swa_scratch_reuse = False

    @property
    def num_committed_tokens(self) -> int:
        return len(self.committed)

    def resize(self, capacity, history_length=None) -> bool:
        if capacity is not None:
            self.capacity = max(self.capacity, capacity)
        if history_length is not None:
            self.history_length = max(self.history_length, history_length)
        return True

    def _prev(self, ordinal: int):
        return self.root if ordinal == 0 else self.tree_blocks[ordinal - 1]

    def _add_or_get(self, prev, tokens):
        """``addOrGetExistingBlock``: a new block, or the existing one with these tokens or a
        longer sibling covering them (the engine's ``Block`` raises ``UselessBlockError``)."""
        try:
            return self.rt.Block(tokens, prev), True
        except self.rt.UselessBlockError as e:
            return e.block, False

    @staticmethod
    def _install(block, lc: int, n_tokens: int) -> None:
        """``convertToCommitted`` / ``_copyPageToTreeBlock``: a page covering ``n_tokens`` of the
        block, installed only over a page covering fewer (``can_replace_page``)."""
        if block.can_replace_page(lc, n_tokens):
            block.replace_page(lc, Page(lc, n_tokens))

    def _snapshot_ssm(self, block, num_tokens: int) -> None:
        """``_snapshotSsmToTreeBlock``: the recurrent state after ``num_tokens`` tokens, unless the
        block already holds one at least as deep."""
        in_block = num_tokens - block.ordinal * self.tpb
        assert 0 < in_block <= self.tpb
        if block.page_coverage(SSM) >= in_block:
            return
        self._install(block, SSM, in_block)

    def _commit_block(self, ordinal: int, is_last: bool, commit_ssm: bool = False) -> None:
        assert self.state == self.ALLOWED and ordinal == self.num_committed_blocks
        start = ordinal * self.tpb
        tokens = self.committed[start : start + self.tpb]
        is_full = len(tokens) == self.tpb
        if not is_last and not is_full:
            raise RuntimeError("Cannot commit block that is not full except last block")
        block, is_new = self._add_or_get(self._prev(ordinal), tokens)
        did_commit = False
        if is_new:
            self._install(block, ATTN, len(tokens))
            did_commit = True
        elif block.is_full and is_full:  # rebase onto the existing block (allowSeqRebasing)
            if block.page_coverage(ATTN) < len(tokens):
                self._install(block, ATTN, len(tokens))
            did_commit = True
        else:  # cannot commit and cannot reuse the existing block: stop committing
            self.state = self.VIRTUAL_STOP
        if did_commit:
            self.tree_blocks[ordinal] = block
            self.num_committed_blocks += 1
            if commit_ssm:
                self._snapshot_ssm(block, start + len(tokens))
        if is_last or self.state == self.VIRTUAL_STOP:
            self.state = self.USER_STOP

    def _snapshot_partial(self, ordinal: int, commit_ssm: bool) -> None:
        """``_snapshotPartialBlockToTree``: the committed tokens of a partial last block go into the
        tree (as a new partial block, or onto the existing block or longer sibling covering them)
        with their KV and, if asked, the recurrent state at their end; the block stays uncommitted
        for this request."""
        start = ordinal * self.tpb
        tokens = self.committed[start : start + self.tpb]
        assert 0 < len(tokens) < self.tpb
        block, _ = self._add_or_get(self._prev(ordinal), tokens)
        if block.page_coverage(ATTN) < len(tokens):
            self._install(block, ATTN, len(tokens))
        if commit_ssm:
            self._snapshot_ssm(block, start + len(tokens))

    def commit(self, tokens, is_end: bool = False) -> None:
        if not tokens:
            if is_end:
                self.stop_committing()
            return
        if self.state == self.USER_STOP:
            raise RuntimeError("Cannot commit tokens after stop_committing()")
        n = len(self.committed) + len(tokens)
        self.history_length = max(self.history_length, n)
        self.committed.extend(tokens)
        if self.state == self.VIRTUAL_STOP:
            if is_end:
                self.state = self.USER_STOP
            return
        full = n // self.tpb
        partial = n % self.tpb != 0
        if full > self.num_committed_blocks or partial:
            ssm_ordinal = (n - 1) // self.tpb  # the block whose end is the last committed token
            for ordinal in range(self.num_committed_blocks, full):
                self._commit_block(ordinal, False, ordinal == ssm_ordinal)
                if self.state != self.ALLOWED:
                    break
            if partial and self.state == self.ALLOWED:
                if is_end:
                    self._commit_block(full, True, True)
                else:
                    self._snapshot_partial(full, True)
        if is_end and self.state != self.USER_STOP:
            self.stop_committing()

    def stop_committing(self) -> None:
        if self.state == self.USER_STOP:
            return
        if self.state == self.VIRTUAL_STOP:
            self.state = self.USER_STOP
            return
        if len(self.committed) - self.num_committed_blocks * self.tpb > 0:
            self._commit_block(self.num_committed_blocks, True)
        else:
            self.state = self.USER_STOP


# ------------------------------------------------------------------ the manager around it


class _Request:
    """The fields of ``LlmRequest`` the manager's methods read."""

    def __init__(self, rid: int, prompt: list[int]) -> None:
        self.py_request_id = rid
        self.prompt = prompt
        self.prompt_len = len(prompt)
        self.expect_snapshot_points: list[int] = []
        self.context_current_position = 0
        self.is_dummy_request = False

    @property
    def context_remaining_length(self) -> int:
        return self.prompt_len - self.context_current_position

    def get_tokens(self, beam: int) -> list[int]:
        return self.prompt


class EngineHarness:
    """``MambaHybridCacheManagerV2`` as far as block reuse goes: the engine's methods, bound to a
    stub ``self`` holding the engine's radix tree."""

    def __init__(self, root: Path, tokens_per_block: int, interval: int, from_start, from_end) -> None:
        self.rt = load_radix_tree(root)
        policy = SimpleNamespace(ALL_REUSABLE="all_reusable", PER_REQUEST="per_request")
        namespace = {
            "List": list,
            "LlmRequest": _Request,
            "ScheduledRequests": SimpleNamespace,
            "DEFAULT_BEAM_INDEX": 0,
            "BlockReusePolicy": policy,
        }
        manager_dir = root / MANAGER
        self.m = load_methods(manager_dir / "common.py", ("prepare_expect_snapshot_points",), dict(namespace))
        self.m |= load_methods(
            manager_dir / "mamba_cache_manager_v2.py",
            ("update_context_resources", "try_commit_blocks", "_mark_context_position_as_history"),
            dict(namespace),
        )
        self.tpb = tokens_per_block
        self.tree = self.rt.BlockRadixTree(_Registry(), tokens_per_block)
        state = SimpleNamespace(
            periodic_snapshot_interval=interval,
            additional_snapshot_offsets_from_start=list(from_start),
            additional_snapshot_offsets_from_end=list(from_end),
        )
        self.self_ = SimpleNamespace(
            enable_block_reuse=True,
            is_draft=False,
            local_num_mamba_layers=1,
            kv_cache_config=SimpleNamespace(mamba_state_config=state),
            _supports_additional_snapshot_offsets=True,  # the V2 manager
            block_reuse_policy=policy.PER_REQUEST,  # the V2 manager turns ALL_REUSABLE into PER_REQUEST
            conversation_manager=None,
            _branch_snapshot_points={},  # enable_branch_snapshot off (the default)
            _branch_snapshots_taken_total=0,
            kv_cache_map={},
            _augment_tokens_for_block_reuse=lambda tokens, request, start, end: list(tokens[start:end]),
        )
        for name in ("try_commit_blocks", "_mark_context_position_as_history"):
            setattr(self.self_, name, types.MethodType(self.m[name], self.self_))

    def serve(self, rid: int, prompt: list[int], chunk: int) -> int:
        """One request's prefill through the manager; its hit tokens."""
        req = _Request(rid, prompt)
        self.m["prepare_expect_snapshot_points"](self.self_, [req])
        match = self.tree.match(self.rt.ReuseScope(), prompt[:-1], enable_partial_match=True)
        kv = EngineKvCache(self.rt, self.tree, self.tpb, match)
        self.self_.kv_cache_map[rid] = kv
        hit = req.context_current_position = match.num_tokens
        ends = {p for p in req.expect_snapshot_points if p > hit}
        ends.update(range(hit + chunk, req.prompt_len, chunk))
        ends.add(req.prompt_len)
        batch = SimpleNamespace(context_requests=[req])
        for end in sorted(ends):
            req.context_current_position = end
            self.m["update_context_resources"](self.self_, batch)
        # free_resources: one more try_commit_blocks while the cache is active
        self.m["try_commit_blocks"](self.self_, req, kv)
        del self.self_.kv_cache_map[rid]
        return hit


# ------------------------------------------------------------------ the two sides


def prompts(trace) -> list[list[int]]:
    """Each request's prompt as token ids (hash-block traces: drawn from the hashes)."""
    B = trace.block_tokens
    out = []
    for r in trace.requests:
        n_in = r.n_input_tokens(B)
        toks = request_tokens(r.input_tokens, [], block_tokens=B, input_len=n_in, output_len=0)
        out.append([int(t) for t in toks[:n_in]])
    return out


def sim_hits(trace, policy: str, knobs: dict, chunk: int) -> tuple[list[int], np.ndarray]:
    """Hit tokens per request of ``policy`` in sequential mode (no eviction), in arrival order."""
    config = SimConfig(
        policy=policy,
        model=MODEL,
        capacity_bytes=UNLIMITED,
        mode="sequential",
        prefill_chunk_tokens=chunk,
        **knobs,
    )
    sim = build(trace, config)
    order = np.argsort(timestamps(sim), kind="stable")
    res = run(sim)
    hit = (
        res.requests.set_index("request_id")["hit_tokens"]
        if "request_id" in res.requests
        else res.requests["hit_tokens"]
    )
    return [int(hit.iloc[i]) for i in order], order


def offsets(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trtllm", required=True, help="folder holding TensorRT-LLM's tensorrt_llm/ files (see above)")
    ap.add_argument("--trace", default="sharegpt", help="sharegpt (Qwen3.5 tokens) or mooncake:sample")
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--tokens-per-block", type=int, default=32, help="the engine's tokens_per_block")
    ap.add_argument("--prefill-chunk", type=int, default=8192)
    ap.add_argument("--periodic-snapshot-interval", type=int, default=0)
    ap.add_argument("--additional-snapshot-offsets-from-start", default="")
    ap.add_argument("--additional-snapshot-offsets-from-end", default="")
    ap.add_argument("--policies", default="trtllm")
    ap.add_argument("--out", default="", help="CSV of per-request hits (request, input tokens, engine, presets)")
    args = ap.parse_args()
    root = Path(args.trtllm)
    trace = load_trace(args.trace, TraceOptions(sessions=args.sessions))
    print(
        f"trace: {args.trace}, {len(trace.requests)} requests, {trace.n_sessions} sessions; "
        f"tokens_per_block {args.tokens_per_block}, periodic {args.periodic_snapshot_interval}, "
        f"from start [{args.additional_snapshot_offsets_from_start}], "
        f"from end [{args.additional_snapshot_offsets_from_end}]"
    )
    knobs = {
        "periodic_snapshot_interval": args.periodic_snapshot_interval,
        "additional_snapshot_offsets_from_start": args.additional_snapshot_offsets_from_start,
        "additional_snapshot_offsets_from_end": args.additional_snapshot_offsets_from_end,
    }
    results, order = {}, None
    for policy in args.policies.split(","):
        results[policy], order = sim_hits(trace, policy, knobs, args.prefill_chunk)
    engine = EngineHarness(
        root,
        args.tokens_per_block,
        args.periodic_snapshot_interval,
        offsets(args.additional_snapshot_offsets_from_start),
        offsets(args.additional_snapshot_offsets_from_end),
    )
    toks = prompts(trace)
    eng = [engine.serve(k, toks[i], args.prefill_chunk) for k, i in enumerate(order)]
    for policy, hits in results.items():
        same = sum(a == b for a, b in zip(hits, eng))
        diff = Counter(np.sign(np.array(hits) - np.array(eng)))
        print(
            f"{policy:24s} agrees on {same}/{len(eng)} requests "
            f"(simulator higher on {diff.get(1, 0)}, lower on {diff.get(-1, 0)}); "
            f"hit tokens {sum(hits):,} vs engine {sum(eng):,}"
        )
        shown = 0
        for k, (a, b) in enumerate(zip(hits, eng)):
            if a != b and shown < 8:
                print(f"  request {order[k]} (input {len(toks[order[k]])}): simulator {a}, engine {b}")
                shown += 1
    if args.out:
        with open(args.out, "x", newline="") as f:
            w = csv.writer(f)
            w.writerow(["request", "input_tokens", "engine", *results])
            for k, i in enumerate(order):
                w.writerow([int(i), len(toks[i]), eng[k], *(results[p][k] for p in results)])


if __name__ == "__main__":
    main()

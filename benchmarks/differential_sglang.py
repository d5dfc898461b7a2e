"""Differential check: SGLang's own radix cache (``UnifiedRadixCache`` + mamba component) against the
``sglang`` presets, hit tokens per request.

The same request stream goes through sgl-project/sglang's cache on the CPU and through the
simulator's preset in sequential mode (one request at a time, in arrival order). Nothing of SGLang
is copied here: the script imports it from a folder given on the command line (the unpacked wheel,
``pip download --no-deps sglang==0.5.23`` then ``unzip``) plus a folder of the pure-Python
modules it imports at load time (``pip install --no-deps --target``: orjson, pybase64, starlette,
msgspec, apache-tvm-ffi, transformers, safetensors, sentencepiece, compressed-tensors, loguru,
gguf, openai, sniffio, partial-json-parser); torchvision, which it imports for vision models only,
is replaced by an empty stub module.

Engine side, per request (the calls SGLang's scheduler makes, ``managers/schedule_batch.py``,
``schedule_policy.py``, ``scheduler_components/batch_result_processor.py``,
``mem_cache/common.py``): ``Req.init_next_round_input`` (the match, capped at input - 1 tokens,
copy-on-write of the matched state), ``tree_cache.lock``, ``alloc_req_slots`` (the request's mamba
slot and, with extra_buffer, its two ping-pong track slots, evicting states when the pool is
full); then each chunked-prefill chunk: ``alloc_token_slots`` (evicting KV), extra_buffer's track
entry (``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``, called on a stub batch)
and ``checkpoint_kv_cache`` after every chunk of a request that goes on; decode: one token slot
per computed output token (all but the last, which is sampled but never run), extra_buffer's
decode track when the committed length reaches a multiple of ``mamba_track_grid``; at the end
``release_kv_cache(checkpoint=True)``. The tensor pools are real SGLang pools with one attention
head of width 1 and a 1-head, 2 x 2 state (a few bytes a slot); the mamba LRU's clock
(``get_and_increase_time_counter``) is SGLang's own counter, already deterministic.

Memory: "ample" sizes both pools so that nothing is evicted. Otherwise the simulator gets
``--gpu-memory M`` (the preset's split: ``floor(M x r / (1 + r) / state bytes)`` states, the KV
budget the rest) and the engine a KV pool of ``floor(KV budget / KV bytes per token)`` tokens and a
mamba pool of those states, each with a reserve lent to the one running request (its KV tokens;
its working slot, two ping-pong slots with extra_buffer, one per state it donates) and taken back
after it with the engine's own calls (``alloc_token_slots``, ``evict_for_alloc``): the cache
itself has exactly the simulator's budgets and evicts when the request ends, as the simulator's
sequential mode does (it charges running requests nothing and evicts at the insert). Requests at
equal trace times go in arrival order; SGLang stamps recency from its own counter
(``get_and_increase_time_counter``), deterministic, so no clock is patched.

    python benchmarks/differential_sglang.py --sglang ENGINES/sglang-0.5.23 \\
        --deps ENGINES/deps --trace sharegpt --sessions 100 --memory 10GB

On a hash-block trace (``mooncake:sample``) the engine gets each 512-token symbol spelled out as
tokens and the preset the symbols, unless ``--hash-block-tokens`` is given: then the trace itself is
spelled out (``traces/hashblock.py``) and both sides see the same tokens.

Prints, for each preset compared, how many requests get the same hit as the engine, and writes
``--out`` (a CSV of per-request hits) when given.
"""

from __future__ import annotations

import argparse
import csv
import importlib.abc
import importlib.machinery
import os
import sys
import time
import types
from collections import Counter
from dataclasses import dataclass

import numpy as np
from differential_report import (  # this folder
    Agreement,
    add_hash_block_tokens,
    des_events,
    served_hits,
    sim_events,
)

MODEL = "qwen3.5-9b"
PRESETS = {
    # label: (simulator policy, simulator knobs, engine strategy)
    "sglang/no_buffer": ("sglang", {"mamba_radix_cache_strategy": "no_buffer"}, "no_buffer"),
    "sglang/extra_buffer": ("sglang", {"mamba_radix_cache_strategy": "extra_buffer"}, "extra_buffer"),
}
STUBBED = ("torchvision",)  # imported by SGLang's vision-model configs only


class _AnyMeta(type):
    def __getattr__(cls, name):
        return _Anything()


class _Anything(metaclass=_AnyMeta):
    """A stand-in for any attribute of a stubbed module (classes, enums, functions)."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Anything()

    def __getattr__(self, name):
        return _Anything()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for ``STUBBED`` (never used by the cache code)."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        module.__getattr__ = lambda name: type(name, (_Anything,), {})
        return module

    def exec_module(self, module):
        pass


@dataclass(frozen=True)
class Touch:
    """The simulator touched waiting request ``request_id``'s prefix, ``tokens`` of its prompt and
    output (``Simulation.touch_prefix``: SGLang's waiting-prefix refresh, rule 17)."""

    request_id: int
    tokens: int


@dataclass
class EngineSetup:
    strategy: str
    kv_tokens: int
    mamba_slots: int
    page_size: int = 1
    track_interval: int = 256
    prefill_chunk: int = 8192
    kv_reserve: int = 0  # KV slots held back and lent to each running request
    mamba_reserve: int = 0  # mamba slots held back and lent to each running request
    tree_core: str | None = None  # SGLang's tree core backend (None: the engine's default, rust)
    max_running: int = 1  # requests running at once (request slots in the pool)


def engine_tokens(req, block: int, out: bool) -> np.ndarray:
    """A request's prompt (or its output, all but what the simulator stores) in tokens: a symbol of a
    hash-block trace becomes ``block`` tokens, ``symbol * block + offset``."""
    sym = req.output_tokens if out else req.input_tokens
    n = req.n_output_tokens(block) if out else req.n_input_tokens(block)
    if block == 1:
        return np.asarray(sym[:n], dtype=np.int64)
    pos = np.arange(n)
    ids = np.asarray(sym, dtype=np.int64)[np.minimum(pos // block, len(sym) - 1)]
    if out:  # outputs of hash-block traces are unique per request
        ids = np.full(n, -(req.request_id + 1) * 10**6, dtype=np.int64) - pos
        return ids
    return ids * block + pos % block


class SGLangDriver:
    """SGLang's cache, driven one request at a time as its scheduler drives it."""

    def __init__(self, setup: EngineSetup, max_len: int):
        import torch  # noqa: PLC0415
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape  # noqa: PLC0415
        from sglang.srt.environ import envs  # noqa: PLC0415
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: PLC0415
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: PLC0415
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool  # noqa: PLC0415
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: PLC0415
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: PLC0415
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: PLC0415

        self.setup = setup
        extra = setup.strategy != "no_buffer"
        args = ServerArgs(
            model_path="dummy",
            page_size=setup.page_size,
            mamba_radix_cache_strategy=setup.strategy,
            mamba_track_interval=setup.track_interval,
            chunked_prefill_size=setup.prefill_chunk,
        )
        args._mamba_cache_chunk_size = max(64, setup.page_size)  # the FLA chunk (a dummy model has no config)
        set_global_server_args_for_scheduler(args)
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("float32"):
            shape = Mamba2StateShape.create(
                tp_world_size=1,
                intermediate_size=2,
                n_groups=1,
                num_heads=1,
                head_dim=2,
                state_size=2,
                conv_kernel=2,
            )
            params = Mamba2CacheParams(shape=shape, layers=[0])
        self.pool = HybridReqToTokenPool(
            size=setup.max_running + 1,
            mamba_size=setup.mamba_slots + setup.mamba_reserve,
            mamba_spec_state_size=2,
            max_context_len=max_len + 8,
            device="cpu",
            enable_memory_saver=False,
            cache_params=params,
            mamba_layer_ids=[0],
            enable_mamba_extra_buffer=extra,
            enable_mamba_extra_buffer_lazy=setup.strategy == "extra_buffer_lazy",
            enable_overlap_schedule=True,  # the default: two ping-pong track slots per request
        )
        size = setup.kv_tokens + setup.kv_reserve
        kv = HybridLinearKVPool(
            size=size,
            dtype=torch.bfloat16,
            page_size=setup.page_size,
            head_num=1,
            head_dim=1,
            full_attention_layer_ids=[1],
            device="cpu",
            mamba_pool=self.pool.mamba_pool,
        )
        self.allocator = TokenToKVPoolAllocator(
            size=size, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
        )
        self.tree = UnifiedRadixCache(
            params=CacheInitParams(
                req_to_token_pool=self.pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=setup.page_size,
                disable=False,
                tree_components=(ComponentType.FULL, ComponentType.MAMBA),
                enable_mamba_extra_buffer=extra,
                tree_core_backend=setup.tree_core,
            )
        )
        self.reserve = self.allocator.alloc(setup.kv_reserve) if setup.kv_reserve else None
        self.mamba_reserve = self.pool.mamba_allocator.alloc(setup.mamba_reserve) if setup.mamba_reserve else None
        self.model_config = types.SimpleNamespace(hf_text_config=types.SimpleNamespace(mamba_chunk_size=64))
        self.rid = 0

    def _lend(self, n: int):
        """Give ``n`` reserved KV slots back to the allocator for the running request."""
        if self.reserve is None or n <= 0:
            return 0
        n = min(n, len(self.reserve))
        self.allocator.free(self.reserve[len(self.reserve) - n :])
        self.reserve = self.reserve[: len(self.reserve) - n]
        return n

    def _take_back(self, n: int) -> None:
        """Take the lent slots back, evicting with the engine's own calls (``alloc_token_slots``,
        ``evict_for_alloc``) what the finished request left beyond the pools' budgets."""
        import torch  # noqa: PLC0415
        from sglang.srt.mem_cache.allocation import alloc_token_slots  # noqa: PLC0415
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: PLC0415

        if n > 0:
            self.reserve = torch.cat([self.reserve, alloc_token_slots(self.tree, n)])
        if self.setup.mamba_reserve:
            mamba = self.pool.mamba_allocator
            want = self.setup.mamba_reserve
            if mamba.available_size() < want:
                self.tree.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=want - mamba.available_size()))
            self.mamba_reserve = mamba.alloc(want)
            assert self.mamba_reserve is not None, "the mamba pool could not be taken back"

    def begin(self, prompt: np.ndarray, output: np.ndarray, first_end: int | None = None):
        """A new request's lookup (``init_next_round_input``: the match, capped at input - 1, with
        the copy-on-write of the hit's state), its lock and its request slots, the first chunk ending
        at ``first_end`` (default: the hit plus the prefill chunk). Returns the request and its hit."""
        from array import array  # noqa: PLC0415

        from sglang.srt.managers.schedule_batch import Req  # noqa: PLC0415
        from sglang.srt.mem_cache.allocation import alloc_req_slots  # noqa: PLC0415
        from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: PLC0415

        n, n_out = len(prompt), len(output)
        req = Req(
            rid=str(self.rid),
            origin_input_text="",
            origin_input_ids=array("q", prompt.tolist()),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=n_out),
        )
        self.rid += 1
        req.output_ids = array("q")
        req.init_next_round_input(self.tree)
        hit = int(req.prefix_len)
        req.extend_end = min(n, hit + self.setup.prefill_chunk) if first_end is None else max(first_end, hit + 1)
        req.lock = self.tree.lock(req.last_node)
        alloc_req_slots(self.pool, [req], self.tree)
        req._sim_out = output.tolist()  # the tokens it will sample
        return req, hit

    def extend(self, req, end: int) -> None:
        """One prefill chunk of ``req``: tokens ``req.prefix_len`` .. ``end`` (KV slots, extra_buffer's
        track entry on a stub batch)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: PLC0415
        from sglang.srt.mem_cache.allocation import alloc_token_slots  # noqa: PLC0415

        pos = req.prefix_len
        req.extend_end = end
        loc = alloc_token_slots(self.tree, end - pos)
        self.pool.write((req.kv.req_pool_idx, slice(pos, end)), loc)
        req.kv.kv_committed_len = end
        req.kv.kv_allocated_len = end
        if self.setup.strategy != "no_buffer":
            batch = types.SimpleNamespace(
                model_config=self.model_config, tree_cache=self.tree, req_to_token_pool=self.pool
            )
            ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend(batch, req)

    def extended(self, req) -> bool:
        """After a step that ran a chunk of ``req``: a chunk short of the prompt's end is published
        (``checkpoint_kv_cache``, the scheduler's ``stash_chunked_request``); the prompt's last chunk
        samples the first output token, and the request is published and decodes on
        (``process_batch_result_prefill``) or is released. Returns whether it finished."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache  # noqa: PLC0415

        if req.extend_end < len(req.origin_input_ids):
            checkpoint_kv_cache(req, self.tree)
            return False
        req.output_ids.append(req._sim_out[0])
        if len(req._sim_out) > 1:
            checkpoint_kv_cache(req, self.tree)
            return False
        self.finish(req)
        return True

    def touch(self, prompt: np.ndarray, output: np.ndarray, tokens: int) -> None:
        """SGLang's own ``touch_waiting_prefix`` (``mem_cache/common.py`` L215-L218) on a waiting
        request built as the scheduler holds it: its prompt and the ``tokens - len(prompt)`` output
        tokens it generated before a retraction; it walks them uncapped and holds nothing."""
        from array import array  # noqa: PLC0415

        from sglang.srt.managers.schedule_batch import Req  # noqa: PLC0415
        from sglang.srt.mem_cache.common import touch_waiting_prefix  # noqa: PLC0415
        from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: PLC0415

        req = Req(
            rid="touch",
            origin_input_text="",
            origin_input_ids=array("q", prompt.tolist()),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=max(len(output), 1)),
        )
        req.output_ids = array("q", output[: max(tokens - len(prompt), 0)].tolist())
        touch_waiting_prefix(req, self.tree)

    def decode_slot(self, req) -> None:
        """A decode step's KV slot for the newest sampled token of ``req``."""
        from sglang.srt.mem_cache.allocation import alloc_token_slots  # noqa: PLC0415

        n, j = len(req.origin_input_ids), len(req.output_ids)
        loc = alloc_token_slots(self.tree, 1)
        self.pool.write((req.kv.req_pool_idx, slice(n + j - 1, n + j)), loc)
        req.kv.kv_allocated_len = n + j

    def decoded(self, req) -> bool:
        """After a decode step: the newest sampled token ran, the next is sampled (extra_buffer's
        decode track when the committed length reaches a multiple of ``mamba_track_grid``). Returns
        whether the request finished (it is released then)."""
        from sglang.srt.runtime_context import mamba_track_grid  # noqa: PLC0415

        n, j = len(req.origin_input_ids), len(req.output_ids)
        req.kv.kv_committed_len = n + j
        req.output_ids.append(req._sim_out[j])
        if self.setup.strategy != "no_buffer" and req.kv.kv_committed_len % mamba_track_grid(self.tree.page_size) == 0:
            req.kv.mamba_prev_track_seqlen = req.kv.mamba_last_track_seqlen
            req.kv.mamba_last_track_seqlen = req.kv.kv_committed_len
            req.kv.mamba_last_track_idx = req.kv.mamba_next_track_idx
            req.kv.mamba_next_track_idx = self.pool.get_mamba_ping_pong_other_idx(req.kv.mamba_last_track_idx)
        if len(req.output_ids) >= len(req._sim_out):
            self.finish(req)
            return True
        return False

    def finish(self, req) -> None:
        """``release_kv_cache(checkpoint=True)`` with input + output - 1 tokens computed."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH  # noqa: PLC0415
        from sglang.srt.mem_cache.common import release_kv_cache  # noqa: PLC0415

        n_out = len(req._sim_out)
        req.finished_reason = FINISH_LENGTH(length=n_out)
        req.finished_len = n_out
        release_kv_cache(req, self.tree, checkpoint=True)

    def run(self, prompt: np.ndarray, output: np.ndarray) -> int:
        """One request alone through the cache; returns its hit tokens."""
        n, n_out = len(prompt), len(output)
        if self.mamba_reserve is not None:  # lent before the match: its copy-on-write takes a slot
            self.pool.mamba_allocator.free(self.mamba_reserve)
            self.mamba_reserve = None
        req, hit = self.begin(prompt, output)
        lent = self._lend(n + n_out - 1 - hit)
        while True:  # chunked prefill
            self.extend(req, min(n, req.prefix_len + self.setup.prefill_chunk))
            if self.extended(req):
                break
            if req.extend_end >= n:
                while True:
                    self.decode_slot(req)
                    if self.decoded(req):
                        break
                break
        self._take_back(lent)
        return hit

    # ---- fcfs with the simulator's pools: running requests take their memory from a reserve
    def _lent(self, rid: int, op, kv: int, mamba: int):
        """Run ``op()`` for request ``rid`` with ``kv`` KV slots and ``mamba`` mamba slots lent
        from the reserve, so that the engine's allocation evicts nothing (the simulator's fcfs
        charges a running request nothing); what ``op`` did not take goes straight back, what it
        took is counted as lent to ``rid`` (``self.owed``) until ``_settle``. Returns ``op()``."""
        import torch  # noqa: PLC0415

        mamba_alloc = self.pool.mamba_allocator
        assert len(self.reserve) >= kv and len(self.mamba_reserve) >= mamba, "the reserve is spent"
        kv0, m0 = self.allocator.available_size(), mamba_alloc.available_size()
        if kv:
            self.allocator.free(self.reserve[len(self.reserve) - kv :])
            self.reserve = self.reserve[: len(self.reserve) - kv]
        if mamba:
            mamba_alloc.free(self.mamba_reserve[len(self.mamba_reserve) - mamba :])
            self.mamba_reserve = self.mamba_reserve[: len(self.mamba_reserve) - mamba]
        out = op()
        back_kv = self.allocator.available_size() - kv0  # free beyond the cache's own: unused
        back_m = mamba_alloc.available_size() - m0
        assert back_kv >= 0 and back_m >= 0, "an allocation evicted: lend more"
        if back_kv:
            self.reserve = torch.cat([self.reserve, self.allocator.alloc(back_kv)])
        if back_m:
            self.mamba_reserve = torch.cat([self.mamba_reserve, mamba_alloc.alloc(back_m)])
        owed = self.owed.setdefault(rid, [0, 0])
        owed[0] += kv - back_kv
        owed[1] += mamba - back_m
        return out

    def _settle(self, rid: int, req, finished: bool) -> None:
        """At the simulator's insert (a prefill's end, a request's end): take back what ``rid``
        was lent beyond what it still holds privately (its decode tokens' KV, its working and
        ping-pong mamba slots), evicting with the engine's own calls as the simulator's insert
        evicts, so the cache is back within the simulator's budgets."""
        import torch  # noqa: PLC0415
        from sglang.srt.mem_cache.allocation import alloc_token_slots  # noqa: PLC0415
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: PLC0415

        owed = self.owed.get(rid, [0, 0])
        held_kv = held_m = 0
        if not finished:  # its KV past what the tree holds of it (extra_buffer: past its last track)
            held_kv = max(0, req.kv.kv_allocated_len - req.kv.cache_protected_len)
            held_m = int(req.kv.mamba_pool_idx is not None)
            if req.kv.mamba_ping_pong_track_buffer is not None:
                held_m += len(req.kv.mamba_ping_pong_track_buffer)
        kv, m = owed[0] - held_kv, owed[1] - held_m
        if kv > 0:
            self.reserve = torch.cat([self.reserve, alloc_token_slots(self.tree, kv)])
            owed[0] -= kv
        if m > 0:
            mamba = self.pool.mamba_allocator
            if mamba.available_size() < m:
                self.tree.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=m - mamba.available_size()))
            got = mamba.alloc(m)
            assert got is not None, "the mamba pool could not be taken back"
            self.mamba_reserve = torch.cat([self.mamba_reserve, got])
            owed[1] -= m
        if finished:
            self.owed.pop(rid, None)

    def run_events(self, events, tokens) -> tuple[dict[int, int], Counter]:
        """The simulator's ``--scheduler fcfs`` run (its ``Lookup``, ``Prefill`` and ``Decode``
        events, in the order it emitted them) through the cache: a request's lookup when the
        simulator looked it up (for ``sglang``, when its server took it), its whole chunked prefill
        when the simulator's prefill ended (each chunk published, the prompt's end published), its
        decode tokens and its release when its decode ended. With the simulator's pools
        (``--memory M --pools``) a running request's slots are lent from a reserve and taken back
        at the simulator's inserts (``_lent``, ``_settle``). Returns the engine's hit per request
        id and the odd cases."""
        from sim.engine.events import Decode, Lookup, Prefill  # noqa: PLC0415

        pooled = self.reserve is not None
        self.owed: dict[int, list[int]] = {}
        lend = self._lent if pooled else (lambda rid, op, kv, mamba: op())
        spare = 4  # mamba slots lent per engine call (a copy-on-write, a fork, two ping-pong slots)
        live: dict = {}
        hits: dict[int, int] = {}
        odd: Counter = Counter()
        for ev in events:
            rid = int(ev.request.request_id) if hasattr(ev, "request") else None
            if isinstance(ev, Lookup):
                odd["lookups"] += rid in hits
                prompt, output = tokens[rid]
                req, hits[rid] = lend(rid, lambda p=prompt, o=output: self.begin(p, o), 0, spare)
                live[rid] = req
            elif isinstance(ev, Prefill):
                req = live[rid]
                n = len(req.origin_input_ids)
                done = False
                while True:
                    end = min(n, req.prefix_len + self.setup.prefill_chunk)

                    def chunk(req=req, end=end):
                        self.extend(req, end)
                        return self.extended(req)

                    done = lend(rid, chunk, end - req.prefix_len, spare)
                    if done:
                        del live[rid]
                        break
                    if req.extend_end >= n:
                        break
                if pooled:
                    self._settle(rid, req, done)
            elif isinstance(ev, Decode) and rid in live:
                req = live.pop(rid)

                def token(req=req):
                    self.decode_slot(req)
                    return self.decoded(req)

                while not lend(rid, token, 1, spare):
                    pass
                if pooled:
                    self._settle(rid, req, True)
        odd["unfinished"] = len(live)
        return hits, odd

    def run_steps(self, steps, tokens, probe=None) -> tuple[dict[int, int], Counter]:
        """The simulator's continuous-batching steps (``Step`` events) and waiting-prefix touches
        (``Touch``, replayed with SGLang's own ``touch_waiting_prefix``) through the cache, in order:
        per step the running requests' chunks and decode tokens, then the newly scheduled requests'
        lookups and first chunks; after the step each chunk is published or, at the prompt's end,
        samples its first token; a request is released at the step that samples its last token.
        Returns the engine's hit per request id and the schedule's odd cases (``start``: the
        engine's hit is not where the simulator's first chunk starts)."""
        live: dict = {}
        hits: dict[int, int] = {}
        odd: Counter = Counter()
        for ev in steps:
            if isinstance(ev, Touch):  # a pass's waiting-prefix refresh, before its step's tokens
                self.touch(*tokens[ev.request_id], ev.tokens)
                odd["touches"] += 1
                continue
            if ev.preempted:
                raise RuntimeError(f"the simulator preempted requests at t = {ev.t_start:.3f} s (not replayed)")
            for _ in range(ev.steps):
                ran = []
                # the running requests' tokens first (the simulator charges them before it looks
                # new requests up), then the new requests' lookups and first chunks
                for rid, _a, b in ev.prefills:
                    if rid not in live:
                        continue
                    req = live[rid]
                    if b <= req.prefix_len:  # the engine's hit lies past this chunk: nothing to run
                        odd["skipped"] += 1
                        continue
                    self.extend(req, b)
                    ran.append((rid, req))
                decodes = [(rid, live[rid]) for rid, _ctx in ev.decodes]
                for _rid, req in decodes:
                    self.decode_slot(req)
                for rid, a, b in ev.prefills:
                    if rid in live:
                        continue
                    prompt, output = tokens[rid]
                    req, hit = self.begin(prompt, output, first_end=b)
                    hits[rid] = hit
                    odd["start"] += hit != a
                    live[rid] = req
                    self.extend(req, req.extend_end)
                    ran.append((rid, req))
                for rid, req in ran:
                    if self.extended(req):
                        del live[rid]
                for rid, req in decodes:
                    if self.decoded(req):
                        del live[rid]
            if probe is not None:  # a caller's look at the engine after each step event
                probe(ev, live)
        odd["unfinished"] = len(live)
        return hits, odd


def engine_hits(trace, order, setup: EngineSetup) -> list[int]:
    block = trace.block_tokens
    reqs = [trace.requests[i] for i in order]
    longest = max(r.n_input_tokens(block) + r.n_output_tokens(block) for r in reqs)
    driver = SGLangDriver(setup, longest)
    hits = []
    for r in reqs:
        hits.append(driver.run(engine_tokens(r, block, False), engine_tokens(r, block, True)))
    return hits


def sim_run(trace, policy: str, knobs: dict, memory: str):
    """Hit tokens per request of ``policy`` in sequential mode, in arrival order, and the simulation."""
    from sim.config import UNLIMITED, SimConfig  # noqa: PLC0415

    extra = {"gpu_memory": memory} if memory != "ample" else {}
    config = SimConfig(policy=policy, model=MODEL, capacity_bytes=UNLIMITED, mode="sequential", **knobs, **extra)
    return served_hits(trace, config)


def _config(policy: str, knobs: dict, scheduler: str):
    from sim.config import UNLIMITED, SimConfig  # noqa: PLC0415

    return SimConfig(policy=policy, model=MODEL, capacity_bytes=UNLIMITED, mode="des", scheduler=scheduler, **knobs)


def _pools(sim, knobs: dict):
    """The preset's pools (KV tokens, states; None: ample, no ``gpu_memory`` in ``knobs``): fixed
    when the tree is built."""
    if not knobs.get("gpu_memory"):
        return None
    tree = sim.tree
    return int(tree.kv_capacity_bytes // tree.kv_bytes_per_token), tree.state_capacity


def sim_steps(trace, policy: str, knobs: dict):
    """``policy`` under ``--scheduler continuous`` (the default step budget; the preset keeps each
    step's prefill within its ``--prefill-chunk``; ``gpu_memory`` in ``knobs`` for the engine's
    pools): its hit per request id, its ``Step`` events and waiting-prefix touches (rule 17) in
    order, and its pools (KV tokens, states; None: ample)."""
    from sim.engine.events import Step  # noqa: PLC0415

    def patch(sim, log):  # the waiting-prefix touches, in order among the steps
        touch = sim.touch_prefix

        def recorded(r, t, tokens):
            log.events.append(Touch(int(r.request_id), int(tokens)))
            touch(r, t, tokens)

        sim.touch_prefix = recorded

    hits, events, sim = des_events(trace, _config(policy, knobs, "continuous"), (Step, Touch), patch)
    return hits, events, _pools(sim, knobs)


def sim_fcfs(trace, policy: str, knobs: dict):
    """``policy`` under ``--scheduler fcfs`` (des mode, one prefill server; ``gpu_memory`` in
    ``knobs`` for the engine's pools): its hit per request id, its lookup, prefill and decode events
    in order (``differential_report.sim_events``) and its pools."""
    hits, events, sim = sim_events(trace, _config(policy, knobs, "fcfs"))
    return hits, events, _pools(sim, knobs)


def scheduled(trace, args, label: str, rows: list) -> None:
    """One preset under ``--scheduler continuous`` (its steps) or ``fcfs`` (its lookups, prefills and
    decodes), replayed through the engine in the simulator's order."""
    policy, knobs, strategy = PRESETS[label]
    chunk = args.prefill_chunk
    t0 = time.time()
    rate = {"sessions_per_second": args.sessions_per_second} if args.sessions_per_second else {}
    memory = {"gpu_memory": args.memory} if args.memory != "ample" else {}
    knobs = {**knobs, "prefill_chunk_tokens": chunk, **rate, **memory}
    fcfs = args.scheduler == "fcfs"
    pools = None
    if fcfs:
        sim, steps, pools = sim_fcfs(trace, policy, knobs)
    else:
        sim, steps, pools = sim_steps(trace, policy, knobs)
    block = trace.block_tokens
    tokens = {
        int(r.request_id): (engine_tokens(r, block, False), engine_tokens(r, block, True)) for r in trace.requests
    }
    lens = [len(p) + len(o) for p, o in tokens.values()]
    # ample: every token of every request, and per request a state per chunk, its prompt end, its
    # end and its running slots
    states = sum(-(-n // chunk) + 5 for n in lens) + 64
    running = (
        0 if fcfs else max(len(e.prefills) + len(e.decodes) for e in steps if not isinstance(e, Touch))
    )  # in one step
    kv_tokens = sum(lens) + 64
    reserve = {}
    if pools is not None:  # the simulator's pools; running requests take their slots from them
        kv_tokens, states = pools
        if fcfs:  # ... lent from a reserve (fcfs charges them nothing): every request's at most
            reserve = {"kv_reserve": sum(lens) + 64, "mamba_reserve": 8 * len(lens) + 64}
    setup = EngineSetup(strategy, kv_tokens, states, prefill_chunk=chunk, max_running=len(lens), **reserve)
    setup.tree_core = args.tree_core
    driver = SGLangDriver(setup, max(lens))
    try:
        got, odd = driver.run_events(steps, tokens) if fcfs else driver.run_steps(steps, tokens)
    except (AssertionError, RuntimeError) as e:  # the engine's pools ran dry, or a preemption (not replayed)
        print(f"{label}: the engine stopped: {e} ({driver.pool.mamba_allocator.available_size()} mamba slots free)")
        return
    ids = sorted(sim)
    agreement = Agreement.of([sim[i] for i in ids], [got.get(i, -1) for i in ids])
    aborted = len(trace.requests) - len(sim)
    if aborted:
        odd["unfinished"] = f"{odd['unfinished']}, aborted at arrival {aborted} (not compared)"
    if fcfs:
        what = f"lookups repeated {odd['lookups']}, unfinished {odd['unfinished']}"
    else:
        n_steps = sum(e.steps for e in steps if not isinstance(e, Touch))
        what = (
            f"{n_steps:,} steps, up to {running} running; first chunks not at the engine's hit "
            f"{odd['start']} (chunks skipped {odd['skipped']}), unfinished {odd['unfinished']}, "
            f"waiting-prefix touches replayed {odd['touches']}"
        )
    print(
        f"{label + f' ({args.scheduler})':34s} {agreement.counts(percent=True)}; {agreement.tokens()}; "
        f"{what} ({time.time() - t0:.0f} s)"
    )
    for k in agreement.differing[:5]:
        i = ids[k]
        print(
            f"  request {i} (input {len(tokens[i][0])}, output {len(tokens[i][1])}): simulator {sim[i]}, engine {got.get(i)}"
        )
    rows.extend((label, args.trace, args.memory, i, sim[i], got.get(i, -1)) for i in ids)


def engine_setup(trace, sim, strategy: str, memory: str, prefill_chunk: int) -> EngineSetup:
    """The engine's pool sizes for the simulator's memory (see the module docstring)."""
    from sim.cost import get_model  # noqa: PLC0415

    block = trace.block_tokens
    total = sum(r.n_input_tokens(block) + r.n_output_tokens(block) for r in trace.requests)
    longest = max(r.n_input_tokens(block) + r.n_output_tokens(block) for r in trace.requests)
    running = 1 if strategy == "no_buffer" else 3
    if memory == "ample":
        return EngineSetup(strategy, total + 64, 3 * len(trace.requests) + 64, prefill_chunk=prefill_chunk)
    spec = get_model(MODEL)
    tree = sim.tree
    kv_tokens = int(tree.kv_capacity_bytes // spec.kv_bytes_per_token())
    chunks = -(-longest // prefill_chunk)
    return EngineSetup(
        strategy,
        kv_tokens,
        tree.state_capacity,
        prefill_chunk=prefill_chunk,
        kv_reserve=longest,
        mamba_reserve=running + chunks + 2,  # the request's own slots and one per state it donates
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sglang", required=True, help="folder holding SGLang's sglang/ package (the unpacked wheel)")
    ap.add_argument("--deps", default="", help="folder of the modules SGLang imports (pip --target)")
    ap.add_argument("--trace", default="sharegpt", help="trace spec (sharegpt, mooncake:sample)")
    ap.add_argument("--sessions", type=int, default=100)
    add_hash_block_tokens(ap)
    ap.add_argument("--memory", default="ample", help="'ample' (nothing evicted) or the engine's --gpu-memory")
    ap.add_argument("--prefill-chunk", type=int, default=8192)
    ap.add_argument("--presets", default=",".join(PRESETS), help=f"comma-separated, of {', '.join(PRESETS)}")
    ap.add_argument("--tree-core", default=None, choices=("rust", "python"), help="SGLang's tree core (default: rust)")
    ap.add_argument(
        "--scheduler",
        choices=("sequential", "fcfs", "continuous"),
        default="sequential",
        help="fcfs / continuous: the preset under that scheduler (des mode; ample memory, or --memory with "
        "--pools), replayed through the engine",
    )
    ap.add_argument(
        "--sessions-per-second",
        type=float,
        default=0.0,
        help="continuous: sessions started per second (0: the simulator's default); more runs more at once",
    )
    ap.add_argument(
        "--pools",
        action="store_true",
        help="fcfs / continuous with --memory: the engine gets the simulator's pools (continuous: the engine may "
        "run out of mamba slots, see docs/presets-engines.md)",
    )
    ap.add_argument("--out", default="", help="CSV of per-request hits (never overwritten)")
    args = ap.parse_args()
    if args.scheduler != "sequential" and args.memory != "ample" and not args.pools:
        print(f"error: --scheduler {args.scheduler} is compared with ample memory only", file=sys.stderr)
        raise SystemExit(2)
    if args.out and os.path.exists(args.out):
        print(f"error: {args.out} exists (--out never replaces a file)", file=sys.stderr)
        raise SystemExit(2)
    if not os.path.isfile(os.path.join(args.sglang, "sglang", "__init__.py")):
        print(f"error: {args.sglang}: no sglang/ package (unpack SGLang's wheel there)", file=sys.stderr)
        raise SystemExit(2)
    sys.path[:0] = [p for p in (args.sglang, args.deps) if p]
    sys.meta_path.insert(0, _StubFinder())
    from traces.registry import TraceOptions, load_trace  # noqa: PLC0415

    trace = load_trace(args.trace, TraceOptions(sessions=args.sessions, hash_block_tokens=args.hash_block_tokens))
    print(f"trace {args.trace}: {len(trace.requests)} requests, block {trace.block_tokens}, memory {args.memory}")
    rows = []
    for label in args.presets.split(","):
        if args.scheduler != "sequential":
            scheduled(trace, args, label, rows)
            continue
        policy, knobs, strategy = PRESETS[label]
        knobs = {**knobs, "prefill_chunk_tokens": args.prefill_chunk}
        t0 = time.time()
        sim, order, simulation = sim_run(trace, policy, knobs, args.memory)
        # a request the preset aborts at arrival (rule 18) never reaches the engine's cache: the
        # engine is driven with the others only, and the comparison leaves it out
        keep = [k for k, i in enumerate(order) if not simulation.aborts(trace.requests[i])]
        aborted = len(order) - len(keep)
        sim, order = [sim[k] for k in keep], order[keep]
        setup = engine_setup(trace, simulation, strategy, args.memory, args.prefill_chunk)
        setup.tree_core = args.tree_core
        eng = engine_hits(trace, order, setup)
        agreement = Agreement.of(sim, eng)
        print(
            f"{label:22s} {agreement.counts(percent=True)}; {agreement.tokens()}; "
            f"engine pools {setup.kv_tokens:,} KV tokens, {setup.mamba_slots:,} mamba slots"
            + (f"; aborted at arrival {aborted} (not compared)" if aborted else "")
            + f" ({time.time() - t0:.0f} s)"
        )
        rows.extend((label, args.trace, args.memory, int(order[k]), a, b) for k, (a, b) in enumerate(zip(sim, eng)))
        for k in agreement.differing[:5]:
            r = trace.requests[order[k]]
            print(
                f"  request {order[k]} (input {r.n_input_tokens(trace.block_tokens)}, output "
                f"{r.n_output_tokens(trace.block_tokens)}): simulator {sim[k]}, engine {eng[k]}"
            )
    if args.out:
        with open(args.out, "x", newline="") as f:
            w = csv.writer(f)
            w.writerow(["preset", "trace", "memory", "request", "sim_hit", "engine_hit"])
            w.writerows(rows)


if __name__ == "__main__":
    main()

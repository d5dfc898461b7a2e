"""Differential check: vLLM's own KV cache manager (hybrid, Mamba align mode) against the ``vllm`` preset.

The same request stream (a real ShareGPT slice with Qwen3.5 tokens, or ``mooncake:sample`` with its
512-token hash blocks spelled out as tokens) goes through vllm-project/vllm's v1 cache code on the
CPU and through the simulator's preset in sequential mode; the hit tokens of every request are
compared. On a hash-block trace the preset sees the blocks (a block or state ends on a 512-token
symbol) unless ``--hash-block-tokens`` is given: then the trace itself is spelled out
(``traces/hashblock.py``, the spelling of ``tokens_of`` below) and both sides see the same tokens.
Nothing of vLLM is copied here: the script imports ``vllm/v1/core/`` (``KVCacheManager``, the
``HybridKVCacheCoordinator``, ``FullAttentionManager`` / ``MambaManager``, ``BlockPool``,
``kv_cache_utils``) and ``vllm/v1/kv_cache_interface.py`` from the folder given with ``--vllm`` (the
unpacked wheel: ``pip download --no-deps vllm==0.33.0`` and unzip its ``vllm/*.py``), with the
modules they import but do not need on this path (``vllm.config``, ``vllm.logger``, the request
class, metrics, KV events, multimodal helpers, hashing backends) replaced by small stand-ins; the
scheduler's ``Scheduler._mamba_block_aligned_split`` is read from ``vllm/v1/core/sched/scheduler.py``
and called with a stub ``self`` (as ``differential_vllm_split.py`` does).

Engine side. A ``KVCacheConfig`` as vLLM builds it for Qwen3.5-9B (8 full-attention and 24
Gated-DeltaNet layers): one attention group and three Mamba groups of eight layers each (vLLM
groups layers into groups of equal size; the page of one layer is the same in every group), all
with the preset's block (the attention block raised to the mamba page: 528 tokens, or
``--block-size``), ``mamba_cache_mode="align"``, the hash block equal to the block (no
``prefix_match_unit``: the default), ``prefix_cache_retention_interval`` as the preset's knob
(``-1`` is the Python API's ``None``), no EAGLE, no internal prefill checkpoints (the Triton GDN
prefill backend; FlashInfer's exports the prompt checkpoint inside the last chunk and changes the
step count, not where states sit). Each request, in the simulator's sequential order, one at a time
as the scheduler would run it alone: ``new_step_starts``; ``get_computed_blocks`` (sets
``shared_prefix_boundary``); prefill chunks cut by ``_mamba_block_aligned_split`` with the preset's
``--prefill-chunk`` budget, each allocated with ``allocate_slots``; then decode one token a step up
to input + output - 1 computed tokens (the last sampled token never runs); ``free``.

Memory. The simulator charges a KV block B x ``kv_bytes_per_token`` and a state
``state_bytes``; vLLM charges one block id per attention block and one block id per Mamba group per
state, a block id being eight layers' pages (the attention page of B tokens; the Mamba page is
padded up to it). ``--capacity`` bytes become ``capacity // (B x kv_bytes_per_token)`` block ids
(the engine's ``num_blocks = memory // (page x layers per group)``), so a KV block costs the same
on both sides and a state costs three block ids in vLLM against ``state_bytes / (B x
kv_bytes_per_token)`` (2.98 at B = 528) in the simulator's paper presets; the ``vllm`` preset charges
three, the padded pages, and the running request's own blocks in sequential mode, as the engine
(``--headroom`` adds engine blocks on top). ``--capacity 0`` (default): ample memory, nothing
evicted.

``--scheduler continuous`` runs the preset under the continuous-batching scheduler instead (ample
memory) and replays its steps (``Step`` events: prefill chunks, decodes, in order) through the
engine: the newly scheduled requests' lookups, each chunk cut by the engine's split from the one the
simulator scheduled (a chunk the engine would cut elsewhere is counted), frees at the step that
samples the last token.

    python benchmarks/differential_vllm.py --vllm ENGINES/vllm-0.34.0 --trace sharegpt --sessions 100
    python benchmarks/differential_vllm.py --vllm ENGINES/vllm-0.34.0 --scheduler continuous

Prints, per preset, how many requests get the same hit as the engine; ``--out`` writes one CSV row
per request (request, input, output, engine hit, simulator hit per preset).
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import importlib.util
import logging
import pickle
import sys
import types
from collections import Counter
from enum import Enum
from pathlib import Path


from sim.config import UNLIMITED, SimConfig, parse_size
from sim.cost import get_model
from sim.engine.drivers import run
from sim.engine.events import EventLog, Step
from sim.simulate import build
from traces.registry import TraceOptions, load_trace
from differential_report import Agreement, add_hash_block_tokens, served_hits  # this folder

MODEL = "qwen3.5-9b"
LAYERS_PER_GROUP = 8  # Qwen3.5-9B: 8 attention layers -> groups of 8 (1 attention, 3 Mamba)
CORE = (
    "vllm.utils.math_utils",
    "vllm.v1.kv_cache_layout",
    "vllm.v1.kv_cache_spec_registry",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.kv_cache_metrics",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.kv_cache_manager",
)


# ---------------------------------------------------------------------------------- loading vLLM
class _Logger(logging.LoggerAdapter):
    def __init__(self, name):
        super().__init__(logging.getLogger(name), {})

    def info_once(self, *a, **k):
        pass

    def warning_once(self, *a, **k):
        pass

    def debug_once(self, *a, **k):
        pass


class _Anything:
    """A stand-in class: any attribute, any call."""

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        return _Anything()

    def __call__(self, *a, **k):
        return _Anything()


class RequestStatus(Enum):
    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3


def _usage(message: str):
    """Bad input: one line on stderr, exit 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _stub(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _package(name: str, root: Path) -> None:
    """An empty package whose submodules load from ``root`` (its ``__init__`` is never run)."""
    if name in sys.modules:
        return
    mod = types.ModuleType(name)
    mod.__path__ = [str(root / name.replace(".", "/"))]
    sys.modules[name] = mod


def _load(name: str, root: Path) -> types.ModuleType:
    path = root / (name.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_vllm(root: Path) -> types.SimpleNamespace:
    """vLLM's cache modules from ``root`` (a folder holding ``vllm/``), heavy imports stubbed."""
    if not (root / "vllm/v1/core/kv_cache_manager.py").is_file():
        _usage(f"{root}: no vllm/v1/core/kv_cache_manager.py (unpack vLLM's wheel there)")
    for pkg in (
        "vllm",
        "vllm.utils",
        "vllm.v1",
        "vllm.v1.core",
        "vllm.v1.core.sched",
        "vllm.v1.attention",
        "vllm.v1.attention.backends",
        "vllm.v1.hisparse",
        "vllm.v1.metrics",
        "vllm.distributed",
        "vllm.multimodal",
        "vllm.config",
    ):
        _package(pkg, root)

    class MambaAttentionBackendEnum(Enum):
        MAMBA1 = 1
        MAMBA2 = 2
        GDN_ATTN = 3
        LINEAR = 4
        SHORT_CONV = 5

    class _Event:
        def __init__(self, *a, **k):
            self.__dict__.update(k)

    _stub("vllm.logger", init_logger=_Logger)
    _stub("vllm.envs", VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=False)
    _stub("vllm.config", VllmConfig=object, get_current_vllm_config_or_none=lambda: None)
    _stub("vllm.platforms", current_platform=_Anything())
    sys.modules["vllm"].envs = sys.modules["vllm.envs"]
    _stub("vllm.multimodal.utils", get_mm_features_in_window=lambda *a, **k: (0, []))
    _stub("vllm.utils.hashing", xxhash=lambda x: b"", xxhash_cbor=lambda x: b"")
    _stub("vllm.utils.torch_utils", get_dtype_size=lambda dtype: dtype.itemsize)
    _stub("vllm.v1.utils", tensor_data=lambda t: t, ConstantList=list)
    _stub("vllm.v1.attention.backends.registry", MambaAttentionBackendEnum=MambaAttentionBackendEnum)
    _stub("vllm.v1.request", Request=object, RequestStatus=RequestStatus)
    _stub(
        "vllm.v1.metrics.stats",
        PrefixCacheStats=_Anything,
        KVCacheEvictionEvent=_Anything,
        PrefillStats=_Anything,
    )
    _stub(
        "vllm.distributed.kv_events",
        MEDIUM_GPU="GPU",
        MEDIUM_CPU="CPU",
        AllBlocksCleared=_Event,
        BlockRemoved=_Event,
        BlockStored=_Event,
        KVCacheEvent=_Event,
    )
    mods = {}
    for name in CORE:
        mods[name] = _load(name, root)
        if name == "vllm.v1.core.block_pool":  # HiSparse's pool subclasses it; unused here
            pool = mods[name].BlockPool
            _stub(
                "vllm.v1.hisparse.block_pool", SharedEventQueueBlockPool=type("SharedEventQueueBlockPool", (pool,), {})
            )
    return types.SimpleNamespace(
        interface=mods["vllm.v1.kv_cache_interface"],
        utils=mods["vllm.v1.core.kv_cache_utils"],
        manager=mods["vllm.v1.core.kv_cache_manager"],
        split=load_split(root / "vllm/v1/core/sched/scheduler.py", mods["vllm.v1.kv_cache_interface"]),
    )


def load_split(path: Path, interface):
    """``Scheduler._mamba_block_aligned_split`` from vLLM's scheduler.py."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_mamba_block_aligned_split":
            node.decorator_list = []
            namespace: dict = {"Request": object, **vars(interface)}
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
            return namespace["_mamba_block_aligned_split"]
    _usage(f"{path}: no _mamba_block_aligned_split in it")


# ---------------------------------------------------------------------------------- the engine
class EngineRequest:
    """What vLLM's cache code reads of ``vllm.v1.request.Request`` (no sampling, no multimodal)."""

    def __init__(self, request_id: str, prompt: list[int], hasher, max_tokens: int):
        self.request_id = request_id
        self._all_token_ids = list(prompt)
        self.all_token_ids = self._all_token_ids
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_output_placeholders = 0
        self.num_preemptions = 0
        self.shared_prefix_boundary = 0
        self.max_tokens = max_tokens
        self.status = RequestStatus.WAITING
        self.skip_reading_prefix_cache = False  # vLLM <= 0.33
        self.prefix_cache_hit_limit = None  # vLLM >= 0.34
        self.mm_features: list = []
        self.lora_request = None
        self.cache_salt = None
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes = None
        self.session_id = None
        self.block_hashes: list = []
        self._hasher = hasher
        self.block_hashes.extend(hasher(self))

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    def get_max_cache_hit_length(self, bound: int | None = None) -> int:
        return min(x for x in (self.num_tokens - 1, bound) if x is not None)

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    def append(self, token: int) -> None:
        self._all_token_ids.append(token)
        self.block_hashes.extend(self._hasher(self))


def _hash(obj) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def scheduler_stub(block: int, budget: int) -> types.SimpleNamespace:
    """``self`` of ``Scheduler._mamba_block_aligned_split``: align mode, no EAGLE, hash block =
    block (no ``prefix_match_unit``), no internal prefill checkpoints (Triton GDN prefill)."""
    return types.SimpleNamespace(
        cache_config=types.SimpleNamespace(block_size=block),
        scheduler_config=types.SimpleNamespace(long_prefill_token_threshold=0),
        max_num_scheduled_tokens=budget,
        use_eagle=False,
        use_eagle_block_drop=False,
        num_hash_lookahead_tokens=0,
        hash_block_size=block,
        block_size=block,
        mamba_partial_cache_hit=False,
        mamba_shared_prefix_checkpoint=False,
        mamba_has_prefill_checkpoint_blocks=False,
        mamba_prefill_checkpoint_alignment=None,
        need_mamba_block_aligned_split=True,
    )


class Engine:
    """vLLM's ``KVCacheManager`` for a Qwen3.5-9B-shaped hybrid model, driven one request at a time."""

    def __init__(self, v, block: int, num_blocks: int, retention: int | None, budget: int, max_len: int):
        import torch  # noqa: PLC0415 (the specs' dtypes)

        itf = v.interface
        spec = get_model(MODEL)
        page = block * spec.kv_bytes_per_token() // spec.n_attn  # one layer's attention page
        per_layer = spec.kv_bytes_per_token() // spec.n_attn  # K and V of one token, one layer
        attn = itf.FullAttentionSpec(
            block_size=block, num_kv_heads=per_layer // (2 * 256 * 2), head_size=256, dtype=torch.bfloat16
        )
        # the GDN state of one layer (its shapes do not matter here; its page is padded to the attention page)
        mamba = itf.MambaSpec(
            block_size=block,
            shapes=((1,),),
            dtypes=(torch.float32,),
            page_size_padded=page,
            mamba_type=itf.MambaAttentionBackendEnum.GDN_ATTN,
            mamba_cache_mode="align",
        )
        n_linear = spec.n_gdn + spec.n_mamba
        groups = [itf.KVCacheGroupSpec([f"attn.{i}" for i in range(LAYERS_PER_GROUP)], attn)]
        for g in range(n_linear // LAYERS_PER_GROUP):
            groups.append(itf.KVCacheGroupSpec([f"gdn{g}.{i}" for i in range(LAYERS_PER_GROUP)], mamba))
        config = itf.KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=groups,
            prefix_cache_retention_interval=retention,
            hash_block_size=block,
            cache_hit_alignment_tokens=block,
        )
        v.utils.init_none_hash(_hash)
        self.hasher = v.utils.get_request_block_hasher(block, _hash)
        self.manager = v.manager.KVCacheManager(
            kv_cache_config=config,
            max_model_len=max_len,
            scheduler_block_size=block,
            hash_block_size=block,
            enable_caching=True,
        )
        self.split = v.split
        self.sched = scheduler_stub(block, budget)
        self.budget = budget
        self.n = 0

    def serve(self, prompt: list[int], output: list[int]) -> tuple[int, list[int]]:
        """One request alone: hit tokens and its prefill step ends. Computes input + output - 1 tokens."""
        m = self.manager
        self.n += 1
        req = EngineRequest(f"r{self.n}", prompt, self.hasher, max(len(output), 1))
        m.new_step_starts()
        blocks, hit, req.shared_prefix_boundary = m.get_computed_blocks(req)
        first, ends = True, []
        while req.num_computed_tokens + (hit if first else 0) < req.num_prompt_tokens:
            start = req.num_computed_tokens + (hit if first else 0)
            k = self.split(self.sched, req, min(self.budget, req.num_tokens - start), hit if first else 0)
            if k <= 0:
                raise RuntimeError(f"{req.request_id}: the split scheduled 0 tokens at {start}")
            if not first:
                m.new_step_starts()
            new = m.allocate_slots(
                req, k, num_new_computed_tokens=hit if first else 0, new_computed_blocks=blocks if first else None
            )
            if new is None:
                raise RuntimeError(f"{req.request_id}: out of blocks in prefill (raise --headroom)")
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = start + k
            ends.append(req.num_computed_tokens)
            first = False
        if output:
            req.append(int(output[0]))  # sampled by the last prefill step
        for tok in output[1:]:  # decode: each step computes the newest token and samples the next
            m.new_step_starts()
            if m.allocate_slots(req, 1) is None:
                raise RuntimeError(f"{req.request_id}: out of blocks in decode (raise --headroom)")
            req.num_computed_tokens += 1
            req.append(int(tok))
        m.free(req)
        return hit, ends

    def run_steps(self, steps, tokens) -> tuple[dict[int, int], Counter]:
        """The simulator's continuous-batching steps (``Step`` events) through the engine: each
        step ``new_step_starts``, the running requests in vLLM's running order (prefill chunks and
        one decode token each, interleaved as ``Scheduler.schedule`` walks ``self.running``: each
        ``allocate_slots`` frees that request's skipped blocks before the next one allocates), then
        the newly scheduled ones (``get_computed_blocks``, their first chunk), each chunk cut by the
        engine's split from the chunk the simulator scheduled; a request is freed at the end of the
        step that sampled its last output token. Returns the engine's hit per request id and a
        count of disagreements of the schedule (``split``: the engine cuts a chunk elsewhere).

        With a bounded pool (``--capacity``) the running requests allocate from the cached blocks'
        pool, as in vLLM, and the simulator's preemptions (``Step.preempted``) are replayed: the
        scheduler's order (``Scheduler.schedule``: a running request whose ``allocate_slots`` fails
        preempts the newest running request, ``_preempt_request`` frees its blocks, and retries) is
        followed by freeing the step's preempted requests, newest first, when a running request's
        allocation fails, and any left at the end of the running requests (``sim_only_preempt``:
        the simulator preempted where the engine had room). A running request whose allocation
        fails with none left to free (``engine_preempt``) is preempted in the engine as vLLM
        would (the newest running request); a request the engine does not hold when the simulator
        runs it (preempted by the engine, or ``deferred``: a new request the engine has no room to
        admit) is looked up again then with its prompt and the tokens it generated, and
        recomputes them at once (its hit stays the simulator-side lookup's). A request the
        simulator preempted is looked up again when it is rescheduled: its hit is that lookup's,
        as the simulator records it."""
        m = self.manager
        self.admissions: list[tuple[int, float, int, int]] = []  # (request, step start, its hit there, engine's)
        live: dict[int, tuple[EngineRequest, list[int]]] = {}  # in vLLM's running order
        generated: dict[int, int] = {}  # output tokens sampled before a preemption
        missing: set[int] = set()  # requests the simulator runs and the engine does not hold
        hits: dict[int, int] = {}
        odd: Counter = Counter()

        def preempt(rid: int) -> None:
            req, _out = live.pop(rid)
            generated[rid] = req.num_tokens - req.num_prompt_tokens
            m.free(req)

        def admit(rid: int, budget: int | None, a: int | None):
            """A new ``EngineRequest`` for ``rid`` (its prompt and the tokens it generated), looked
            up; ``budget``: its first chunk's tokens, or None for all of them at once."""
            prompt, out = tokens[rid]
            self.n += 1
            req = EngineRequest(f"r{rid}.{self.n}", prompt, self.hasher, max(len(out), 1))
            for tok in out[: generated.get(rid, 0)]:
                req.append(int(tok))
            blocks, hit, req.shared_prefix_boundary = m.get_computed_blocks(req)
            k = req.num_tokens - hit if budget is None else self.split(self.sched, req, budget, hit)
            if budget is not None:
                odd["split"] += k != budget or hit != a
            if k <= 0:  # the split schedules nothing from this hit in this budget: it waits
                return None, hit
            if m.allocate_slots(req, k, num_new_computed_tokens=hit, new_computed_blocks=blocks) is None:
                return None, hit
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = hit + k
            live[rid] = (req, list(out))
            return req, hit

        def allocate(rid: int, k: int, pending: list[int]) -> bool:
            req = live[rid][0]
            while m.allocate_slots(req, k) is None:
                if pending:
                    victim = pending.pop(0)
                elif len(live) > 1:
                    victim = next(reversed(live))
                    odd["engine_preempt"] += 1
                    missing.add(victim)
                else:
                    raise RuntimeError(f"request {rid}: out of blocks alone")
                if victim in live:
                    preempt(victim)
                if victim == rid:
                    return False
            return True

        def readmit(rid: int, done: list) -> None:
            """A request the simulator runs that the engine does not hold: looked up again and
            its tokens recomputed at once (vLLM's rescheduling of a preempted request, in one step)."""
            req, _hit = admit(rid, None, None)
            if req is None:
                odd["readmit_failed"] += 1
                return
            missing.discard(rid)
            odd["readmitted"] += 1
            self._sampled(req, live[rid][1], done, rid)

        for ev in steps:
            for step in range(ev.steps):
                m.new_step_starts()
                done = []
                # the simulator pops the newest running request first
                pending = [] if step else [r for r in ev.preempted if r in live]
                pending.sort(key=lambda r: -list(live).index(r))
                for rid in ev.preempted if not step else ():
                    if rid not in live:
                        missing.discard(rid)
                # the running requests in vLLM's running order (``Scheduler.schedule`` walks
                # ``self.running``: each one's ``allocate_slots`` frees its skipped blocks before
                # the next one allocates), a prefill chunk or one decode token each
                chunks = {c[0]: c for c in ev.prefills if c[0] in live}
                decoding = {rid for rid, _ctx in ev.decodes if rid not in missing}
                handled = set()
                for rid in [r for r in live if r in chunks or r in decoding]:
                    if rid not in live:  # preempted by the engine in this step
                        continue
                    handled.add(rid)
                    req, out = live[rid]
                    if rid in chunks:
                        _, a, b = chunks[rid]
                        k = self.split(self.sched, req, min(b - a, req.num_tokens - req.num_computed_tokens))
                        odd["split"] += k != b - a
                    else:
                        k = 1
                    if k <= 0 or not allocate(rid, k, pending):
                        continue
                    req.num_computed_tokens += k
                    self._sampled(req, out, done, rid)
                for rid, _ctx in ev.decodes:
                    if rid not in handled and (rid in missing or rid not in live):
                        readmit(rid, done)
                for rid in pending:
                    odd["sim_only_preempt"] += 1
                    if rid in live:
                        preempt(rid)
                for rid, a, b in [c for c in ev.prefills if c[0] not in live]:
                    if rid in missing:
                        readmit(rid, done)
                        continue
                    req, hit = admit(rid, b - a, a)
                    hits[rid] = hit
                    self.admissions.append((rid, ev.t_start, a, hit))
                    if req is None:
                        odd["deferred"] += 1
                        missing.add(rid)
                        continue
                    self._sampled(req, live[rid][1], done, rid)
                for rid in done:
                    if rid in live:
                        m.free(live.pop(rid)[0])
        odd["unfinished"] = len(live)
        return hits, odd

    @staticmethod
    def _sampled(req, out: list[int], done: list, rid: int) -> None:
        """After a step: a request past its prompt samples its next output token, or is done."""
        if req.num_computed_tokens < req.num_tokens:  # a (re)prefill still under way
            return
        k = req.num_tokens - req.num_prompt_tokens  # tokens sampled so far
        if k < len(out):
            req.append(int(out[k]))
        if req.num_tokens - req.num_prompt_tokens >= len(out):
            done.append(rid)


# ---------------------------------------------------------------------------------- the simulator
def sim_hits(trace, policy: str, block: int, capacity: int, retention: int, chunk: int):
    """Hit tokens per request of ``policy`` in sequential mode, in the order it serves them."""
    knobs = {"block_size": block, "prefill_chunk_tokens": chunk}
    if policy == "vllm":
        knobs["prefix_cache_retention_interval"] = retention
    config = SimConfig(policy=policy, model=MODEL, capacity_bytes=capacity or UNLIMITED, mode="sequential", **knobs)
    hits, order, sim = served_hits(trace, config)
    return hits, order, sim.grid


def sim_steps(trace, block: int, retention: int, chunk: int, capacity: int = 0):
    """``vllm`` under ``--scheduler continuous``: its hit per request id, its steps and grid.
    ``capacity`` 0: ample memory."""
    config = SimConfig(
        policy="vllm",
        model=MODEL,
        capacity_bytes=capacity or UNLIMITED,
        mode="des",
        scheduler="continuous",
        block_size=block,
        prefill_chunk_tokens=chunk,
        max_num_batched_tokens=chunk,
        prefix_cache_retention_interval=retention,
    )
    log = EventLog()
    sim = build(trace, config, observers=(log,))
    res = run(sim)
    hits = dict(zip(res.requests["request_id"].astype(int), res.requests["hit_tokens"].astype(int), strict=True))
    return hits, [e for e in log.events if isinstance(e, Step)], sim.grid


def tokens_of(trace, r) -> tuple[list[int], list[int]]:
    """A request's prompt and output as token ids: the tokens themselves, or, on a hash-block trace,
    each symbol spelled out as its block of distinct ids (the last prompt symbol partial)."""
    G = getattr(trace, "block_tokens", 1) or 1
    if G == 1:
        return [int(t) for t in r.input_tokens], [int(t) for t in r.output_tokens]

    def spell(symbols, n):
        out = [(int(s) + (1 << 40)) * G + j for s in symbols for j in range(G)]
        return out[:n]

    return spell(r.input_tokens, int(r.input_len)), spell(r.output_tokens, int(r.output_len))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", type=Path, required=True, help="folder holding vLLM's vllm/ package (an unpacked wheel)")
    ap.add_argument("--trace", default="sharegpt", help="sharegpt or mooncake:sample (any trace spec)")
    ap.add_argument("--sessions", type=int, default=100)
    add_hash_block_tokens(ap)
    ap.add_argument("--block-size", type=int, default=0, help="0: the preset's block (528 for Qwen3.5-9B)")
    ap.add_argument("--retention", type=int, default=0, help="--prefix-cache-retention-interval (-1: dense)")
    ap.add_argument("--prefill-chunk", type=int, default=8192)
    ap.add_argument("--capacity", default="0", help="simulator capacity (e.g. 4GB); 0: ample, nothing evicted")
    ap.add_argument("--headroom", type=int, default=0, help="engine blocks added to the capacity's (default 0)")
    ap.add_argument("--policies", default="vllm,vllm-0.11-align")
    ap.add_argument(
        "--scheduler",
        choices=("sequential", "continuous"),
        default="sequential",
        help="continuous: vllm under --scheduler continuous, its steps replayed through the engine",
    )
    ap.add_argument("--out", type=Path, help="CSV of per-request hits")
    args = ap.parse_args(argv)
    if args.out is not None and args.out.exists():
        _usage(f"{args.out} exists (--out never replaces a file)")
    v = load_vllm(args.vllm)
    trace = load_trace(args.trace, TraceOptions(sessions=args.sessions, hash_block_tokens=args.hash_block_tokens))
    if args.scheduler == "continuous":
        return continuous(v, trace, args)
    capacity = parse_size(args.capacity) if args.capacity != "0" else 0
    results, order, block = {}, None, None
    for policy in args.policies.split(","):
        results[policy], order, block = sim_hits(
            trace, policy, args.block_size, capacity, args.retention, args.prefill_chunk
        )
    spec = get_model(MODEL)
    reqs = [tokens_of(trace, trace.requests[i]) for i in order]
    longest = max(len(p) + len(o) for p, o in reqs)
    states_per = (spec.n_gdn + spec.n_mamba) // LAYERS_PER_GROUP
    headroom = args.headroom
    if capacity:
        num_blocks = capacity // (block * spec.kv_bytes_per_token()) + headroom
    else:
        num_blocks = sum(-(-(len(p) + len(o)) // block) * (1 + states_per) for p, o in reqs) + 64
    retention = None if args.retention == -1 else args.retention
    engine = Engine(v, block, num_blocks + 1, retention, args.prefill_chunk, longest + 8)
    print(
        f"trace {args.trace}: {len(reqs)} requests; block {block}; engine blocks {num_blocks} "
        f"(headroom {headroom}); retention {args.retention}; capacity {args.capacity}"
    )
    engine_hits = []
    for prompt, output in reqs:
        engine_hits.append(engine.serve(prompt, output)[0])
    for policy, hits in results.items():
        agreement = Agreement.of(hits, engine_hits)
        print(agreement.line(policy, 18))
        for k in agreement.differing[:5]:
            p, o = reqs[k]
            print(
                f"  #{k} request {order[k]} (input {len(p)}, output {len(o)}): "
                f"simulator {hits[k]}, engine {engine_hits[k]}"
            )
    if args.out:
        with args.out.open("x", newline="") as f:
            w = csv.writer(f)
            w.writerow(["serve_order", "request", "input", "output", "engine", *results])
            for k, i in enumerate(order):
                p, o = reqs[k]
                w.writerow([k, int(i), len(p), len(o), engine_hits[k], *(results[x][k] for x in results)])
    return 0


def continuous(v, trace, args) -> int:
    """The continuous-batching comparison: every request's hit, the schedule's odd cases."""
    capacity = parse_size(args.capacity) if args.capacity != "0" else 0
    hits, steps, block = sim_steps(trace, args.block_size, args.retention, args.prefill_chunk, capacity)
    tokens = {int(r.request_id): tokens_of(trace, r) for r in trace.requests}
    spec = get_model(MODEL)
    longest = max(len(p) + len(o) for p, o in tokens.values())
    per = 1 + (spec.n_gdn + spec.n_mamba) // LAYERS_PER_GROUP
    if capacity:  # as sequentially: the capacity's block ids (the null block on top)
        num_blocks = capacity // (block * spec.kv_bytes_per_token()) + args.headroom + 1
    else:
        num_blocks = sum(-(-(len(p) + len(o)) // block) * per + 2 * per for p, o in tokens.values()) + 64
    retention = None if args.retention == -1 else args.retention
    engine = Engine(v, block, num_blocks, retention, args.prefill_chunk, longest + 8)
    got, odd = engine.run_steps(steps, tokens)
    ids = sorted(hits)
    same = sum(hits[i] == got.get(i, -1) for i in ids)
    print(
        f"trace {args.trace}: {len(ids)} requests; block {block}; retention {args.retention}; "
        f"capacity {args.capacity} ({num_blocks - 1} engine blocks); continuous scheduler, "
        f"{sum(e.steps for e in steps)} steps, {sum(len(e.preempted) for e in steps)} preemptions"
    )
    print(
        f"vllm (continuous)  agrees on {same}/{len(ids)} requests; hit tokens {sum(hits.values()):,} vs engine "
        f"{sum(got.values()):,}; chunks cut elsewhere {odd['split']}, unfinished {odd['unfinished']}"
    )
    if capacity:
        print(
            "schedule: engine-only preemptions {engine_preempt}, simulator-only {sim_only_preempt}, "
            "new requests the engine could not admit {deferred}, re-admitted {readmitted} "
            "(failed {readmit_failed})".format_map(odd)
        )
    differ = [i for i in ids if hits[i] != got.get(i, -1)]
    adm = engine.admissions
    same_adm = [k for k, (_, _, a, h) in enumerate(adm) if a == h]
    first = next((k for k, (_, _, a, h) in enumerate(adm) if a != h), None)
    print(
        f"admissions (a lookup the simulator scheduled): {len(same_adm)}/{len(adm)} with the engine's hit equal"
        + (
            ""
            if first is None
            else f"; the first that differs is the {first + 1}th: request {adm[first][0]} at "
            f"{adm[first][1]:.2f} s, simulator {adm[first][2]}, engine {adm[first][3]}"
        )
    )
    for i in differ[:5]:
        p, o = tokens[i]
        print(f"  request {i} (input {len(p)}, output {len(o)}): simulator {hits[i]}, engine {got.get(i)}")
    if args.out:
        with args.out.open("x", newline="") as f:
            w = csv.writer(f)
            w.writerow(["request", "input", "output", "engine", "vllm"])
            for i in ids:
                w.writerow([i, len(tokens[i][0]), len(tokens[i][1]), got.get(i, -1), hits[i]])
    return 0


if __name__ == "__main__":
    sys.exit(main())

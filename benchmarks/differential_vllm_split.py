"""Differential check of vLLM's prefill chunk split against the ``vllm`` preset's (issue 43, item 1,
the rule item 2 changed).

vLLM's ``Scheduler._mamba_block_aligned_split`` (``vllm/v1/core/sched/scheduler.py``) decides where
an align-mode prefill step ends: whole blocks, the prompt's last full block, a chunk starting
mid-block re-aligned at the next boundary, and the block-floored shared-prefix junction. This
script loads that one method from a vLLM file the user points to (a checkout's scheduler.py, or any
file defining the method; its code stays theirs: it is read, never copied here), calls it with a
stub ``self`` the way vLLM's own tests do (``Scheduler._mamba_block_aligned_split(stub, request,
n)``), and drives one request's prefill to its end with each of:

- the engine's method (``request.shared_prefix_boundary`` = the KV match, at most prompt - 1, as
  ``get_computed_blocks`` sets it);
- the preset's ``VllmAdmission.schedule_chunk`` (the continuous scheduler's cut) and
  ``VllmAdmission.step_ends`` (the cut of fcfs / sequential mode, one request at a time), and, for
  reference, vLLM 0.11's ``align_step_ends`` (the ``vllm-0.11-align`` preset, no junction);

over a grid of blocks, prompt lengths, hits, junctions and step budgets, and counts the cases whose
chunk ends agree. No EAGLE, no fine-grained prefix match unit (the preset models neither).

    python benchmarks/differential_vllm_split.py --vllm PATH/vllm/v1/core/sched/scheduler.py
"""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
from pathlib import Path
from types import SimpleNamespace

from policies.base import AdmissionContext
from policies.vllm import align_step_ends
from policies.vllm_current import VllmAdmission, VllmParams


def _functions(path: Path, names: tuple[str, ...]) -> dict:
    """The top-level functions ``names`` defined in ``path`` (those that exist), compiled alone."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    namespace: dict = {"cdiv": lambda a, b: -(-a // b)}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace


def load_split(path: Path):
    """The ``_mamba_block_aligned_split`` function defined in ``path`` (inside any class), with the
    checkpoint-position helpers newer vLLM calls from it (``vllm/v1/kv_cache_interface.py`` next to
    the scheduler's package, when there)."""
    helpers: dict = {}
    interface = path.parents[2] / "kv_cache_interface.py"
    if interface.is_file():
        helpers = _functions(interface, ("get_mamba_prefill_checkpoint_position", "is_mamba_prefill_checkpoint_valid"))
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_mamba_block_aligned_split":
            node.decorator_list = []
            module = ast.Module(body=[node], type_ignores=[])
            namespace: dict = {"Request": object, **helpers}
            exec(compile(module, str(path), "exec"), namespace)  # noqa: S102 - the user's own vLLM file
            return namespace["_mamba_block_aligned_split"]
    raise SystemExit(f"{path}: no _mamba_block_aligned_split in it")


def stub(block: int, budget: int) -> SimpleNamespace:
    """``self`` as vLLM's scheduler has it for align mode, no EAGLE, match unit = block."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=block),
        block_size=block,
        num_hash_lookahead_tokens=0,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        max_num_scheduled_tokens=budget,
        use_eagle=False,
        use_eagle_block_drop=False,
        hash_block_size=block,
        mamba_partial_cache_hit=False,
        mamba_shared_prefix_checkpoint=False,
        mamba_fine_grained_prefix_cache=False,
        mamba_has_prefill_checkpoint_blocks=False,
        mamba_prefill_checkpoint_alignment=None,
        mamba_role_checkpoint=False,
        need_mamba_block_aligned_split=True,
    )


def engine_ends(split, block: int, n: int, hit: int, match: int, budget: int) -> list[int] | None:
    """Chunk ends of one prefill by the engine's method (None: it stalls, scheduling 0 tokens)."""
    self = stub(block, budget)
    req = SimpleNamespace(
        num_computed_tokens=hit,
        num_prompt_tokens=n,
        num_tokens=n,
        num_output_tokens=0,
        shared_prefix_boundary=min(match, n - 1) if match > hit else 0,
        request_id="r",
    )
    ends = []
    while req.num_computed_tokens < n:
        k = split(self, req, min(budget, n - req.num_computed_tokens))
        if k <= 0:
            return None
        req.num_computed_tokens += k
        ends.append(req.num_computed_tokens)
    return ends


def preset_ends(block: int, n: int, hit: int, match: int, budget: int) -> tuple[list[int], list[int], list[int]]:
    """Chunk ends of the preset: the continuous scheduler's (schedule_chunk), one request's
    (step_ends) and vLLM 0.11's (align_step_ends)."""
    adm = VllmAdmission(VllmParams(block_size=block, prefill_chunk_tokens=budget))
    ctx = AdmissionContext(n // block, n // block, block, input_tokens=n, match_tokens=match)
    pos, cont = hit, []
    while pos < n:
        k = adm.schedule_chunk(pos, n, min(budget, n - pos), budget, ctx)
        pos += k
        cont.append(pos)
    return cont, adm.step_ends(hit, n, ctx), align_step_ends(hit, n, block, budget)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", type=Path, required=True, help="vLLM's scheduler.py (or a file defining the method)")
    ap.add_argument("--blocks", default="16,64,528", help="block sizes (tokens)")
    ap.add_argument("--budgets", default="96,528,2048,8192", help="step budgets (max_num_batched_tokens)")
    ap.add_argument("--lengths", default="1,17,64,100,527,528,529,1000,1056,2500,4100", help="prompt lengths")
    args = ap.parse_args(argv)
    split = load_split(args.vllm)
    blocks = [int(x) for x in args.blocks.split(",")]
    budgets = [int(x) for x in args.budgets.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    total = same_cont = same_one = same_old = stalled = 0
    first_diff = []
    for block, budget, n in itertools.product(blocks, budgets, lengths):
        for hit in sorted({0, block, (n - 1) // block * block} & set(range(0, n, block))):
            for match in sorted({0, hit + 1, (hit + n) // 2, n - 1, n}):
                eng = engine_ends(split, block, n, hit, match, budget)
                if eng is None:
                    stalled += 1
                    continue
                cont, one, old = preset_ends(block, n, hit, match, budget)
                total += 1
                same_cont += cont == eng
                same_one += one == eng
                same_old += old == eng
                if (cont != eng or one != eng) and len(first_diff) < 8:
                    first_diff.append((block, budget, n, hit, match, eng, cont, one))
    print(f"cases: {total} (engine stalled, not compared: {stalled})")
    print(f"continuous scheduler (schedule_chunk) agrees: {same_cont} / {total}")
    print(f"one request at a time (step_ends)        agrees: {same_one} / {total}")
    print(f"vLLM 0.11's split (align_step_ends)      agrees: {same_old} / {total} (no junction, no re-alignment)")
    for block, budget, n, hit, match, eng, cont, one in first_diff:
        print(
            f"  B={block} budget={budget} n={n} hit={hit} match={match}: engine {eng} | continuous {cont} | one {one}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rule 20's test case (``tests/policies/test_sglang_engine_rules.py``
``test_a_retracted_request_is_matched_with_its_prompt_and_generated_tokens``) through SGLang 0.5.23's
own cache: A and B (10-token prompts, 4,200 output tokens) prefill in one step and decode together
in a pool of 8,300 KV tokens and 6 mamba slots, driven with ``benchmarks/differential_sglang.py``'s
driver; when the next decode step no longer fits (the engine's own ``check_decode_mem``) the batch
retracts with SGLang's own ``ScheduleBatch.retract_decode`` on a stub batch (its retraction order,
``release_req``, ``release_kv_cache(checkpoint=False)``); A decodes to its end and B is matched
again with SGLang's own ``init_next_round_input``. Prints when B was retracted, how many tokens it
had generated and its hit, beside a request with B's prompt alone matched at that moment. Then
rule 21's case (``test_sglang_retracts_the_fewest_outputs_then_the_longest_prompt``): A's prompt
20 tokens, a pool of 8,310: the engine's own order retracts A.

    python benchmarks/results/2026-12-05-sglang-retract/verify_retract.py ENGINES/sglang-0.5.23 ENGINES/deps
"""

from __future__ import annotations

import sys
import types
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests" / "policies"), sys.argv[1], sys.argv[2]]

import differential_sglang as ds  # noqa: E402
from engine_cases import toks  # noqa: E402

sys.meta_path.insert(0, ds._StubFinder())

KV_TOKENS, MAMBA, N_OUT = 8300, 6, 4200


def main(a_len: int = 10, kv_tokens: int = KV_TOKENS) -> None:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: PLC0415
    from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: PLC0415

    setup = ds.EngineSetup("no_buffer", kv_tokens, MAMBA, prefill_chunk=8192, max_running=4)
    driver = ds.SGLangDriver(setup, 2 * N_OUT)
    a_prompt, b_prompt = toks(100, a_len), toks(200, 10)
    print(f"A: {a_len}-token prompt, B: 10, {N_OUT} output tokens each, {kv_tokens} KV tokens, {MAMBA} mamba slots")
    reqs = []
    for prompt, k in ((a_prompt, 0), (b_prompt, 1)):
        req, hit = driver.begin(prompt, toks(9000 + 1000 * k, N_OUT), first_end=len(prompt))
        assert hit == 0
        driver.extend(req, len(prompt))
        assert not driver.extended(req)  # the prompt's checkpoint: its KV and the state at 10
        reqs.append(req)
    # a stub decode batch: the engine's own check and retraction over the running requests
    batch = types.SimpleNamespace(
        reqs=list(reqs),
        req_to_token_pool=driver.pool,
        token_to_kv_pool_allocator=driver.allocator,
        tree_cache=driver.tree,
        hisparse_coordinator=None,
        spec_algorithm=types.SimpleNamespace(is_none=lambda: True),
        model_config=driver.model_config,
    )
    batch.filter_batch = lambda keep_indices: setattr(batch, "reqs", [batch.reqs[i] for i in keep_indices])
    for name in ("check_decode_mem", "new_tokens_required_next_decode", "release_req", "retract_decode"):
        setattr(batch, name, types.MethodType(getattr(ScheduleBatch, name), batch))
    batch._get_decode_retraction_order = ScheduleBatch._get_decode_retraction_order
    retracted, step = None, 0
    while batch.reqs:
        step += 1
        if retracted is None and not batch.check_decode_mem():
            out, _ratio, aborted = batch.retract_decode()
            assert not aborted and len(out) == 1
            retracted = (out[0], step, len(out[0].output_ids))
        for req in list(batch.reqs):
            driver.decode_slot(req)
            if driver.decoded(req):
                batch.reqs.remove(req)
    b, at, generated = retracted
    name = "AB"[reqs.index(b)]
    print(f"retracted: request {name} before decode step {at}, {generated} tokens generated")
    b.init_next_round_input(driver.tree)
    print(f"{name} matched with its prompt + {len(b.output_ids)} generated tokens: hit {int(b.prefix_len)}")
    if b is not reqs[1]:
        return
    alone = Req(
        rid="alone",
        origin_input_text="",
        origin_input_ids=array("q", b_prompt.tolist()),
        sampling_params=SamplingParams(temperature=0, max_new_tokens=N_OUT),
    )
    alone.output_ids = array("q")
    alone.init_next_round_input(driver.tree)
    print(f"B's prompt alone (capped at 9 tokens): hit {int(alone.prefix_len)}")


if __name__ == "__main__":
    main()
    print()
    main(20, 8310)

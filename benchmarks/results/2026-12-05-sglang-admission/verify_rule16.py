"""Rule 16's budget through SGLang 0.5.23's own ``PrefillAdder.add_one_req``: D (10 prompt tokens,
80 out, ``ignore_eos``) runs with 20 tokens sampled (29 KV tokens allocated: its prompt and 19
decoded); W (20 prompt tokens, 1 out) asks to be admitted. SGLang asks W's 20 tokens, its 1 output
and a page (22) below the free and evictable size less D's remaining 60: it refuses W with 82
tokens free and admits it with 83. The simulator's ``ContinuousEngine._admission_need`` at that
pass asks 20 + 1 + 1 + 1 (the strict ``<``) + 59 (D's remaining less the token of this step,
charged already) = 82 tokens free after D's decode token of the step, i.e. 83 before: the same
threshold. Pools of a few bytes a slot, as ``benchmarks/differential_sglang.py`` builds them.

    python benchmarks/results/2026-12-05-sglang-admission/verify_rule16.py ENGINES/sglang-0.5.23 ENGINES/deps
"""

from __future__ import annotations

import sys
from array import array
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), sys.argv[1], sys.argv[2]]

import differential_sglang as ds  # noqa: E402

sys.meta_path.insert(0, ds._StubFinder())


def verdict(pool_tokens: int, sampled: int = 20):
    """SGLang's answer for W with D holding ``sampled`` output tokens, in a KV pool of
    ``pool_tokens``: (tokens free, D's outputs, the adder's result)."""
    from sglang.srt.managers.schedule_batch import Req  # noqa: PLC0415
    from sglang.srt.managers.schedule_policy import PrefillAdder  # noqa: PLC0415
    from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: PLC0415

    driver = ds.SGLangDriver(ds.EngineSetup("no_buffer", pool_tokens, 8, prefill_chunk=8192, max_running=4), 200)
    d, _ = driver.begin(np.arange(100, 110), np.arange(9000, 9080), first_end=10)
    d.sampling_params.ignore_eos = True
    driver.extend(d, 10)
    driver.extended(d)  # the prompt ran, the first token is sampled
    for _ in range(sampled - 1):
        driver.decode_slot(d)
        driver.decoded(d)
    running = SimpleNamespace(reqs=[d], batch_size=lambda: 1, is_empty=lambda: False)
    w = Req(
        rid="w",
        origin_input_text="",
        origin_input_ids=array("q", range(200, 220)),
        sampling_params=SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True),
    )
    w.output_ids = array("q")
    w.init_next_round_input(driver.tree)
    adder = PrefillAdder(1, driver.tree, driver.allocator, running, 0.7, 16384, 8192)
    res = adder.add_one_req(w, has_chunked_req=False, truncation_align_size=None)
    return driver.allocator.available_size(), len(d.output_ids), res.name


if __name__ == "__main__":
    for n in (110, 111, 112, 113):
        free, out, res = verdict(n)
        print(f"KV pool {n} tokens: {free} free, D has {out} output tokens: {res}")

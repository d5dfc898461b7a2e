"""How small an error each replay validation mode sees (issue 24): a planted error of one head of
one layer of a restored recurrent state, of one layer's conv window, of one KV page, and a
production-side error (a wrong state handed to the store, present in the main replay and its fp32
shadow alike), each at sizes from 0.1 % to 50 %, under ``--validate tolerance|exact|shadow``.

One request's prompt + response is replayed (states admitted at a 64-multiple inside the prompt,
at the prompt end and after the response), the error is planted, and a second request hits the
last state; "caught" means the replay reported a failure for that hit. A clean run of every mode
comes first (it must report none).

    python benchmarks/validation_sensitivity.py                          # replay-tiny, CPU, seconds
    python benchmarks/validation_sensitivity.py --model qwen3.5-9b --device cuda --prompt 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SITES = ("state", "conv", "kv", "produced")
MODES = ("tolerance", "exact", "shadow")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="replay-tiny")
    ap.add_argument("--layers", type=int, default=None, help="mixer layers replayed (default: all)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--prompt", type=int, default=100, help="prompt tokens of the first request")
    ap.add_argument("--scales", default="0.001,0.005,0.01,0.05,0.1,0.2,0.5")
    ap.add_argument("--kernel", default=None, help="gated-delta backend (default: by device)")
    args = ap.parse_args()

    import numpy as np
    import torch

    from sim.cost import get_model
    from sim.replay.model import DTYPES, HybridModel, ReplayShape
    from sim.replay.runner import Replayer
    from sim.replay.store import CheckpointStore

    spec = get_model(args.model)
    shape = ReplayShape.from_spec(spec, args.layers)
    dev = torch.device(args.device)
    kw = {} if args.kernel is None else {"kernel": args.kernel}
    model = HybridModel(shape, device=dev, dtype=DTYPES[args.dtype], seed=0, **kw)
    shadow_model = model.upcast(torch.float32)
    rng = np.random.default_rng(0)
    P = int(args.prompt)
    prompt, out, more = (rng.integers(0, 1 << 16, n) for n in (P, 30, 40))
    reqs = {0: (np.concatenate([prompt, out]), P), 1: (np.concatenate([prompt, out, more]), P + 70)}
    tail = P + 30 - 1  # the engines' last-token rule: the response's last token never ran
    inner = (P // 2) // 64 * 64 or 64

    def replayer(m, mode, produced_scale=None):
        store = CheckpointStore(shape, m.dtype, device=dev, page_tokens=64)
        rp = Replayer(m, store, lambda r: reqs[r], validate=mode)
        if produced_scale is not None:
            sink = rp._sink

            def faulty(f):
                s = sink(f)

                def on_state(p, layer, rec, conv):
                    if p == tail and layer == shape.layers - 1:
                        rec = rec.clone()
                        rec[0] *= produced_scale
                    s(p, layer, rec, conv)

                return on_state

            rp._sink = faulty
        return rp, store

    def run(mode, site=None, scale=1.0):
        pairs = [
            replayer(model, "tolerance" if mode == "tolerance" else "exact", scale if site == "produced" else None)
        ]
        if mode == "shadow":
            pairs.append(replayer(shadow_model, "tolerance", scale if site == "produced" else None))
        for rp, _ in pairs:
            rp.lookup(0, None, 0)
            rp.prefill(0, 0, P)
            rp.admit(1, 0, inner, "chunk")
            rp.admit(2, 0, P, "prompt end")
            rp.decode(0)
            rp.admit(3, 0, tail, "tail")
        rp, store = pairs[0]
        if site == "state":
            store.tensors(3)[0][shape.layers - 1, 0] *= scale
        elif site == "conv":
            store.tensors(3)[1][0] *= scale
        elif site == "kv" and store.has_kv:
            store.page(3, len(store.info(3).pages) // 2)[0, 1] *= scale
        for rp, _ in pairs:
            rp.lookup(1, 3, tail)
            rp.decode(1)
            rp.finish()
        kinds = [f.kind for f in pairs[0][0].failures] + [
            "shadow-" + f.kind for rp, _ in pairs[1:] for f in rp.failures
        ]
        return kinds, pairs[0][0].records[1]

    t0 = time.perf_counter()
    backend = getattr(model, "kernel", "triton")
    print(f"model {args.model} {shape.counts()} {args.dtype} on {dev}, backend {backend}, prompt {P} tokens")
    for mode in MODES:
        fails, r = run(mode)
        print(
            f"clean {mode:>9}: failures {len(fails)}; errors recurrent {r.max_rec_error:.2e}, conv "
            f"{r.max_conv_error:.2e}, outputs {r.max_out_error:.2e}, KV {r.max_kv_error:.2e}",
            flush=True,
        )
    scales = [float(x) for x in args.scales.split(",")]
    print("\ncaught (failure kind) by planted error size; rows: where x validation mode")
    head = f"{'site':>9} {'mode':>9} " + " ".join(f"{s:>14.1%}" for s in scales)
    print(head)
    for site in SITES:
        if site == "kv" and not shape.attn_layers:
            continue
        for mode in MODES:
            cells = []
            for s in scales:
                fails, _ = run(mode, site, 1.0 + s)
                cells.append(fails[0] if fails else "missed")
            print(f"{site:>9} {mode:>9} " + " ".join(f"{c:>14}" for c in cells), flush=True)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()

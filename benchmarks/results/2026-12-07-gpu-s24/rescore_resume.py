"""Re-score the time saved of kept replay rows (requests.parquet + summary.json) with and without the
committed timing's resumed-call term (``gdn_resume_ms_per_chunk``), and, for rows measured before the
conv fix, with the resumed calls' measured gated-delta extra taken out (what the fix would give if
it removes the extra): python rescore_resume.py ROWS_DIR [--gpu h100]"""

import argparse
import glob
import json
import os
import sys
from dataclasses import replace

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))

from sim.cost import default_timing, get_model  # noqa: E402
from sim.replay.calibration import Run, request_errors  # noqa: E402
from sim.replay.summary import cost_counts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--strip", action="store_true", help="take the measured resumed extra out (pre-fix rows)")
    a = ap.parse_args()
    print(
        f"{'row':<42} {'hits':>4} {'measured':>9} {'with term':>9} {'err':>7} {'no term':>9} {'err':>7}"
        + ("  stripped meas / err" if a.strip else "")
    )
    for f in sorted(glob.glob(os.path.join(a.rows, "*", "requests.parquet"))):
        name = os.path.basename(os.path.dirname(f))
        model = name.split("-mooncake")[0].split("-sharegpt")[0]
        s = json.load(open(os.path.join(os.path.dirname(f), "summary.json")))["summary"]
        counts = cost_counts(s["layers_replayed"])
        spec = get_model(model)
        df = pd.read_parquet(f)
        t = default_timing(model, gpu=a.gpu, tensor_parallel=1)
        t = replace(t, gpus=1, comm_ms_per_call=0.0, comm_ms_per_token=0.0)
        out = []
        for tt in (t, replace(t, gdn_resume_ms_per_chunk=0.0)):
            e = request_errors(Run(spec, counts, df, name), tt)
            out.append(e)
        h = out[0][np.isfinite(out[0].saved_ms)]
        meas = h.saved_ms.sum()
        w, n = h.modelled_saved_ms.sum(), out[1][np.isfinite(out[1].saved_ms)].modelled_saved_ms.sum()
        ew, en = (w - meas) / abs(meas), (n - meas) / abs(meas)
        line = f"{name:<42} {len(h):>4} {meas:>9.1f} {w:>9.1f} {ew:>+7.1%} {n:>9.1f} {en:>+7.1%}"
        if a.strip:
            v = df[df.validated & np.isfinite(df.full_ms)]
            sfx = v.input_tokens - v.hit_tokens
            extra = v.suffix_ms_gated_delta - v.full_ms_gated_delta * sfx / v.input_tokens
            sm = meas + extra.clip(lower=0).sum()
            line += f"  {sm:9.1f} {(n - sm) / abs(sm):+7.1%}"
        print(line)


if __name__ == "__main__":
    main()

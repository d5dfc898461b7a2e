"""Peak memory of loading a trace: a cold build (tokenizing, then caching) and a cached load, each in a
fresh process, with the bytes held by the token buffers.

    python benchmarks/trace_memory.py                  # ShareGPT, every conversation with >= 2 rounds
    python benchmarks/trace_memory.py --sessions 100 --min-rounds 10

Measured on the >= 2-round ShareGPT trace (56,820 requests): token buffers 182 MB (int64) -> 91 MB
(int32); peak RSS of a cached load 415 MB -> 155 MB (int32 buffers, and a cache hit no longer loads
the tokenizer's vocabulary); of a cold build 574 MB -> 380 MB (before: PYTHONPATH=<traces/ of 4f766ae>).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def measure(spec: str, sessions: int, min_rounds: int) -> dict:
    import resource

    from traces.registry import TraceOptions, load_trace

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    trace = load_trace(spec, TraceOptions(sessions=sessions, min_rounds=min_rounds))
    seconds = time.perf_counter() - t0
    buffers = {}
    for r in trace.requests:  # each distinct buffer once (requests are views into shared buffers)
        for a in (r.input_tokens, r.output_tokens):
            root = a if a.base is None else a.base
            buffers[id(root)] = root.nbytes
    return {
        "cache": trace.meta.get("cache"),
        "requests": len(trace.requests),
        "dtype": str(trace.requests[0].input_tokens.dtype),
        "buffers_mb": sum(buffers.values()) / 1e6,
        "seconds": seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": before / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="sharegpt")
    ap.add_argument("--sessions", type=int, default=0)
    ap.add_argument("--min-rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.trace, args.sessions, args.min_rounds)))
        return
    cache = tempfile.mkdtemp(prefix="marconi-trace-memory-")  # the trace cache of these two runs only
    env = dict(os.environ, MARCONI_CACHE_DIR=cache)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--trace",
        args.trace,
        "--sessions",
        str(args.sessions),
        "--min-rounds",
        str(args.min_rounds),
    ]
    try:
        for label in ("cold build", "cached load"):
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            m = json.loads(out.strip().splitlines()[-1])
            print(
                f"{label:<12} {m['requests']:,} requests, {m['dtype']} buffers {m['buffers_mb']:.1f} MB, "
                f"peak RSS {m['peak_rss_mb']:.0f} MB (interpreter {m['rss_before_mb']:.0f} MB), {m['seconds']:.1f} s"
            )
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()

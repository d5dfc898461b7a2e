"""Seeded random search of `marconi run` for capacity breaches: python search.py SEED N OUT.jsonl

Draws small synthetic traces (agent, chat, system-prompt) and mooncake:sample slices, every preset of
`marconi policies`, --scheduler fcfs / continuous / --mode sequential, --state-alignment exact / chunk
(for the policies that read it), state pools, retention intervals, servers and step budgets, on
replay-tiny; runs each in-process and writes one JSON line per run (exit code, exception). Besides
the tree's own capacity assertion it flags any tree call that leaves the cache further over its
capacity (or a pool over its own) than it found it ("silent"): continuous batching's forced charges
(``memory_overshoots``) may leave it over, never a call of the tree.
"""

import json
import random
import sys
import traceback

from click.testing import CliRunner

from sim.cache.engine_tree import EngineTree
from sim.cache.tree import HybridRadixTree
from sim.cli import main

POLICIES = [
    *("vllm+", "sglang+", "marconi", "sglang", "vllm", "trtllm", "lmdeploy", "sglang-0.5.9-no-buffer"),
    *("sglang-0.5.9-extra-buffer", "sglang-0.5.8-no-buffer-pathrefresh", "vllm-0.11-align", "vllm-0.11-all"),
    *("lmdeploy-0.16-pytorch", "trtllm-1.2-interval", "belady", "belady-size", "gdsf", "vanilla", "infinite"),
]
ENGINES = ["vllm", "vllm-0.11-align", "vllm-0.11-all", "sglang", "trtllm", "lmdeploy", "lmdeploy-0.16-pytorch"]
ENGINES += ["trtllm-1.2-interval", "sglang-0.5.9-extra-buffer"]
ALIGNING = ("sglang+", "marconi", "infinite", "belady", "belady-size", "gdsf")
POOLED = ("sglang", "lmdeploy", "sglang-0.5.9-no-buffer", "sglang-0.5.9-extra-buffer", "lmdeploy-0.16-pytorch")
SILENT: list[str] = []


def _pools(tree) -> tuple[int, int]:
    cap = getattr(tree, "state_capacity", None)
    return (0, 0) if cap is None else (tree.kv_bytes - tree.kv_capacity_bytes, tree.n_states - cap)


def _watch(cls, name: str) -> None:
    f = getattr(cls, name)

    def g(self, *a, **k):
        over, pools = self.used_bytes - self.capacity_bytes, _pools(self)
        r = f(self, *a, **k)
        after = _pools(self)
        if self.used_bytes - self.capacity_bytes > max(over, 0):
            SILENT.append(f"{cls.__name__}.{name}: {self.used_bytes} > {self.capacity_bytes}")
        if after[0] > max(pools[0], 0) or after[1] > max(pools[1], 0):
            SILENT.append(f"{cls.__name__}.{name}: pools {pools} -> {after}")
        return r

    setattr(cls, name, g)


for _n in ("cache_again", "refresh_hit", "release_path", "keep_partial_tail"):
    _watch(EngineTree, _n)
for _n in ("insert", "reserve", "unlock", "lock", "lookup"):
    _watch(HybridRadixTree, _n)


def draw(rng: random.Random) -> list[str]:
    r = rng.randint
    kind = rng.choice(["agent", "chat", "system-prompt"])
    if kind == "agent":
        tr = (
            f"synthetic:agent:sessions={r(1, 6)},turns={r(2, 12)},prompt_tokens={r(50, 600)},"
            f"task_tokens={r(10, 200)},output_tokens={r(1, 60)},obs_tokens={r(10, 120)},prompts={r(1, 2)}"
        )
    elif kind == "chat":
        tr = (
            f"synthetic:chat:sessions={r(1, 6)},turns={r(2, 8)},prompt_tokens={r(50, 600)},"
            f"user_tokens={r(10, 150)},output_tokens={r(1, 60)},prompts={r(1, 2)}"
        )
    else:
        tr = (
            f"synthetic:system-prompt:sessions={r(2, 8)},prompt_tokens={r(50, 800)},"
            f"user_tokens={r(10, 150)},output_tokens={r(1, 60)},prompts={r(1, 3)}"
        )
    pol = rng.choice(POLICIES) if rng.random() < 0.3 else rng.choice(ENGINES)
    cap = rng.choice([r(20, 120), r(120, 400)])
    mooncake = rng.random() < 0.25
    if mooncake:
        tr, cap = "mooncake:sample", r(64, 4000)
    args = ["run", "--model", "replay-tiny", "--trace", tr, "--policy", pol, "--capacity", f"{cap}KB", "--no-progress"]
    if not mooncake:
        args += ["--trace-seed", str(r(0, 9))]
    sched = rng.choice(["fcfs", "continuous", "seq"])
    args += ["--mode", "sequential"] if sched == "seq" else ["--scheduler", sched]
    if pol in ALIGNING and rng.random() < 0.5:
        args += ["--state-alignment", "chunk", "--chunk-size", str(rng.choice([16, 32, 64]))]
    if pol in POOLED and rng.random() < 0.5:
        args += ["--state-pool", str(r(5, 12) if pol.startswith("sglang") else r(1, 6))]
    if pol == "vllm" and rng.random() < 0.5:
        args += ["--prefix-cache-retention-interval", str(rng.choice([-1, 48, 96]))]
    if sched == "fcfs" and rng.random() < 0.4:
        args += ["--servers", str(r(2, 3))]
    if sched == "continuous" and rng.random() < 0.5:
        args += ["--max-num-batched-tokens", str(rng.choice([64, 128, 256, 512])), "--max-num-seqs", str(r(1, 4))]
    if rng.random() < 0.4:
        args += ["--sessions-per-second", str(rng.choice([5, 20, 100]))]
    if mooncake:
        a0 = r(0, 200)
        args += ["--session-range", f"{a0}:{a0 + r(10, 60)}"]
        if rng.random() < 0.3:
            args += ["--hash-block-tokens"]
    return args


def main_(seed: int, n: int, out_path: str) -> None:
    rng = random.Random(seed)
    runner = CliRunner()
    with open(out_path, "w") as out:
        for i in range(n):
            args = draw(rng)
            res = runner.invoke(main, args)
            rec = {"i": i, "args": args, "rc": res.exit_code}
            if SILENT:
                rec["silent"] = SILENT[:3]
                SILENT.clear()
            if res.exit_code != 0:
                e = res.exception
                rec["exc"] = f"{type(e).__name__}: {e}"[:300]
                if isinstance(e, SystemExit):
                    rec["out"] = res.output[-300:]
                else:
                    rec["tb"] = "".join(traceback.format_exception(e))[-1500:]
            out.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main_(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

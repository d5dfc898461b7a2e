"""A new user's own traces (session 22): what said less than the user needs, or said it wrongly,
through the real CLI in process."""

from __future__ import annotations

import json

from sim.cli import main

#: three Mooncake rows: 1,024 / 1,536 / 1,100 input tokens; rows 2 and 3 share row 1's two blocks
ROWS = [
    {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
    {"timestamp": 1000, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 3]},
    {"timestamp": 2000, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 4]},
]


def _mooncake(tmp_path, rows=ROWS):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"mooncake:{p}"


def test_an_untuned_alpha_whose_cache_rejected_but_never_evicted_says_so(runner, tmp_path):
    """A 30MB cache (one marconi-7b state) takes none of the three requests' KV: every insert is
    rejected, nothing is evicted (the table says 0), and the line said 'too few requests after the
    first eviction'; the tuner starts when the cache first has to make room."""
    args = ["run", "--trace", _mooncake(tmp_path), "--capacity", "30MB", "--scheduler", "fcfs", "--no-progress"]
    res = runner.invoke(main, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["policy"]: r for r in json.loads(res.stdout)}
    assert rows["marconi"]["evictions"] == 0 and rows["marconi"]["rejected"] == 3
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1] == (
        "marconi: alpha auto stayed at 0 (not tuned: too few requests after the cache first filled)"
    )

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


def _conv(cid, rounds):
    msgs = []
    for k in range(rounds):
        msgs += [{"from": "human", "value": f"question {k} of {cid}"}, {"from": "gpt", "value": f"answer {k}"}]
    return {"id": cid, "conversations": msgs}


def test_a_sharegpt_file_cut_short_is_said(runner, tmp_path):
    """A user's ShareGPT JSON array that stops inside a record (a download cut short) ran its
    complete records and said nothing; the package's own copy is cut by design. Now a note on
    stderr says the file is cut and how many records were read; a whole file has none."""
    text = json.dumps([_conv("a", 2), _conv("b", 2), _conv("c", 2)])
    whole, cut = tmp_path / "whole.json", tmp_path / "cut.json"
    whole.write_text(text)
    cut.write_text(text[: text.index('"c"') + 10])
    args = ["run", "--min-rounds", "1", "--policy", "sglang+", "--no-progress"]
    res = runner.invoke(main, [*args, "--trace", f"sharegpt:{cut}"])
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [
        f"note: sharegpt:{cut} ends inside a record (the file is cut short): its 2 complete records before it are read"
    ]
    assert res.stdout.startswith(f"trace sharegpt:{cut}: 4 requests, 2 sessions")
    res = runner.invoke(main, [*args, "--trace", f"sharegpt:{whole}"])
    assert res.exit_code == 0 and res.stderr == "", res.output


def test_lmsys_conversations_left_out_as_non_ascii_are_said(runner, tmp_path):
    """lmsys:FILE drops conversations of more than 50% non-ASCII text (the paper's selection): a
    user's Chinese conversations vanished from the run without a word. Now a note counts them."""
    import pandas as pd

    def conv(cid, user, reply):
        return {
            "conversation_id": cid,
            "turn": 1,
            "conversation": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}],
        }

    p = tmp_path / "lm.parquet"
    rows = [conv("en", "hello there", "hi"), conv("zh", "你好" * 10, "世界" * 10), conv("en2", "héllo", "ok")]
    pd.DataFrame(rows).to_parquet(p)
    res = runner.invoke(
        main, ["run", "--trace", f"lmsys:{p}", "--min-rounds", "1", "--policy", "sglang+", "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [
        f"note: 1 conversation of lmsys:{p} left out: more than 50% non-ASCII text (the Marconi paper's LMSys selection)"
    ]
    assert res.stdout.startswith(f"trace lmsys:{p}: 2 requests, 2 sessions")


def test_a_selected_conversation_that_makes_no_request_is_said(runner, tmp_path):
    """--sessions 3 of a ShareGPT file whose second conversation opens with a 40,000-word message
    (over --max-tokens 32,768) ran 2 sessions without a word; now a note says one was left out."""
    recs = [_conv("a", 2), _conv("b", 2), _conv("c", 2)]
    recs[1]["conversations"][0]["value"] = "word " * 40_000
    p = tmp_path / "long.json"
    p.write_text(json.dumps(recs))
    args = ["run", "--trace", f"sharegpt:{p}", "--min-rounds", "2", "--sessions", "3", "--policy", "sglang+"]
    res = runner.invoke(main, [*args, "--no-progress"])
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [
        f"note: 1 conversation of sharegpt:{p} left out: it makes no request (its first is over --max-tokens "
        "32,768, or it has none)"
    ]
    assert res.stdout.startswith(f"trace sharegpt:{p}: 4 requests, 2 sessions")


def test_the_default_list_checks_the_blocks_of_the_policies_it_runs(runner, tmp_path):
    """On a Mooncake trace the default list leaves vllm+ out (32-token checkpoints in 512-token
    blocks), yet a 27MB capacity was refused for vllm+'s block, with 'use a smaller --block-size',
    a knob vllm+ refuses. The default list now runs what it keeps; a named vllm+ is still refused,
    naming only what it can change; a policy whose block is a knob still names --block-size."""
    spec = _mooncake(tmp_path)
    res = runner.invoke(main, ["run", "--trace", spec, "--capacity", "27MB", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "vllm+ left out: checkpoints finer than the trace's 512-token blocks" in res.stdout.splitlines()[0]
    res = runner.invoke(main, ["run", "--trace", "synthetic:chat", "--capacity", "27MB", "--policy", "vllm+"])
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        "Error: capacity 27MB cannot hold one 32-token block of marconi-7b with its state (28.9MB) for vllm+: "
        "every insert would be rejected; use a larger --capacity"
    ]
    args = ["run", "--trace", "synthetic:chat", "--capacity", "200MB", "--policy", "lmdeploy", "--block-size", "4096"]
    res = runner.invoke(main, args)
    assert res.exit_code == 2 and res.output.strip().endswith("use a smaller --block-size or a larger --capacity")


def test_an_fcfs_batch_size_is_null_where_the_table_shows_a_dash(runner, tmp_path):
    """fcfs steps no batches: the table shows '-', but run --format json and report's CSV / JSON
    gave a mean batch size of 0.0, a number a spreadsheet averages in. Now null / empty there;
    continuous batching's stays a number (here 1.0: the three requests run one at a time)."""
    spec = _mooncake(tmp_path)
    base = ["--trace", spec, "--policy", "sglang+", "--no-progress"]
    for scheduler, want in (("fcfs", None), ("continuous", 1.0)):
        out = tmp_path / scheduler
        res = runner.invoke(main, ["run", *base, "--scheduler", scheduler, "--format", "json", "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)[0]["batch_size_mean"] == want
        rep = runner.invoke(main, ["report", str(out), "--format", "json"])
        assert rep.exit_code == 0, rep.output
        assert json.loads(rep.stdout)[0]["batch_size_mean"] == want
        csv = runner.invoke(main, ["report", str(out), "--format", "csv"]).stdout.splitlines()
        assert csv[1].split(",")[csv[0].split(",").index("batch_size_mean")] == ("" if want is None else "1.0")

"""A new user's own trace file given to --trace without its kind (session 24's new-user hunt):
the error names the kind the file looks like, and a sweep refuses it before any configuration runs."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim.cli import main
from traces.registry import guess_kind

MOONCAKE = {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]}
BAILIAN = {**MOONCAKE, "chat_id": 1, "parent_chat_id": -1, "turn": 1, "type": "text", "hash_ids": [1] * 64}
MARCONI = {"session_id": 0, "turn_id": 0, "ts": 0, "num_input_tokens": 1, "num_output_tokens": 1}
MARCONI.update(input_tokens=[5], output_tokens=[6])
SHAREGPT = {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
OPENAI = {"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
LMSYS = {"conversation_id": "c", "conversation": [{"role": "user", "content": "hi"}], "turn": 1}
TRAJ = {"history": [{"role": "system", "content": "You are an agent."}], "info": {}}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("name", "rows", "kind"),
    [
        ("m.jsonl", [MOONCAKE, MOONCAKE], "mooncake"),
        ("b.jsonl", [BAILIAN], "bailian"),
        ("a.jsonl", [MARCONI], "marconi-jsonl"),
        ("s.jsonl", [SHAREGPT], "sharegpt"),
        ("o.jsonl", [OPENAI], "sharegpt"),
        ("l.jsonl", [LMSYS], "lmsys"),
        ("t.jsonl", [TRAJ], "swebench"),
        ("x.jsonl", [{"a": 1}], None),
    ],
)
def test_guess_kind_by_the_first_record(tmp_path, name, rows, kind):
    assert guess_kind(_jsonl(tmp_path / name, rows)) == kind


def test_guess_kind_of_arrays_gzip_folders_and_parquet(tmp_path):
    arr = tmp_path / "sg.json"
    arr.write_text(json.dumps([SHAREGPT] * 3, indent=2))  # pretty-printed: no whole line is a record
    assert guess_kind(arr) == "sharegpt"
    gz = tmp_path / "m.jsonl.gz"
    gz.write_bytes(gzip.compress((json.dumps(MOONCAKE) + "\n").encode()))
    assert guess_kind(gz) == "mooncake"
    folder = tmp_path / "trajs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "one.traj").write_text(json.dumps(TRAJ))
    assert guess_kind(folder) == "swebench"
    assert guess_kind(folder / "sub" / "one.traj") == "swebench"
    pq.write_table(pa.Table.from_pylist([LMSYS]), tmp_path / "rows.parquet")
    assert guess_kind(tmp_path / "rows.parquet") is None  # LMSys rows and trajectories alike
    (tmp_path / "notes.txt").write_text("plain words\n")
    assert guess_kind(tmp_path / "notes.txt") is None


def test_run_with_a_bare_path_names_the_kind(runner, tmp_path):
    """`marconi run --trace trace.jsonl` listed every spec form; the file's own kind is what the
    user needs: the spec to write."""
    p = _jsonl(tmp_path / "m.jsonl", [MOONCAKE])
    res = runner.invoke(main, ["run", "--trace", str(p), "--no-progress"])
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"Error: unknown trace '{p}': a trace file is given with its format before it; it looks like a trace "
        f"of kind mooncake: --trace mooncake:{p}"
    )
    q = tmp_path / "notes.txt"
    q.write_text("words\n")
    res = runner.invoke(main, ["traces", "stats", str(q)])
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"Error: unknown trace '{q}': a trace file is given with its format before it; --trace KIND:{q}, KIND "
        "one of sharegpt, lmsys, swebench, mooncake, bailian, marconi-jsonl"
    )


def test_unknown_spec_that_is_no_path_lists_the_specs(runner):
    res = runner.invoke(main, ["traces", "stats", "foo:bar"])
    assert res.exit_code == 2 and res.output.startswith("Error: unknown trace 'foo:bar'; valid: sharegpt, ")


@pytest.mark.parametrize("second", ["foo:bar", "PATH"])
def test_sweep_refuses_an_unknown_trace_before_any_run(runner, tmp_path, second):
    """`sweep --trace synthetic:chat,trace.jsonl` printed its grid and ran the first trace's
    configurations, then failed at the second's; now one line before anything runs or is written."""
    p = _jsonl(tmp_path / "m.jsonl", [MOONCAKE])
    spec = str(p) if second == "PATH" else second
    out = tmp_path / "out"
    res = runner.invoke(
        main, ["sweep", "--out", str(out), "--trace", f"synthetic:chat,{spec}", "--policy", "vllm+", "--no-progress"]
    )
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"Error: unknown trace '{spec}'") and len(res.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("kind", ["sharegpt", "lmsys"])
def test_kind_and_colon_without_a_path(runner, tmp_path, monkeypatch, kind):
    """`--trace lmsys:` read every parquet file under the working folder (from the venv's pyarrow
    test data: "missing column 'conversation' (columns: carat, clarity, ...)") and `sharegpt:` said
    "path is a directory, not a file: ."; now one line says the path is missing."""
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.Table.from_pylist([LMSYS]), tmp_path / "stray.parquet")  # what `lmsys:` picked up
    res = runner.invoke(main, ["traces", "stats", f"{kind}:", "--no-progress"])
    assert res.exit_code == 2, res.output
    want = f"Error: --trace {kind}: names no file after the ':': --trace {kind}:PATH (--trace {kind} alone: "
    assert res.output.startswith(want)
    out = tmp_path / "out"
    res = runner.invoke(main, ["sweep", "--out", str(out), "--trace", f"synthetic:chat,{kind}:", "--no-progress"])
    assert res.exit_code == 2 and "names no file after the ':'" in res.output and not out.exists()


def test_spaces_around_the_path_are_dropped(runner, tmp_path):
    """`--trace "mooncake: trace.jsonl"` (a space after the colon, or a newline pasted after the
    path) was 'mooncake file not found:  trace.jsonl'."""
    from traces.registry import split_spec

    assert split_spec(" Mooncake : x.jsonl \n") == ("mooncake", "x.jsonl")
    assert split_spec("sharegpt") == ("sharegpt", None)
    p = _jsonl(tmp_path / "m.jsonl", [MOONCAKE])
    for spec in (f"mooncake: {p}", f"mooncake:{p} ", "mooncake: sample"):
        res = runner.invoke(main, ["traces", "stats", spec, "--format", "json", "--no-progress"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["requests"] == (300 if spec.endswith("sample") else 1)


def test_swebench_with_fewer_trajectories_than_sessions_asked(runner, tmp_path):
    """`--sessions 10` of a folder of 2 trajectories ran 2 without a word (chat traces say it)."""
    from pathlib import Path

    fixtures = Path(__file__).resolve().parents[2] / "traces" / "swebench_fixtures"
    folder = tmp_path / "trajs"
    folder.mkdir()
    for p in sorted(fixtures.glob("*.traj")):
        (folder / p.name).write_text(p.read_text())
    env = {"MARCONI_CACHE_DIR": str(tmp_path / "cache")}
    res = runner.invoke(main, ["traces", "stats", f"swebench:{folder}", "--sessions", "10", "--no-progress"], env=env)
    assert res.exit_code == 0, res.output
    assert f"note: --sessions 10: swebench:{folder} has only 2 trajectories\n" in res.output
    res = runner.invoke(main, ["traces", "stats", f"swebench:{folder}", "--sessions", "2", "--no-progress"], env=env)
    assert res.exit_code == 0 and "note:" not in res.output

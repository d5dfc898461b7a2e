"""A sweep value that names a file or folder holding a comma is one value (sweep --model
"my,model/" read /tmp/.../my as a config: "no such file")."""

from __future__ import annotations

from sim.experiments.grid import parse_values


def test_a_path_with_a_comma_is_one_value(tmp_path, monkeypatch):
    folder = tmp_path / "my,model"
    folder.mkdir()
    assert parse_values(str(folder), "str", "--model") == [str(folder)]
    # a list is still a list, and a comma path that is no file or folder is split as before
    assert parse_values(f"{folder},nemotron-h-8b", "str") == [str(tmp_path / "my"), "model", "nemotron-h-8b"]
    assert parse_values(str(tmp_path / "no,such"), "str") == [str(tmp_path / "no"), "such"]
    # a repeated flag lists it beside others
    assert parse_values([str(folder), "nemotron-h-8b"], "str") == [str(folder), "nemotron-h-8b"]
    # relative to the working folder too
    monkeypatch.chdir(tmp_path)
    assert parse_values("my,model", "str") == ["my,model"]


def test_a_trace_spec_whose_path_holds_a_comma_is_one_value(tmp_path):
    """sweep --trace mooncake:a,b.jsonl ran 'mooncake:a' and 'b.jsonl' (mooncake file not found: a)."""
    f = tmp_path / "a,b.jsonl"
    f.write_text("")
    d = tmp_path / "tr,ajs"
    d.mkdir()
    assert parse_values(f"mooncake:{f}", "trace", "--trace") == [f"mooncake:{f}"]
    assert parse_values(f"swebench:marconi:{d}", "trace") == [f"swebench:marconi:{d}"]
    assert parse_values([f"mooncake:{f}", "synthetic:chat"], "trace") == [f"mooncake:{f}", "synthetic:chat"]
    # a list of specs, a synthetic spec's k=v pairs and a comma path that is no file stay as before
    assert parse_values("mooncake:sample,synthetic:chat", "trace") == ["mooncake:sample", "synthetic:chat"]
    assert parse_values("synthetic:chat:sessions=2,turns=3", "trace") == ["synthetic:chat:sessions=2,turns=3"]
    assert parse_values(f"mooncake:{tmp_path / 'no,such'}", "trace") == [f"mooncake:{tmp_path / 'no'}", "such"]

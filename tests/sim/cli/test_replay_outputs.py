"""What `marconi replay` (and `marconi run`, its folder kind) leaves on disk and reads back: a timing
file held to its model whatever the spelling of the model's path, an output folder that holds one
run's files after ``--force``, and no empty folders after Ctrl-C. Each test is a tester's report
(session 21), reproduced on the CPU before its fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.cost import TimingModel, read_timing_file, timing_to_dict
from sim.errors import UsageError

TOY = Path(__file__).resolve().parents[2] / "data" / "configs" / "toy-mamba2-hybrid.json"
CHAT = "synthetic:chat:sessions=2,turns=2,prompt_tokens=40,user_tokens=24,output_tokens=16,prompts=1"
RUN = ["run", "--trace", CHAT, "--model", "replay-tiny", "--capacity", "10MB", "--policy", "marconi"]
RUN += ["--no-progress"]
REPLAY = ["replay", "--trace", CHAT, "--model", "replay-tiny", "--capacity", "10MB", "--device", "cpu"]
REPLAY += ["--requests", "2", "--no-progress"]


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---- 1. a timing file of a model read from a config.json, whichever way its path is spelled ----


def test_a_timing_file_of_a_config_model_is_accepted_in_every_spelling_of_its_path(cwd):
    """Written by `marconi replay --model m/config.json --calibrate t.json` (the file records the
    model's name, its path as given), it was refused for `--model m`, `./m/` and the absolute path
    of the same file ("calibrated for m/config.json, not m"). The same config read is the same
    model; another config (another width), a preset, or a recorded path that no longer reads is
    still refused."""
    (cwd / "m").mkdir()
    shutil.copy(TOY, cwd / "m" / "config.json")
    d = dict(timing_to_dict(TimingModel(123.0, 4.5, 6.7, source="hand")), model="m/config.json")
    (cwd / "t.json").write_text(json.dumps(d))
    (cwd / "sub").mkdir()
    for spelling in ("m/config.json", "m", "./m/", str(cwd / "m"), str(cwd / "m" / "config.json"), "sub/../m"):
        assert read_timing_file("t.json", model=spelling).effective_tflops == 123.0, spelling
    # a copy of the same config elsewhere reads as the same model
    (cwd / "copy").mkdir()
    shutil.copy(TOY, cwd / "copy" / "config.json")
    assert read_timing_file("t.json", model="copy").effective_tflops == 123.0
    # another model: refused, in its own spelling
    wide = json.loads(TOY.read_text())
    wide["hidden_size"] = 128
    (cwd / "wide").mkdir()
    (cwd / "wide" / "config.json").write_text(json.dumps(wide))
    for other in ("wide", "replay-tiny", "nemotron-h-8b"):
        with pytest.raises(UsageError, match=rf"calibrated for m/config.json, not {other}$"):
            read_timing_file("t.json", model=other)
    # the recorded path gone: only the same spelling is that model
    (cwd / "t2.json").write_text(json.dumps(dict(d, model="gone/config.json")))
    with pytest.raises(UsageError, match="calibrated for gone/config.json, not m$"):
        read_timing_file("t2.json", model="m")
    # `marconi run --timing` reads it through the same check
    res = CliRunner().invoke(main, ["run", "--trace", CHAT, "--model", "m", "--capacity", "10MB", "--timing", "t.json"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(
        main, ["run", "--trace", CHAT, "--model", "wide", "--capacity", "10MB", "--timing", "t.json"]
    )
    assert res.exit_code == 2 and "calibrated for m/config.json, not wide" in res.output, res.output


# ---- 2. --force over the other command's folder: none of its files left as this one's ----------


def test_force_over_the_other_commands_folder_leaves_none_of_its_files(cwd):
    """`marconi replay --out o --force` over a folder `marconi run --out o` wrote kept the run's
    occupancy.parquet beside the replay's summary (to be read as the replay's), and `marconi run
    --out o --force` over a replay's folder kept its steps.parquet. Files the user put there stay;
    without --force a leftover of the other command is refused, never silently removed."""
    pytest.importorskip("torch")
    r = CliRunner()
    res = r.invoke(main, [*RUN, "--out", "o"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (cwd / "o").iterdir()) == ["occupancy.parquet", "requests.parquet", "summary.json"]
    (cwd / "o" / "notes.txt").write_text("mine")
    res = r.invoke(main, [*REPLAY, "--out", "o", "--force"])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in (cwd / "o").iterdir())
    assert names == ["notes.txt", "requests.parquet", "steps.parquet", "summary.json"], names
    assert "wall_s" in json.loads((cwd / "o" / "summary.json").read_text())["summary"]  # the replay's
    res = r.invoke(main, [*RUN, "--out", "o", "--force"])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in (cwd / "o").iterdir())
    assert names == ["notes.txt", "occupancy.parquet", "requests.parquet", "summary.json"], names
    assert (cwd / "o" / "notes.txt").read_text() == "mine"
    # a leftover of the other command alone (no summary.json) is not removed without --force
    (cwd / "p").mkdir()
    (cwd / "p" / "occupancy.parquet").write_text("run's")
    res = r.invoke(main, [*REPLAY, "--out", "p"])
    assert res.exit_code == 2 and "p/occupancy.parquet already exists; pass --force" in res.output, res.output
    (cwd / "q").mkdir()
    (cwd / "q" / "steps.parquet").write_text("replay's")
    res = r.invoke(main, [*RUN, "--out", "q"])
    assert res.exit_code == 2 and "q/steps.parquet already exists; pass --force" in res.output, res.output
    assert (cwd / "p" / "occupancy.parquet").read_text() == "run's" and (cwd / "q" / "steps.parquet").is_file()


# ---- 3. Ctrl-C: the folders the command made, still empty, removed -----------------------------


@pytest.mark.parametrize("stop", [KeyboardInterrupt, UsageError])
def test_an_interrupted_replay_removes_the_empty_folders_it_made(cwd, monkeypatch, stop):
    """Ctrl-C during `marconi replay --out new/a/b --calibrate new/c/t.json` (exit 130) left new/,
    new/a/b and new/c behind, empty: the folders were made by one check and locked by a click
    resource, which is closed without the exception. A folder that existed before, or holds a
    file, stays. An error after the folders were made (here a stand-in for the replay's) is the
    same path."""
    pytest.importorskip("torch")
    import sim.replay.session as session

    def run_replay(*a, **k):
        raise stop("stopped") if stop is UsageError else stop()

    monkeypatch.setattr(session, "run_replay", run_replay)
    (cwd / "old").mkdir()
    (cwd / "kept").mkdir()
    (cwd / "kept" / "mine.txt").write_text("mine")
    args = [*REPLAY, "--out", "new/a/b", "--calibrate", "new/c/t.json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == (130 if stop is KeyboardInterrupt else 2), res.output
    assert not (cwd / "new").exists()
    res = CliRunner().invoke(main, [*REPLAY, "--out", "old/x", "--calibrate", "kept/sub/t.json"])
    assert res.exit_code != 0
    assert sorted(p.name for p in cwd.iterdir()) == ["kept", "old"]
    assert list((cwd / "old").iterdir()) == [] and [p.name for p in (cwd / "kept").iterdir()] == ["mine.txt"]
    # the folders are still made (or refused) before the replay: an unwritable place is one line
    res = CliRunner().invoke(main, [*REPLAY, "--out", "/proc/marconi-out"])
    assert res.exit_code == 2 and "--out /proc/marconi-out: cannot create or write the folder" in res.output

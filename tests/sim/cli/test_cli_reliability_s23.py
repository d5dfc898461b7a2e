"""Session 23: what users see of `run`, `sweep`, `report`, `plot`, `traces`, `models`, `policies`
and `kernels` when they are interrupted, rerun, or given input they cannot use."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli import main

SMALL = ["--trace", "synthetic:chat:sessions=3,turns=2", "--no-progress", "--policy", "sglang+"]


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _interrupt_the_occupancy_write(monkeypatch):
    """Ctrl-C arriving while `run --out` writes occupancy.parquet (summary.json and
    requests.parquet already written before it, in the order run writes them)."""
    real = pd.DataFrame.to_parquet

    def to_parquet(self, path, *args, **kwargs):
        if "occupancy" in Path(path).name:
            raise KeyboardInterrupt
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", to_parquet)


def test_run_interrupted_while_writing_leaves_no_partial_output_set(runner, tmp_path, monkeypatch):
    """An interrupted `run --out D --events E` left D/summary.json and D/requests.parquet without
    occupancy.parquet or the events file: a folder `report` reads as a finished run, which the rerun
    of the same command then refused as existing outputs. Now the set is renamed into place at once,
    with the stop signals held back: nothing of it is left, and the rerun runs."""
    out, events = tmp_path / "r", tmp_path / "events.jsonl"
    args = ["run", *SMALL, "--out", str(out), "--events", str(events)]
    with monkeypatch.context() as m:
        _interrupt_the_occupancy_write(m)
        res = runner.invoke(main, args)
    assert res.exit_code == 130, res.output
    assert not events.exists()
    assert not out.exists() or _snapshot(out) == {}, sorted(_snapshot(out))
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert sorted(_snapshot(out)) == ["occupancy.parquet", "requests.parquet", "summary.json"]
    assert events.is_file()


def test_run_force_interrupted_while_writing_keeps_the_earlier_set_whole(runner, tmp_path, monkeypatch):
    """`run --force` over an earlier run's folder, interrupted while it wrote: the new summary.json
    sat beside the earlier run's requests.parquet (another policy's rows). Now the earlier files are
    all kept, byte for byte."""
    out = tmp_path / "r"
    assert runner.invoke(main, ["run", *SMALL, "--out", str(out)]).exit_code == 0
    before = _snapshot(out)
    with monkeypatch.context() as m:
        _interrupt_the_occupancy_write(m)
        res = runner.invoke(main, ["run", *SMALL[:-1], "marconi", "--alpha", "1", "--out", str(out), "--force"])
    assert res.exit_code == 130, res.output
    assert _snapshot(out) == before


@pytest.mark.parametrize("rate", ["1e-320", "1e300", "0", "nan"])
def test_traces_stats_takes_the_session_rates_run_takes(runner, rate):
    """`traces stats --sessions-per-second 1e-320` ordered the sessions on a clock of infinities
    (numpy's overflow warning on stderr, exit 0) though `run` refuses any rate outside 1e-6..1e6."""
    res = runner.invoke(main, ["traces", "stats", "synthetic:chat:sessions=3", "--sessions-per-second", rate])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == (
        f"Error: --sessions-per-second must be in 1e-06..1e+06 (sessions started per second), not {float(rate)!r}"
    )
    for edge in ("1e-6", "1e6"):
        res = runner.invoke(main, ["traces", "stats", "synthetic:chat:sessions=3", "--sessions-per-second", edge])
        assert res.exit_code == 0, res.output


def test_models_prints_flops_per_token_with_three_digits_in_every_row(runner):
    """`marconi models`' last column was `.3g`: qwen3.5-9b's 1.4e+10 beside marconi-7b's 1.32e+10
    (and falcon-h1-7b's 1.4e+10), two digits where the others had three."""
    res = runner.invoke(main, ["models", "marconi-7b", "qwen3.5-9b", "replay-tiny"])
    assert res.exit_code == 0, res.output
    last = [line.split()[-1] for line in res.output.splitlines()[2:5]]
    assert last == ["1.32e+10", "1.40e+10", "2.16e+05"], res.output


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "s"
    res = CliRunner().invoke(
        main, ["sweep", *SMALL[:-1], "sglang+,marconi", "--alpha", "0,1", "--save-requests", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    return out


def test_plot_interrupted_leaves_no_figure_and_its_rerun_draws_them_all(runner, small_sweep, tmp_path, monkeypatch):
    """`plot --kind all` interrupted at its third figure left the first two (and a hidden
    `.tmp-alpha.svg` when it came inside a save): the rerun of the same command refused them as
    existing files. Now the figures are renamed into place together when the last is drawn."""
    import sim.cli.plot as plot_cli

    figs = tmp_path / "figs"
    real, calls = plot_cli.make_figure, []

    def third_interrupted(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(plot_cli, "make_figure", third_interrupted)
        res = runner.invoke(main, ["plot", str(small_sweep), "--kind", "all", "--out", str(figs)])
    assert res.exit_code == 130, res.output
    assert not figs.exists() or list(figs.iterdir()) == [], sorted(p.name for p in figs.iterdir())
    res = runner.invoke(main, ["plot", str(small_sweep), "--kind", "all", "--out", str(figs)])
    assert res.exit_code == 0, res.output
    kinds = ("hit-rate", "alpha", "ttft", "occupancy", "ttft-load", "misses")
    expected = sorted(f"{k}.{fmt}" for k in kinds for fmt in ("png", "svg"))
    assert sorted(p.name for p in figs.iterdir()) == expected
    assert sorted(Path(line).name for line in res.output.split()) == expected  # each path printed once it exists


def test_plot_draws_the_same_bytes_twice(runner, small_sweep, tmp_path):
    """Two `plot` runs of one results folder wrote different SVGs: the save time in the metadata and
    clip-path / image ids salted with a random UUID. The PNGs were equal already."""
    for name in ("a", "b"):
        res = runner.invoke(main, ["plot", str(small_sweep), "--kind", "hit-rate", "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
    for fmt in ("png", "svg"):
        a, b = (tmp_path / name / f"hit-rate.{fmt}" for name in ("a", "b"))
        assert a.read_bytes() == b.read_bytes(), fmt
    assert b"<dc:date>" not in a.read_bytes()


def test_sweep_limit_zero_on_a_new_folder_runs_nothing_and_says_so(runner, tmp_path):
    """`sweep --limit 0 --out NEW` printed `ran 0 configurations`, then `Error: no results in NEW`
    with exit 2 (the closing table read an empty folder). Now it ends with the table's own line,
    exit 0, and leaves no empty folder behind (as --dry-run)."""
    out = tmp_path / "new"
    res = runner.invoke(main, ["sweep", *SMALL, "--out", str(out), "--limit", "0"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-2:] == [
        f"ran 0 configurations in 0.0 s (0 skipped as done, 0 failed) -> {out}",
        "no finished configuration to show",
    ]
    assert not out.exists()


def test_output_names_that_are_not_utf8_are_refused_before_any_work(runner, tmp_path):
    r"""`run --out $'\xff'` simulated the whole trace, then stopped with pyarrow's
    UnicodeEncodeError traceback (`surrogates not allowed`) writing requests.parquet; a sweep
    the same at its first row. Now the name is refused in one line, exit 2, nothing created."""
    import os

    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/r\xff")
    for args in (
        ["run", *SMALL, "--out", bad],
        ["sweep", *SMALL, "--out", bad],
        ["run", *SMALL, "--events", bad + ".jsonl"],
    ):
        res = runner.invoke(main, args)
        assert res.exit_code == 2, res.output
        assert (
            len(res.output.strip().splitlines()) == 1 and "r\\xff" in res.output and "is not a UTF-8 name" in res.output
        )
    assert list(tmp_path.iterdir()) == []


def test_an_output_encoding_without_alpha_prints_escapes_not_a_traceback(small_sweep):
    """`PYTHONIOENCODING=latin-1 marconi report DIR` printed the table up to the first `marconi α=0`
    row, then a UnicodeEncodeError traceback (exit 1)."""
    import os
    import subprocess
    import sys

    marconi = str(Path(sys.executable).parent / "marconi")
    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}
    res = subprocess.run([marconi, "report", str(small_sweep)], capture_output=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr.decode("latin-1")
    assert b"marconi \\u03b1=1" in res.stdout and b"Traceback" not in res.stderr


def test_run_help_names_every_file_and_event_kind_it_writes(runner, tmp_path):
    """`run --help` said --out writes summary.json and requests.parquet (it writes occupancy.parquet
    too) and listed the event kinds without arrive and step, which the default scheduler writes."""
    from sim.cli.run import RUN_OUTPUTS
    from sim.engine.events import EVENT_NAMES

    out, events = tmp_path / "r", tmp_path / "e.jsonl"
    res = runner.invoke(main, ["run", *SMALL, "--out", str(out), "--events", str(events)])
    assert res.exit_code == 0, res.output
    written = {line.split('"event": "')[1].split('"')[0] for line in events.read_text().splitlines()}
    assert {"arrive", "step"} <= written <= set(EVENT_NAMES.values())
    text = " ".join(runner.invoke(main, ["run", "--help"]).output.split())
    out_help = text.split("--out DIRECTORY", 1)[1].split("--events FILE", 1)[0]
    assert all(name in out_help for name in RUN_OUTPUTS) and sorted(p.name for p in out.iterdir()) == sorted(
        RUN_OUTPUTS
    )
    events_help = text.split("--events FILE", 1)[1].split("--force", 1)[0]
    assert set(EVENT_NAMES.values()) <= set(re.findall(r"[a-z_]+", events_help)), events_help


def test_served_rates_keep_three_significant_digits():
    """The `served req/s` column was `.3g`: 0.26 printed above 0.259, 1.2 beside 1.21."""
    from sim.analysis import table

    recs = [{"policy": p, "throughput_rps": v} for p, v in (("a", 0.26), ("b", 0.259), ("c", 1.2), ("d", 99.96))]
    lines = table.format_table(recs, ["throughput_rps"]).splitlines()[3:]
    assert [line.split()[-1] for line in lines] == ["0.260", "0.259", "1.20", "100"]


def test_the_saturation_warning_writes_plain_numbers():
    """`run --trace mooncake:sample --policy sglang+` warned of a queue growing `from 232 s to
    1.39e+03 s`; a time scale of 180 was suggested as `--time-scale 1.8e+02`."""
    from sim.analysis import table

    sat = table.Saturation(True, 232.1, 1390.4, 100.0, 0.0163)
    line = table.saturation_warning([("sglang+", sat)], 2.94, None, 1.0)
    assert "grows from 232 s to 1390 s" in line and "sustains about 0.0163 requests/s" in line, line
    assert line.endswith("about --time-scale 180 or more keeps up"), line
    assert "e+" not in line


def test_report_tells_capacities_apart_that_round_to_one_size(runner, tmp_path):
    """`sweep --capacity 5GiB,5.37GB,5.371GB` ended with three rows labelled 5.37GB (and
    `report --where` listed `5.37GB, 5.37GB, 5.37GB`): sizes are printed to as many digits as tell
    them apart; three digits where they suffice."""
    out = tmp_path / "s"
    res = runner.invoke(main, ["sweep", *SMALL, "--capacity", "5GiB,5.37GB,5.371GB", "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["report", str(out)])
    labels = [line.split()[1] for line in res.output.splitlines()[3:]]
    assert sorted(labels) == sorted(["5.369GB", "5.37GB", "5.371GB"]), res.output
    res = runner.invoke(main, ["report", str(out), "--where", "capacity=1GB"])
    assert res.output.strip().endswith("(capacity holds: 5.369GB, 5.37GB, 5.371GB)"), res.output
    from sim.analysis.report import size_labels

    assert size_labels([1e9, 2e9, 5 * 2**30]) == {10**9: "1GB", 2 * 10**9: "2GB", 5 * 2**30: "5.37GB"}


def test_sweep_refuses_a_missing_trace_file_before_any_configuration_runs(runner, tmp_path):
    """`sweep --trace synthetic:chat,mooncake:typo.jsonl` ran the synthetic configurations, then
    stopped at the Mooncake one with `mooncake file not found` (exit 2, a results folder left half
    done): the workers load each trace when its turn comes. Now it stops before anything runs."""
    out, typo = tmp_path / "s", tmp_path / "typo.jsonl"
    spec = f"synthetic:chat:sessions=3,turns=2,mooncake:{typo}"
    res = runner.invoke(
        main,
        ["sweep", "--trace", spec, "--policy", "sglang+", "--model", "qwen3.5-9b", "--no-progress", "--out", str(out)],
    )
    assert res.exit_code == 2, res.output
    assert res.output.strip() == f"Error: --trace mooncake:{typo}: no such file or folder: {typo}"
    assert not out.exists()
    res = runner.invoke(main, ["sweep", "--trace", "swebench:marconi:no-such-dir", "--out", str(out), "--dry-run"])
    assert res.output.strip() == "Error: --trace swebench:marconi:no-such-dir: no such file or folder: no-such-dir"
    tok = ["--trace", "sharegpt", "--sessions", "2", "--policy", "sglang+", "--tokenizer", f"qwen3.5,hf:{typo}"]
    res = runner.invoke(main, ["sweep", *tok, "--no-progress", "--out", str(out)])  # a tokenizer file the same
    assert res.output.strip() == f"Error: --tokenizer hf:{typo}: no such file: {typo}"
    assert not out.exists()


def test_plot_of_records_some_configurations_lack_says_so(runner, small_sweep, tmp_path):
    """A sweep run without --save-requests, then rerun with it and interrupted, holds records for
    some configurations only: `plot --kind ttft` drew the others and left a variant's curve out of
    its panel without a word. Now it names how many lack them and the way to add them."""
    import shutil

    folder = tmp_path / "s"
    shutil.copytree(small_sweep, folder)
    gone = sorted((folder / "_requests").iterdir())[0]
    gone.unlink()
    (folder / "_occupancy" / gone.name).unlink()
    res = runner.invoke(main, ["plot", str(folder), "--kind", "ttft", "--out", str(tmp_path / "f")])
    assert res.exit_code == 2, res.output
    assert "configurations have no requests records in" in res.output
    assert "rerun the same sweep with --save-requests to add them, or leave those rows out with --where" in res.output
    assert not (tmp_path / "f").exists()
    res = runner.invoke(main, ["plot", str(folder), "--kind", "all", "--out", str(tmp_path / "g")])
    assert res.exit_code == 0, res.output
    notes = [line for line in res.output.splitlines() if line.startswith("note: ")]
    assert [n.split(" not drawn: ")[0] for n in notes] == ["note: ttft", "note: occupancy"], notes
    assert not (tmp_path / "g" / "ttft.png").exists() and (tmp_path / "g" / "hit-rate.png").exists()


def test_sweep_takes_an_empty_session_range_as_run_does(runner, tmp_path):
    """`sweep --session-range ''` said `no values given` though its help (run's) says `empty =
    all`, and `--session-range 0:1 --session-range ''` ran one point, the empty one dropped. Both
    are points of the grid now; the table says `all` where the cell was blank."""
    out = tmp_path / "s"
    res = runner.invoke(main, ["sweep", *SMALL, "--out", str(out), "--session-range", ""])
    assert res.exit_code == 0, res.output
    assert "grid: one point = 1 configuration" in res.output
    res = runner.invoke(main, ["sweep", *SMALL, "--out", str(out), "--session-range", "0:1", "--session-range", ""])
    assert res.exit_code == 0, res.output
    assert "= 2 configurations" in res.output and "already done: 1, to run: 1" in res.output
    ranges = sorted(line.split()[1] for line in res.output.splitlines() if line.startswith("sglang+ "))
    assert ranges == ["0:1", "all"], res.output


@pytest.mark.parametrize(("lim", "labels"), [((17, 110), ["20", "30", "50", "100"]), ((15, 45), ["20", "30", "40"])])
def test_a_log_axis_within_a_decade_labels_ticks_that_do_not_run_together(lim, labels):
    """The TTFT panels of a small sweep (17 to 110 ms) carried a number on every tick: `80 90100`
    ran together at the top of the decade. An axis spanning more than 4x labels 1, 2, 3 and 5 of each
    decade; a narrower one (4x or less) keeps every number."""
    from sim.analysis.plot import _label_log_axis, pyplot

    plt = pyplot()
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    ax.plot([lim[0], lim[1]], [0, 1])
    ax.set_xlim(*lim)
    _label_log_axis(plt, ax.xaxis)
    fig.canvas.draw()
    ticks = [*ax.xaxis.get_minor_ticks(), *ax.xaxis.get_major_ticks()]
    shown = {t.label1.get_text() for t in ticks if lim[0] <= t.get_loc() <= lim[1] and t.label1.get_text()}
    plt.close(fig)
    assert sorted(shown, key=float) == labels


@pytest.mark.parametrize("cmd", [["run"], ["sweep"], ["advise"], ["traces", "stats"], ["traces", "prepare"]])
def test_every_progress_switch_says_what_it_is(runner, cmd):
    """--progress/--no-progress had no help in any command: where the bar goes (stderr, so stdout
    piped elsewhere stays the results alone) was left to guess."""
    text = " ".join(runner.invoke(main, [*cmd, "--help"]).output.split())
    assert "--progress / --no-progress A progress bar on stderr. [default: progress]" in text


@pytest.mark.parametrize(
    ("spec", "option", "said"),
    [
        ("synthetic:chat:seed=3", ["--trace-seed", "5"], "(its seed=3 sets the trace seed): give one of them"),
        (
            "synthetic:chat:sessions=3",
            ["--sessions", "10"],
            "(its sessions=3 sets the session count): give one of them",
        ),
        ("synthetic:chat", ["--response-time", "5"], "(its think times are drawn from think=, 10 s by default;"),
        ("synthetic:few-shot", ["--response-time", "5"], "(one request a session: no think time;"),
    ],
)
def test_synthetic_specs_refuse_the_options_they_do_not_read(runner, tmp_path, spec, option, said):
    """A synthetic spec's own `seed=` / `sessions=` won over `--trace-seed` / `--sessions` without a
    word (`sweep --trace synthetic:chat:seed=3 --trace-seed 0,1,2`: three identical rows), and only
    the agent kind draws think times from `--response-time` (chat's come from its `think=`)."""
    for cmd in (["run", "--no-progress"], ["traces", "stats"], ["sweep", "--out", str(tmp_path / "s"), "--dry-run"]):
        res = runner.invoke(main, [*cmd, "--trace", spec, *option])
        assert res.exit_code == 2, (cmd, res.output)
        assert res.output.startswith(f"Error: {option[0]} does nothing for {spec} {said}"), res.output
    res = runner.invoke(main, ["traces", "stats", "--trace", "synthetic:agent:sessions=2", "--response-time", "3"])
    assert res.exit_code == 0, res.output  # the agent kind reads it


def test_fewer_sessions_than_asked_for_are_said(runner):
    """`run --sessions 1000 --min-rounds 40` ran ShareGPT's 2 such conversations without a word (a
    --session-range past the trace is said); the default --sessions 100 says nothing."""
    args = ["traces", "stats", "sharegpt", "--min-rounds", "40", "--no-progress", "--format", "json"]
    res = runner.invoke(main, [*args, "--sessions", "1000"])
    assert res.exit_code == 0, res.output
    assert (
        "note: --sessions 1,000: sharegpt has only 2 conversations of at least 40 rounds (--min-rounds 40)"
        in res.output
    )
    res = runner.invoke(main, args)
    assert res.exit_code == 0 and "note:" not in res.output, res.output


def test_advise_says_fewer_sessions_than_asked_for_too(runner, tmp_path):
    args = ["advise", "--for", "sglang", "--model", "qwen3.5-9b", "--min-rounds", "40", "--sessions", "1000"]
    res = runner.invoke(main, [*args, "--trials", "1", "--workers", "1", "--no-progress", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert (
        "note: --sessions 1,000: sharegpt has only 2 conversations of at least 40 rounds (--min-rounds 40)"
        in res.output
    )


def test_report_reads_a_results_folder_whose_name_is_not_utf8(runner, small_sweep, tmp_path):
    r"""A sweep folder renamed by hand to a name that is not UTF-8 (`res\xff`): `report` said
    `cannot read results file ...: surrogates not allowed (delete it and rerun the sweep ...)`,
    advice that would delete good results. The files are opened by handle now."""
    import os
    import shutil

    folder = os.fsdecode(os.fsencode(str(tmp_path)) + b"/res\xff")
    shutil.copytree(small_sweep, folder)
    res = runner.invoke(main, ["report", folder, "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert len(res.output.strip().splitlines()) == 1 + len(list(Path(small_sweep).glob("*.parquet")))


def test_commands_printed_for_pasting_quote_a_folder_with_a_space(runner, tmp_path):
    """`sweep --out 'my results'` ended with `CSV or JSON: marconi report my results --sort ...`,
    which pasted reports a folder `my`; `plot` of a run folder named it the same way."""
    import shlex

    out = tmp_path / "my results"
    res = runner.invoke(main, ["sweep", *SMALL, "--out", str(out)])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "CSV or JSON: " in ln)
    command = line.split("CSV or JSON: ", 1)[1].rstrip("):")
    assert shlex.split(command) == ["marconi", "report", str(out), "--sort", "token_hit_rate"]
    run = tmp_path / "a run"
    assert runner.invoke(main, ["run", *SMALL, "--out", str(run)]).exit_code == 0
    res = runner.invoke(main, ["plot", str(run), "--out", str(tmp_path / "f")])
    assert res.exit_code == 2 and f"`marconi report {shlex.quote(str(run))}` prints them" in res.output, res.output


def test_traces_stats_prints_hit_rates_as_run_does(runner):
    """`traces stats` printed `kv_hit_rate 0.9195` (run prints 91.95%) and `mean_turns_per_session
    8.0000`; JSON keeps the fractions."""
    res = runner.invoke(main, ["traces", "stats", "synthetic:chat:sessions=5"])
    assert res.exit_code == 0, res.output
    rows = dict(line.split(None, 1) for line in res.output.strip().splitlines())
    assert rows["kv_hit_rate"] == "91.95%" and rows["request_hit_rate"] == "95.00%", rows
    assert rows["mean_turns_per_session"] == "8.00" and rows["mean_input_tokens"] == "2,261.0"
    res = runner.invoke(main, ["traces", "stats", "synthetic:chat:sessions=5", "--format", "json"])
    assert round(json.loads(res.output)["kv_hit_rate"], 4) == 0.9195


def test_long_latencies_print_whole_milliseconds():
    """A saturated run's TTFT p50 printed `2037224.4` ms; under a second keeps its tenth."""
    from sim.analysis import table

    recs = [{"policy": "a", "ttft_p50_ms": 2037224.44, "ttft_p95_ms": 999.94}]
    line = table.format_table(recs, ["ttft_p50_ms", "ttft_p95_ms"]).splitlines()[-1]
    assert line.split()[1:] == ["2,037,224", "999.9"], line


def test_report_of_a_stopped_advise_study_names_no_missing_advice(runner, tmp_path):
    """`report A` of an `advise --out A` interrupted before its end pointed to `A/advice.json`,
    which was not there."""
    folder = tmp_path / "a"
    folder.mkdir()
    (folder / "study.journal").write_text("")
    for cmd in (["report", str(folder)], ["plot", str(folder), "--out", str(tmp_path / "f")]):
        res = runner.invoke(main, cmd)
        assert res.exit_code == 2, res.output
        assert "advice.json" not in res.output.replace("(no advice.json:", ""), res.output
        assert "no recommendation yet" in res.output and "to finish it" in res.output, res.output


def test_sessions_help_says_what_zero_does_to_a_synthetic_trace(runner):
    """`--sessions` said `0 = all` for text and synthetic traces; a synthetic trace has no `all`:
    `--sessions 0` made its default 100 sessions."""
    res = runner.invoke(main, ["traces", "stats", "synthetic:chat", "--sessions", "0", "--format", "json"])
    assert json.loads(res.output)["sessions"] == 100
    text = " ".join(runner.invoke(main, ["run", "--help"]).output.split())
    assert "First N sessions of a text trace (0 = all); a synthetic trace makes N (0: 100)." in text


def test_run_events_parquet_is_not_written_among_a_sweeps_rows(runner, small_sweep, tmp_path):
    """`run --events SWEEP/events.parquet` wrote it among the sweep's rows: `report SWEEP`, `plot`
    and the sweep's rerun then stopped at `events.parquet is not a row of marconi sweep`."""
    import shutil

    folder = tmp_path / "s"
    shutil.copytree(small_sweep, folder)
    res = runner.invoke(main, ["run", *SMALL, "--events", str(folder / "events.parquet")])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(
        f"Error: --events {folder / 'events.parquet'}: {folder} holds the rows of `marconi sweep`"
    )
    assert not (folder / "events.parquet").exists()
    assert runner.invoke(main, ["run", *SMALL, "--events", str(folder / "events.jsonl")]).exit_code == 0
    assert runner.invoke(main, ["report", str(folder)]).exit_code == 0


def test_sweep_into_a_folder_holding_a_parquet_of_ones_own_stops_before_it_runs(runner, tmp_path):
    """`sweep --out D` where D holds `mine.parquet` ran every configuration, then ended with
    `Error: D/mine.parquet is not a row of marconi sweep` (exit 2), and report / plot stopped the
    same. Now it is refused before anything runs; rows of a sweep there are fine."""
    out = tmp_path / "d"
    out.mkdir()
    pd.DataFrame({"a": [1]}).to_parquet(out / "mine.parquet")
    res = runner.invoke(main, ["sweep", *SMALL, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == (
        f"Error: {out / 'mine.parquet'} is not a row of `marconi sweep`, and report, plot and the sweep's table "
        f"read every parquet file in {out}: move it out, or give another --out"
    )
    assert sorted(p.name for p in out.iterdir()) == ["mine.parquet"]
    (out / "mine.parquet").unlink()
    assert runner.invoke(main, ["sweep", *SMALL, "--out", str(out)]).exit_code == 0
    assert runner.invoke(main, ["sweep", *SMALL, "--out", str(out)]).exit_code == 0  # its own rows: resumed


def test_reading_a_results_folder_of_many_rows_shows_a_bar_on_a_terminal(small_sweep, capsys, monkeypatch):
    """`report` (and plot, and a sweep's closing table) read about 110 rows a second with nothing on
    screen: 2,000 rows 18 s, a 40,000-configuration sweep minutes. From MANY_ROWS files, on a
    terminal, a bar on stderr says how far the reading is; never on a pipe."""
    from sim.experiments import store

    n = len(store.row_files(small_sweep))
    store.load_results(small_sweep, progress=True)
    assert f"reading rows:   0%|          | 0/{n} " in capsys.readouterr().err
    monkeypatch.setattr(store, "MANY_ROWS", n)
    store.load_results(small_sweep)  # pytest's stderr is no terminal: no bar
    assert "reading rows" not in capsys.readouterr().err
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)  # a terminal
    store.load_results(small_sweep)
    assert f"reading rows:   0%|          | 0/{n} " in capsys.readouterr().err
    monkeypatch.setattr(store, "MANY_ROWS", n + 1)  # fewer files than that: quick, no bar
    store.load_results(small_sweep)
    assert "reading rows" not in capsys.readouterr().err


def test_the_run_header_names_an_fcfs_scheduler_and_its_servers(runner):
    """`run --scheduler fcfs --servers 3` said `des` alone in its header, as when fcfs was the
    default (continuous batching is, and is named)."""
    heads = {}
    for extra in (["--scheduler", "fcfs", "--servers", "3"], [], ["--mode", "sequential"]):
        res = runner.invoke(main, ["run", *SMALL, *extra])
        assert res.exit_code == 0, res.output
        heads[" ".join(extra)] = res.output.splitlines()[0].split(" | ")[3]
    assert heads == {
        "--scheduler fcfs --servers 3": "des, fcfs (3 servers)",
        "": "des, continuous batching (8192 tokens, 256 seqs per step)",
        "--mode sequential": "sequential",
    }


def test_a_long_rerun_shows_a_bar_while_it_checks_the_stored_results(runner, small_sweep, monkeypatch):
    """A rerun sweep reads every stored row (and with --save-requests its details) before it says
    `already done`: about 8 ms a configuration, minutes in silence for 40,000. From CHECK_BAR
    configurations a bar says it, under --progress; --no-progress keeps quiet."""
    import sim.cli.sweep as sweep_cli

    monkeypatch.setattr(sweep_cli, "CHECK_BAR", 2)
    args = ["sweep", "--trace", "synthetic:chat:sessions=3,turns=2", "--policy", "sglang+,marconi", "--alpha", "0,1"]
    res = runner.invoke(main, [*args, "--save-requests", "--out", str(small_sweep), "--dry-run"])
    assert res.exit_code == 0 and "already done: 3, to run: 0" in res.output, res.output
    assert "checking stored results" in res.output
    res = runner.invoke(main, [*args, "--save-requests", "--out", str(small_sweep), "--dry-run", "--no-progress"])
    assert "already done: 3, to run: 0" in res.output and "checking stored results" not in res.output


def test_files_written_together_get_the_mode_a_plain_open_gives(runner, tmp_path):
    """The set renamed into place (``written_together``) is made by mkstemp (0600), then given the
    mode a plain ``open`` gives: 0666 less the umask, never executable (mutation run, session 23:
    0o667 survived)."""
    import os

    from sim.cli.outdir import current_umask

    out = tmp_path / "r"
    res = runner.invoke(main, ["run", *SMALL, "--out", str(out)])
    assert res.exit_code == 0, res.output
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes and set(modes.values()) == {0o666 & ~current_umask()}, modes
    assert not any(m & 0o111 for m in modes.values())
    assert os.access(out / "summary.json", os.R_OK | os.W_OK)


def test_a_figure_asked_for_alone_that_the_rows_cannot_draw_is_refused(runner, small_sweep, tmp_path):
    """`plot --kind alpha` of a folder without Marconi's static-alpha rows: one line, exit 2, no
    figure; under --kind all the same figure is a note and the others are drawn (mutation run,
    session 23: the note taken for the single kind survived)."""
    only = small_sweep.parent / "only"
    res = runner.invoke(main, ["sweep", *SMALL, "--out", str(only)])  # sglang+ alone: no alpha rows
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["plot", str(only), "--kind", "alpha", "--out", str(tmp_path / "f")])
    assert res.exit_code == 2 and res.output.startswith("Error: no static-alpha rows of policy 'marconi'"), res.output
    assert not (tmp_path / "f").exists() or not list((tmp_path / "f").iterdir())
    res = runner.invoke(main, ["plot", str(only), "--kind", "all", "--out", str(tmp_path / "g")])
    assert res.exit_code == 0, res.output
    assert "note: alpha not drawn: no static-alpha rows" in res.stderr
    assert (tmp_path / "g" / "hit-rate.png").is_file() and not (tmp_path / "g" / "alpha.png").exists()


def test_figures_are_saved_at_120_dpi(tmp_path):
    """`plot`'s PNGs carry 120 dpi (mutation run, session 23: 121 survived)."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    from sim.analysis.plot import pyplot, save_to

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, 1])
    save_to(fig, tmp_path / "f.png", "png")
    plt.close(fig)
    assert [round(d) for d in Image.open(tmp_path / "f.png").info["dpi"]] == [120, 120]

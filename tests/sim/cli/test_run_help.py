"""`marconi run --help` reads in sections with examples (issue 45): every option listed once, under
the section of its kind, and the examples run as written (at a small size)."""

from __future__ import annotations

import re
import shlex

from click.testing import CliRunner

from sim.cli import main
from sim.cli.run import RUN_SECTIONS


def _help() -> str:
    res = CliRunner().invoke(main, ["run", "--help"], terminal_width=120)
    assert res.exit_code == 0, res.output
    return res.output


def test_run_help_lists_every_option_once_under_its_section():
    text = _help()
    heads = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert heads == list(RUN_SECTIONS)
    sections = dict(zip(heads, re.split(r"^(?:" + "|".join(map(re.escape, heads)) + r"):$", text, flags=re.M)[1:]))
    for flag, section in [
        ("--trace", "Trace"),
        ("--capacity", "Policies and cache"),
        ("--scheduler", "Engine, arrivals and timing"),
        ("--mamba-track-interval", RUN_SECTIONS[3]),
        ("--duel-window", "Tuning (--alpha auto, marconi-oracle)"),
        ("--columns", "Output"),
    ]:
        assert re.search(rf"^  {re.escape(flag)}(?![\w-])", sections[section], re.M), (flag, section)
    options = text[text.index(f"\n{RUN_SECTIONS[0]}:\n") :]
    for param in main.commands["run"].params:
        flag = max(param.opts, key=len)
        assert len(re.findall(rf"^  {re.escape(flag)}(?![\w-])", options, re.M)) == 1, flag


def test_run_help_examples_run():
    text = _help()
    block = text.split("Examples:")[1].split("\n\n")[0]
    examples = [line.strip() for line in block.splitlines() if line.strip().startswith("marconi run")]
    assert len(examples) >= 4
    for example in examples:
        # a few sessions: --sessions where the trace reads it (a hash-block trace refuses it, issue 47)
        few = ["--session-range", "0:2"] if "mooncake:" in example else ["--sessions", "2"]
        argv = shlex.split(example)[1:] + few + ["--no-progress"]
        if "--out" in argv:  # no files written by the test
            i = argv.index("--out")
            del argv[i : i + 2]
        res = CliRunner().invoke(main, argv)
        assert res.exit_code == 0, (example, res.output)


def test_sweep_help_lists_every_option_once_under_runs_sections():
    """`marconi sweep --help` listed its 70 options in one flat block; it reads in run's sections
    now (each axis under the section of the run option it lists values of), its own options
    (--out, --engine, --workers, ...) last."""
    from sim.cli.sweep import SWEEP_SECTIONS

    res = CliRunner().invoke(main, ["sweep", "--help"], terminal_width=120)
    assert res.exit_code == 0, res.output
    text = res.output
    heads = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert heads == list(SWEEP_SECTIONS) and heads[:5] == list(RUN_SECTIONS[:5])
    sections = dict(zip(heads, re.split(r"^(?:" + "|".join(map(re.escape, heads)) + r"):$", text, flags=re.M)[1:]))
    for flag, section in [
        ("--trace", "Trace"),
        ("--hash-block-tokens", "Trace"),
        ("--capacity", "Policies and cache"),
        ("--scheduler", "Engine, arrivals and timing"),
        ("--block-size", RUN_SECTIONS[3]),
        ("--tuning-lru", "Tuning (--alpha auto, marconi-oracle)"),
        ("--out", SWEEP_SECTIONS[5]),
        ("--workers", SWEEP_SECTIONS[5]),
    ]:
        assert re.search(rf"^  {re.escape(flag)}(?![\w-])", sections[section], re.M), (flag, section)
    options = text[text.index(f"\n{SWEEP_SECTIONS[0]}:\n") :]
    for param in main.commands["sweep"].params:
        flag = max(param.opts, key=len)
        assert len(re.findall(rf"^  {re.escape(flag)}(?![\w-])", options, re.M)) == 1, flag

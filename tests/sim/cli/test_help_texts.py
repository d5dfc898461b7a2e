"""What `--help` tells a first-time reader (session 24's read-through): every option of every
command says what it does (`--format` and `plot --out` said nothing), option texts name the
policy presets by the names `marconi policies` lists (`--block-size` named `vllm-align` and
`vllm-all`, old aliases, and left out `vllm`, which reads it), and a command group lists its
commands with their whole first sentence, as `marconi --help` does (`marconi traces --help`
cut `stats` at "hit-rate upper...")."""

from __future__ import annotations

import re

import click
from click.testing import CliRunner

from policies.base import ALIASES, policy_knobs
from sim.cli import main


def _commands(group: click.Group, path: str = "marconi"):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{path} {name}")
        else:
            yield f"{path} {name}", cmd


def _options():
    for path, cmd in _commands(main):
        for param in cmd.params:
            if isinstance(param, click.Option) and param.name != "help":
                yield path, param


def test_every_option_of_every_command_has_a_help_text():
    silent = [f"{path} {param.opts[0]}" for path, param in _options() if not (param.help or "").strip()]
    assert not silent, f"options without a help text: {silent}"


def test_option_help_names_presets_by_their_current_names():
    assert {"vllm-align", "vllm-all", "sglang-v1"} <= set(ALIASES)  # the old names exist, as aliases
    old = [
        (f"{path} {param.opts[0]}", alias)
        for path, param in _options()
        for alias in ALIASES
        if re.search(rf"(?<![\w-]){re.escape(alias)}(?![\w-])", param.help or "")
    ]
    assert not old, f"help texts naming a preset by an old name: {old}"


def _named(help_text: str, preset: str) -> bool:
    """``preset`` is named in ``help_text``: by its name, or by a ``family*`` pattern."""
    words = {w.rstrip(".") for w in re.findall(r"[\w.+*-]+", help_text)}
    return preset in words or any(w.endswith("*") and preset.startswith(w[:-1]) for w in words)


def test_a_knob_help_that_names_presets_names_every_preset_that_reads_it():
    """`--block-size` named vllm-align / vllm-all and lmdeploy (not vllm, vllm-0.11-*,
    lmdeploy-0.16-pytorch), `--state-pool` left out trtllm, `--prefix-cache-decode-state-interval`
    lmdeploy-0.16-pytorch: a reader of `run --help` took those options for ones the preset ignores."""
    readers = policy_knobs()
    presets = {p for names in readers.values() for p in names}
    checked = []
    for param in main.commands["run"].params:
        if param.name not in readers or not any(_named(param.help or "", p) for p in presets):
            continue  # a knob whose help names no preset (--alpha, --prefill-chunk)
        missing = [p for p in readers[param.name] if not _named(param.help, p)]
        assert not missing, (param.opts[0], missing, param.help)
        checked.append(param.name)
    assert {"block_size", "state_pool", "prefix_cache_decode_state_interval", "page_size"} <= set(checked)


def test_a_command_group_lists_each_command_with_its_whole_first_sentence():
    for group in ("traces", "kernels"):
        res = CliRunner().invoke(main, [group, "--help"], terminal_width=80)
        assert res.exit_code == 0, res.output
        listing = " ".join(res.output.split("Commands:")[1].split())
        for name, cmd in main.commands[group].commands.items():
            first = " ".join(cmd.help.split("\n\n")[0].split())
            assert f"{name} {first}" in listing, (group, name, listing)
        assert "..." not in listing


def _help_of(command: str, flag: str) -> str:
    (param,) = [p for p in main.commands[command].params if flag in p.opts]
    return param.help


def test_the_same_option_reads_the_same_in_run_sweep_and_advise():
    """advise's `--sessions-per-second` said only "sessions started per second" (not how they start,
    nor that open-loop traces keep their timestamps, both true there), its `--ray-address` gave no
    example where sweep's did."""
    rate = _help_of("run", "--sessions-per-second")
    assert _help_of("advise", "--sessions-per-second") == rate
    assert _help_of("sweep", "--sessions-per-second").startswith(rate)  # sweep adds its Values: line
    assert _help_of("advise", "--ray-address") == _help_of("sweep", "--ray-address")


def test_report_columns_help_names_the_sets_run_names():
    """`report --columns misses` works as `run --columns misses` does; report's help left it out."""
    for command in ("run", "report"):
        text = _help_of(command, "--columns")
        assert all(word in text for word in ("default", "all", "misses")), (command, text)

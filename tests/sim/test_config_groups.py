"""SimConfig in groups (issue 46.5): every knob lives in one group's dataclass, is read, written and
given flat by its name, and is declared once (default, help, section) for every command that
offers it (`run`, `sweep`, `replay`)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.config import (
    GROUPS,
    ROW_ORDER,
    SECTIONS,
    CacheSettings,
    EngineSettings,
    SimConfig,
    TimingSettings,
    TraceSettings,
    section_of,
)
from sim.errors import UsageError
from sim.tuning_options import TunerParams


def test_each_knob_is_in_exactly_one_group_and_in_the_flat_order():
    names = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) == len(SimConfig.field_names())
    assert SimConfig.field_names() == list(ROW_ORDER)  # no knob added after ROW_VERSION 2's row yet
    assert [f.name for f in dataclasses.fields(SimConfig)] == ["trace", "cache", "engine", "timing", "tuning"]
    assert (SimConfig.group_of("alpha"), SimConfig.group_of("seed"), SimConfig.group_of("gpu")) == (
        "cache",
        "trace",
        "timing",
    )
    assert SimConfig.group_of("block_size") == "engine" and SimConfig.group_of("duel_every") == "tuning"


def test_flat_keywords_fill_the_groups_and_flat_attributes_read_and_write_them():
    cfg = SimConfig(alpha=1.5, capacity_bytes=7, servers=3, gpu="h100", arrival="poisson", duel_every=9)
    assert cfg.cache == CacheSettings(alpha=1.5, capacity_bytes=7)
    assert cfg.engine == EngineSettings(servers=3)
    assert cfg.timing == TimingSettings(gpu="h100")
    assert cfg.trace == TraceSettings(arrival="poisson")
    assert cfg.tuning == TunerParams(duel_every=9)
    cfg.block_size = 64
    cfg.retune_every = 4  # the frozen tuning group is replaced, the others set in place
    assert (cfg.engine.block_size, cfg.tuning.retune_every, cfg.block_size, cfg.retune_every) == (64, 4, 64, 4)
    assert SimConfig.from_flat(**cfg.to_flat()) == cfg
    with pytest.raises(TypeError, match="unexpected keyword argument 'alhpa'"):
        SimConfig(alhpa=1)


def test_configs_never_share_a_group():
    """dataclasses.replace (the tuners' shadow configs) and whole groups given to the constructor
    are copied: changing one config leaves the other as it was."""
    base = SimConfig(alpha=1.0)
    shadow = dataclasses.replace(base, alpha=0.0)
    shadow.capacity_bytes = 1
    assert (base.alpha, base.capacity_bytes, shadow.alpha) == (1.0, 5 * 10**9, 0.0)
    cache = CacheSettings(policy="sglang+")
    a, b = SimConfig(cache=cache), SimConfig(cache=cache, capacity_bytes=3)
    a.model = "qwen3.5-9b"
    assert (cache.model, b.model, b.capacity_bytes, cache.capacity_bytes) == ("marconi-7b", "marconi-7b", 3, 5 * 10**9)
    assert pickle.loads(pickle.dumps(b)) == b  # sweep workers receive configs pickled


def test_the_row_is_flat_in_the_old_order_with_the_scheduler_that_runs():
    row = SimConfig(policy="sglang+", servers=2).as_row()
    assert list(row) == list(ROW_ORDER)
    assert row["scheduler"] == "fcfs" and row["policy"] == "sglang+" and row["servers"] == 2
    assert SimConfig().to_flat()["scheduler"] == "auto"


def test_a_bad_choice_names_the_flag_of_its_knob():
    with pytest.raises(UsageError, match=r"^--ttft-model must be flops or jamba, not 'x'$"):
        SimConfig(ttft_model="x").validate()
    with pytest.raises(UsageError, match=r"^--tuning-start must be empty or snapshot, not 'x'$"):
        SimConfig(tuning_start="x").validate()


def test_every_knob_has_a_run_help_section():
    assert {section_of(n) for n in SimConfig.field_names()} == set(SECTIONS)
    assert section_of("sessions_per_second") == "engine" and section_of("model") == "cache"
    assert section_of("page_size") == "preset" and section_of("tuner") == "tuning"


def _defaults(command: str) -> dict:
    return {p.name: p.default for p in main.commands[command].params}


def test_run_and_replay_take_their_options_from_the_declarations():
    """A knob's default is its field's (replay's own: its model preset; run's lead options give
    theirs as text); a ReplaySettings field's default is the dataclass's (dtype: by device)."""
    from sim.replay.session import ReplaySettings

    run, replay = _defaults("run"), _defaults("replay")
    for f in SimConfig.settings("sim") + SimConfig.settings("tuning"):
        assert run[f.name] == f.default, f.name
    assert (run["policies"], run["capacity"], run["alpha"]) == ("vllm+,sglang+,marconi", "5GB", "auto")
    assert run["sessions_per_second"] == SimConfig().sessions_per_second
    for name in ("state_alignment", "chunk_size", "mode", "scheduler", "max_num_batched_tokens", "max_num_seqs"):
        assert replay[name] == SimConfig.knob(name).default, name
    assert (replay["policy"], replay["capacity"], replay["alpha"], replay["model"]) == (
        "marconi",
        "5GB",
        "auto",
        "qwen3.5-9b",
    )
    own = {f.name: f for f in dataclasses.fields(ReplaySettings)}
    offered = {n for n in own if n in replay}
    assert offered == set(own) - {"warmup", "check_steps"}
    for name in offered - {"dtype"}:
        assert replay[name] == own[name].default, name
    assert replay["dtype"] is None


def test_replay_help_says_each_field_help_once():
    from sim.replay.session import ReplaySettings

    text = " ".join(CliRunner().invoke(main, ["replay", "--help"], terminal_width=4000).output.split())
    for f in dataclasses.fields(ReplaySettings):
        if f.metadata.get("help"):
            assert text.count(f.metadata["help"]) == 1, f.name
    for name in ("state_alignment", "chunk_size"):
        assert SimConfig.knob(name).metadata["help"] in text, name
    # --mode and --scheduler say what replay does (one engine, the FLOPs model: run's help names its
    # --servers and --ttft-model; tests/sim/replay/test_replay_cli.py), once each
    for name in ("mode", "scheduler"):
        assert SimConfig.knob(name).metadata["help"] not in text, name
    assert text.count("auto: continuous in --mode des, fcfs in --mode sequential.") == 1


def test_replay_settings_refuse_a_bad_choice_naming_the_flag():
    from sim.replay.session import ReplaySettings

    with pytest.raises(UsageError, match=r"^--validate must be exact, shadow or tolerance, not 'x'$"):
        ReplaySettings(device="cpu", validation="x").validate()
    with pytest.raises(UsageError, match=r"^--store must be gpu or host, not 'x'$"):
        ReplaySettings(device="cpu", store="x").validate()


def test_a_knob_added_to_a_group_later_comes_after_the_old_columns(monkeypatch):
    """A knob not in ROW_ORDER (added after ROW_VERSION 2) is a column after the old ones, which
    keep their order (a mutation survivor of sim/config.py, seed 1)."""
    import sim.config as config

    @dataclasses.dataclass
    class More(EngineSettings):
        later_knob: int = config.setting(3, "A knob added later.")

    monkeypatch.setitem(config.GROUPS, "engine", More)
    names = list(config._knob_table())
    assert names == [*ROW_ORDER, "later_knob"]

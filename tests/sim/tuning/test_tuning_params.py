"""The tuning knobs are written once, in ``TunerParams`` (sim/tuning_options.py): SimConfig's
``tuning`` group, the CLI options of `run` / `sweep` and the sweep's tuning axes are
generated from it, and the tuners read their knobs back through ``tuner_params``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

from sim.config import SimConfig
from sim.tuning_options import TunerParams, tuner_params

ROOT = Path(__file__).resolve().parents[3]


def test_simconfig_tuning_fields_are_tuner_params():
    """SimConfig's tuning group is a TunerParams: its knobs are TunerParams' own fields (one
    declaration of each default and help), read and written flat as well."""
    assert SimConfig.settings("tuning") == list(fields(TunerParams))
    cfg = SimConfig(duel_every=7)
    assert isinstance(cfg.tuning, TunerParams) and cfg.tuning.duel_every == 7
    cfg.duel_window = 11  # a frozen group: the flat assignment replaces it
    assert (cfg.tuning.duel_window, cfg.duel_window, cfg.duel_every) == (11, 11, 7)


def test_tuners_read_their_knobs_from_the_config():
    cfg = SimConfig(duel_every=7, alpha_grid="0,1", tuning_lru=False)
    p = tuner_params(cfg)
    assert isinstance(p, TunerParams)
    assert (p.duel_every, p.alpha_grid, p.tuning_lru) == (7, "0,1", False)


def test_a_knob_added_to_tuner_params_becomes_a_field_an_option_and_an_axis():
    """Extend TunerParams before sim.config is imported (a fresh interpreter): the new knob is a
    SimConfig field in the tuning group, a `run` / `sweep` option with its help and a tuning axis."""
    code = textwrap.dedent(
        """
        from dataclasses import dataclass, fields

        from click.testing import CliRunner

        import sim.tuning_options as to
        from policies.base import knob


        @dataclass(frozen=True)
        class Extended(to.TunerParams):
            duel_probe: int = knob(3, "Duel tuner: a knob written only in the Params.")


        to.TunerParams = Extended

        from sim.cli import main
        from sim.config import SimConfig, flag_of
        from sim.experiments.grid import TUNING_KNOBS

        f = SimConfig.knob("duel_probe")
        assert f.default == 3 and SimConfig.group_of("duel_probe") == "tuning", f
        assert f in SimConfig.settings("tuning")
        assert flag_of(f) == "--duel-probe"
        assert SimConfig(duel_probe=5).as_row()["duel_probe"] == 5
        assert to.tuner_params(SimConfig(duel_probe=5)).duel_probe == 5
        assert "duel_probe" in TUNING_KNOBS
        for command in ("run", "sweep"):
            out = CliRunner().invoke(main, [command, "--help"], terminal_width=200).output
            assert "--duel-probe" in out and "a knob written only in the Params" in out, out
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"

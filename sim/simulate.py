"""The one assembly point: a config becomes a Simulation with its compat variant and its tuner.

``build`` picks the engine variant (``--compat``: the core engine, or ``sim.compat``'s artifact
replay) and attaches the alpha tuner (``--alpha auto``); ``simulate`` builds and runs one
configuration (a preset tuned in hindsight, ``PolicyPreset.hindsight``, such as ``marconi-oracle``,
runs one simulation per alpha through its tuner, ``HINDSIGHT_TUNERS``). The CLI, the sweeps and the
tuners' own replays all go through here.
"""

from __future__ import annotations

from policies.base import PolicyError, PolicyPreset, find_preset
from sim.compat.artifact import ArtifactSimulation
from sim.config import SimConfig
from sim.cost import ModelSpec, TimingModel, get_model, split_timing
from sim.engine.drivers import run
from sim.engine.metrics import SimResult
from sim.engine.simulation import Simulation
from sim.errors import UsageError
from sim.gpus import get_gpu
from sim.replay.measure import read_timing
from sim.tuning.duel import DuelTuner
from sim.tuning.oracle import run_oracle
from sim.tuning.replay import AlphaTuner
from sim.tuning_options import tuner_params
from traces.base import Trace

#: the tuners that run a preset tuned in hindsight over several simulations, by the name its
#: ``PolicyPreset.hindsight`` gives
HINDSIGHT_TUNERS = {"oracle": run_oracle}


def hindsight_preset(policy: str) -> PolicyPreset | None:
    """The preset ``policy`` names when it is a bound tuned in hindsight over several simulations
    (``PolicyPreset.hindsight``); None otherwise (also for an unknown name: building refuses it)."""
    preset = find_preset(policy)
    return preset if preset is not None and preset.tuned_in_hindsight else None


def build(
    trace: Trace,
    config: SimConfig,
    *,
    spec: ModelSpec | None = None,
    timing: TimingModel | None = None,
    progress=None,
    observers=(),
) -> Simulation:
    """A ready-to-run Simulation of ``trace`` under ``config``; ``observers`` receive its event
    stream (``sim.engine.events``)."""
    config.validate()
    if timing is None and config.timing_file:
        timing = file_timing(config.timing_file, config.model, config.gpu, config.tensor_parallel)
    kw = dict(spec=spec, timing=timing, progress=progress, observers=observers)
    if config.compat == "corrected":
        sim = Simulation(trace, config, **kw)
    else:  # paper: the artifact as published; paper-fixed: its two bugs fixed
        sim = ArtifactSimulation(trace, config, bugs=config.compat == "paper", **kw)
    if sim.auto_alpha and sim.preset.uses_alpha and sim.preset.caching:
        paper = config.compat != "corrected"
        tp = tuner_params(config)
        kind = tp.tuner or ("replay" if paper else "duel")
        if kind == "duel":
            sim.tuner = DuelTuner(sim, build)
        else:
            lru = tp.tuning_lru if tp.tuning_lru is not None else not paper
            sim.tuner = AlphaTuner(sim, build, lru)
    return sim


def file_timing(path, model: str, gpu: str | None = None, tensor_parallel: int = 0) -> TimingModel:
    """The timing a ``--timing`` file prices ``model`` with under ``--gpu`` / ``--tensor-parallel``
    (``build`` uses it; the CLI calls it before the trace is loaded, so a file that cannot go with
    those options is one line before any work: `sweep` had started its grid and `advise` its
    search, and `run` had printed the file's dtype warning above the error)."""
    timing = read_timing(path, model=model)
    if gpu and timing.device and timing.device != gpu:  # a file records its device
        raise UsageError(
            f"timing file {path} was calibrated on {timing.device}, not --gpu {gpu}: leave out one of them"
        )
    if gpu and not timing.device:  # a CPU calibration (or an older file): --gpu would be inert
        raise UsageError(
            f"--gpu {gpu} does nothing with timing file {path} (it names no GPU: its times are used as they are): "
            "leave out one of them"
        )
    return _file_on_group(timing, path, model, int(tensor_parallel or 0))


def _file_on_group(timing, path, model: str, tp: int):
    """A timing file's (one GPU's) times on the --tensor-parallel group: compute split, all-reduces
    over its device's links, as the default timing does (a file's run at --tensor-parallel 8 timed
    one GPU's prefills: only the bytes changed)."""
    have = int(getattr(timing, "gpus", 1) or 1)
    if tp in (0, have):
        return timing
    if have != 1:
        raise UsageError(
            f"timing file {path} was calibrated on {have} GPUs, not --tensor-parallel {tp}: leave out one of them"
        )
    if not timing.device:  # no catalogue GPU: no links to price the all-reduces over
        raise UsageError(
            f"--tensor-parallel {tp} needs the GPU timing file {path} was calibrated on (to "
            "price its all-reduces), and the file names none: leave out one of them"
        )
    return split_timing(timing, get_model(model), get_gpu(timing.device), tp)


def simulate(
    trace: Trace,
    config: SimConfig,
    progress=None,
    *,
    spec: ModelSpec | None = None,
    timing: TimingModel | None = None,
    observers=(),
) -> SimResult:
    """Replay ``trace`` under ``config``; the one entry point the CLI and sweeps call.
    (A preset tuned in hindsight, such as ``marconi-oracle``, runs one simulation per alpha;
    observers are not supported there.)"""
    preset = hindsight_preset(config.policy)
    if preset is not None:
        try:
            tuner = HINDSIGHT_TUNERS[preset.hindsight]
        except KeyError:
            raise PolicyError(
                f"policy {preset.name!r}: unknown hindsight tuner {preset.hindsight!r}; "
                f"choose from: {', '.join(HINDSIGHT_TUNERS)}"
            ) from None
        config.validate()
        return tuner(trace, config, build, progress)
    return run(build(trace, config, spec=spec, timing=timing, progress=progress, observers=observers))

"""What every ``differential_*.py`` script reports: per request, do the simulator's preset and the
engine's own cache code give the same hit tokens, and where they do not, which way.

Imported by the scripts of this folder (``from differential_report import Agreement``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Agreement:
    """Hit tokens of the same requests, in the same order, from the simulator and the engine."""

    n: int  # requests compared
    same: int  # requests with equal hit tokens
    higher: int  # the simulator's hit is larger
    lower: int  # the simulator's hit is smaller
    sim_tokens: int
    engine_tokens: int
    differing: tuple[int, ...]  # positions (in the compared order) whose hits differ

    @classmethod
    def of(cls, sim: Sequence[int], engine: Sequence[int]) -> Agreement:
        if len(sim) != len(engine):
            raise ValueError(f"{len(sim)} simulator hits against {len(engine)} engine hits")
        differing = tuple(k for k, (a, b) in enumerate(zip(sim, engine)) if a != b)
        higher = sum(1 for k in differing if sim[k] > engine[k])
        return cls(
            n=len(sim),
            same=len(sim) - len(differing),
            higher=higher,
            lower=len(differing) - higher,
            sim_tokens=int(sum(sim)),
            engine_tokens=int(sum(engine)),
            differing=differing,
        )

    def counts(self, *, percent: bool = False) -> str:
        """``agrees on S/N requests (simulator higher on H, lower on L)``, the share in % first if asked."""
        share = f"{100 * self.same / self.n:.1f} %; " if percent else ""
        return (
            f"agrees on {self.same}/{self.n} requests ({share}simulator higher on {self.higher}, lower on {self.lower})"
        )

    def tokens(self) -> str:
        return f"hit tokens {self.sim_tokens:,} vs engine {self.engine_tokens:,}"

    def line(self, label: str, width: int) -> str:
        """The scripts' summary line: the label padded to ``width``, counts, then token totals."""
        return f"{label:{width}s} {self.counts()}; {self.tokens()}"


def served_hits(trace, config):
    """The simulator's side of a differential: ``config`` run on ``trace``; returns the hit tokens
    per request in the order the simulator serves them (arrival, ties kept), that order, and the
    simulation (for its tree and grid). The imports wait for the call, as the scripts that load an
    engine's stubs first need."""
    import numpy as np  # noqa: PLC0415

    from sim.engine.drivers import run, timestamps  # noqa: PLC0415
    from sim.simulate import build  # noqa: PLC0415

    sim = build(trace, config)
    order = np.argsort(timestamps(sim), kind="stable")
    res = run(sim)
    requests = res.requests.set_index("request_id") if "request_id" in res.requests else res.requests
    hit = requests["hit_tokens"]
    return [int(hit.iloc[i]) for i in order], order, sim


def add_hash_block_tokens(ap) -> None:
    """The scripts' ``--hash-block-tokens`` switch: the trace loaded as ``marconi run
    --hash-block-tokens`` loads it, so the preset sees the tokens the engine is fed."""
    ap.add_argument(
        "--hash-block-tokens",
        action="store_true",
        help="a hash-block trace (mooncake:sample) spelled out as tokens, as `marconi run --hash-block-tokens` "
        "does: the preset sees the engine's tokens (block_tokens 1) and may end a block or a state inside a "
        "hash block",
    )


def des_events(trace, config, kinds: tuple, patch=None):
    """The simulator's side of a differential under a ``des`` scheduler: ``config`` run on
    ``trace`` with an ``EventLog``; returns its hit tokens per request id (requests the preset
    aborts at arrival left out: they never reach the engine either), its events of ``kinds`` in the
    order it emitted them, and the simulation. ``patch(sim, log)``, if given, is called before the
    run (a script's own hooks on the simulation)."""
    from sim.engine.drivers import run  # noqa: PLC0415
    from sim.engine.events import EventLog  # noqa: PLC0415
    from sim.simulate import build  # noqa: PLC0415

    log = EventLog()
    sim = build(trace, config, observers=(log,))
    if patch is not None:
        patch(sim, log)
    res = run(sim)
    req = res.requests[~res.requests["aborted"]]
    hits = dict(zip(req["request_id"].astype(int), req["hit_tokens"].astype(int), strict=True))
    return hits, [e for e in log.events if isinstance(e, kinds)], sim


def sim_events(trace, config):
    """``config`` (des mode, ``--scheduler fcfs``) on ``trace``: its hit per request id, its
    ``Lookup``, ``Prefill`` and ``Decode`` events in the order emitted (a lookup when the preset
    looks the request up; a prefill when its prefill ends, just before the preset inserts the
    prompt's states; a decode when its decode ends, just before the end insert), and the
    simulation. An engine driver replays them in that order (``differential_sglang.py``,
    ``differential_trtllm.py``: ``run_events``)."""
    from sim.engine.events import Decode, Lookup, Prefill  # noqa: PLC0415

    if config.mode != "des" or config.effective_scheduler != "fcfs":
        raise ValueError(f"sim_events replays --scheduler fcfs in des mode, not {config.mode} / {config.scheduler}")
    return des_events(trace, config, (Lookup, Prefill, Decode))

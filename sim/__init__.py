"""marconi-sim: discrete-event simulation of prefix caching for hybrid LLMs.

Data flows trace -> engine -> cache tree <- policies -> metrics -> results -> notebooks:
``traces`` builds the request table, ``sim.engine`` replays it (sequential or simpy),
``sim.cache`` holds KV and state checkpoints, ``policies`` decide admission and eviction,
``sim.engine.metrics`` summarises; ``sim.simulate`` assembles one run. The layers are in
``pyproject.toml`` (import-linter).
"""

__version__ = "0.1.0"

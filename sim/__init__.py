"""marconi-sim: discrete-event simulation of prefix caching for hybrid LLMs.

Data flows trace -> events -> cache tree <- policies -> metrics -> results -> notebooks:
``traces`` builds the request table, ``sim.engine`` replays it (simpy), ``sim.tree`` holds KV
and state checkpoints, ``policies`` decide admission and eviction, ``sim.metrics`` summarises.
"""

__version__ = "0.1.0"

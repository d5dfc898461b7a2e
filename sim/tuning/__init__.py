"""Alpha tuning for Marconi's eviction (``--alpha auto``) and the static-alpha oracle (``marconi-oracle``).

Tuners sit above the engine: they are attached by ``sim.simulate`` and act only through public
engine methods (``set_eviction``, ``make_eviction``, the sequential and shadow steps, the drivers).

- ``duel``: set dueling with shadow caches on the live stream (the default outside paper compat);
- ``replay``: the artifact's bootstrap-window replay (the default in paper compat);
- ``oracle``: the best static alpha in hindsight (a bound, not a policy).
"""

"""`marconi advise`: recommend an engine's cache settings for a workload, with the evidence.

``space``: each engine's knobs (``ENGINES``) and how GPU memory becomes cache; ``search``: the
Optuna study stored in the output folder, trials simulated in parallel, the recommendation beside
the engine's defaults (and on a held-out part of the trace). Optuna is the optional extra
``advise``.
"""

from sim.experiments.advise.search import (
    OBJECTIVES,  # noqa: F401
    Advice,  # noqa: F401
    Problem,  # noqa: F401
    advice_json,  # noqa: F401
    advise,  # noqa: F401
    differences,  # noqa: F401
    pareto_front,  # noqa: F401
    run_line,  # noqa: F401
)
from sim.experiments.advise.space import ENGINES, build_space, parse_gpu_memory, weight_bytes  # noqa: F401

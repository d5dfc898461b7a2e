"""Pluggable admission and eviction policies, and named presets that combine them.

Importing the package registers every policy (the order fixes the order of ``--policy`` choices):
contracts live in ``policies.base``; a new policy is one module listed here.
"""

from policies import admission, eviction  # noqa: F401  (register the paper's policies)
from policies import presets  # noqa: F401  (after its policies: presets check names on registration)
from policies import engines  # noqa: F401  (the serving engines' presets)
from policies import gdsf  # noqa: F401  (GreedyDual-Size-Frequency)

"""Variants of the core engine that reproduce published artifacts (``--compat paper|paper-fixed``).

Everything here subclasses or wraps a core class and overrides its hooks; ``sim.simulate`` is the
one place that picks a variant. The core tree, engine, policies and cost model know nothing of it.
"""

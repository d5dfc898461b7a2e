"""The environment the notebook tests start a kernel in."""

import os


def kernel_env() -> dict:
    """This process's environment less ``MPLBACKEND``: a backend forced on the test run (Agg, as
    ``benchmarks/mutation.py`` sets for its copies) would reach the kernel and replace its inline
    backend, and the notebooks' figures would come out as ``<Figure ...>`` text, no PNG (the
    notebook tests then failed in the mutation runs of session 23, "drew no figure")."""
    return {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}

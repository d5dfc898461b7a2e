"""Per-test CPU time for pytest (issue 44 item 4): ``PYTHONPATH=<this folder>
CPUTIME_OUT=file.jsonl pytest -p cputime_plugin -n 0 ...`` appends one line per test: ``[test id,
CPU s (user + sys of the process and its reaped children, setup + call + teardown), wall s]``.
``CPUTIME_T1=1`` runs torch on one thread, as the xdist workers run the replay tests."""

import json
import os
import resource
import time

import pytest


def _cpu():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, w0 = _cpu(), time.perf_counter()
    yield
    out = os.environ.get("CPUTIME_OUT")
    if out:
        with open(out, "a") as f:
            row = (item.nodeid, round(_cpu() - c0, 3), round(time.perf_counter() - w0, 3))
            f.write(json.dumps(row) + "\n")


def pytest_configure(config):
    if os.environ.get("CPUTIME_T1"):
        try:
            import torch
        except ImportError:
            return
        torch.set_num_threads(1)

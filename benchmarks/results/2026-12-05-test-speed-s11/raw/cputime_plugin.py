"""Per-test CPU time for pytest (issue 44 item 4, session 11): ``PYTHONPATH=<this folder>
CPUTIME_OUT=file.jsonl pytest -p cputime_plugin -n 0 ...`` appends one line per test: ``[test id,
CPU s, wall s]``, CPU = user + sys of the pytest process, of its reaped children, and of its
live children with their reaped children (read from /proc): a command forked by
tests/cli_forkserver.py is reaped by the server, which lives on past the test, so
``RUSAGE_CHILDREN`` alone (the first rounds' plugin) missed its CPU. Setup + call + teardown.
``CPUTIME_T1=1`` runs torch on one thread."""

import json
import os
import resource
import time

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def _live_children() -> float:
    total = 0.0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    pids = set()
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields after the name: state=0 ... utime=11 stime=12 cutime=13 cstime=14
        total += sum(int(x) for x in fields[11:15]) / _TICK
    return total


def _cpu():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + _live_children()


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

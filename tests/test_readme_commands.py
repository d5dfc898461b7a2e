"""Every command shown in the README's code blocks runs (issues 12 and 20), so the README cannot
drift from the code: each `marconi ...` line verbatim through the real CLI, each in a process of
its own (the first through the installed `marconi` script, the others forked from
tests/cli_forkserver.py, which has the CLI and its heavy imports loaded once), with
small sizes added where a full run would take minutes; every line pastes as written (no `a|b`
alternatives, no placeholders, nothing outside the repository such as ../shared); `make` targets
are checked with `make -n` (running `make test` here would run this suite inside itself); a
`source .venv/bin/activate` line must name the Makefile's venv. The default output shown in
the README must be the stored default table (tests/sim/cli/data/default_run.txt, checked byte for
byte against `marconi run` by tests/sim/cli/test_default_output.py).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from forked_cli import Forks

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MARCONI = str(Path(sys.executable).parent / "marconi")

# small sizes, per subcommand: (flag, value or None), added unless the command sets the flag
SMALL = {
    "run": [("--sessions", "3"), ("--no-progress", None)],
    # --save-requests: the README's plot kinds ttft and occupancy read per-request records
    "sweep": [("--sessions", "2"), ("--save-requests", None), ("--no-progress", None)],
    "stats": [("--sessions", "2")],
    "prepare": [("--sessions", "2")],
    "advise": [("--sessions", "4"), ("--trials", "3"), ("--workers", "1"), ("--no-progress", None)],
}


def _kernels_check_passes(out: str, work: Path) -> str | None:
    """``marconi kernels check``: a pass/fail table of at least ten checks, every one PASS (these
    checks were tests/kernels/test_cli.py's own run of the command: one run, not two)."""
    lines = [ln for ln in out.splitlines() if ln.endswith(("PASS", "FAIL"))]
    if len(lines) < 10 or not all(ln.endswith("PASS") for ln in lines) or "all checks passed" not in out:
        return f"{len(lines)} checks, failed: {[ln for ln in lines if not ln.endswith('PASS')]}\n{out[-1000:]}"
    return None


REPLAY_LINE = "marconi replay --device cpu --model replay-tiny --trace synthetic:chat --requests 40 --out replay/"


def _replay_validates_and_steps(out: str, work: Path) -> str | None:
    """The README's CPU replay (issue 24's command with ``--out``): 40 requests, more than 30 hits,
    every one validated (states and KV), none failed, on the torch backend; under the default
    scheduler, continuous batching (a des replay's default), whose steps are executed and timed
    (``steps.parquet``: one row per executed step, measured and modelled times > 0) and, on a CPU,
    not compared with the committed H200 timing (the line says so; it is not an error). These
    checks were tests/sim/replay/test_replay_cli.py's own run of the same replay (one run, not
    two; the README had a second, identical line with ``--scheduler continuous``)."""
    import json

    import pandas as pd

    folder = work / "replay"
    doc = json.loads((folder / "summary.json").read_text())
    s, why = doc["summary"], []
    if not (s["requests"] == 40 and s["failures"] == 0 and s["kv_failures"] == 0):
        why.append(f"requests {s['requests']}, failures {s['failures']}, KV failures {s['kv_failures']}")
    if not (s["hits"] > 30 and s["hits_validated"] == s["kv_hits_validated"] == s["hits"]):
        why.append(f"hits {s['hits']}, validated {s['hits_validated']}, KV validated {s['kv_hits_validated']}")
    if not (s["kernel"] == doc["settings"]["kernel"] == "torch"):
        why.append(f"kernel {s['kernel']} / {doc['settings']['kernel']}, not torch")
    if "continuous batching (8192 tokens, 256 seqs per step)" not in out:
        why.append("not a continuous-batching replay")
    line = next((x for x in out.splitlines() if x.startswith("step time")), "")
    if not ("steps executed of" in line and "error not compared" in line and "error median" not in line):
        why.append(f"step time line: {line!r}")
    if not (s["time_model_compared"] is False and s["time_model_note"].startswith("not compared")):
        why.append(f"time model compared: {s['time_model_compared']}, {s['time_model_note']!r}")
    df = pd.read_parquet(folder / "steps.parquet")
    if not (s["steps_executed"] > 0 and len(df) == s["steps_executed"]):
        why.append(f"{len(df)} step rows, {s['steps_executed']} steps executed")
    if not ((df["measured_ms"] > 0).all() and (df["modelled_ms"] > 0).all()):
        why.append("a step without its measured or modelled time")
    return "; ".join(why) or None


# what a command's output must show, besides exit 0 (README line -> check of its stdout and the
# commands' folder, returning a failure or None)
OUTPUT_CHECKS = {"marconi kernels check": _kernels_check_passes, REPLAY_LINE: _replay_validates_and_steps}


def code_blocks(text: str, shell: bool = True) -> list[str]:
    """Shell blocks (```bash, sh, console: commands) or the others (```: output shown)."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    return [body for tag, body in blocks if (tag in ("bash", "sh", "shell", "console")) == shell]


def commands(text: str) -> list[str]:
    """Command lines of the README's code blocks: continuations joined, comments dropped."""
    out = []
    for block in code_blocks(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if line.startswith(("marconi ", "make ", "source ")) or line in ("marconi", "make"):
                out.append(line)
    return out


def small(argv: list[str], tmp: Path) -> list[str]:
    argv = list(argv)
    sub = argv[2] if argv[1:2] == ["traces"] and len(argv) > 2 else (argv[1] if len(argv) > 1 else "")
    # a trace that does not read --sessions (hash-block, Marconi JSONL) refuses it (issue 47): the
    # first sessions of it are --session-range 0:N
    fixed_sessions = any(t.startswith(("mooncake:", "bailian:", "marconi-jsonl:")) for t in argv)
    for flag, value in SMALL.get(sub, []):
        if flag == "--sessions" and fixed_sessions:
            flag = "--session-range"
            value = f"0:{value}"
        if flag not in argv and not (flag == "--no-progress" and "--progress" in argv):
            argv += [flag] if value is None else [flag, value]
    return argv


def test_readme_has_commands():
    found = commands(README)
    assert any(c.startswith("marconi run") for c in found) and any(c.startswith("make run") for c in found)


def test_every_readme_command_pastes_as_written():
    """No alternatives (`a|b`), placeholders (SPEC, PATH) or paths outside the repository."""
    for command in commands(README):
        words = shlex.split(command)
        assert not any("|" in w for w in words), f"{command}: `a|b` does not paste; write one line each"
        assert not any(w.isalpha() and w.isupper() for w in words), f"{command}: a placeholder does not paste"
        assert "../" not in command, f"{command}: names something outside the repository"


@pytest.mark.slow  # the longest single test: collected first (tests/conftest.py)
def test_every_readme_command_runs(tmp_path):
    """In README order, in one folder (the sweep writes results/ that plot reads)."""
    env = dict(os.environ, MARCONI_CACHE_DIR=str(tmp_path / "cache"), TRITON_INTERPRET="1")
    work, logs = tmp_path / "work", tmp_path / "logs"
    logs.mkdir()
    # the shipped example configs (`--model docs/examples/...`) where a fresh clone has them
    shutil.copytree(ROOT / "docs" / "examples", work / "docs" / "examples")
    failures = []
    ran = 0
    forks = Forks(env, work, logs)
    try:
        for command in commands(README):
            if command.startswith("source "):
                venv = re.search(r"^VENV \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
                assert command.split()[1] == f"{venv}/bin/activate", f"{command}: the Makefile's venv is {venv}"
                continue
            if command.startswith("make"):
                target = command.split()[1]
                plan = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
                if plan.returncode != 0 or not plan.stdout.strip():
                    failures.append(f"{command}: make -n {target} failed: {plan.stderr.strip()[-300:]}")
                if target == "run":  # what `make run` runs, at a small size
                    command = "marconi run"
                else:
                    continue
            argv = small(shlex.split(command), work)
            if argv[:2] == ["marconi", "kernels"] and shutil.which("nvidia-smi") is None:
                pytest.importorskip("triton")  # the interpreter on CPU needs the kernels extra
            if ran == 0:  # the installed `marconi` script itself, once
                proc = subprocess.run(
                    [MARCONI, *argv[1:]], cwd=work, env=env, capture_output=True, text=True, timeout=600
                )
                rc, out, err = proc.returncode, proc.stdout, proc.stderr
            else:
                rc, out, err = forks.run(argv)
            ran += 1
            if rc != 0:
                failures.append(f"{' '.join(argv)}: exit {rc}: {err.strip()[-400:]}")
            elif command in OUTPUT_CHECKS and (why := OUTPUT_CHECKS[command](out, work)):
                failures.append(f"{command}: {why}")
    finally:
        forks.close()
    checked = set(OUTPUT_CHECKS) & set(commands(README))
    assert checked == set(OUTPUT_CHECKS), f"no longer in the README: {set(OUTPUT_CHECKS) - checked}"
    assert ran >= 8 and forks.n == ran - 1
    assert not failures, "\n".join(failures)


def test_readme_model_configs_are_in_the_repository():
    """`--model PATH` and `marconi models PATH` in the README name a config the repository ships."""
    paths = [w for c in commands(README) for w in shlex.split(c) if w.startswith("docs/examples/")]
    assert paths, "the README reads a model from its config.json"
    for p in paths:
        assert (ROOT / p).is_file() or (ROOT / p / "config.json").is_file(), p


def test_readme_default_output_is_the_stored_table():
    stored = (ROOT / "tests" / "sim" / "cli" / "data" / "default_run_continuous.txt").read_text().splitlines()
    shown = [b for b in code_blocks(README, shell=False) if any(x.startswith("policy ") for x in b.splitlines())]
    assert shown, "the README shows the default output"
    assert shown[0].strip("\n").splitlines() == stored[1:], "README's default table differs from `marconi run`'s"


def test_kernels_check_output_rule(tmp_path):
    table = "".join(f"check {i:<30} PASS\n" for i in range(10)) + "all checks passed\n"
    assert _kernels_check_passes(table, tmp_path) is None
    assert "9 checks" in _kernels_check_passes(table.split("\n", 1)[1], tmp_path)
    assert "FAIL" in _kernels_check_passes(table.replace("check 3 " + " " * 29 + "PASS", "check 3 FAIL"), tmp_path)
    assert _kernels_check_passes(table.replace("all checks passed", ""), tmp_path) is not None


def test_replay_output_rule(tmp_path):
    """The README replay's check fails on each thing it checks (a hand-made folder)."""
    import json

    import pandas as pd

    good = dict(
        requests=40, failures=0, kv_failures=0, hits=37, hits_validated=37, kv_hits_validated=37, kernel="torch",
        time_model_compared=False, time_model_note="not compared: the timing describes h200", steps_executed=3,
    )  # fmt: skip
    out = (
        "replay synthetic:chat | marconi | des, continuous batching (8192 tokens, 256 seqs per step) | torch\n"
        "step time    3 steps executed of 10; measured p50 1 ms; error not compared (see the time model line)\n"
    )

    def check(summary=None, text=out, measured=(1.0, 2.0, 3.0), kernel="torch"):
        (tmp_path / "replay").mkdir(exist_ok=True)
        doc = {"summary": dict(good, **(summary or {})), "settings": {"kernel": kernel}}
        (tmp_path / "replay" / "summary.json").write_text(json.dumps(doc))
        pd.DataFrame({"measured_ms": list(measured), "modelled_ms": [0.6] * len(measured)}).to_parquet(
            tmp_path / "replay" / "steps.parquet"
        )
        return _replay_validates_and_steps(text, tmp_path)

    assert check() is None
    assert "requests 39" in check({"requests": 39})
    assert "failures 1" in check({"failures": 1})
    assert "KV failures 1" in check({"kv_failures": 1})
    assert "hits 30" in check({"hits": 30, "hits_validated": 30, "kv_hits_validated": 30})
    assert "validated 36" in check({"hits_validated": 36})
    assert "KV validated 36" in check({"kv_hits_validated": 36})
    assert "not torch" in check({"kernel": "triton"}) and "not torch" in check(kernel="triton")
    assert "continuous" in check(text=out.replace("continuous batching", "fcfs"))
    assert "step time" in check(text=out.replace("error not compared", "error median 3 %"))
    assert "step time" in check(text=out.splitlines()[0])
    assert "compared: True" in check({"time_model_compared": True})
    assert "compared" in check({"time_model_note": "error median 4 %"})
    assert "2 step rows" in check(measured=(1.0, 2.0))
    assert "0 steps executed" in check({"steps_executed": 0}, measured=())
    assert "measured or modelled" in check(measured=(1.0, 0.0, 3.0))

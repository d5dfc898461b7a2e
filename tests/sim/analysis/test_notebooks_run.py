"""The notebooks as a reader runs them (issue 45): the README's line runs them on a results folder
named relative to the shell's folder (a notebook's kernel runs in notebooks/, where `results`
does not exist), their outputs are committed, and a folder that exists nowhere is one line."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sim.analysis import report
from sim.errors import UsageError
from sim.experiments.grid import expand_grid
from sim.experiments.runners import run_sweep

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


def test_a_relative_results_dir_is_found_from_the_shell_folder_or_the_repository(tmp_path, monkeypatch):
    (tmp_path / "results").mkdir()
    nb = tmp_path / "notebooks"
    nb.mkdir()
    monkeypatch.chdir(nb)  # where a kernel runs
    monkeypatch.setenv("PWD", str(tmp_path))  # where the user typed RESULTS_DIR=results ...
    assert report.find_folder("results") == tmp_path / "results"
    monkeypatch.setenv("PWD", "/")  # started elsewhere: the repository root (notebooks/..) is tried
    assert report.find_folder("results") == tmp_path / "results"
    monkeypatch.setenv("RESULTS_DIR", "results")
    assert report.results_dir(None, "hit_rates") == tmp_path / "results"
    with pytest.raises(UsageError, match="results folder nowhere not found"):
        report.find_folder("nowhere")


def test_committed_notebooks_hold_their_outputs():
    for name in ("hit_rates", "alpha_sweep", "ttft", "advise", "replay"):
        nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
        outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
        assert outputs, f"{name}.ipynb is committed without outputs: python notebooks/execute.py {name}"
        assert not [o for o in outputs if o.get("output_type") == "error"], name
        assert (ROOT / "notebooks" / f"{name}.ipynb").stat().st_size < 400_000, f"{name}.ipynb: keep outputs small"


def test_the_readme_notebook_line_runs_as_written(tmp_path):
    pytest.importorskip("nbclient")
    (line,) = [x for x in README.splitlines() if "notebooks/execute.py" in x and x.startswith("RESULTS_DIR=")]
    command = re.split(r"\s+#", line, maxsplit=1)[0]
    env_part, *argv = shlex.split(command)
    key, value = env_part.split("=")
    assert argv[:2] == ["python", "notebooks/execute.py"]
    # the README's sweep writes results/ beside the shell; a small one here
    tasks = expand_grid(
        {"trace": ["sharegpt"], "sessions": [2]},
        {"policy": ["sglang+", "marconi"], "capacity_bytes": [10**9, 2 * 10**9], "alpha": [0.0, 1.0]},
    )
    run_sweep(tasks, tmp_path / value, workers=1, save_requests=True, progress=False)
    env = dict(os.environ, **{key: value}, PWD=str(tmp_path), MARCONI_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / argv[1]), *argv[2:]], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in argv[2:]:
        if name.startswith("-"):
            break
        out = tmp_path / argv[-1] / f"{name}.ipynb"
        text = out.read_text()
        assert str((tmp_path / value).resolve()) in text  # the notebook read the folder given
        assert '"output_type": "error"' not in text


def test_execute_refuses_an_unknown_notebook(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "notebooks" / "execute.py"), "nope", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no notebook nope" in proc.stderr


def _stderr_of(nb: dict) -> list[str]:
    return [
        "".join(o.get("text", ""))
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stderr"
    ]


def test_committed_notebooks_show_no_warning():
    """A reader's first look is the committed outputs: no warning or traceback on stderr there (the
    advise notebook showed tqdm's "IProgress not found" TqdmWarning, from Optuna's import of
    tqdm.auto in a kernel without ipywidgets)."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        noisy = [t for t in _stderr_of(json.loads(path.read_text())) if re.search(r"Warning|Traceback", t)]
        assert not noisy, f"{path.name}: {noisy[0][:300]}"


def test_the_replay_notebook_keeps_its_own_replay_out_of_the_terminal(tmp_path):
    """Without REPLAY_DIR the replay notebook runs a tiny CPU replay in a subprocess, whose table
    went to the terminal that started the kernel (past `python notebooks/execute.py`'s own lines),
    not into the notebook; it is captured now, and the notebook still reads the folder it wrote."""
    pytest.importorskip("nbclient")
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("REPLAY_DIR", "MPLBACKEND")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "notebooks" / "execute.py"), "replay", "--out", str(tmp_path)],
        cwd=tmp_path,
        env=dict(env, MARCONI_CACHE_DIR=str(tmp_path / "cache")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [proc.stdout.strip()] and proc.stdout.startswith("replay: "), proc.stdout
    nb = json.loads((tmp_path / "replay.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    assert "synthetic:chat" in text and "from " in text
    assert not _stderr_of(nb)

"""Installing: no setuptools deprecation box (SPDX license string), and `make run` installs only
when pyproject.toml changed (issue 12)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_license_is_an_spdx_string_and_metadata_builds_without_deprecation(tmp_path, monkeypatch):
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in meta["build-system"]["requires"]  # the first setuptools reading SPDX strings
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    for pkg in ("sim", "traces", "policies", "kernels"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(src)
    from setuptools import build_meta

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist_info = build_meta.prepare_metadata_for_build_wheel(str(tmp_path))
    # What matters: no deprecation about the license (a TOML table or a License :: classifier).
    # Other warnings are setuptools' own business (some versions call [tool.setuptools] beta).
    about_license = [str(w.message) for w in caught if "licen" in str(w.message).lower()]
    assert not about_license, about_license
    text = (tmp_path / dist_info / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in text
    assert "Classifier: License ::" not in text
    assert "Name: marconi-sim" in text and "Requires-Dist: numpy" in text


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_installs_once(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)

    def planned() -> list[str]:
        # under `make test` the parent's MAKELEVEL/MAKEFLAGS would make the child print "Entering directory"
        env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
        out = subprocess.run(
            ["make", "--no-print-directory", "-n", "run"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.splitlines()

    assert planned() == [".venv/bin/pip install -q -e .", "touch .venv/.installed", ".venv/bin/marconi run"]
    (tmp_path / ".venv" / ".installed").touch()
    assert planned() == [".venv/bin/marconi run"]  # the second call only runs
    later = (tmp_path / ".venv" / ".installed").stat().st_mtime + 10
    os.utime(tmp_path / "pyproject.toml", (later, later))  # a changed pyproject.toml installs again
    assert planned()[0] == ".venv/bin/pip install -q -e ."

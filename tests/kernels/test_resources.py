"""Hopper resource check on the CPU (benchmarks/kernel_resources.py): compiled for sm_90a at the
library's launch configs, no kernel spills registers and the state kernel's chunk loop is
pipelined (cp.async). The first three-kernel version failed both (255 registers and 64-560 bytes
of spills per kernel, no cp.async): a 2x slowdown no CPU test could see."""

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from forked_cli import shared_forks

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_resources.py"

pytestmark = [
    pytest.mark.skipif(
        platform.machine() != "x86_64" or sys.platform != "linux",
        reason="the triton wheel's ptxas is an x86-64 Linux binary",
    ),
    pytest.mark.triton_compat,  # the compile for sm_90a changes with every Triton: run on both
]


def _run(*args):
    """``python benchmarks/kernel_resources.py args`` in a process of its own, forked from one with
    torch and compiled-mode Triton loaded once per test process (tests/cli_forkserver.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences triton 3.9's notice
    argv = [str(SCRIPT), *args]
    rc, out, err = shared_forks(env, ("torch", "triton", "kernels.chunk_gdn")).run(argv, timeout=600, script=SCRIPT)
    if rc is None:
        raise subprocess.TimeoutExpired(argv, 600, out, err)
    return subprocess.CompletedProcess(argv, rc, out, err)


@pytest.mark.parametrize("dtype,dim", [("bf16", 128), ("fp16", 256), ("bf16", 64)])
def test_no_spills_and_pipelined_state_loop(dtype, dim):
    run = _run("--check", "--dtype", dtype, "--head-dim", str(dim))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()[2:]}
    # and the segmented state pass's kernels (opt-in: kernels.chunk_segmented)
    triton_rows = {"solve", "wu", "state", "state-wide", "state-wide-nob", "output", "seg", "seg-wide", "combine"}
    # the Gluon state loop where the library would run it on Hopper (16-bit, K = 128), spill-free
    # (--check) in Triton 3.6 and 3.9 alike
    # and the output kernel as it runs beside that loop (``OVL``), and the loop with the output
    # inside its program (``FUSE``, opt-in: its cp.async rings too), and the Gluon solve with its
    # pair of value heads on one key head and on two; --check also holds the solve's substitution
    # to the triangle's multiplies (its masked sums fold)
    gluon_rows = (
        {"gluon", "gluon-wide", "gluon-wide-nob", "output-ovl", "fused", "fused-wide", "fused-wide-nob"}
        | {"gsolve", "gsolve-nopair"}
        | ({"output-discard"} if dtype != "fp32" else set())  # DISCARD (opt-in): whole 128-byte rows
        if dim == 128 and _has_gluon()
        else set()
    )
    assert set(rows) == triton_rows | gluon_rows
    for name in ("state", "state-wide", "state-wide-nob", *(gluon_rows - {"output-ovl", "output-discard"})):
        assert int(rows[name][6]) > 0  # cp.async column
    for name in gluon_rows & {"gsolve", "gsolve-nopair"}:
        assert int(rows[name][7]) == 8 * (1 if name == "gsolve" else 2)  # one K K^T per key head
        assert 64 * 63 // 2 <= int(rows[name][11]) <= 3000  # fp32 multiplies: the triangle's


def _has_gluon() -> bool:
    from kernels import state_gluon

    return state_gluon.gluon is not None


def test_refuses_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env)
    assert run.returncode == 2 and "TRITON_INTERPRET" in run.stderr


def test_fla_state_loop_compiles_beside_ours():
    """``--fla``: FLA's state loop at its Hopper configurations, in the same columns (skips where
    fla-core is not installed: it is an optional peer)."""
    pytest.importorskip("fla")
    run = _run("--fla", "--head-dim", "128")
    assert run.returncode == 0, run.stdout + run.stderr
    fla = [line.split() for line in run.stdout.splitlines() if line.lstrip().startswith("FLA")]
    assert len(fla) == 4 and all(int(r[8]) > 0 and int(r[9]) > 0 for r in fla)  # cp.async and wgmma


def test_fp32_default_products_spill_a_fraction_of_ieee():
    """fp32 inputs default to tf32x3 products (``FP32_PRECISION``): Triton's IEEE FMA products
    hold whole operand rows in registers and spill kilobytes in every kernel (H200, K = V = 128:
    14x slower). At head dim 64 (quicker to compile than 128, same picture) the default's state
    loop and w / u do not spill at all, its output kernel spills under a quarter of IEEE's and its
    solve less than IEEE's."""

    def spills(*args):
        run = _run("--dtype", "fp32", "--head-dim", "64", *args)
        assert run.returncode == 0, run.stdout + run.stderr
        assert ("tf32x3" if not args else args[-1]) in run.stdout.splitlines()[0]
        return {line.split()[0]: int(line.split()[4].split("/")[0]) for line in run.stdout.splitlines()[2:]}

    default, ieee = spills(), spills("--precision", "ieee")
    rows = {"solve", "wu", "state", "state-wide", "state-wide-nob", "output", "seg", "seg-wide", "combine"}
    assert set(default) == set(ieee) == rows  # no Gluon
    # (the segmented pass's combine multiplies fp32 states in tf32x3 whatever the inputs' precision)
    for name in ("wu", "state", "state-wide", "state-wide-nob", "seg", "seg-wide"):
        assert default[name] == 0 and ieee[name] > 1000, (default, ieee)
    assert default["output"] <= ieee["output"] / 4 and default["solve"] < ieee["solve"], (default, ieee)


def _script_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernel_resources_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_kernel_is_assembled_once_per_ptx_and_tools(tmp_path, monkeypatch):
    """The ptxas report and SASS counts are kept per PTX (beside Triton's cache): the same PTX is
    answered from the cache, another PTX, other tools, ``--no-cache`` or a failed disassembly are
    assembled again; the entry holds exactly what the tools said."""
    kr = _script_module()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    calls = []
    report = "ptxas info    : Used 40 registers, 0 bytes spill stores, 0 bytes spill loads"

    def ptxas(ptx_path, out_path):
        calls.append(open(ptx_path).read())
        return report + f" #{len(calls)}"

    counts = [(100, 3, 7)]
    monkeypatch.setattr(kr, "_ptxas_info", ptxas)
    monkeypatch.setattr(kr, "_sass_counts", lambda cubin: counts[-1])
    assert kr._assembled("k", "PTX A") == (report + " #1", (100, 3, 7))
    assert kr._assembled("k2", "PTX A") == (report + " #1", (100, 3, 7)) and calls == ["PTX A"]
    assert (tmp_path / "kernel-resources").is_dir()
    assert kr._assembled("k", "PTX B") == (report + " #2", (100, 3, 7)) and calls == ["PTX A", "PTX B"]
    tools = kr._tools_key
    monkeypatch.setattr(kr, "_tools_key", lambda bindir: (*tools(bindir), ("ptxas", "another")))
    assert kr._assembled("k", "PTX A")[0] == report + " #3"  # another ptxas: assembled again
    monkeypatch.setattr(kr, "USE_CACHE", False)
    assert kr._assembled("k", "PTX A")[0] == report + " #4" and len(calls) == 4
    monkeypatch.setattr(kr, "USE_CACHE", True)
    counts.append((None, None, None))  # nvdisasm missing or failed: not kept
    assert kr._assembled("k", "PTX C") == (report + " #5", (None, None, None))
    counts.append((5, 0, 0))
    assert kr._assembled("k", "PTX C") == (report + " #6", (5, 0, 0))
    assert kr._assembled("k", "PTX C") == (report + " #6", (5, 0, 0)) and len(calls) == 6


def test_the_cache_key_holds_the_ptx_the_tools_and_the_script(tmp_path, monkeypatch):
    kr = _script_module()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for exe in ("ptxas", "nvdisasm"):
        (bindir / exe).write_text(exe)
    key = kr._cache_key("PTX", str(bindir))
    assert key == kr._cache_key("PTX", str(bindir)) and key != kr._cache_key("PTX ", str(bindir))
    (bindir / "nvdisasm").write_text("another nvdisasm")
    kr._tools_key.cache_clear()  # (read once a process)
    assert kr._cache_key("PTX", str(bindir)) != key
    other = tmp_path / "other"  # the same binaries elsewhere (another venv): the same key
    shutil.copytree(bindir, other)
    assert kr._cache_key("PTX", str(other)) == kr._cache_key("PTX", str(bindir))
    key = kr._cache_key("PTX", str(bindir))
    copy = tmp_path / "kernel_resources.py"  # the script changed: its old entries are not read
    copy.write_text(SCRIPT.read_text() + "\n# changed\n")
    monkeypatch.setattr(kr, "__file__", str(copy))
    assert kr._cache_key("PTX", str(bindir)) != key


def test_ssd_kernels_spill_free_pipelined_and_overlapped():
    """``--ssd``: the SSD (Mamba2) kernels at Nemotron-H 8B's layer, spill-free, the state loop's
    loads pipelined (cp.async) where the output runs after it and where it runs beside it (the
    loop's CTA barrier before each progress release is inline assembly: ``tl.debug_barrier`` there
    left no cp.async, 54 -> 16 KB of shared memory, session 17), and --check holds the overlap's
    handshake (the loop's launch trigger and releases, the output's acquires and final wait)."""
    run = _run("--ssd", "--check", "--dtype", "bf16")
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()[2:]}
    gluons = ("ssd-state-gluon", "ssd-state-gluon-wg2", "ssd-state-gluon-wg2-tma")
    assert set(rows) == {
        "ssd-state", "ssd-prep", "ssd-output", "ssd-state-ovl", "ssd-state-tma", *gluons, "ssd-fused-gluon",
        "ssd-output-ovl", "ssd-output-discard",
    }  # fmt: skip
    # the loop and its output in one warp-specialised program (``WS``): spill-free (--check), its loads
    # pipelined, the products of both partitions on wgmma (the loop's and the output's three), no
    # layout conversion, and no chunk-start copy through memory: fewer global stores than the loop
    # and the output kernel together
    f = rows["ssd-fused-gluon"]
    assert int(f[6]) > 0 and int(f[7]) > int(rows["ssd-state-gluon"][7]) and int(f[12]) == 0
    assert int(f[10]) < int(rows["ssd-state-gluon"][10]) + int(rows["ssd-output-ovl"][10])
    assert all(int(rows[k][6]) > 0 for k in ("ssd-state", "ssd-state-ovl", "ssd-state-tma", *gluons))
    # the Gluon loop (``GLUON``, one warpgroup or two) stores both states from the accumulator: no
    # layout conversion (the Triton loop converts each through shared memory) and fewer barriers
    for g in gluons:
        assert int(rows[g][12]) == 0 < int(rows["ssd-state-ovl"][12])
        assert int(rows[g][13]) < int(rows["ssd-state-ovl"][13])
    # two warpgroups: as many warps as the Triton loop; with ``TMA_B`` its fp32 boundary states leave
    # by bulk copies from the shared ring (fewer global stores than the register stores' loop)
    assert rows["ssd-state-gluon-wg2"][1] == rows["ssd-state-ovl"][1] == "8"
    assert int(rows["ssd-state-gluon-wg2-tma"][10]) < int(rows["ssd-state-gluon-wg2"][10])
    # the bulk copies of the boundary states (``TMA_B``, the default where few chunks emit one): fewer
    # global stores in the loop than the overlapped loop's (its fp32 states leave by the copy engine)
    assert int(rows["ssd-state-tma"][10]) < int(rows["ssd-state-ovl"][10])


def test_conv_from_a_state_converts_no_layouts_and_spills_nothing():
    """The causal conv1d from an incoming conv state (a resumed call) compiles to the layout
    conversions and barriers of the conv from zeros, and neither spills: read as ``[N, D, W-1]`` on
    every chunk, the state's gather added five conversions, 20 barriers and 1.3 KB of spills a
    program, and a resumed gated-delta layer ran 11-21 % slower per chunk (sessions 20-24)."""
    run = _run("--conv", "--check")
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()[2:] if not line.startswith("#")}
    assert set(rows) == {"conv", "conv-state", "conv-own"}
    assert "layout conversions" in run.stdout
    # a call from zeros runs the binary of a call from a state (``ONE_BINARY``, session 26): the
    # zeros' own straight-line binary had 11 of its loads after the silu's exponentials on triton
    # 3.6 (3 from a state), each one's latency exposed: ~6 ns a token and layer on the H200
    assert rows["conv"][1:] == rows["conv-state"][1:]

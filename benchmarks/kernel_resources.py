"""Registers, spills, shared memory and load pipelining of the gated-delta kernels on Hopper,
without a GPU: each kernel is compiled for sm_90a at the launch configuration the library uses,
and the PTX goes through the ptxas that ships inside the triton wheel.

    python benchmarks/kernel_resources.py [--dtype bf16] [--head-dim 128] [--precision tf32x3] [--check] [--fla] [--no-cache]

Why it exists: the first three-kernel version spilled registers in every kernel (per-element
64-bit address arithmetic, runtime head dims that defeated 16-byte vector loads and hence Triton's
cp.async pipelining). None of that shows in a CPU test, and GPU time is scarce; this shows it in
seconds. ``--check`` exits 1 when a kernel spills or the state kernel's loop is not pipelined
(tests/kernels/test_resources.py runs it). Needs a compiled-mode Triton: TRITON_INTERPRET must be
unset, since the interpreter replaces the kernels by Python functions.

Each kernel's ``ptxas -v`` report and SASS counts are kept beside Triton's own cache (its
``TRITON_CACHE_DIR``, default ``~/.triton/cache``, folder ``kernel-resources``), keyed by the
PTX's bytes, the ptxas / nvdisasm binaries' bytes and this script's own text: a
kernel whose PTX did not change is not assembled and disassembled again (``--no-cache`` does it
all the same; ~0.5 CPU s a kernel, most of it nvdisasm's start). ptxas and nvdisasm are
deterministic, so a cached row is the row they would print; Triton caches its compile the same way.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# parameter name -> Triton type; the pointer element type of the half-precision tensors follows
# --dtype. A kernel parameter missing here is reported (the table must follow the kernels).
HALF_PTRS = {"q", "k", "v", "beta", "w", "u", "w_out", "u_out", "a_out", "a_in", "h_out", "vn_out", "vn", "h", "o"}
FP32_PTRS = {"g", "A_log", "dt_bias", "gc", "gc_out", "gl", "gl_out", "fd", "fd_out", "h0", "ht", "hb", "Z", "P", "sin"}
INT_PTRS = {"chunk_info", "seq_info", "store_slot", "prog", "seg_info", "seq_segs"}
FP32_SCALARS = {"scale"}
# integer arguments the library passes as multiples of 16 at the production shapes (strides of
# [T, heads, dim] tensors, HV = 32): Triton specialises those, so the compile does too
DIV16_INTS = {"skt", "skh", "svt", "svh", "sqt", "sqh", "HV"}
# the SSD (Mamba2) kernels' own (``--ssd``): x / dt / B / C / y and the chunk-start copy in the
# input dtype, the rest fp32; the strides of Nemotron-H 8B's layer (H = 128, P = 64, G = 8, N = 128)
HALF_PTRS |= {"x", "dt", "Bm", "Cm", "y", "hs"}
# the causal conv1d's (``--conv``): weights, inputs, outputs and conv states in the input dtype
HALF_PTRS |= {"wt", "bias", "cs_in", "cs_out", "cb"}
DIV16_INTS |= {"D"}
FP32_PTRS |= {"A", "Dv", "gam_out", "dt_out", "gam", "dtc"}
FP32_SCALARS |= {"dt_min", "dt_max"}
DIV16_INTS |= {"sxt", "sxh", "sdt", "sbt", "sbg", "sct", "scg"}


# constexprs that select code paths rather than shapes; the check compiles the common path
FLAGS = {
    "solve": dict(USE_GATE=False, BETA_SIGMOID=False),
    "wu": dict(BETA_SIGMOID=False),
    "state": dict(WHILE_LOOP=False, STORE_B=True),
    "out": {},
}
NAMES = {"solve": "solve", "wu": "wu", "state": "state", "out": "output"}


#: multiplies of a thread's column substitution in the Gluon solve: the 64 x 64 triangle. Its
#: masked sums over all 64 rows fold to this where the ``-0.0`` terms fold away (about 2400 with
#: the L scaling's and the rest, FFMA and FMUL together, in triton 3.6 and 3.9), and to about
#: twice it where they do not: ``--check`` fails above the bound
GSOLVE_TRIANGLE = 64 * 63 // 2
GSOLVE_MAX_FMUL = 3000


def kernel_specs(dim: int, dtype: str, precision=None):
    """(name, jit function, constexprs, launch options) as ``chunk_gated_delta_rule`` launches
    them for head dims K = V = ``dim`` (from the library's own ``launch_params``), at the
    benchmark's layout (16 key heads, 32 value heads, contiguous keys: the state loop takes head
    counts and key strides as constants). The state loop three times: with boundary stores at
    its default V block ("state"), and at the wide block ``state_wide`` picks when the programs
    fill the GPU, with and without boundary stores ("state-wide", "state-wide-nob")."""
    import torch

    from kernels import chunk_gdn as m

    fns = {"solve": m._solve_kernel, "wu": m._wu_kernel, "state": m._state_kernel, "out": m._output_kernel}
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    layout = dict(HV=32, GROUP=2, skt=16 * dim, skh=dim)
    specs = []

    def split(params: dict) -> tuple[dict, dict]:  # (constexprs, launch options; host-only keys dropped)
        opts = {k: v for k, v in params.items() if k in m.LAUNCH_OPTIONS}
        return {k: v for k, v in params.items() if k not in m.LAUNCH_OPTIONS and k not in m.HOST_KEYS}, opts

    for key, params in m.launch_params(dim, dim, tdtype, precision).items():
        consts, opts = split(params)
        consts = {**consts, **FLAGS[key], **(layout if key == "state" else {})}
        specs.append((NAMES[key], fns[key], {k: v for k, v in consts.items() if k in fns[key].arg_names}, opts))
    consts, opts = split(m.launch_params(dim, dim, tdtype, precision, wide_state=True)["state"])
    consts = {k: v for k, v in consts.items() if k in fns["state"].arg_names}
    for name, store in (("state-wide", True), ("state-wide-nob", False)):
        specs.append((name, fns["state"], {**consts, **FLAGS["state"], **layout, "STORE_B": store}, opts))
    # the Gluon state loop where the library would run it on a Hopper GPU (its own constexprs:
    # no precision, grid or interpreter switches)
    for name, wide, store in (("gluon", False, True), ("gluon-wide", True, True), ("gluon-wide-nob", True, False)):
        params = m.launch_params(dim, dim, tdtype, precision, wide_state=wide, gluon=True)["state"]
        if not params["GLUON"]:
            continue
        consts, opts = split(params)
        gfn = m._gluon_state_kernel
        consts = {k: v for k, v in {**consts, **layout, "STORE_B": store}.items() if k in gfn.arg_names}
        specs.append((name, gfn, consts, opts))
    # the Gluon loop with the output inside its program (``FUSE``, opt-in: kernels.fused_gluon)
    from kernels import fused_gluon

    for name, wide, store in (("fused", False, True), ("fused-wide", True, True), ("fused-wide-nob", True, False)):
        params = m.launch_params(dim, dim, tdtype, precision, wide_state=wide, gluon=True)["state"]
        if not params["GLUON"] or fused_gluon._gluon_fused_kernel is None:
            continue
        consts, opts = split(params)
        ffn = fused_gluon._gluon_fused_kernel
        extra = {**layout, "sqt": 16 * dim, "sqh": dim, "STORE_B": store}
        specs.append((name, ffn, {k: v for k, v in {**consts, **extra}.items() if k in ffn.arg_names}, opts))
    # the Gluon solve where the library would run it (two value heads a program), with the pair
    # sharing a key head (GROUP even: one K K^T) and not (two)
    from kernels import solve_gluon

    for name, pair in (("gsolve", True), ("gsolve-nopair", False)):
        params = m.launch_params(dim, dim, tdtype, precision, wide_state=True, gluon=True)["solve"]
        if not params["GLUON"] or solve_gluon._gluon_solve_kernel is None:
            continue
        consts, opts = split(params)
        sfn = solve_gluon._gluon_solve_kernel
        extra = {**FLAGS["solve"], "PAIR": pair}
        specs.append((name, sfn, {k: v for k, v in {**consts, **extra}.items() if k in sfn.arg_names}, opts))
    # the output kernel overlapped with the Gluon loop (``OVL``), where the library runs it so
    out = m.launch_params(dim, dim, tdtype, precision, wide_state=True, gluon=True)["out"]
    if out["OVL"]:
        consts, opts = split(out)
        specs.append(("output-ovl", fns["out"], consts, opts))
        # ... dropping its scratch's L2 lines after their read (``DISCARD``, opt-in)
        if m.discard_applies(dim, dim, out["BV"], torch.finfo(tdtype).bits):
            specs.append(("output-discard", fns["out"], dict(consts, DISCARD=1), opts))
    # the segmented state pass (opt-in, kernels.chunk_segmented): pass 1 (each segment's
    # zero-start state and transition) at the loop's default and wide V blocks, and the combine
    from kernels import chunk_segmented as seg

    for name, wide in (("seg", False), ("seg-wide", True)):
        consts, opts = split(m.launch_params(dim, dim, tdtype, precision, wide_state=wide)["state"])
        extra = {**layout, "WHILE_LOOP": False}
        sfn = seg._segment_kernel
        specs.append((name, sfn, {k: v for k, v in {**consts, **extra}.items() if k in sfn.arg_names}, opts))
    specs.append(("combine", seg._combine_kernel, seg.combine_constexprs(layout["HV"], dim, dim), seg.COMBINE_OPTIONS))
    return specs


def _signature(fn, consts: dict, dtype: str):
    half = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    sig, attrs = {}, {}
    for i, p in enumerate(fn.params):
        name = p.name
        if name in consts:
            sig[name] = "constexpr"
            continue
        if name == "hb_desc":  # the SSD loop's boundary-state descriptor (``TMA_B``; Gluon's ``TMA``), else None
            if consts.get("TMA"):  # the Gluon loop's: its block carries the shared layout
                from triton.experimental.gluon import language as ttgl

                layout = ttgl.NVMMASharedLayout.get_default_for([consts["P"], consts["N"]], ttgl.float32)
                sig[name] = "tensordesc<fp32[{P},{N}],{layout!r}>".format(layout=layout, **consts)
            elif consts.get("TMA_B"):
                sig[name] = "tensordesc<fp32[{BP},{BN}]>".format(**consts)
            else:
                sig[name], consts = "constexpr", dict(consts, hb_desc=None)
            continue
        if name in HALF_PTRS:
            sig[name] = half
        elif name in FP32_PTRS:
            sig[name] = "*fp32"
        elif name in INT_PTRS:
            sig[name] = "*i32"
        elif name in FP32_SCALARS:
            sig[name] = "fp32"
        elif name in ("GROUP", "l2norm", "has_h0", "use_state", "sgt", "sgh", "sbt", "sbh"):
            sig[name] = "i32"
        elif name in DIV16_INTS:
            sig[name] = "i32"
        else:
            raise SystemExit(
                f"kernel_resources: no type for parameter {name!r} of "
                f"the {fn.fn.__name__} kernel; add it to the tables at the top of this script"
            )
        if sig[name].startswith("*") or name in DIV16_INTS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    cst = {(fn.arg_names.index(n),): v for n, v in consts.items()}
    return sig, cst, attrs


def _sass_counts(cubin_path: str) -> tuple:
    """(SASS instructions, global stores, fp32 multiplies: FFMA and FMUL, global loads scheduled
    after the first exponential: MUFU) of a cubin, from the wheel's ``nvdisasm``; Nones where it is
    missing or fails. The late loads: ptxas interleaves loads with arithmetic in straight-line code,
    each one's latency then exposed (the conv from zeros, session 26)."""
    import triton

    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    if not os.path.exists(exe):
        return None, None, None, None
    run = subprocess.run([exe, "-c", cubin_path], capture_output=True, text=True)
    if run.returncode != 0:
        return None, None, None, None
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", run.stdout)
    heads = [op.split(".")[0] for op in ops]
    first = heads.index("MUFU") if "MUFU" in heads else len(heads)
    late = heads[first:].count("LDG")
    return len(ops), heads.count("STG"), heads.count("FFMA") + heads.count("FMUL"), late


def _ptxas_info(ptx_path: str, out_path: str) -> str:
    """``ptxas -v`` output from the first ptxas in the triton wheel that accepts this PTX (triton
    3.9 writes PTX 9.x, which only its CUDA 13 ``ptxas-blackwell`` reads)."""
    import triton

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    errors = []
    for exe in ("ptxas", "ptxas-blackwell"):
        path = os.path.join(bindir, exe)
        if not os.path.exists(path):
            continue
        run = subprocess.run([path, "-v", "-arch=sm_90a", ptx_path, "-o", out_path], capture_output=True, text=True)
        if run.returncode == 0:
            return run.stderr
        errors.append(f"{exe}: {run.stderr.strip().splitlines()[0] if run.stderr else run.returncode}")
    raise SystemExit(
        f"kernel_resources: no ptxas in the triton wheel could assemble the PTX ({'; '.join(errors) or bindir})"
    )


def measure(name, fn, consts, opts, dtype):
    sig, cst, attrs = _signature(fn, consts, dtype)
    return _compile_stats(name, fn, sig, cst, attrs, opts)


#: False: assemble and disassemble every kernel (``--no-cache``)
USE_CACHE = True
#: bumped when what a cache entry holds changes
_CACHE_VERSION = 2


def _cache_dir() -> str:
    base = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    return os.path.join(base, "kernel-resources")


@functools.lru_cache(maxsize=None)
def _tools_key(bindir: str) -> tuple:
    """What the wheel's ptxas and nvdisasm are: (name, SHA-256 of the binary) each (~0.1 CPU s,
    once a process; by content, so another clone's or venv's copy of the same wheel shares it)."""
    key = []
    for exe in ("ptxas", "ptxas-blackwell", "nvdisasm"):
        path = os.path.join(bindir, exe)
        if os.path.exists(path):
            with open(path, "rb") as f:
                key.append((exe, hashlib.sha256(f.read()).hexdigest()))
    return tuple(key)


def _cache_key(ptx: str, bindir: str) -> str:
    """The PTX, the tools, and this file's own text: a change here (how ptxas runs, how SASS is
    counted) is never answered from entries the old code made."""
    with open(os.path.abspath(__file__), "rb") as f:
        script = hashlib.sha256(f.read()).hexdigest()
    head = json.dumps([_CACHE_VERSION, script, _tools_key(bindir)]).encode()
    return hashlib.sha256(head + b"\0" + ptx.encode()).hexdigest()


def _cache_get(key: str):
    try:
        with open(os.path.join(_cache_dir(), key + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _cache_put(key: str, value) -> None:
    """Written to a temporary file renamed into place (two processes filling one entry is safe);
    an unwritable cache folder is not an error."""
    folder = _cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, os.path.join(folder, key + ".json"))
    except OSError:
        pass


def _assembled(name: str, ptx: str) -> tuple[str, tuple]:
    """(``ptxas -v`` report, SASS counts) of a kernel's PTX, from the cache where it holds them."""
    import triton

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    key = _cache_key(ptx, bindir) if USE_CACHE else None
    if key and (hit := _cache_get(key)) is not None:
        return hit[0], tuple(hit[1])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = _ptxas_info(path, os.path.join(tmp, "o"))
        counts = _sass_counts(os.path.join(tmp, "o"))
    if key and None not in counts:  # a missing or failing nvdisasm is asked again next time
        _cache_put(key, [out, list(counts)])
    return out, counts


#: FLA 0.6.0's state loop (``chunk_gated_delta_rule_fwd_kernel_h_blockdim64``), compiled beside ours
#: at the configurations its autotuner chooses among on Hopper (BV 32 / 64, 2 / 4 warps, 2-4 stages)
FLA_CONFIGS = ((32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3))


def fla_specs(dim: int, dtype: str):
    """(name, jit function, signature, constexprs, attrs, launch options) of FLA's state loop for
    qwen3.5-9b's heads (H 16, HV 32), fixed length, gate on, initial and final state, v' kept;
    None where FLA is not importable."""
    try:
        from fla.ops.common import chunk_delta_h
    except Exception as exc:  # noqa: BLE001 - not installed, or its import fails here
        print(f"# FLA not importable ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None
    fn = chunk_delta_h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64
    while type(fn).__name__ != "JITFunction":  # through @heuristics / @autotune
        fn = fn.fn
    half = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    specs = []
    for bv, warps, stages in FLA_CONFIGS:
        consts = dict(
            gk=None,
            cu_seqlens=None,
            chunk_offsets=None,
            H=16,
            HV=32,
            K=dim,
            V=dim,
            BT=64,
            BV=bv,
            USE_G=True,
            USE_GK=False,
            USE_INITIAL_STATE=True,
            STORE_FINAL_STATE=True,
            SAVE_NEW_VALUE=True,
            STATE_V_FIRST=False,
            IS_VARLEN=False,
        )
        sig, attrs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name in consts:
                sig[name] = "constexpr"
            elif name in ("k", "v", "w", "v_new", "h"):
                sig[name] = half
            elif name in ("g", "h0", "ht"):
                sig[name] = "*fp32"
            else:
                sig[name] = "i32"
            if sig[name].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        cst = {(fn.arg_names.index(n),): v for n, v in consts.items()}
        specs.append((f"FLA h BV{bv}", fn, sig, cst, attrs, dict(num_warps=warps, num_stages=stages)))
    return specs


def _compile_stats(name, fn, sig, cst, attrs, opts):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    src = ASTSource(fn=fn, signature=sig, constexprs=cst, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(opts))
    ptx = compiled.asm["ptx"]
    out, (sass, stores, fmul, late) = _assembled(name, ptx)
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return dict(
        kernel=name,
        warps=opts.get("num_warps"),
        stages=opts.get("num_stages"),
        registers=regs,
        spill_stores=int(spill.group(1)),
        spill_loads=int(spill.group(2)),
        shared_kb=compiled.metadata.shared / 1024,
        cp_async=ptx.count("cp.async.cg"),
        wgmma=ptx.count("wgmma.mma_async"),
        mma_sync=ptx.count("mma.sync"),
        sass=sass,
        stores=stores,
        fmul=fmul,
        late_loads=late,
        # the overlapped output's handshake (``OVL``): the loop's launch trigger and releases, the
        # output's acquires and its wait for the loop's completion
        # L2 lines dropped unwritten (the SSD output's ``DISCARD``)
        discards=ptx.count("discard.global.L2"),
        # register-layout conversions (through shared memory) and CTA barriers (the conv kernel's
        # path with an incoming state must add none: ``--conv``)
        converts=compiled.asm["ttgir"].count("ttg.convert_layout"),
        barriers=ptx.count("bar.sync"),
        # bulk tensor copies out of shared memory (the SSD loop's ``TMA_B`` boundary states)
        tma_stores=len(re.findall(r"\bcp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        handshake=dict(
            launch=ptx.count("griddepcontrol.launch_dependents"),
            wait=ptx.count("griddepcontrol.wait"),
            release=len(re.findall(r"\batom\.[\w.]*release", ptx)),
            acquire=len(re.findall(r"\bld\.[\w.]*acquire|\batom\.[\w.]*acquire", ptx)),
        ),
    )


def _row(r: dict) -> str:
    def n(x):
        return "-" if x is None else str(x)

    return (
        f"{r['kernel']:>8} {r['warps']:>5} {r['stages']:>6} {r['registers']:>5} "
        f"{r['spill_stores']:>6}/{r['spill_loads']:<7} {r['shared_kb']:>8.1f} "
        f"{r['cp_async']:>8} {r['wgmma']:>6} {r['mma_sync']:>8} {n(r['sass']):>6} {n(r['stores']):>6}"
        f" {n(r['fmul']):>6} {r['converts']:>5} {r['barriers']:>4} {n(r['late_loads']):>5}"
    )


#: Nemotron-H 8B's Mamba2 layer, the shape ``--ssd`` compiles the SSD kernels at
SSD_SHAPE = dict(H=128, P=64, N=128, G=8)


def ssd_specs(dtype: str):
    """(name, jit function, constexprs, launch options) of the SSD kernels as ``chunk_ssd``
    launches them (``kernels.ssd.SSD_CONFIGS``) at ``SSD_SHAPE`` with the fp32 state at every
    boundary: the dt / gamma kernel, the state loop and the output kernel, each where the output
    runs after the loop ("ssd-state", "ssd-output") and, for 16-bit inputs, beside it on Hopper
    ("ssd-state-ovl", "ssd-output-ovl": the loop's releases, the output's acquires)."""
    import triton
    import triton.language as tl

    from kernels import ssd, ssd_fused_gluon, ssd_gluon

    H, P, N, G = (SSD_SHAPE[k] for k in "HPNG")
    f32 = dtype == "fp32"
    dot = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}[dtype]
    prec = ssd.FP32_PRECISION if f32 else "tf32"
    base = dict(H=H, GROUP=H // G, P=P, N=N, BN=N)
    opts_keys = ("num_warps", "num_stages")
    specs = []
    for suffix, overlaps in (("", False), ("-ovl", True)):
        if overlaps and f32:
            continue
        cfg = ssd._config("state", f32, overlaps)
        ovl = bool(cfg["OVL"]) and bool(cfg["PREP"]) and overlaps
        nps = triton.cdiv(P, cfg["BP"])
        consts = dict(
            base, BP=cfg["BP"], HAS_BIAS=True, SOFTPLUS=True, CLAMP=False, STORE_B=True, DOT=dot, PREC=prec,
            WHILE_LOOP=False, FUSE=bool(cfg["FUSE"]), HAS_D=True, D_PER_P=False, PREP=bool(cfg["PREP"]), OVL=ovl,
            SIG=cfg["SIG"], NPS=nps, sdh=1, TMA_B=cfg["TMA_B"] == ssd.TMA_ALWAYS and cfg["BP"] == P and overlaps,
        )  # fmt: skip
        specs.append((f"ssd-state{suffix}", ssd._ssd_state_kernel, consts, {k: cfg[k] for k in opts_keys}))
        if overlaps and not consts["TMA_B"] and cfg["BP"] == P:
            # the boundary states by bulk tensor copies (``TMA_B``: the default where at most one chunk
            # in ``ssd.TMA_SPARSE_CHUNKS`` emits a state, ``TMA_SPARSE``): no layout conversion
            specs.append(
                ("ssd-state-tma", ssd._ssd_state_kernel, dict(consts, TMA_B=True), {k: cfg[k] for k in opts_keys})
            )
        if not suffix:
            prep = dict(H=H, HAS_BIAS=True, SOFTPLUS=True, CLAMP=False, OVL=False, NPS=nps, sdh=1)
            specs.append(("ssd-prep", ssd._ssd_prep_kernel, prep, dict(num_warps=4, num_stages=3)))  # the defaults
        if overlaps and ssd_gluon.applies(P, N, 16, bool(cfg["PREP"])):
            # the Gluon loop (``GLUON``, kernels.ssd_gluon): both state stores from the accumulator
            gconsts = dict(H=H, GROUP=H // G, P=P, N=N, STORE_B=True, OVL=ovl, SIG=cfg["SIG"])
            # one warpgroup a program ("ssd-state-gluon"), two ("-wg2"); the boundary states by bulk
            # copies from a ring of shared buffers ("-tma")
            for wg, tma in ((1, False), (2, False), (2, True)):
                specs.append(
                    (
                        "ssd-state-gluon" + ("" if wg == 1 else f"-wg{wg}") + ("-tma" if tma else ""),
                        ssd_gluon._gluon_ssd_state_kernel, dict(gconsts, WG=wg, TMA=tma),
                        dict(num_warps=4 * wg, num_stages=1),
                    )
                )  # fmt: skip
            # the loop and its output in one warp-specialised program (``WS``, kernels.ssd_fused_gluon)
            fconsts = dict(H=H, GROUP=H // G, P=P, N=N, STORE_B=True, HAS_D=True, D_PER_P=False)
            specs.append(
                ("ssd-fused-gluon", ssd_fused_gluon._gluon_ssd_fused_kernel, fconsts, dict(num_warps=4, num_stages=1))
            )
        out = ssd._config("out", f32)
        oconsts = dict(
            base, BP=out["BP"], HAS_D=True, D_PER_P=False, DOT=dot, PREC=prec, OVL=ovl, NPS=nps,
            NPO=triton.cdiv(P, out["BP"]), DISCARD=False, LINES=1,
        )  # fmt: skip
        oopts = {k: out[k] for k in opts_keys} | ({"launch_pdl": True} if ovl else {})
        specs.append((f"ssd-output{suffix}", ssd._ssd_output_kernel, oconsts, oopts))
        lines = ssd._whole_lines(P * N * (4 if f32 else 2))
        if overlaps and oconsts["NPO"] == 1 and lines:
            # the chunk-start copy's L2 lines dropped after their one reader (``DISCARD``, opt-in)
            dconsts = dict(oconsts, DISCARD=True, LINES=lines)
            specs.append(("ssd-output-discard", ssd._ssd_output_kernel, dconsts, oopts))
    return specs


#: the replay's gated-delta conv (qwen3-next's conv_dim 8192 = 2 x 16 x 128 + 32 x 128, width 4)
CONV_SHAPE = dict(W=4)


def conv_specs(dtype: str):
    """(name, jit function, constexprs, launch options) of the causal conv1d kernel as
    ``kernels.conv.causal_conv1d`` launches it (``CONV_CONFIG``), silu, no bias, the boundary
    windows kept: from zeros ("conv": with ``ONE_BINARY`` the binary of a call from a state),
    from an incoming conv state ("conv-state", a resumed call), whose extra reads must add no
    layout conversion or barrier, and the zeros' own binary ("conv-own", ``ONE_BINARY=0``), whose
    straight-line code ptxas schedules with loads after the exponentials (``late``): the launched
    conv from zeros must have no more late loads than the conv from a state (``--check``)."""
    from kernels import conv

    cfg = dict(conv.CONV_CONFIG)
    one = bool(cfg.pop("ONE_BINARY"))
    opts = {"num_warps": cfg.pop("num_warps"), "num_stages": 3}  # the launch leaves Triton's default
    base = dict(W=CONV_SHAPE["W"], HAS_BIAS=False, SILU=True, STORE_B=True, **cfg)
    return [
        ("conv", conv._conv_kernel, dict(base, HAS_STATE=one), opts),
        ("conv-state", conv._conv_kernel, dict(base, HAS_STATE=True), opts),
        ("conv-own", conv._conv_kernel, dict(base, HAS_STATE=False), opts),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument(
        "--precision",
        choices=["ieee", "tf32", "tf32x3"],
        default=None,
        help="fp32 inputs' matrix products (default: the library's, tf32x3)",
    )
    ap.add_argument("--check", action="store_true", help="exit 1 on spills or an unpipelined state loop")
    ap.add_argument(
        "--fla", action="store_true", help="also compile FLA's state loop at its Hopper configs (needs fla-core)"
    )
    ap.add_argument("--no-cache", action="store_true", help="assemble and disassemble every kernel, cached or not")
    ap.add_argument(
        "--ssd",
        action="store_true",
        help="the SSD (Mamba2) kernels instead, at Nemotron-H 8B's layer (--head-dim unused)",
    )
    ap.add_argument(
        "--conv",
        action="store_true",
        help="the causal conv1d kernel instead, from zeros and from a conv state (--head-dim unused)",
    )
    args = ap.parse_args(argv)
    global USE_CACHE
    USE_CACHE = not args.no_cache
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("kernel_resources: unset TRITON_INTERPRET (it needs compiled-mode Triton)", file=sys.stderr)
        return 2
    try:
        import triton
    except ImportError:
        print("needs triton: pip install 'marconi-sim[kernels]'", file=sys.stderr)
        return 2
    from kernels import chunk_gdn

    prec = (args.precision or chunk_gdn.FP32_PRECISION) if args.dtype == "fp32" else "tf32"
    shape = "SSD H = {H}, P = {P}, N = {N}, G = {G}".format(**SSD_SHAPE) if args.ssd else f"K = V = {args.head_dim}"
    print(f"# sm_90a, triton {triton.__version__}, {args.dtype} ({prec} products), {shape}")
    print(
        f"{'kernel':>8} {'warps':>5} {'stages':>6} {'regs':>5} {'spill st/ld B':>14} "
        f"{'smem KB':>8} {'cp.async':>8} {'wgmma':>6} {'mma.sync':>8} {'sass':>6} {'stores':>6} {'fmul':>6}"
        f" {'conv':>5} {'bar':>4} {'late':>5}"
    )
    bad = []
    if args.conv:
        specs = conv_specs(args.dtype)
    elif args.ssd:
        specs = ssd_specs(args.dtype)
    else:
        specs = kernel_specs(args.head_dim, args.dtype, args.precision)
    got = {}
    for name, fn, consts, opts in specs:
        r = measure(name, fn, consts, opts, args.dtype)
        got[name] = r
        print(_row(r))
        if r["spill_stores"] or r["spill_loads"]:
            bad.append(f"{name} spills {r['spill_stores']} B")
        if name.startswith(("state", "gluon", "fused", "ssd-state")) and r["cp_async"] == 0:
            bad.append(f"the state kernel's loads are not pipelined (no cp.async): {name}")
        if name.startswith("gsolve") and r["fmul"] is not None and r["fmul"] > GSOLVE_MAX_FMUL:
            # the substitution's masked sums no longer fold to the triangle's multiply-adds
            bad.append(f"the Gluon solve runs {r['fmul']} fp32 multiplies (the triangle is {GSOLVE_TRIANGLE}): {name}")
        if consts.get("DISCARD") and not r["discards"]:
            bad.append(f"the output drops no L2 line: {name}")
        if name.startswith("ssd-state-gluon") and r["converts"]:
            bad.append(f"the Gluon SSD loop converts {r['converts']} layouts (it stores from the accumulator)")
        if (consts.get("TMA_B") or consts.get("TMA")) and not r["tma_stores"]:
            bad.append(f"the boundary states go out by no bulk tensor copy: {name}")
        hs = r["handshake"]
        if consts.get("OVL") and name.startswith(("gluon", "ssd-state")) and not (hs["launch"] and hs["release"]):
            bad.append(f"the overlapped loop releases no progress: {name} {hs}")
        if consts.get("OVL") and name.startswith(("output", "ssd-output")) and not (hs["acquire"] and hs["wait"]):
            bad.append(f"the overlapped output acquires no progress: {name} {hs}")
    if "conv-state" in got:
        plain, resumed = got["conv"], got["conv-state"]
        print(f"# conv layout conversions {plain['converts']} / {resumed['converts']}, barriers {plain['barriers']} / "
              f"{resumed['barriers']} (from zeros / from a state)")  # fmt: skip
        if (resumed["converts"], resumed["barriers"]) > (plain["converts"], plain["barriers"]):
            bad.append("the conv from a state converts layouts the conv from zeros does not (every chunk pays it)")
        if None not in (plain["late_loads"], resumed["late_loads"]) and plain["late_loads"] > resumed["late_loads"]:
            bad.append(
                f"the conv from zeros schedules {plain['late_loads']} loads after its exponentials, the conv from a "
                f"state {resumed['late_loads']} (their latency exposed on every chunk)"
            )
    if args.fla:
        for name, fn, sig, cst, attrs, opts in fla_specs(args.head_dim, args.dtype) or []:
            r = _compile_stats(name, fn, sig, cst, attrs, opts)
            print(_row(r))
    if bad and args.check:
        print("check failed: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

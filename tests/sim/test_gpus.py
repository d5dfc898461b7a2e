"""The GPU catalogue (sim/gpus.py), --gpu and --tensor-parallel (sim.cost.default_timing,
group_spec; docs/cost-model.md §5): defaults unchanged, the calibrated device used as is, other
devices scaled by their datasheets and said 'uncalibrated for GPU', tensor-parallel bytes, FLOPs
and the all-reduce priced by hand."""

import json

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.config import SimConfig
from sim.cost import HardwareTiming, default_timing, get_model, group_spec, model_for, timing_note
from sim.errors import UsageError
from sim.gpus import ALLREDUCE_LATENCY_S, GPUS, allreduce_s, get_gpu


def test_catalogue_entries_are_sane_and_cited():
    for g in GPUS.values():
        assert g.source and 50 < g.bf16_tflops < 5000 and g.memory_bytes >= 24 * 10**9
        assert g.hbm_bytes_per_s > 5e11 and g.link_bytes_per_s > 0
    assert get_gpu("H200").memory_bytes == 141 * 2**30 and get_gpu("a100-40gb").hbm_bytes_per_s == 1.555e12
    with pytest.raises(UsageError, match="unknown GPU 'tpu'"):
        get_gpu("tpu")


def test_allreduce_by_hand():
    g = get_gpu("h100")  # 900 GB/s both ways: 450 GB/s each way
    assert allreduce_s(g, 1e6, 1) == 0.0
    assert allreduce_s(g, 1e6, 4) == pytest.approx(ALLREDUCE_LATENCY_S + 2 * 3 / 4 * 1e6 / 450e9)


@pytest.mark.parametrize("name", ["marconi-7b", "qwen3.5-9b", "qwen3-next-80b-a3b", "nemotron-h-8b"])
def test_no_gpu_no_tp_is_the_old_default(name):
    t = default_timing(name)
    assert t.comm_ms_per_token == 0 and t.comm_ms_per_call == 0 and not t.uncalibrated
    assert timing_note(t) == ""


def test_the_calibrated_device_is_used_as_is():
    base, on_h200 = default_timing("qwen3.5-9b"), default_timing("qwen3.5-9b", "h200", 1)
    assert isinstance(on_h200, HardwareTiming) and on_h200.ms_per_tflop == base.ms_per_tflop
    assert not on_h200.uncalibrated and on_h200.device == "h200"
    spec = get_model("qwen3.5-9b")
    assert on_h200.prefill_time_s(spec, 0, 4096) == pytest.approx(base.prefill_time_s(spec, 0, 4096))


def test_another_device_is_scaled_by_its_datasheet_and_says_so():
    h200, b200 = default_timing("qwen3.5-9b", "h200", 1), default_timing("qwen3.5-9b", "b200", 1)
    assert b200.uncalibrated and timing_note(b200) == "uncalibrated for GPU b200"
    for k, v in h200.ms_per_tflop.items():  # the same fraction of a higher peak
        assert b200.ms_per_tflop[k] == pytest.approx(v * 989 / 2250)
    for k, v in h200.layer_call_ms.items():  # weights read at the bandwidth ratio
        assert b200.layer_call_ms[k] == pytest.approx(v * 4.8 / 7.7)
    assert b200.layer_floor_ms == h200.layer_floor_ms  # the host is the host
    assert b200.decode_ms_per_token == pytest.approx(h200.decode_ms_per_token * 4.8 / 7.7)
    assert b200.fraction_of_peak() == pytest.approx(h200.fraction_of_peak())
    # the paper's A100 fit prices the 7B presets on the paper's GPU; any other GPU gets the
    # calibrated hardware model, as the other presets (session 24: replayed on an H100,
    # marconi-7b's prefills were 5-6 % from it and 24-1,200 % from the paper's fit carried there)
    a, a40 = default_timing("marconi-7b"), default_timing("marconi-7b", "a100-40gb", 1)
    assert type(a40) is type(a) and a40.effective_tflops == a.effective_tflops
    assert a40.decode_ms_per_token == a.decode_ms_per_token and not a40.uncalibrated
    for seven in ("marconi-7b", "llama-7b"):
        h = default_timing(seven, "h100", 1)
        assert isinstance(h, HardwareTiming) and h.device == "h100" and not h.uncalibrated
        assert h.ms_per_tflop == default_timing("nemotron-h-8b", "h100", 1).ms_per_tflop
        b = default_timing(seven, "b200", 1)  # no B200 file: the H200's scaled, and said
        assert b.uncalibrated and b.ms_per_tflop == b200.ms_per_tflop


def test_group_spec_replicates_kv_heads_fewer_than_the_group():
    q = get_model("qwen3-next-80b-a3b")  # 2 KV heads, 16 attention heads, Hk 16, Hv 32
    assert group_spec(q, 2) == q  # split evenly: group totals unchanged
    g8 = group_spec(q, 8)  # each of 8 GPUs keeps one of the 2 KV heads: 4x the KV bytes
    assert g8.kv_bytes_per_token() == 4 * q.kv_bytes_per_token()
    assert g8.state_bytes() == q.state_bytes()
    n = get_model("granite-4.0-h-small")  # 1 Mamba group: replicated on each GPU
    g4 = group_spec(n, 4)
    assert g4.mamba_n_groups == 4 and g4.state_bytes() > n.state_bytes()
    with pytest.raises(UsageError, match="--tensor-parallel 3 does not divide the 16 attention heads"):
        group_spec(q, 3)


def test_tensor_parallel_timing_by_hand():
    spec = get_model("nemotron-h-8b")
    one, four = default_timing("nemotron-h-8b", "h200", 1), default_timing("nemotron-h-8b", "h200", 4)
    assert four.gpus == 4 and one.gpus == 1
    blocks = 4 + 24 + 24
    link = 900e9 / 2
    per_token = blocks * 2 * 3 / 4 * 4096 * 2 / link
    assert four.comm_ms_per_token == pytest.approx(per_token * 1e3)
    assert four.comm_ms_per_call == pytest.approx(blocks * ALLREDUCE_LATENCY_S * 1e3)
    # prefill: the group's compute / 4, then the all-reduces of 4096 tokens and one call
    no_comm = HardwareTiming(**{**_fields(four), "comm_ms_per_token": 0.0, "comm_ms_per_call": 0.0})
    want = no_comm.prefill_time_s(spec, 0, 4096) + (4096 * per_token + blocks * ALLREDUCE_LATENCY_S)
    assert four.prefill_time_s(spec, 0, 4096) == pytest.approx(want)
    assert four.prefill_time_s(spec, 0, 8192) < one.prefill_time_s(spec, 0, 8192)


def _fields(t):
    import dataclasses

    return {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.init}


def test_simconfig_validates_gpu_and_tp():
    with pytest.raises(UsageError, match="--gpu must be"):
        SimConfig(gpu="tpu").validate()
    with pytest.raises(UsageError, match="--tensor-parallel must be"):
        SimConfig(tensor_parallel=-1).validate()
    cfg = SimConfig(model="qwen3-next-80b-a3b", tensor_parallel=8)
    assert model_for(cfg).kv_bytes_per_token() == 4 * get_model("qwen3-next-80b-a3b").kv_bytes_per_token()


def test_cli_run_says_uncalibrated_in_header_and_summary(tmp_path):
    args = ["run", "--trace", "synthetic:chat", "--sessions", "2", "--no-progress", "--policy", "marconi"]
    r = CliRunner().invoke(main, [*args, "--model", "nemotron-h-8b", "--gpu", "l40s", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "uncalibrated for GPU l40s" in r.output.splitlines()[0]
    (row,) = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert row["gpu"] == "l40s" and row["timing_note"] == "uncalibrated for GPU l40s" and row["timing_device"] == "l40s"
    r = CliRunner().invoke(main, [*args, "--model", "nemotron-h-8b", "--gpu", "h200"])
    assert r.exit_code == 0 and "uncalibrated" not in r.output
    r = CliRunner().invoke(main, [*args, "--model", "qwen3-next-80b-a3b", "--tensor-parallel", "3"])
    assert r.exit_code == 2 and "does not divide" in r.output and "Traceback" not in r.output


def test_a_calibrated_timing_file_records_its_device(tmp_path):
    from sim.cost import read_timing_file
    from sim.gpus import catalogue_name
    from sim.replay.measure import write_timing

    assert catalogue_name("NVIDIA H200") == "h200" and catalogue_name("NVIDIA A100-SXM4-40GB") == "a100-40gb"
    assert catalogue_name("NVIDIA H100 PCIe") == "h100-pcie" and catalogue_name("cpu") == ""
    t = default_timing("qwen3.5-9b")
    write_timing(tmp_path / "t.json", t, get_model("qwen3.5-9b"), {"device": "NVIDIA H100 80GB HBM3"})
    d = json.loads((tmp_path / "t.json").read_text())
    back = read_timing_file(tmp_path / "t.json")
    assert back.device == "h100" and back.ms_per_tflop == t.ms_per_tflop
    assert d["model"] == "qwen3.5-9b"


def test_a_timing_file_of_another_device_than_gpu_is_refused(tmp_path):
    from sim.replay.measure import write_timing
    from traces.registry import load_trace

    path = tmp_path / "t.json"
    write_timing(path, default_timing("qwen3.5-9b"), get_model("qwen3.5-9b"), {"device": "NVIDIA H200"})
    trace = load_trace("synthetic:chat:sessions=1,turns=2")
    from sim.simulate import simulate

    with pytest.raises(UsageError, match="calibrated on h200, not --gpu h100"):
        simulate(trace, SimConfig(model="qwen3.5-9b", timing_file=str(path), gpu="h100"))
    assert simulate(trace, SimConfig(model="qwen3.5-9b", timing_file=str(path), gpu="h200")).summary.requests == 2


def test_nvl_and_gh200_are_their_own_entries_and_uncalibrated():
    """torch's "NVIDIA H100 NVL", "NVIDIA H200 NVL" and "NVIDIA GH200 ..." were read as the SXM
    entries (a replay on an H100 NVL compared with the H100 SXM calibration as calibrated), while
    --gpu h100-nvl was refused. The datasheets: H100 NVL 94GB at 3.9 TB/s, H200 NVL 141GB at
    4.8 TB/s, both 1,671 TFLOPS bf16 with sparsity (835 dense); GH200 96GB HBM3 at 4 TB/s or 144GB
    HBM3e at 4.9 TB/s, 990 TFLOPS."""
    from sim.gpus import catalogue_name

    names = {
        "NVIDIA H100 NVL": "h100-nvl",
        "NVIDIA H200 NVL": "h200-nvl",
        "NVIDIA GH200 480GB": "gh200",
        "NVIDIA GH200 144G HBM3e": "gh200-144gb",
        "NVIDIA H100 80GB HBM3": "h100",
        "NVIDIA H200": "h200",
    }
    assert {n: catalogue_name(n) for n in names} == names
    figures = {
        g: (GPUS[g].bf16_tflops, GPUS[g].memory_bytes / 2**30, GPUS[g].hbm_bytes_per_s / 1e12) for g in names.values()
    }
    assert figures["h100-nvl"] == (835.0, 94, 3.9) and figures["h200-nvl"] == (835.0, 141, 4.8)
    assert figures["gh200"] == (990.0, 96, 4.0) and figures["gh200-144gb"] == (990.0, 144, 4.9)
    for spelling in ("h100-nvl", "H100 NVL", "NVIDIA H100 NVL 94GB"):
        assert get_gpu(spelling).name == "h100-nvl"
    assert get_gpu("NVIDIA GH200 480GB").name == "gh200" and get_gpu("gh200 144gb").name == "gh200-144gb"
    # no calibration of their own: the H200's, scaled by the datasheets (prefill at 989 / 835 of its time)
    for gpu in ("h100-nvl", "h200-nvl", "gh200", "gh200-144gb"):
        t = default_timing("qwen3.5-9b", gpu=gpu, tensor_parallel=1)
        assert t.uncalibrated and t.device == gpu and f"uncalibrated for GPU {gpu}" in t.source
    # a replay on an H100 NVL compares with that scaled timing and says so (it took the H100 SXM
    # calibration as this GPU's, with no note)
    from sim.replay.calibration import replay_timing

    t, note = replay_timing(None, get_model("qwen3.5-9b"), "bf16", "cuda", "NVIDIA H100 NVL")
    assert t.device == "h100-nvl" and note.startswith("uncalibrated for GPU h100-nvl: the h200 calibration scaled")
    assert replay_timing(None, get_model("qwen3.5-9b"), "bf16", "cuda", "NVIDIA H100 80GB HBM3")[1] == ""


def test_a_replay_s_peak_is_its_catalogue_entry_s():
    """The fit's ceiling on an H100 NVL was the SXM's 989 TFLOP/s (the name fragment "H100"); a
    device the catalogue knows takes its bf16 / fp16 figure, fp32 its PEAKS row as before."""
    from sim.replay.measure import device_peak

    assert device_peak("NVIDIA H100 NVL", "bf16") == device_peak("NVIDIA H200 NVL", "fp16") == 835.0
    assert device_peak("NVIDIA H100 PCIe", "bf16") == 756.0 and device_peak("NVIDIA GH200 480GB", "bf16") == 990.0
    assert device_peak("NVIDIA H100 80GB HBM3", "bf16") == device_peak("NVIDIA H200", "bf16") == 989.0
    assert device_peak("NVIDIA H100 NVL", "fp32") == 67.0 and device_peak("NVIDIA H200", "fp8") == 0.0


@pytest.mark.parametrize("gpu", ["a100", "l40s", "h20", "b200"])
def test_a_timing_carried_to_another_gpu_moves_every_byte_at_its_memorys_rate(gpu):
    """``scale_timing`` (an uncalibrated GPU priced from the H200 file): the per-layer call time,
    decode and every per-GB term (weights read, activations written, keys and values read) at the
    memory-bandwidth ratio, so a GB of weights takes at least the GPU's datasheet time (session
    27 review: the weights were read at the H200's 4.8 TB/s on an A100's 2.0 and an L40S's 0.86)."""
    from sim.cost import default_timing

    t = default_timing("qwen3.5-9b", gpu=gpu, tensor_parallel=1)
    home = default_timing("qwen3.5-9b", gpu="h200", tensor_parallel=1)
    assert t.uncalibrated and not home.uncalibrated
    bw = get_gpu("h200").hbm_bytes_per_s / get_gpu(gpu).hbm_bytes_per_s
    for k in ("attention", "gated_delta", "mlp"):
        assert t.layer_call_ms[k] == pytest.approx(home.layer_call_ms[k] * bw)
        assert t.ms_per_weight_gb[k] == pytest.approx(home.ms_per_weight_gb[k] * bw)
        assert t.ms_per_act_gb[k] == pytest.approx(home.ms_per_act_gb[k] * bw)
        assert t.ms_per_weight_gb[k] >= 1e12 / get_gpu(gpu).hbm_bytes_per_s * (1 - 1e-12)
    assert t.ms_per_kv_gb == pytest.approx(home.ms_per_kv_gb * bw)

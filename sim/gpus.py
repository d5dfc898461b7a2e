"""The GPU catalogue behind ``--gpu``: datasheet figures of the accelerators hybrid models are served
on, one frozen entry each with the datasheet it comes from (docs/cost-model.md §5).

Figures are per GPU: dense (no sparsity) bf16 / fp16 tensor throughput, memory, memory bandwidth,
and the GPU-to-GPU link's total bandwidth (both directions, as datasheets quote it; an all-reduce
moves data at half of it each way). Where a calibrated timing file exists for a device
(``sim/data/<name>-timing.json``, which records its device) ``sim.cost`` uses it; elsewhere it
scales the calibrated hardware model by these figures and says "uncalibrated for GPU".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sim.errors import UsageError


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_tflops: float  # dense bf16 / fp16 tensor-core peak, TFLOP/s
    memory_bytes: int
    hbm_bytes_per_s: float  # memory bandwidth
    link_bytes_per_s: float  # NVLink / Infinity Fabric / PCIe total per GPU, both directions
    source: str


GB = 10**9
TB = 10**12

GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("a100-40gb", 312.0, 40 * GB, 1.555 * TB, 600 * GB, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB)"),
        GPU("a100", 312.0, 80 * GB, 2.039 * TB, 600 * GB, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)"),
        GPU("h100", 989.0, 80 * GB, 3.35 * TB, 900 * GB, "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"),
        GPU("h100-pcie", 756.0, 80 * GB, 2.0 * TB, 600 * GB, "NVIDIA H100 datasheet (PCIe; NVLink bridge)"),
        GPU(
            "h100-nvl",
            835.0,
            94 * GB,
            3.9 * TB,
            600 * GB,
            "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL: 1,671 TFLOPS bf16 with sparsity; NVLink bridge)",
        ),
        GPU("h20", 148.0, 96 * GB, 4.0 * TB, 900 * GB, "NVIDIA H20 product brief (SXM)"),
        GPU("h200", 989.0, 141 * GB, 4.8 * TB, 900 * GB, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
        GPU(
            "h200-nvl",
            835.0,
            141 * GB,
            4.8 * TB,
            900 * GB,
            "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL: 1,671 TFLOPS bf16 with sparsity; NVLink bridge)",
        ),
        GPU("gh200", 990.0, 96 * GB, 4.0 * TB, 900 * GB, "NVIDIA GH200 Grace Hopper Superchip datasheet (96GB HBM3)"),
        GPU(
            "gh200-144gb",
            990.0,
            144 * GB,
            4.9 * TB,
            900 * GB,
            "NVIDIA GH200 Grace Hopper Superchip datasheet (144GB HBM3e)",
        ),
        GPU("b200", 2250.0, 180 * GB, 7.7 * TB, 1800 * GB, "NVIDIA HGX B200 datasheet (per GPU of 8)"),
        GPU("l40s", 362.0, 48 * GB, 0.864 * TB, 64 * GB, "NVIDIA L40S datasheet (no NVLink: PCIe Gen4 x16)"),
        GPU("mi300x", 1307.0, 192 * GB, 5.3 * TB, 896 * GB, "AMD Instinct MI300X datasheet (Infinity Fabric)"),
    )
}


def canonical_gpu(name: str) -> str:
    """The catalogue name of a GPU as people spell it: any case, spaces or underscores for dashes,
    a vendor prefix, the SXM form factor, the memory type, or the memory the entry has
    ("NVIDIA H100 SXM5 80GB", "h100_sxm", "A100-80GB", "nvidia-h200" -> h100, h100, a100, h200);
    a spelling of no entry comes back lowercased, for the caller to refuse."""
    s = re.sub(r"[\s_]+", "-", str(name).strip().lower())
    s = re.sub(r"^(nvidia|amd)-(instinct-)?", "", s)
    s = {"gh200-480gb": "gh200"}.get(s, s)  # nvidia-smi's name of it: 480GB is the Grace CPU's memory
    if s in GPUS:
        return s
    s = re.sub(r"-(sxm\d*|hbm\d*e?)(?=-|$)", "", s)  # the usual form factor, the memory's kind
    m = re.fullmatch(r"(.+?)-?(\d+)gb", s)
    if m and f"{m[1]}-{m[2]}gb" in GPUS:
        return f"{m[1]}-{m[2]}gb"
    if m and m[1] in GPUS and GPUS[m[1]].memory_bytes == int(m[2]) * GB:
        return m[1]  # the memory the entry has: another name of it
    return s if s in GPUS else str(name).strip().lower()


def get_gpu(name: str) -> GPU:
    try:
        return GPUS[canonical_gpu(name)]
    except KeyError:
        raise UsageError(f"unknown GPU {name!r}; valid: {', '.join(GPUS)}") from None


ALLREDUCE_LATENCY_S = 10e-6  # one small NCCL all-reduce within a node (estimate, docs/cost-model.md §5)


def allreduce_s(gpu: GPU, nbytes: float, tp: int) -> float:
    """A ring all-reduce of ``nbytes`` over ``tp`` GPUs: each GPU sends and receives
    2 (tp - 1) / tp of the buffer at half its link's total bandwidth, plus a fixed latency."""
    if tp <= 1:
        return 0.0
    return ALLREDUCE_LATENCY_S + 2 * (tp - 1) / tp * nbytes / (gpu.link_bytes_per_s / 2)


_CUDA_NAMES = (  # fragment of torch.cuda.get_device_name -> catalogue name, most specific first
    ("H100 PCIe", "h100-pcie"),
    ("H100 NVL", "h100-nvl"),
    ("H200 NVL", "h200-nvl"),
    ("GH200 144G", "gh200-144gb"),  # "NVIDIA GH200 144G HBM3e"
    ("GH200", "gh200"),  # "NVIDIA GH200 480GB" (96GB HBM3; 480GB is the Grace CPU's memory)
    ("A100-SXM4-40GB", "a100-40gb"),
    ("A100-PCIE-40GB", "a100-40gb"),
    ("A100", "a100"),
    ("H100", "h100"),
    ("H200", "h200"),
    ("H20", "h20"),
    ("B200", "b200"),
    ("L40S", "l40s"),
    ("MI300X", "mi300x"),
)


def catalogue_name(device_name: str) -> str:
    """The catalogue entry of a device as torch names it ("NVIDIA H200" -> "h200"), "" if none:
    what a timing file written by ``marconi replay --calibrate`` records as its device."""
    for frag, name in _CUDA_NAMES:
        if frag.lower() in str(device_name).lower():
            return name
    return ""

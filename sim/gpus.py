"""The GPU catalogue behind ``--gpu``: datasheet figures of the accelerators hybrid models are served
on, one frozen entry each with the datasheet it comes from (docs/cost-model.md §5).

Figures are per GPU: dense (no sparsity) bf16 / fp16 tensor throughput, memory, memory bandwidth,
and the GPU-to-GPU link's total bandwidth (both directions, as datasheets quote it; an all-reduce
moves data at half of it each way), the GPUs of one server's NVLink (or PCIe) domain and the
network card each GPU has to other servers. Where a calibrated timing file exists for a device
(``sim/data/<name>-timing.json``, which records its device) ``sim.cost`` uses it; elsewhere it
scales the calibrated hardware model by these figures and says "uncalibrated for GPU".
"""

from __future__ import annotations

import difflib
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
    # GPUs joined by NVLink bridges rather than a switch (H100 PCIe / NVL in pairs, H200 NVL in 2s or
    # 4s): a tensor-parallel group larger than ``bridge_group`` reaches its other GPUs over PCIe,
    # ``pcie_bytes_per_s`` (total, both directions); 0: every GPU of the node on ``link_bytes_per_s``
    bridge_group: int = 0
    pcie_bytes_per_s: float = 0.0
    # the GPUs of one server (its NVLink switch, bridges or PCIe): a larger group spans servers and
    # all-reduces over ``node_link_bytes_per_s``, each GPU's network card (total, both directions)
    node_gpus: int = 8
    node_link_bytes_per_s: float = 0.0


GB = 10**9
GiB = 2**30
TB = 10**12
#: a GPU's network card to other servers, total both directions (as ``link_bytes_per_s``): one
#: 400 Gb/s InfiniBand NDR / RoCE port per GPU (DGX H100 / H200 / B200: 8x ConnectX-7) is 50 GB/s
#: each way; 200 Gb/s (DGX A100's 8x ConnectX-6 HDR; NVIDIA's Enterprise Reference Architecture
#: 2-8-5-200 for PCIe servers of 8 GPUs: 200 Gb/s of east-west network a GPU) is 25 GB/s each way
NIC_400G = 2 * 50 * GB
NIC_200G = 2 * 25 * GB

#: Memory: the datasheet's figure ("80GB HBM3") is a binary one, as memory is counted (JEDEC: 1 GB
#: of a memory part = 2**30 bytes; an H100's 80GB is 5 stacks of 16 GiB, and nvidia-smi reports
#: 81,559 MiB of it usable): each entry holds the datasheet's number of GiB, so ``--gpu-memory 80GiB``
#: on an H100 is its whole memory and ``80GB`` (80e9 bytes) a little less. Bandwidths are decimal
#: (TB/s, GB/s), as the datasheets quote them.
GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        # datasheet: 40GB HBM2 (5 x 8 GiB)
        GPU(
            "a100-40gb",
            312.0,
            40 * GiB,
            1.555 * TB,
            600 * GB,
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB); DGX A100 datasheet (8 GPUs on NVSwitch, "
            "8x ConnectX-6 200Gb/s HDR InfiniBand)",
            node_link_bytes_per_s=NIC_200G,
        ),
        # datasheet: 80GB HBM2e
        GPU(
            "a100",
            312.0,
            80 * GiB,
            2.039 * TB,
            600 * GB,
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB); DGX A100 datasheet (8 GPUs on NVSwitch, "
            "8x ConnectX-6 200Gb/s HDR InfiniBand)",
            node_link_bytes_per_s=NIC_200G,
        ),
        # datasheet: 80GB HBM3 (nvidia-smi: 81,559 MiB)
        GPU(
            "h100",
            989.0,
            80 * GiB,
            3.35 * TB,
            900 * GB,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM5); DGX H100 datasheet (8 GPUs on NVSwitch, "
            "8x ConnectX-7 400Gb/s InfiniBand / Ethernet)",
            node_link_bytes_per_s=NIC_400G,
        ),
        # datasheet: 80GB HBM2e
        # NVLink bridge of 2 (600 GB/s), PCIe Gen5 x16 (128 GB/s) to the rest
        GPU(
            "h100-pcie",
            756.0,
            80 * GiB,
            2.0 * TB,
            600 * GB,
            "NVIDIA H100 datasheet (PCIe; NVLink bridge); NVIDIA Enterprise Reference Architecture 2-8-5-200 "
            "(8 PCIe GPUs a server, 200Gb/s of network a GPU)",
            bridge_group=2,
            pcie_bytes_per_s=128 * GB,
            node_link_bytes_per_s=NIC_200G,
        ),
        GPU(
            "h100-nvl",
            835.0,
            94 * GiB,  # datasheet: 94GB HBM3
            3.9 * TB,
            600 * GB,
            "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL: 1,671 TFLOPS bf16 with sparsity; NVLink bridge); "
            "NVIDIA Enterprise Reference Architecture 2-8-5-200 (8 PCIe GPUs a server, 200Gb/s of network a GPU)",
            bridge_group=2,  # datasheet: NVLink 600 GB/s between a bridged pair, PCIe Gen5 128 GB/s
            pcie_bytes_per_s=128 * GB,
            node_link_bytes_per_s=NIC_200G,
        ),
        # product brief: 96GB HBM3
        GPU(
            "h20",
            148.0,
            96 * GiB,
            4.0 * TB,
            900 * GB,
            "NVIDIA H20 product brief (SXM); HGX of 8 on NVSwitch, network as DGX H100's (8x 400Gb/s: no "
            "reference system of the H20 is published)",
            node_link_bytes_per_s=NIC_400G,
        ),
        # datasheet: 141GB HBM3e (nvidia-smi: 143,771 MiB)
        GPU(
            "h200",
            989.0,
            141 * GiB,
            4.8 * TB,
            900 * GB,
            "NVIDIA H200 Tensor Core GPU datasheet (SXM); DGX H200 datasheet (8 GPUs on NVSwitch, "
            "8x ConnectX-7 400Gb/s InfiniBand / Ethernet)",
            node_link_bytes_per_s=NIC_400G,
        ),
        GPU(
            "h200-nvl",
            835.0,
            141 * GiB,  # datasheet: 141GB HBM3e
            4.8 * TB,
            900 * GB,
            "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL: 1,671 TFLOPS bf16 with sparsity; NVLink bridge); "
            "NVIDIA Enterprise Reference Architecture 2-8-5-200 (8 H200 NVL a server, 200Gb/s of network a GPU)",
            # datasheet: "2- or 4-way NVIDIA NVLink bridge: 900GB/s per GPU", PCIe Gen5 128 GB/s; the
            # 4-way bridge taken (a server of 8 is two bridged 4s)
            bridge_group=4,
            pcie_bytes_per_s=128 * GB,
            node_link_bytes_per_s=NIC_200G,
        ),
        # datasheet: 96GB HBM3 (the GPU's; the Grace CPU's 480GB LPDDR5X is not counted)
        # a server holds one superchip (NVIDIA MGX; the Enterprise Reference Architecture's Grace Hopper
        # configuration), with a 400Gb/s ConnectX-7 / BlueField-3: its 900 GB/s NVLink joins GPUs only
        # in an NVLink Switch system (GH200 NVL32, DGX GH200), which the catalogue does not price
        GPU(
            "gh200",
            990.0,
            96 * GiB,
            4.0 * TB,
            900 * GB,
            "NVIDIA GH200 Grace Hopper Superchip datasheet (96GB HBM3; one superchip a server, 400Gb/s network)",
            node_gpus=1,
            node_link_bytes_per_s=NIC_400G,
        ),
        GPU(
            "gh200-144gb",
            990.0,
            144 * GiB,  # datasheet: 144GB HBM3e
            4.9 * TB,
            900 * GB,
            "NVIDIA GH200 Grace Hopper Superchip datasheet (144GB HBM3e; one superchip a server, 400Gb/s network)",
            node_gpus=1,
            node_link_bytes_per_s=NIC_400G,
        ),
        # datasheet: 180GB HBM3e a GPU (1,440GB per HGX B200 of 8; nvidia-smi: 183,359 MiB)
        GPU(
            "b200",
            2250.0,
            180 * GiB,
            7.7 * TB,
            1800 * GB,
            "NVIDIA HGX B200 datasheet (per GPU of 8); DGX B200 datasheet (8x ConnectX-7 400Gb/s InfiniBand / Ethernet)",
            node_link_bytes_per_s=NIC_400G,
        ),
        # datasheet: 48GB GDDR6 with ECC
        # 8 a server, on PCIe within it (the catalogue's link) and 200Gb/s of network a GPU between servers
        GPU(
            "l40s",
            362.0,
            48 * GiB,
            0.864 * TB,
            64 * GB,
            "NVIDIA L40S datasheet (no NVLink: PCIe Gen4 x16); NVIDIA Enterprise Reference Architecture 2-8-5-200 "
            "(8 PCIe GPUs a server, 200Gb/s of network a GPU)",
            node_link_bytes_per_s=NIC_200G,
        ),
        # datasheet: 192GB HBM3 (8 x 24 GiB)
        GPU(
            "mi300x",
            1307.0,
            192 * GiB,
            5.3 * TB,
            896 * GB,
            "AMD Instinct MI300X datasheet (Infinity Fabric); AMD Instinct MI300X Platform of 8, AMD Instinct "
            "MI3XX reference design (a 400Gb/s NIC a GPU)",
            node_link_bytes_per_s=NIC_400G,
        ),
    )
}


def datasheet_memory(gpu: GPU) -> str:
    """The memory of ``gpu`` as its datasheet's figure, in the unit it is counted in: "80GiB"."""
    return f"{gpu.memory_bytes // GiB}GiB"


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
    m = re.fullmatch(r"(.+?)-?(\d+)gi?b", s)  # "80GB" or "80GiB": the datasheet's figure either way
    if m and f"{m[1]}-{m[2]}gb" in GPUS:
        return f"{m[1]}-{m[2]}gb"
    if m and m[1] in GPUS and GPUS[m[1]].memory_bytes == int(m[2]) * GiB:
        return m[1]  # the memory the entry has: another name of it
    return s if s in GPUS else str(name).strip().lower()


def unknown_gpu(name: str) -> str:
    """The line refusing a GPU the catalogue lacks: the entries its spelling is close to (difflib,
    on the name without vendor, form factor and memory: "h800" -> h100, h200, h20), then the
    catalogue."""
    s = re.sub(r"[\s_]+", "-", str(name).strip().lower())
    s = re.sub(r"^(nvidia|amd)-(instinct-)?", "", s)
    s = re.sub(r"-(sxm\d*|pcie|hbm\d*e?|\d+gi?b)(?=-|$)", "", s) or s
    close = difflib.get_close_matches(s, list(GPUS), n=3, cutoff=0.6)
    near = f" (close: {', '.join(close)})" if close else ""
    return f"unknown GPU {name!r}{near}; the catalogue (sim/gpus.py): {', '.join(GPUS)}"


def get_gpu(name: str) -> GPU:
    try:
        return GPUS[canonical_gpu(name)]
    except KeyError:
        raise UsageError(unknown_gpu(name)) from None


ALLREDUCE_LATENCY_S = 10e-6  # one small NCCL all-reduce within a node (estimate, docs/cost-model.md §5)


def group_link_bytes_per_s(gpu: GPU, tp: int) -> float:
    """The link a tensor-parallel group of ``tp`` GPUs all-reduces over (total, both directions):
    the slowest hop of its ring, which paces it. NVLink within a bridge group, PCIe once the group
    spans bridges; a group larger than a server (``node_gpus``) also crosses the network between
    servers, each GPU's card (``node_link_bytes_per_s``): the slower of the two. NCCL's
    hierarchical all-reduce across servers (a ring or tree over the network, NVLink inside) is
    bound by the same per-GPU card, so either is priced at it."""
    link = gpu.link_bytes_per_s
    if gpu.bridge_group and tp > gpu.bridge_group:
        link = gpu.pcie_bytes_per_s
    if tp > gpu.node_gpus:
        link = min(link, gpu.node_link_bytes_per_s)
    return link


def allreduce_s(gpu: GPU, nbytes: float, tp: int) -> float:
    """A ring all-reduce of ``nbytes`` over ``tp`` GPUs: each GPU sends and receives
    2 (tp - 1) / tp of the buffer over the ring's slowest hop, at half its total bandwidth each way
    (``group_link_bytes_per_s``), plus a fixed latency:

        t = ALLREDUCE_LATENCY_S + 2 (tp - 1) / tp * nbytes / (B / 2),  B = group_link_bytes_per_s(gpu, tp)

    (16 H100s, two servers of 8: B / 2 = 50 GB/s, the 400 Gb/s card, not NVLink's 450 GB/s)."""
    if tp <= 1:
        return 0.0
    return ALLREDUCE_LATENCY_S + 2 * (tp - 1) / tp * nbytes / (group_link_bytes_per_s(gpu, tp) / 2)


def node_words(gpu: GPU, tp: int) -> str:
    """What a group of ``tp`` GPUs larger than one server is, in a line's words ("" within one):
    "2 nodes of 8: all-reduce over the inter-node link, 50 GB/s each way" (its ring's slowest hop,
    ``group_link_bytes_per_s``, half of it each way)."""
    node = gpu.node_gpus
    if tp <= node:
        return ""
    nodes = -(-tp // node)
    layout = f"{nodes} nodes of {node}" if tp % node == 0 else f"{nodes} nodes ({node} a node, {tp % node} on the last)"
    each = group_link_bytes_per_s(gpu, tp) / 2 / 1e9
    over = "over the inter-node link" if gpu.node_link_bytes_per_s <= group_link_bytes_per_s(gpu, tp) else "over PCIe"
    return f"{layout}: all-reduce {over}, {each:g} GB/s each way"


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

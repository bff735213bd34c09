"""The accelerators theseus knows, with their published facts: one table for every reader.

``theseus plan`` reads a chip's memory, peaks, HBM and link bandwidth (and for GPUs what XLA's GPU
compiler needs) by its target kind (``CHIPS["h100"]``); the trainer's MFU and the benchmarks find the
chip of a device by the ``device_kind`` jax reports (:func:`chip_of`, :func:`published_peak`). The
figures are dense (no sparsity), per device as jax counts devices. No import of jax here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Chip:
    """One accelerator kind: what the roofline estimate, the compiler and MFU need to know.

    A figure of 0 is not recorded (``fp8_flops``: no FP8 units, or none published)."""

    name: str  # the device kind jax reports
    platform: str  # "cuda" | "tpu"
    memory_bytes: int  # what one program may use
    bf16_flops: float  # dense peak FLOP/s
    fp8_flops: float  # dense peak FLOP/s
    hbm_bandwidth: float  # bytes/s
    link_bandwidth: float  # bytes/s per chip and direction inside a host (NVLink) or slice (ICI)
    host_link_bandwidth: float = 0.0  # bytes/s per chip and direction between hosts (GPUs: InfiniBand)
    #: GPU only: the device description XLA's GPU compiler reads (compute capability, SMs, caches).
    compute_capability: tuple[int, int] = (0, 0)
    core_count: int = 0
    clock_ghz: float = 0.0
    l2_cache_bytes: int = 0
    shared_memory_per_core: int = 0
    shared_memory_per_block_optin: int = 0
    description: str = ""
    #: Words of the device kinds jax reports for this chip, lower case ("h100 pcie" of "NVIDIA H100 PCIe").
    device_kinds: tuple[str, ...] = ()


#: The H100 SXM; the H200 SXM is the same chip (SMs, clocks, caches, NVLink) with more and faster HBM.
_H100 = Chip(
    name="NVIDIA H100 80GB HBM3",
    platform="cuda",
    memory_bytes=84_942_979_072,
    bf16_flops=989e12,
    fp8_flops=1979e12,
    hbm_bandwidth=3.35e12,
    link_bandwidth=450e9,
    host_link_bandwidth=50e9,
    compute_capability=(9, 0),
    core_count=132,
    clock_ghz=1.98,
    l2_cache_bytes=50 * 2**20,
    shared_memory_per_core=233_472,
    shared_memory_per_block_optin=232_448,
    description="H100 SXM",
    device_kinds=("h100",),
)

#: Published figures (dense, no sparsity), by kind. NVLink: 900 GB/s (H100/H200 SXM, H200 NVL's bridge)
#: and 600 GB/s (A100, H100 PCIe's and NVL's bridges) in both directions together; between hosts one
#: 400 Gb/s InfiniBand port per GPU. The PCIe and NVL cards peak lower than the SXM parts of the same
#: name (lower clocks and power). Memory is recorded for the kinds ``theseus plan`` compiles for.
CHIPS: dict[str, Chip] = {
    "h100": _H100,
    "h100-pcie": Chip(
        name="NVIDIA H100 PCIe",
        platform="cuda",
        memory_bytes=0,
        bf16_flops=756e12,
        fp8_flops=1513e12,
        hbm_bandwidth=2.0e12,
        link_bandwidth=300e9,
        description="H100 PCIe",
        device_kinds=("h100 pcie",),
    ),
    "h100-nvl": Chip(
        name="NVIDIA H100 NVL",
        platform="cuda",
        memory_bytes=0,
        bf16_flops=835e12,
        fp8_flops=1671e12,
        hbm_bandwidth=3.9e12,
        link_bandwidth=300e9,
        description="H100 NVL",
        device_kinds=("h100 nvl",),
    ),
    "h200": replace(
        _H100,
        name="NVIDIA H200",
        memory_bytes=150_754_820_096,
        hbm_bandwidth=4.8e12,
        description="H200 SXM",
        device_kinds=("h200",),
    ),
    "h200-nvl": Chip(
        name="NVIDIA H200 NVL",
        platform="cuda",
        memory_bytes=0,
        bf16_flops=835e12,
        fp8_flops=1671e12,
        hbm_bandwidth=4.8e12,
        link_bandwidth=450e9,
        description="H200 NVL",
        device_kinds=("h200 nvl",),
    ),
    "gh200": Chip(
        name="NVIDIA GH200 480GB",
        platform="cuda",
        memory_bytes=0,  # sold with 96 GB of HBM3 or 144 GB of HBM3e
        bf16_flops=989e12,
        fp8_flops=1979e12,
        hbm_bandwidth=0.0,
        link_bandwidth=450e9,
        description="GH200",
        device_kinds=("gh200",),
    ),
    "a100": Chip(
        name="NVIDIA A100-SXM4-80GB",
        platform="cuda",
        memory_bytes=85_899_345_920,
        bf16_flops=312e12,
        fp8_flops=0.0,
        hbm_bandwidth=2.039e12,
        link_bandwidth=300e9,
        host_link_bandwidth=25e9,
        compute_capability=(8, 0),
        core_count=108,
        clock_ghz=1.41,
        l2_cache_bytes=40 * 2**20,
        shared_memory_per_core=167_936,
        shared_memory_per_block_optin=166_912,
        description="A100 SXM 80 GB",
        device_kinds=("a100",),  # every A100 card has the same bf16 peak
    ),
    "l40s": Chip(
        name="NVIDIA L40S",
        platform="cuda",
        memory_bytes=0,
        bf16_flops=362e12,
        fp8_flops=733e12,
        hbm_bandwidth=864e9,
        link_bandwidth=0.0,
        description="L40S",
        device_kinds=("l40s",),
    ),
    "l4": Chip(
        name="NVIDIA L4",
        platform="cuda",
        memory_bytes=0,
        bf16_flops=121e12,
        fp8_flops=242.5e12,
        hbm_bandwidth=300e9,
        link_bandwidth=0.0,
        description="L4",
        device_kinds=("l4",),
    ),
    "a10": Chip(
        name="NVIDIA A10G",
        platform="cuda",
        memory_bytes=0,
        bf16_flops=125e12,  # the A10's figure; AWS's A10G publishes none of its own
        fp8_flops=0.0,
        hbm_bandwidth=600e9,
        link_bandwidth=0.0,
        description="A10 / A10G",
        device_kinds=("a10", "a10g"),
    ),
    "rtx4090": Chip(
        name="NVIDIA GeForce RTX 4090",
        platform="cuda",
        memory_bytes=0,
        bf16_flops=165e12,  # with float32 accumulation
        fp8_flops=330e12,
        hbm_bandwidth=1008e9,
        link_bandwidth=0.0,
        description="GeForce RTX 4090",
        device_kinds=("rtx 4090",),
    ),
    "v100": Chip(
        name="Tesla V100-SXM2-16GB",
        platform="cuda",
        memory_bytes=0,
        bf16_flops=125e12,  # its float16 tensor-core peak: a V100 has no bf16 units
        fp8_flops=0.0,
        hbm_bandwidth=900e9,
        link_bandwidth=0.0,
        description="V100",
        device_kinds=("v100",),
    ),
    # TPU memory: what one program may use ("usable"), not the nominal HBM beside it. Each is the largest
    # program libtpu compiles for a chip of the kind, alone or in a slice (its refusal names the same
    # figure: "available HBM (15.75G)", in GiB), found by bisection to within 8 KiB; v5e's is also the
    # memory_stats()["bytes_limit"] jax reports on a real "TPU v5 lite".
    "v5e": Chip(
        name="TPU v5 lite",
        platform="tpu",
        memory_bytes=16_909_336_576,  # usable 15.75 GiB (16,126 MiB) of nominal 16 GiB
        bf16_flops=197e12,
        fp8_flops=0.0,
        hbm_bandwidth=819e9,
        link_bandwidth=100e9,
        description="TPU v5e",
        device_kinds=("tpu v5 lite", "tpu v5e"),
    ),
    "v5p": Chip(
        name="TPU v5",  # the device kind jax reports for a v5p
        platform="tpu",
        memory_bytes=102_803_432_448,  # usable 95.74 GiB; published HBM 95 GB
        bf16_flops=459e12,
        fp8_flops=0.0,
        hbm_bandwidth=2765e9,
        link_bandwidth=300e9,
        description="TPU v5p",
        device_kinds=("tpu v5", "tpu v5p"),
    ),
    "v6e": Chip(
        name="TPU v6 lite",
        platform="tpu",
        memory_bytes=33_550_237_696,  # usable 31.25 GiB (31,996 MiB) of nominal 32 GiB
        bf16_flops=918e12,
        fp8_flops=0.0,
        hbm_bandwidth=1640e9,
        link_bandwidth=224e9,
        description="TPU v6e (Trillium)",
        device_kinds=("tpu v6 lite", "tpu v6e"),
    ),
    "v4": Chip(
        name="TPU v4",
        platform="tpu",
        memory_bytes=0,  # nominal 32 GiB
        bf16_flops=275e12,
        fp8_flops=0.0,
        hbm_bandwidth=1200e9,
        link_bandwidth=0.0,
        description="TPU v4",
        device_kinds=("tpu v4",),
    ),
    "v3": Chip(
        name="TPU v3",
        platform="tpu",
        memory_bytes=0,
        bf16_flops=61.5e12,  # a chip's 123 TFLOP/s over its two TensorCores, which jax counts as two devices
        fp8_flops=0.0,
        hbm_bandwidth=0.0,
        link_bandwidth=0.0,
        description="TPU v3 (one TensorCore)",
        device_kinds=("tpu v3",),
    ),
}

#: (pattern, word, kind) for every device-kind word; a word matches standing alone ("l4" is not in "NVIDIA L40S",
#: "h200" not in "NVIDIA GH200 480GB").
_WORDS = tuple(
    (re.compile(rf"(?<![a-z0-9]){re.escape(word)}(?![a-z0-9])"), word, kind)
    for kind, chip in CHIPS.items()
    for word in chip.device_kinds
)


def chip_of(device_kind: str) -> Chip | None:
    """The chip of a device kind as jax reports it (``"NVIDIA H100 PCIe"``, ``"TPU v5 lite"``), or None.

    The longest matching word wins, so the PCIe and NVL cards are not taken for the SXM parts
    ("h100 pcie" over "h100") and a v5e is not taken for a v5p ("tpu v5 lite" over "tpu v5")."""
    text = device_kind.lower()
    found = [(len(word), kind) for pattern, word, kind in _WORDS if pattern.search(text)]
    return CHIPS[max(found)[1]] if found else None


def published_peak(device_kind: str) -> float | None:
    """The published dense bf16 peak FLOP/s of one device of ``device_kind``, or None when unknown."""
    chip = chip_of(device_kind)
    return None if chip is None else chip.bf16_flops


__all__ = ["CHIPS", "Chip", "chip_of", "published_peak"]

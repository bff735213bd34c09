"""Compile targets: the accelerators ``theseus plan`` compiles for, by name, with their published facts.

A target is a GPU kind times a device count (``h100x8``; ``h100x8x4`` = 4 hosts of 8) or a TPU slice by
its topology name (``v5e:2x4``). The facts of each kind (memory, peak FLOP/s, HBM and link bandwidth, and
for GPUs what XLA's GPU compiler needs to know about the device) are the published figures of
:mod:`theseus.base.chips`, the table the trainer's MFU reads too. No import of jax here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from theseus.base.chips import CHIPS, Chip
from theseus.errors import ConfigError

#: The kinds ``--target`` names: GPUs whose compiler description the table holds, TPUs whose slices
#: are described below.
GPU_KINDS = ("h100", "h200", "a100")
TPU_KINDS = ("v5e", "v5p", "v6e")
EXAMPLES = "h100x8, h200x8, a100x8, h100x8x4 (4 hosts of 8), v5e:1 (one chip), v5e:2x4, v5p:2x2x2, v6e:2x4"


@dataclass(frozen=True)
class Target:
    """What to compile for: ``hosts`` x ``per_host`` chips of one kind (a TPU slice: its topology)."""

    spec: str
    kind: str
    hosts: int
    per_host: int
    topology: str  # TPU: "2x4"; GPU: "hosts x 1 x per_host" as the CUDA topology wants it

    @property
    def chip(self) -> Chip:
        return CHIPS[self.kind]

    @property
    def platform(self) -> str:
        return self.chip.platform

    @property
    def devices(self) -> int:
        return self.hosts * self.per_host

    def describe(self) -> str:
        chips = f"{self.devices} x {self.chip.description}"
        if self.platform == "tpu":
            return f"{chips} ({self.kind}:{self.topology})"
        return chips + (f" ({self.hosts} hosts of {self.per_host})" if self.hosts > 1 else "")


_GPU = re.compile(r"^(?P<kind>[a-z]+\d+)x(?P<per_host>\d+)(?:x(?P<hosts>\d+))?$")
_TPU = re.compile(r"^(?P<kind>v\d+[a-z]?):(?P<topology>\d+(?:x\d+){0,2})$")
#: Chips per TPU host (a v5e/v6e host holds 8 chips at most, a v5p host 4).
_TPU_HOST_CHIPS = {"v5e": 8, "v6e": 8, "v5p": 4}
#: Dimensions of each kind's topology: v5e and v6e slices are 2-D, v5p slices 3-D.
_TPU_DIMENSIONS = {"v5e": 2, "v6e": 2, "v5p": 3}


def tpu_topology(kind: str, topology: str, spec: str) -> str:
    """``topology`` as the TPU compiler names it: ``1`` (one chip, as on Colab or Kaggle) is ``1x1``
    (``1x1x1`` for v5p); another bare count names no slice shape."""
    if "x" in topology:
        return topology
    if topology != "1":
        raise ConfigError(
            f"--target {spec!r}: name a TPU slice by its topology, for example {kind}:2x4; a bare count "
            f"is only {kind}:1 (one chip)"
        )
    return "x".join(["1"] * _TPU_DIMENSIONS[kind])


def parse_target(spec: str) -> Target:
    """The target named ``spec`` (``h100x8``, ``h100x8x4``, ``v5e:1``, ``v5e:2x4``); ConfigError naming the forms."""
    text = spec.strip().lower()
    tpu = _TPU.match(text)
    if tpu:
        kind = tpu["kind"]
        if kind not in TPU_KINDS:
            raise ConfigError(f"unknown TPU kind {kind!r} in --target {spec!r}; choose one of {', '.join(TPU_KINDS)}")
        topology = tpu_topology(kind, tpu["topology"], spec)
        chips = math.prod(int(n) for n in topology.split("x"))
        per_host = min(chips, _TPU_HOST_CHIPS[kind])
        return Target(spec, kind, chips // per_host, per_host, topology)
    gpu = _GPU.match(text)
    if gpu and gpu["kind"] in GPU_KINDS:
        per_host, hosts = int(gpu["per_host"]), int(gpu["hosts"] or 1)
        if not 1 <= per_host <= 8 or hosts < 1:
            raise ConfigError(
                f"--target {spec!r}: a GPU host holds 1 to 8 GPUs; write KINDxGPUSxHOSTS, for example h100x8x4"
            )
        return Target(spec, gpu["kind"], hosts, per_host, f"{hosts}x1x{per_host}")
    raise ConfigError(f"unknown --target {spec!r}; use a GPU count or a TPU slice, for example {EXAMPLES}")


def gpu_target_config(chip: Chip) -> str:
    """The ``GpuTargetConfig`` text proto XLA's GPU compiler reads for a deviceless compile of ``chip``.

    Only the fields the pinned jax's XLA knows; what the compiler does not use for code generation
    (vendor strings, driver versions) is left out."""
    major, minor = chip.compute_capability
    return "\n".join(
        [
            "gpu_device_info {",
            "  threads_per_block_limit: 1024",
            "  threads_per_warp: 32",
            "  shared_memory_per_block: 49152",
            f"  shared_memory_per_core: {chip.shared_memory_per_core}",
            "  threads_per_core_limit: 2048",
            f"  core_count: {chip.core_count}",
            "  fpus_per_core: 128" if major >= 9 else "  fpus_per_core: 64",
            "  block_dim_limit_x: 2147483647",
            "  block_dim_limit_y: 65535",
            "  block_dim_limit_z: 65535",
            f"  memory_bandwidth: {int(chip.hbm_bandwidth)}",
            f"  l2_cache_size: {chip.l2_cache_bytes}",
            f"  clock_rate_ghz: {chip.clock_ghz}",
            f"  device_memory_size: {chip.memory_bytes}",
            f"  shared_memory_per_block_optin: {chip.shared_memory_per_block_optin}",
            f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
            "  registers_per_core_limit: 65536",
            "  registers_per_block_limit: 65536",
            "}",
            'platform_name: "CUDA"',
            "dnn_version_info { major: 9 minor: 8 }",
            f'device_description_str: "{chip.name}"',
            "",
        ]
    )


__all__ = ["CHIPS", "EXAMPLES", "Chip", "Target", "gpu_target_config", "parse_target"]

"""A step-time estimate from a compiled program: a roofline over its kernels plus its collectives.

Not a measurement. Each kernel takes the longer of its matmul FLOPs at the chip's peak and its bytes at
the HBM bandwidth; each collective moves its bytes over the links it crosses (NVLink or ICI inside a
host or slice, the host network between GPU hosts); a stated share of collective time hides behind
compute. Real steps also pay kernel launches, imperfect overlap and matmuls below peak, so the
estimate is an upper bound on speed (a lower bound on time).
"""

from __future__ import annotations

from dataclasses import dataclass

from theseus.plan.hlo import ProgramCost
from theseus.plan.targets import Target

#: The share of collective time assumed hidden behind compute.
DEFAULT_OVERLAP = 0.5


@dataclass
class Estimate:
    """Seconds per step and what they are made of, with the assumptions behind them."""

    compute_seconds: float  # kernels bound by matmul FLOPs
    memory_seconds: float  # kernels bound by HBM traffic
    collective_seconds: float
    overlap: float
    peak_flops: float
    hbm_bandwidth: float
    link_bandwidth: float
    host_link_bandwidth: float

    @property
    def step_seconds(self) -> float:
        return self.compute_seconds + self.memory_seconds + (1.0 - self.overlap) * self.collective_seconds

    def mfu(self, model_flops_per_device: float) -> float:
        """The model FLOPs utilisation the estimated step time implies."""
        if self.step_seconds <= 0:
            return 0.0
        return model_flops_per_device / self.step_seconds / self.peak_flops

    def assumptions(self) -> list[str]:
        lines = [
            f"peak {self.peak_flops / 1e12:,.1f} TFLOP/s per chip for bf16 matmuls (fp8: the chip's fp8 peak; "
            "float32: half the bf16 peak)",
            f"HBM {self.hbm_bandwidth / 1e12:,.2f} TB/s; links {self.link_bandwidth / 1e9:,.0f} GB/s per chip and "
            "direction inside a host or slice"
            + (f", {self.host_link_bandwidth / 1e9:,.0f} GB/s between hosts" if self.host_link_bandwidth else ""),
            "each kernel: max(matmul FLOPs / peak, bytes / HBM bandwidth); ring collectives",
            f"{self.overlap:.0%} of collective time hidden behind compute",
        ]
        return lines


def peak_for(dtype: str, target: Target) -> float:
    """The matmul peak of ``target`` for inputs of ``dtype``."""
    chip = target.chip
    if dtype.startswith("f8") and chip.fp8_flops:
        return chip.fp8_flops
    if dtype in ("f32", "f64"):
        return chip.bf16_flops / 2
    return chip.bf16_flops


def estimate(cost: ProgramCost, target: Target, overlap: float = DEFAULT_OVERLAP) -> Estimate:
    """The roofline estimate of one step of a program with ``cost`` on ``target``."""
    chip = target.chip
    compute = memory = 0.0
    for kernel in cost.kernels:
        flops_time = kernel.flops / peak_for(kernel.dtype, target) if kernel.flops else 0.0
        bytes_time = kernel.bytes / chip.hbm_bandwidth
        if flops_time >= bytes_time:
            compute += flops_time * kernel.count
        else:
            memory += bytes_time * kernel.count
    collectives = 0.0
    for collective in cost.collectives:
        crosses_hosts = target.hosts > 1 and any(
            len({device // target.per_host for device in group}) > 1 for group in collective.groups
        )
        bandwidth = chip.host_link_bandwidth if crosses_hosts and chip.host_link_bandwidth else chip.link_bandwidth
        collectives += collective.moved_bytes * collective.count / bandwidth
    return Estimate(
        compute_seconds=compute,
        memory_seconds=memory,
        collective_seconds=collectives,
        overlap=overlap,
        peak_flops=chip.bf16_flops,
        hbm_bandwidth=chip.hbm_bandwidth,
        link_bandwidth=chip.link_bandwidth,
        host_link_bandwidth=chip.host_link_bandwidth if target.platform == "cuda" else 0.0,
    )


__all__ = ["DEFAULT_OVERLAP", "Estimate", "estimate", "peak_for"]

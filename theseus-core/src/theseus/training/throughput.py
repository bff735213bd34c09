"""Peak FLOP/s per device (published figures of :mod:`theseus.base.chips`, or measured on CPU) for MFU."""

from __future__ import annotations

import functools
import time
from typing import Any

from theseus.base.chips import chip_of


@functools.cache
def measured_peak(size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a jitted float32 matmul on the default device (best of ``repeats``)."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / max(best, 1e-9)


def known_peak_flops(device: Any, configured: float = 0.0) -> tuple[float, str] | None:
    """Peak FLOP/s of one ``device`` and where the figure comes from, when it is configured or
    published; None when only a measurement (``measured_peak``) can tell."""
    if configured > 0:
        return configured, "configured"
    chip = chip_of(str(getattr(device, "device_kind", "")))
    if chip is not None:
        return chip.bf16_flops, f"published bf16 peak of {chip.description}"
    return None


def peak_flops(device: Any, configured: float = 0.0) -> tuple[float, str]:
    """Peak FLOP/s of one ``device`` and where the figure comes from (measured when not known)."""
    known = known_peak_flops(device, configured)
    return known if known is not None else (measured_peak(), "measured float32 matmul")


def mfu(flops_per_step: float, steps: int, seconds: float, peak_per_device: float, devices: int) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all devices."""
    if seconds <= 0 or peak_per_device <= 0 or devices <= 0:
        return 0.0
    return flops_per_step * steps / seconds / (peak_per_device * devices)

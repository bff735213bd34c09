"""This machine's measured matmul peak: a large jitted ``jnp.dot``, median of repetitions after warm-up.

Run ``python benchmarks/peak.py [--size N] [--dtype float32]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Loop, median_seconds, start_like_theseus_run


@dataclasses.dataclass(frozen=True)
class Peak:
    """A measured matmul rate: ``flops_per_s`` of square ``size`` products in ``dtype``."""

    flops_per_s: float
    size: int
    dtype: str
    seconds: float
    device: str

    def __str__(self) -> str:
        return f"{self.flops_per_s / 1e9:.1f} GFLOP/s ({self.dtype} {self.size}x{self.size} dot on {self.device})"


def matmul_chain(
    size: int, dtype: str = "float32", chain: int = 4, device: Any = None
) -> tuple[Callable[[], Any], float, str]:
    """``(call, flops_per_call, device name)``: ``call()`` runs ``chain`` dependent ``size``-square
    products in one jitted function (dispatch cost is negligible next to the arithmetic) and
    returns the unfinished result."""
    import jax
    import jax.numpy as jnp

    dev = device if device is not None else jax.devices()[0]
    dt = jnp.dtype(dtype)
    ka, kb = jax.random.split(jax.random.key(0))
    # Scaled so that repeated products neither overflow nor vanish (values stay O(1)).
    a = jax.device_put((jax.random.normal(ka, (size, size), jnp.float32) / size**0.5).astype(dt), dev)
    b = jax.device_put((jax.random.normal(kb, (size, size), jnp.float32) / size**0.5).astype(dt), dev)

    @jax.jit
    def products(a: jax.Array, b: jax.Array) -> jax.Array:
        x = a
        for _ in range(chain):
            x = jnp.dot(x, b, preferred_element_type=dt)
        return x

    name = f"{dev.platform}:{getattr(dev, 'device_kind', dev)}"
    return (lambda: products(a, b)), 2.0 * size**3 * chain, name


def measure_peak(
    size: int = 2048,
    dtype: str = "float32",
    *,
    repeats: int = 7,
    warmup: int = 2,
    chain: int = 4,
    device: Any = None,
) -> Peak:
    """The sustained matmul FLOP/s of ``device`` (default: the first jax device): median over ``repeats``."""
    call, flops, name = matmul_chain(size, dtype, chain, device)
    seconds = median_seconds(lambda: call().block_until_ready(), repeats=repeats, warmup=warmup)
    return Peak(flops / seconds, size, dtype, seconds, name)


class PeakLoop(Loop):
    """The matmul peak as a timed :class:`~benchmarks.common.Loop`, measured in the same rounds as the
    training loops, so that a shared machine's load swings affect both sides of an MFU ratio alike.
    One "step" is one call of the product chain; ``flops_per_step`` is its FLOP count."""

    name = "matmul peak"

    def __init__(self, size: int = 2048, dtype: str = "float32", chain: int = 4, min_seconds: float = 0.0) -> None:
        self.size, self.dtype, self.chain = size, dtype, chain
        self.min_seconds = min_seconds
        self.flops_per_step = 2.0 * size**3 * chain
        self.call: Callable[[], Any] | None = None

    def prepare(self, warmup: int) -> float:
        start = time.perf_counter()
        self.call, _, self.device = matmul_chain(self.size, self.dtype, self.chain)
        self.run(1)
        first = time.perf_counter() - start
        if warmup:
            self.run(warmup)
        return first

    def window(self, steps: int) -> float:
        """Seconds for ``steps`` calls, measured over at least ``steps`` calls and ``min_seconds``
        (so a short peak window samples the machine's load as long as a training window does), after
        one untimed call (as :meth:`benchmarks.common.Loop.window`)."""
        self.run(1)
        start = time.perf_counter()
        calls = 0
        while True:
            self.run(steps)
            calls += steps
            elapsed = time.perf_counter() - start
            if elapsed >= self.min_seconds:
                return elapsed * steps / calls

    def run(self, steps: int) -> None:
        assert self.call is not None, "prepare() first"
        last = None
        for _ in range(steps):
            last = self.call()
        if last is not None:
            last.block_until_ready()

    def close(self) -> None:
        self.call = None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    print(measure_peak(args.size, args.dtype, repeats=args.repeats))


if __name__ == "__main__":
    start_like_theseus_run()
    main()

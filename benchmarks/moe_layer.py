"""The mixture-of-experts layer's dispatch: grouped matmuls (``ragged_dot``) against a dense one-hot
einsum and a loop over experts, forward + backward step time side by side in one run.

    python benchmarks/moe_layer.py [--tokens 2048] [--width 256] [--expert-hidden 128] [--rounds 5]

At ``E=8, k=2`` and ``E=64, k=8`` with small experts, interleaved round by round:

* ``ragged_dot``: the layer's dropless path (:func:`theseus.model.layers.moe.dropless_experts`): token
  copies sorted by expert, each projection one grouped matmul;
* ``blocks``: the layer's CPU dropless path (:func:`~theseus.model.layers.moe.blocked_experts`): each
  expert's copies padded to blocks, one matmul per block (XLA's CPU ``ragged_dot`` computes every
  group over all rows);
* ``dense einsum``: every expert on every token, combined with a one-hot weight matrix
  (:func:`~theseus.model.layers.moe.dense_experts`, ``E / k`` times the routed work);
* ``loop``: each expert on every token in a Python loop (:func:`~theseus.model.layers.moe.loop_over_experts`).

All four compute the same output (checked); the router is included. Ratios are medians of per-round
ratios against ``ragged_dot`` (> 1: slower than ragged_dot).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp

from benchmarks.common import machine_line, rotated_rounds
from theseus.model.layers._common import ACTIVATIONS
from theseus.model.layers.moe import (
    MoESpec,
    blocked_experts,
    dense_experts,
    dropless_experts,
    loop_over_experts,
    route,
)

DISPATCHES = {
    "ragged_dot": dropless_experts,
    "blocks": blocked_experts,
    "dense einsum": dense_experts,
    "loop": loop_over_experts,
}
SHAPES = ((8, 2), (64, 8))


def step(dispatch: str, experts: int, top_k: int, tokens: int, width: int, hidden: int) -> tuple[Any, tuple[Any, ...]]:
    """The jitted gradient of a scalar of the layer's output, and its arguments."""
    spec = MoESpec(n_experts=experts, top_k=top_k, expert_hidden=hidden)
    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (tokens, width))
    router = 0.1 * jax.random.normal(keys[1], (width, experts))
    kernels = tuple(
        0.05 * jax.random.normal(k, s)
        for k, s in zip(
            keys[2:], [(experts, width, hidden), (experts, width, hidden), (experts, hidden, width)], strict=True
        )
    )
    act = ACTIVATIONS["swiglu"]
    combine = DISPATCHES[dispatch]

    def loss(x: jax.Array, router: jax.Array, kernels: Any) -> jax.Array:
        out = combine(x, route(x @ router, spec), kernels, act)
        return jnp.sum(out * out)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (x, router, kernels)


def measure(experts: int, top_k: int, tokens: int, width: int, hidden: int, rounds: int) -> dict[str, float]:
    steps = {name: step(name, experts, top_k, tokens, width, hidden) for name in DISPATCHES}
    reference = jax.tree.leaves(steps["ragged_dot"][0](*steps["ragged_dot"][1]))
    for name, (fn, args) in steps.items():  # compile, warm up, and check the gradients agree
        for got, want in zip(jax.tree.leaves(fn(*args)), reference, strict=True):
            scale = float(jnp.max(jnp.abs(want))) + 1e-6
            assert float(jnp.max(jnp.abs(got - want))) <= 1e-3 * scale, name
    seconds = rotated_rounds(steps, rounds)
    out = {name: statistics.median(values) for name, values in seconds.items()}
    for name in steps:
        ratios = [t / base for t, base in zip(seconds[name], seconds["ragged_dot"], strict=True)]
        out[f"{name} ratio"] = statistics.median(ratios)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--expert-hidden", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(machine_line())
    print(f"{args.tokens} tokens, width {args.width}, expert hidden {args.expert_hidden}, SwiGLU, fwd + bwd")
    columns = ["experts, top-k", *DISPATCHES, "blocks ÷ ragged", "dense ÷ ragged", "loop ÷ ragged"]
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for experts, top_k in SHAPES:
        found = measure(experts, top_k, args.tokens, args.width, args.expert_hidden, args.rounds)
        times = " | ".join(f"{found[name] * 1e3:.1f} ms" for name in DISPATCHES)
        ratios = " | ".join(f"{found[f'{name} ratio']:.2f}" for name in ("blocks", "dense einsum", "loop"))
        print(f"| E={experts}, k={top_k} | {times} | {ratios} |")


if __name__ == "__main__":
    main()

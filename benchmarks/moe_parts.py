"""Where a mixture layer's time goes, forward + backward, against the dense MLP of the same FLOPs.

    python benchmarks/moe_parts.py                       # the Mixtral shape of tpu_mfu.py, bf16
    python benchmarks/moe_parts.py --tiles 512,512,512 1024,768,768

At the shape of ``tpu_mfu.py``'s ``mixtral-8x768`` case (16 x 1024 tokens, width 768, 8 experts of 2,688,
top 2), each part jitted alone and timed side by side in rotated rounds (``common.rotated_rounds``):

* ``dense``: one gated MLP two experts wide, the products a token's two experts make;
* ``dispatch``: routing, sorting the copies by expert, the gathers there and back and the weighted sum,
  with no expert product (:mod:`theseus.model.layers.experts`);
* ``products <path>``: the three grouped products of the sorted copies alone (balanced experts): XLA's
  ``ragged_dot``, and the megablox kernels at each ``--tiles`` (:data:`~theseus.model.layers.experts.GMM_TILES`);
* ``layer <path>``: the whole expert computation as the model runs it (``dropless_experts`` under the
  experts' checkpoint policy), by dropless path.

Ratios are medians of per-round ratios against ``dense``. On a CPU the megablox kernels run interpreted
(slow: the smoke test only checks that the script runs).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp

from benchmarks.common import machine_line, rotated_rounds
from theseus.model.layers import experts
from theseus.model.layers._common import ACTIVATIONS
from theseus.model.layers.moe import MoESpec, route

Step = tuple[Callable[..., Any], Sequence[Any]]
ACT = ACTIVATIONS["swiglu"]


def arrays(tokens: int, width: int, hidden: int, n_experts: int, dtype: Any) -> dict[str, Any]:
    keys = jax.random.split(jax.random.key(0), 6)
    normal = lambda key, shape, scale: (scale * jax.random.normal(key, shape)).astype(dtype)  # noqa: E731
    return {
        "x": normal(keys[0], (tokens, width), 1.0),
        "router": normal(keys[1], (width, n_experts), 0.1).astype(jnp.float32),
        "kernels": tuple(
            normal(k, s, 0.05)
            for k, s in zip(
                keys[2:5],
                [(n_experts, width, hidden), (n_experts, width, hidden), (n_experts, hidden, width)],
                strict=True,
            )
        ),
        "dense": (normal(keys[5], (width, 4 * hidden), 0.05), normal(keys[2], (2 * hidden, width), 0.05)),
    }


def _squares(out: jax.Array) -> jax.Array:
    return jnp.sum(out.astype(jnp.float32) ** 2)


def dense_step(a: dict[str, Any]) -> Step:
    """The gated MLP as wide as a token's ``k`` experts together (here two)."""

    def loss(x: jax.Array, w_in: jax.Array, w_out: jax.Array) -> jax.Array:
        h = x @ w_in
        half = h.shape[-1] // 2
        return _squares((ACT(h[:, :half]) * h[:, half:]) @ w_out)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (a["x"], *a["dense"])


def dispatch_step(a: dict[str, Any], spec: MoESpec) -> Step:
    """Routing, the sort and both gathers, and the weighted sum: everything but the experts' products."""

    def loss(x: jax.Array, router: jax.Array) -> jax.Array:
        routing = route(x.astype(jnp.float32) @ router, spec)
        placed = experts.place(routing.experts.reshape(-1), spec.n_experts)
        rows = experts.gather_rows(x, placed.order, placed.slot, spec.top_k)
        back = experts.permute_rows(2 * rows, placed.slot, placed.order).reshape(x.shape[0], spec.top_k, -1)
        return _squares(jnp.einsum("nkd,nk->nd", back, routing.weights.astype(back.dtype)))

    return jax.jit(jax.grad(loss, argnums=(0, 1))), (a["x"], a["router"])


def products_step(a: dict[str, Any], spec: MoESpec, path: str) -> Step:
    """The three grouped products of every copy, sorted and balanced over the experts."""
    copies = a["x"].shape[0] * spec.top_k
    sizes = jnp.full((spec.n_experts,), copies // spec.n_experts, jnp.int32)
    rows = jnp.repeat(a["x"], spec.top_k, axis=0)

    def loss(rows: jax.Array, kernels: Any) -> jax.Array:
        return _squares(experts._grouped_rows(rows, sizes, kernels, ACT, path))

    return jax.jit(jax.grad(loss, argnums=(0, 1))), (rows, a["kernels"])


def layer_step(a: dict[str, Any], spec: MoESpec, path: str) -> Step:
    """The expert computation as the model runs it: routed, dropless, under the experts' checkpoint policy."""

    def loss(x: jax.Array, router: jax.Array, kernels: Any) -> jax.Array:
        routing = route(x.astype(jnp.float32) @ router, spec)
        run = functools.partial(experts.dropless_experts, act=ACT, path=path)
        return _squares(experts.recomputed(run)(x, routing, kernels))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (a["x"], a["router"], a["kernels"])


def with_tiles(step: Step, tiles: tuple[int, int, int]) -> Step:
    """``step`` traced and compiled under megablox tiles ``tiles`` (the module's setting is put back)."""
    fn, args = step
    kept, experts.GMM_TILES = experts.GMM_TILES, tiles
    try:
        compiled = fn.lower(*args).compile()
    finally:
        experts.GMM_TILES = kept
    return compiled, args


def measure(
    tokens: int,
    width: int,
    hidden: int,
    n_experts: int,
    top_k: int,
    dtype: Any,
    tiles: Sequence[tuple[int, int, int]],
    paths: Sequence[str],
    rounds: int,
) -> dict[str, tuple[float, float]]:
    """Each part's median seconds and its median ratio to ``dense``."""
    spec = MoESpec(n_experts=n_experts, top_k=top_k, expert_hidden=hidden)
    a = arrays(tokens, width, hidden, n_experts, dtype)
    steps: dict[str, Step] = {"dense": dense_step(a), "dispatch": dispatch_step(a, spec)}
    steps["products ragged_dot"] = products_step(a, spec, "ragged_dot")
    for tile in tiles:
        steps[f"products gmm {'x'.join(map(str, tile))}"] = with_tiles(products_step(a, spec, "gmm"), tile)
    for path in paths:
        steps[f"layer {path}"] = layer_step(a, spec, path)
    seconds = rotated_rounds(steps, rounds)
    return {
        name: (
            statistics.median(values),
            statistics.median(t / d for t, d in zip(values, seconds["dense"], strict=True)),
        )
        for name, values in seconds.items()
    }


def tile(text: str) -> tuple[int, int, int]:
    rows, contraction, columns = (int(part) for part in text.split(","))
    return rows, contraction, columns


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16 * 1024)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--expert-hidden", type=int, default=2688)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tiles", type=tile, nargs="*", default=[(512, 512, 512), experts.GMM_TILES])
    parser.add_argument("--paths", nargs="*", default=["ragged_dot", "gmm"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"{machine_line()} · {jax.devices()[0].device_kind}")
    print(
        f"{args.tokens} tokens x {args.top_k} of {args.experts} experts, width {args.width}, expert hidden "
        f"{args.expert_hidden}, {args.dtype}, forward + backward"
    )
    found = measure(
        args.tokens,
        args.width,
        args.expert_hidden,
        args.experts,
        args.top_k,
        jnp.dtype(args.dtype),
        args.tiles,
        args.paths,
        args.rounds,
    )
    print("| part | ms | ÷ dense |\n|---|---|---|")
    for name, (seconds, ratio) in found.items():
        print(f"| {name} | {seconds * 1e3:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()

"""Where a small model's CPU training step goes: variants of the bare loop timed interleaved.

Each variant changes one thing of the bare flax + optax loop (``benchmarks.bare_loop.BareLoop``) and
is timed round by round with the others (and with the PyTorch loop when torch is installed), so the
per-round ratios to the baseline survive the load of a shared machine:

* ``no optimizer``: plain ``p - lr * g`` instead of clipping + AdamW (the optimizer update's share);
* ``forward only``: the loss without gradients (the forward pass's share);
* ``unblocked attention``: causal attention as one masked score matrix instead of query blocks;
* ``einsum attention``: scores, softmax and weighted values written out with ``einsum``;
* ``optax cross-entropy``: ``optax.softmax_cross_entropy_with_integer_labels`` for the loss;
* ``no vocab padding``: ``architecture/vocab_multiple=1``. The workload's vocabulary (256) is already a
  multiple of 128, so this is the baseline's program again: its ratio is the spread between identical
  programs in one run;
* ``bf16 activations``: ``model/activation_dtype=bfloat16`` (float32 parameters).

Run ``python benchmarks/step_ablation.py --preset tiny --batch 8 --seq 256``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bare_loop import BareLoop
from benchmarks.common import (
    Loop,
    add_workload_arguments,
    interleaved,
    load_average,
    machine_line,
    start_like_theseus_run,
)
from benchmarks.workload import Workload


def _einsum_attention(q: Any, k: Any, v: Any, *, mask: Any, is_causal: bool, implementation: str = "auto") -> Any:
    import jax
    import jax.numpy as jnp

    heads, kv_heads = q.shape[2], k.shape[2]
    if kv_heads != heads:
        k = jnp.repeat(k, heads // kv_heads, axis=2)
        v = jnp.repeat(v, heads // kv_heads, axis=2)
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    steps, keys = q.shape[1], k.shape[1]
    allowed = jnp.ones((steps, keys), bool)
    if is_causal:
        allowed = jnp.arange(keys)[None, :] <= jnp.arange(keys - steps, keys)[:, None]
    allowed = allowed[None, None]
    if mask is not None:
        allowed = allowed & mask
    scores = jnp.where(allowed, scores, jnp.finfo(scores.dtype).min)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)


def _optax_cross_entropy(logits: Any, targets: Any, padding_mask: Any = None) -> Any:
    import jax.numpy as jnp
    import optax

    valid = targets != -1
    if padding_mask is not None:
        valid = valid & padding_mask
    nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), jnp.where(valid, targets, 0))
    return jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


class Variant(BareLoop):
    """The bare loop with ``patch`` active while it is traced, and an optional different step."""

    def __init__(
        self, work: Workload, name: str, patch: Callable[[], contextlib.AbstractContextManager] | None = None
    ) -> None:
        super().__init__(work)
        self.name = name
        self.patch = patch or contextlib.nullcontext

    def prepare(self, warmup: int) -> float:
        with self.patch():
            return super().prepare(warmup)


class SgdVariant(Variant):
    """Gradients applied as ``p - 1e-4 * g``: the optimizer's clipping and AdamW update removed."""

    def build(self) -> None:
        super().build()
        import jax

        model = self.work.model

        def step(state: Any, batch: dict[str, Any], key: Any) -> Any:
            params, opt_state = state

            def loss_fn(p: Any) -> Any:
                return model.apply({"params": p}, batch["x"], batch["y"], batch["padding_mask"], rngs={"dropout": key})[
                    1
                ]

            loss, grads = jax.value_and_grad(loss_fn)(params)
            return (jax.tree.map(lambda p, g: p - 1e-4 * g, params, grads), opt_state), loss

        self.jstep = jax.jit(step, donate_argnums=(0,))


class ForwardVariant(Variant):
    """The loss only: no gradients, no update."""

    def build(self) -> None:
        super().build()
        import jax

        model = self.work.model

        def step(state: Any, batch: dict[str, Any], key: Any) -> Any:
            loss = model.apply(
                {"params": state[0]}, batch["x"], batch["y"], batch["padding_mask"], rngs={"dropout": key}
            )[1]
            return state, loss

        self.jstep = jax.jit(step)


def variants(preset: str, batch: int, seq: int) -> list[Loop]:
    from theseus.model.layers import attention
    from theseus.model.stack import transformer

    work = Workload.create(preset, batch=batch, seq=seq)
    loops: list[Loop] = [
        Variant(work, "baseline (bare loop)"),
        SgdVariant(work, "no optimizer"),
        ForwardVariant(work, "forward only"),
        Variant(work, "unblocked attention", lambda: _patched(attention, "MIN_CAUSAL_BLOCK", 10**9)),
        Variant(work, "einsum attention", lambda: _patched(attention, "dot_product_attention", _einsum_attention)),
        Variant(work, "optax cross-entropy", lambda: _patched(transformer, "cross_entropy", _optax_cross_entropy)),
        Variant(
            Workload.create(preset, batch=batch, seq=seq, overrides={"architecture/vocab_multiple": 1}),
            "no vocab padding",
        ),
        Variant(Workload.create(preset, batch=batch, seq=seq, activation_dtype="bfloat16"), "bf16 activations"),
    ]
    try:
        from benchmarks.torch_baseline import TorchLoop, torch_available

        if torch_available():
            loops.append(TorchLoop(work.dims, work.torch_batches(), flops_per_step=work.flops_per_step()))
    except ImportError:
        pass
    return loops


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    before = load_average()
    loops = variants(args.preset, args.batch, args.seq)
    timings = interleaved(loops, steps=args.steps, repeats=args.repeats, warmup=1)
    base = timings[loops[0].name]
    print(f"{machine_line()}; {args.preset} {args.batch}x{args.seq}; load {before} -> {load_average()}")
    print(f"{'variant':28s} {'ms/step':>9s} {'÷ baseline':>11s} {'tok/s':>9s}")
    for name, timing in timings.items():
        ratio = statistics.median(x / y for x, y in zip(timing.windows, base.windows, strict=True))
        print(f"{name:28s} {timing.step_seconds * 1e3:9.1f} {ratio:11.3f} {timing.tokens_per_s:9,.0f}")


if __name__ == "__main__":
    start_like_theseus_run()
    main()

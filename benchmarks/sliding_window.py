"""Sliding-window attention against full causal attention: CPU step time, side by side in one run.

    python benchmarks/sliding_window.py [--width 768] [--heads 12] [--seq 1024] [--window 128] [--rounds 7]

At the gpt2-124m width (768, 12 heads) and sequence 1024, interleaved round by round:

* ``attention``: the causal attention core alone (``dot_product_attention``), forward + backward;
* ``block``: one Llama-style layer (RMSNorm, RoPE attention, SwiGLU MLP), forward + backward.

each with the full causal mask and with a window (``architecture/sliding_window``). On the XLA path
a long sequence is computed in blocks of 128 queries, and a windowed block reads only the keys within
its window, so the windowed score matrix is a band instead of a triangle. Goal: windowed ÷ full <= 1.
Ratios are medians of per-round ratios.
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

from benchmarks.common import machine_line, rotated_rounds, timed_call
from theseus.config import configuration, configure
from theseus.model.layers.attention import dot_product_attention
from theseus.model.models import Llama


def attention_step(heads: int, head_dim: int, seq: int, window: int | None, batch: int) -> tuple[Any, tuple[Any, ...]]:
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (batch, seq, heads, head_dim), jnp.float32) for key in keys)

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out = dot_product_attention(q, k, v, mask=None, is_causal=True, window=window)
        return jnp.sum(out * out)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v)


def block_step(width: int, heads: int, seq: int, window: int | None, batch: int) -> tuple[Any, tuple[Any, ...]]:
    values = {
        "architecture/n_layers": 1,
        "architecture/n_embd": width,
        "architecture/n_heads": heads,
        "architecture/block_size": seq,
        "architecture/vocab_size": 256,
        "architecture/sliding_window": window,
    }
    with configuration(values):
        model = configure(Llama)
    x = jax.random.randint(jax.random.key(1), (batch, seq), 0, 256)
    params = jax.jit(lambda k, x: model.init(k, x, deterministic=True)["params"])(jax.random.key(0), x)

    def loss(p: Any, x: jax.Array) -> jax.Array:
        outputs: Any = model.apply({"params": p}, x, y=x, deterministic=True)
        return outputs[1]

    return jax.jit(jax.grad(loss)), (params, x)


def measure(width: int, heads: int, seq: int, window: int, rounds: int, batch: int = 1) -> dict[str, float]:
    """Median per-round ratio windowed ÷ full, per measurement, and the median times."""
    steps = {
        f"{kind} {label}": build(w)
        for kind, build in (
            ("attention", lambda w: attention_step(heads, width // heads, seq, w, batch)),
            ("block", lambda w: block_step(width, heads, seq, w, batch)),
        )
        for label, w in (("full", None), ("window", window))
    }
    for fn, args in steps.values():  # compile and warm up
        timed_call(fn, args)
    seconds = rotated_rounds(steps, rounds)
    out = {name: statistics.median(values) for name, values in seconds.items()}
    for kind in ("attention", "block"):
        ratios = [w / f for w, f in zip(seconds[f"{kind} window"], seconds[f"{kind} full"], strict=True)]
        out[f"{kind} ratio"] = statistics.median(ratios)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    found = measure(args.width, args.heads, args.seq, args.window, args.rounds)
    print(machine_line())
    print(f"width {args.width}, {args.heads} heads, sequence {args.seq}, window {args.window}, batch 1, fwd + bwd")
    print("| measurement | full | window | window ÷ full | goal |")
    print("|---|---|---|---|---|")
    for kind in ("attention", "block"):
        full, windowed, ratio = found[f"{kind} full"], found[f"{kind} window"], found[f"{kind} ratio"]
        status = "pass" if ratio <= 1.0 else "miss"
        print(f"| {kind} | {full * 1e3:.1f} ms | {windowed * 1e3:.1f} ms | {ratio:.2f} | ≤ 1.00 ({status}) |")


if __name__ == "__main__":
    main()

"""Packed vs padded fine-tuning rows on a skewed length distribution: padding share and tokens/s.

    python benchmarks/sft_packing.py [--block 256] [--rows 8] [--rounds 5]

Writes a synthetic prepared dataset whose document lengths follow a log-normal distribution (most
examples short, a few long, as chat data is), then, side by side in one run:

* the share of padding positions in batches read in the ``"padded"`` and the ``"packed"`` style;
* learned tokens per second of a GPT training step (loss and gradients, jitted) on the same batches;
  both styles have the same shape, so the step time is nearly equal and the difference is the
  learned tokens each step carries.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import configuration, configure
from theseus.data.format import PreparedWriter
from theseus.model.models import GPT
from theseus.training.flywheel import Flywheel, Sampling


def write_skewed(root: Path, documents: int, block: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=np.log(block / 8), sigma=0.9, size=documents).astype(int), 4, 2 * block)
    with PreparedWriter(root, "skewed", vocab_size=257, eot_id=256) as writer:
        tokens = rng.integers(0, 256, size=int(lengths.sum())).astype(np.int64)
        starts = np.cumsum(lengths) - 1
        tokens[starts] = 256
        writer.append("train", tokens, lengths, np.zeros(documents, np.int64))
        writer.commit(tokenizer={"kind": "byte"}, style="padded")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_skewed(root, 4000, args.block)
        batches = {}
        for style in ("padded", "packed"):
            with Flywheel(
                [Sampling("skewed", 1.0, style)],
                root=root,
                block_size=args.block,
                batch_size=args.rows,
                prefetch=0,
            ) as wheel:
                batches[style] = [wheel.batch(step) for step in range(args.rounds)]
    values = {"architecture/n_layers": 2, "architecture/n_embd": 128, "architecture/n_heads": 4}
    with configuration({**values, "architecture/block_size": args.block}):
        model = configure(GPT)
    init = jax.jit(lambda k, x: model.init(k, x, deterministic=True)["params"])
    params = init(jax.random.key(0), jnp.zeros((1, args.block), jnp.int32))

    def loss(p, b):  # type: ignore[no-untyped-def]
        return model.apply({"params": p}, b["x"], y=b["y"], padding_mask=b["padding_mask"], deterministic=True)[1]

    step = {style: jax.jit(jax.value_and_grad(loss)) for style in batches}
    for style, fn in step.items():  # compile both first
        jax.block_until_ready(fn(params, batches[style][0]))
    seconds: dict[str, list[float]] = {s: [] for s in batches}
    for r in range(args.rounds):
        for style, fn in step.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(params, batches[style][r]))
            seconds[style].append(time.perf_counter() - start)
    print("| style | padding share | learned tokens / step | step time | learned tokens/s |")
    print("|---|---|---|---|---|")
    rate = {}
    for style, rows in batches.items():
        padding = float(np.mean([1 - (b["padding_mask"] > 0).mean() for b in rows]))
        learned = float(np.mean([(b["y"] != -1).sum() for b in rows]))
        t = statistics.median(seconds[style])
        rate[style] = learned / t
        print(f"| {style} | {padding:.1%} | {learned:,.0f} | {t * 1e3:.1f} ms | {rate[style]:,.0f} |")
    print(f"\npacked / padded learned tokens/s: {rate['packed'] / rate['padded']:.2f}x")


if __name__ == "__main__":
    main()

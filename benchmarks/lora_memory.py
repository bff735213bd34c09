"""Optimizer-state memory of LoRA fine-tuning next to full fine-tuning, at the gpt2-124m shape.

    python benchmarks/lora_memory.py [--rank 8]

Shapes only (``jax.eval_shape``): nothing is allocated or trained. For each setting it builds the
``train/sft`` optimizer exactly as the trainer does (AdamW, gradient clipping, and with LoRA the
adapter-only partition) and reports the bytes of its state, which for AdamW is two float32 moments
per trained parameter.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from theseus.config import configuration, configure
from theseus.model.models import GPT
from theseus.training.adapters import adapters_only, prune, tree_bytes
from theseus.training.optimizers import AdamW, clip_by_global_norm

SHAPE = {"architecture/preset": "gpt2-124m", "architecture/vocab_size": 50257, "architecture/block_size": 1024}


def measure(settings: dict[str, Any]) -> dict[str, float]:
    """Parameter, adapter and optimizer-state bytes of GPT under ``settings`` (shapes only)."""
    with configuration({**SHAPE, **settings}):
        model = configure(GPT)
        tx = optax.chain(clip_by_global_norm(1.0), AdamW.create(3e-4))
    params = nn.unbox(
        jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32), deterministic=True))
    )["params"]
    if int(settings.get("model/lora/rank", 0)) > 0:
        tx = adapters_only(tx, params)
    state = jax.eval_shape(tx.init, params)
    return {
        "params": tree_bytes(params),
        "adapters": tree_bytes(prune(params)),
        "optimizer": tree_bytes(state),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    cases = {
        "full fine-tuning": {},
        f"LoRA r={args.rank} query,value": {"model/lora/rank": args.rank, "model/lora/targets": ["query", "value"]},
        f"LoRA r={args.rank} attention+MLP": {
            "model/lora/rank": args.rank,
            "model/lora/targets": ["query", "key", "value", "out", "up", "down"],
        },
    }
    results = {name: measure(values) for name, values in cases.items()}
    full = results["full fine-tuning"]["optimizer"]
    print("| setting | parameters | adapters | optimizer state | vs full |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        mib = lambda b: f"{b / 2**20:,.1f} MiB"  # noqa: E731
        ratio = r["optimizer"] / full
        print(f"| {name} | {mib(r['params'])} | {mib(r['adapters'])} | {mib(r['optimizer'])} | {ratio:.4f} |")
    assert math.isclose(
        results["full fine-tuning"]["optimizer"], 2 * results["full fine-tuning"]["params"], rel_tol=1e-3
    )


if __name__ == "__main__":
    main()

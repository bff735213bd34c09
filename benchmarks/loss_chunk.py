"""The loss without the full logits (``model/loss_chunk``): temporaries of one training step's loss and
gradients, and of a preference objective's (summed target log-probabilities, as DPO reads them), for
several chunk sizes, read from the compiled programs (nothing is run: the sizes are the real shapes').

    python benchmarks/loss_chunk.py [--rows 8] [--seq 1024] [--vocab 50304] [--width 256] [--layers 2]

A GPT of ``--layers`` layers and ``--width`` channels in float32 on the default device; ``--chunks``
lists the ``model/loss_chunk`` values (0: all logits at once). Goal: at the default chunk (2048 tokens)
the loss's temporaries <= 0.5 of those of the full logits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def temporaries(objective: str, chunk: int, rows: int, seq: int, vocab: int, width: int, layers: int) -> int:
    """Bytes of temporaries of the loss-and-gradient program of ``objective`` ("loss" or "scores")."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from theseus.config import Schema, configuration, configure, resolve
    from theseus.model.models import GPT

    keys = {
        "architecture/n_layers": layers,
        "architecture/n_embd": width,
        "architecture/n_heads": max(1, width // 64),
        "architecture/vocab_size": vocab,
        "architecture/block_size": seq,
        "model/activation_dtype": "float32",
        "model/loss_chunk": chunk,
    }
    with configuration(resolve(Schema.build(GPT.gather()), overrides=keys)):
        model: Any = configure(GPT)
    params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]))
    tokens = jax.ShapeDtypeStruct((rows, seq), jnp.int32)

    def objective_of(p: Any, x: jax.Array) -> jax.Array:
        if objective == "loss":
            return model.apply({"params": p}, x, x, deterministic=True)[1]
        logps = model.apply({"params": p}, x, x, None, True, method="target_scores")[1]
        return -jnp.mean(jax.nn.log_sigmoid(jnp.sum(logps, axis=-1)))

    compiled = jax.jit(jax.value_and_grad(objective_of)).lower(params, tokens).compile()
    memory: Any = compiled.memory_analysis()
    return int(memory.temp_size_in_bytes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 4096, 2048, 1024])
    args = parser.parse_args(argv)
    shape = (args.rows, args.seq, args.vocab, args.width, args.layers)
    logits = args.rows * args.seq * args.vocab * 4
    print(f"GPT {args.layers} layers x {args.width}, batch {args.rows} x {args.seq} tokens, vocabulary {args.vocab}")
    print(f"float32; the full logits are {logits / 2**20:.1f} MiB")
    print("| objective | model/loss_chunk | temporaries | ÷ all at once |\n|---|---|---|---|")
    for objective in ("loss", "scores"):
        whole = None
        for chunk in args.chunks:
            size = temporaries(objective, chunk, *shape)
            whole = size if whole is None else whole
            print(f"| {objective} | {chunk} | {size / 2**20:.1f} MiB | {size / whole:.3f} |", flush=True)


if __name__ == "__main__":
    main()

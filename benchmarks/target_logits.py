"""How the loss picks each target's logit: a gather against a select-and-sum over the vocabulary.

``theseus.base.logprobs.token_logps`` picks by select-and-sum (exact, and it partitions inside a
pipeline stage under fsdp+tp, where XLA's SPMD partitioner aborts on the gather). Both forms compute
the token cross-entropy of random float32 logits ``[rows, seq, vocab]`` with its gradient, timed side by
side in rotated rounds on the default device; the ratio is select-and-sum's time over the gather's.

Run ``python benchmarks/target_logits.py [--rows 4 --seq 2048 --vocab 128256]`` (``--quick``: small shapes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp

from benchmarks.common import machine_line, rotated_rounds
from theseus.base.logprobs import token_logps


def gathered_logps(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """``log p(target)`` with the target's logit gathered (``take_along_axis``)."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def loss_and_grad(pick: str) -> jax.stages.Wrapped:
    logps = gathered_logps if pick == "gather" else token_logps
    return jax.jit(jax.value_and_grad(lambda logits, targets: -jnp.mean(logps(logits, targets))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke test)")
    args = parser.parse_args()
    rows, seq, vocab = (2, 64, 512) if args.quick else (args.rows, args.seq, args.vocab)
    logits = jax.random.normal(jax.random.key(0), (rows, seq, vocab), jnp.float32)
    targets = jax.random.randint(jax.random.key(1), (rows, seq), 0, vocab)
    forms = {pick: loss_and_grad(pick) for pick in ("gather", "select-and-sum")}
    (loss_g, grad_g), (loss_s, grad_s) = (forms[p](logits, targets) for p in forms)
    seconds = rotated_rounds({p: (fn, (logits, targets)) for p, fn in forms.items()}, args.rounds)
    print(f"# target logits: {rows} x {seq} tokens, vocabulary {vocab}, float32, loss and gradient")
    print(f"# {machine_line()}, {jax.devices()[0].device_kind}, {args.rounds} rounds")
    print("| pick | ms | ratio to gather |")
    print("|---|---|---|")
    gather = statistics.median(seconds["gather"])
    for pick, times in seconds.items():
        print(f"| {pick} | {statistics.median(times) * 1e3:.2f} | {statistics.median(times) / gather:.3f} |")
    print(
        f"loss difference {abs(float(loss_g) - float(loss_s)):.2e}, largest gradient difference "
        f"{float(jnp.max(jnp.abs(grad_g - grad_s))):.2e}"
    )


if __name__ == "__main__":
    main()

"""Log-likelihoods of continuations in batches: one jitted forward pass per batch of rows.

Requests are sorted longest first (as lm-eval's Hugging Face model sorts them), cut into batches
of ``batch_size`` rows, right-padded to a bucketed length (powers of two from 16, at most the
model's context) and the batch filled up with empty rows, so that a whole evaluation compiles the
forward pass once per bucket. A row's context is cut from the left so that context and
continuation fit ``max_length + 1`` tokens (the last token is only predicted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.base.logprobs import scored_positions, token_logps
from theseus.errors import DataError
from theseus.model.harness.encoding import Pair

if TYPE_CHECKING:
    from theseus.model.harness.compute import Compute

#: ``fn(params, ids [B, W], targets [B, W]) -> (summed log-probability [B], all greedy [B])``;
#: targets are -1 where nothing is scored.
ScoreFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]

SMALLEST_BUCKET = 16


def score_function(model: Any) -> ScoreFn:
    """The jitted scorer of a theseus language model (``model.apply(...) -> (logits, loss)``)."""

    def score(params: Any, ids: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits, _ = model.apply({"params": params}, ids, deterministic=True)
        total = jnp.sum(token_logps(logits, targets), axis=-1)
        greedy = jnp.argmax(logits.astype(jnp.float32), axis=-1) == targets
        return total, jnp.all(greedy | ~scored_positions(targets), axis=-1)

    return jax.jit(score)


def bucket(length: int, limit: int) -> int:
    """The padded width of a batch whose longest row has ``length`` tokens."""
    width = SMALLEST_BUCKET
    while width < length:
        width *= 2
    return max(min(width, limit), length)


def order(pairs: Sequence[Pair]) -> list[int]:
    """Request indices longest first (ties by tokens), as lm-eval's Hugging Face model orders them."""
    return sorted(range(len(pairs)), key=lambda i: (-len(pairs[i][0]) - len(pairs[i][1]), (*pairs[i][0], *pairs[i][1])))


def row(pair: Pair, max_length: int) -> tuple[list[int], list[int]]:
    """The input tokens of a request and the targets of its positions (-1: not scored)."""
    context, continuation = pair
    if len(continuation) > max_length:
        raise DataError(
            f"a continuation of {len(continuation)} tokens does not fit the model's context of {max_length} tokens"
        )
    whole = (list(context) + list(continuation))[-(max_length + 1) :]
    inputs = whole[:-1]
    targets = [-1] * len(inputs)
    start = len(inputs) - len(continuation)
    targets[start:] = list(continuation)
    return inputs, targets


def score_pairs(
    compute: Compute, pairs: Sequence[Pair], *, batch_size: int, max_length: int
) -> list[tuple[float, bool]]:
    """``(log-likelihood, is greedy)`` of each request's continuation after its context.

    An empty continuation has log-likelihood 0 and counts as greedy.
    """
    results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
    pending = [i for i in order(pairs) if pairs[i][1]]
    for start in range(0, len(pending), batch_size):
        chunk = pending[start : start + batch_size]
        rows = [row(pairs[i], max_length) for i in chunk]
        width = bucket(max(len(inputs) for inputs, _ in rows), max_length)
        ids = np.zeros((batch_size, width), np.int32)
        targets = np.full((batch_size, width), -1, np.int32)
        for index, (inputs, wanted) in enumerate(rows):
            ids[index, : len(inputs)] = inputs
            targets[index, : len(wanted)] = wanted
        total, greedy = compute.score(ids, targets)
        for index, request in enumerate(chunk):
            results[request] = (float(total[index]), bool(greedy[index]))
    return results


__all__ = ["ScoreFn", "bucket", "order", "row", "score_function", "score_pairs"]

"""Log-probabilities of target tokens under a model's logits: the one computation behind the training
loss, evaluation scoring, the harness, preference objectives and reinforcement learning.

``logits`` ``[..., T, V]`` (any float dtype; computed in float32) score ``targets`` int ``[..., T]``.
A position is scored where its target is not :data:`IGNORED` and ``mask`` (bool ``[..., T]``, True =
real token), when given, is True; an unscored position's log-probability is 0.

The ``chunked_*`` functions compute the same from a head's input instead of its output: ``hidden``
``[B, T, E]`` through ``logits_fn(weights, hidden_chunk)``, a few positions of every row at a time, so
that the ``[B, T, V]`` logits never exist at once (:func:`chunk_layout`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

#: The target of a position that is not scored.
IGNORED = -1


def scored_positions(targets: ArrayLike, mask: ArrayLike | None = None) -> jax.Array:
    """Bool ``[..., T]``: the positions whose target counts (not :data:`IGNORED`, within ``mask``)."""
    scored = jnp.asarray(targets) != IGNORED
    return scored if mask is None else scored & jnp.asarray(mask, jnp.bool_)


def token_logps(logits: ArrayLike, targets: ArrayLike, mask: ArrayLike | None = None) -> jax.Array:
    """``log p(target)`` at each position, float32 ``[..., T]`` (0 where the position is not scored)."""
    logits = jnp.asarray(logits, jnp.float32)
    scored = scored_positions(targets, mask)
    # the target's logit by select-and-sum over the vocabulary, not a gather: exact, and it partitions where
    # the vocabulary is split over devices inside a pipeline stage (XLA cannot partition that gather)
    chosen = jnp.arange(logits.shape[-1], dtype=jnp.int32) == jnp.asarray(targets, jnp.int32)[..., None]
    picked = jnp.sum(jnp.where(chosen, logits, 0.0), axis=-1)
    return jnp.where(scored, picked - jax.nn.logsumexp(logits, axis=-1), 0.0)


def sequence_logps(logits: ArrayLike, targets: ArrayLike, mask: ArrayLike | None = None) -> tuple[jax.Array, jax.Array]:
    """``(sum of log p(target), number of scored targets)`` of each row, both float32 ``[...]``."""
    total = jnp.sum(token_logps(logits, targets, mask), axis=-1)
    return total, jnp.sum(scored_positions(targets, mask), axis=-1).astype(jnp.float32)


def cross_entropy(logits: ArrayLike, targets: ArrayLike, mask: ArrayLike | None = None) -> jax.Array:
    """Mean token cross-entropy (float32): the mean of ``-log p(target)`` over the scored positions;
    0 when none is scored."""
    scored = scored_positions(targets, mask)
    nll = jnp.where(scored, -token_logps(logits, targets, mask), 0.0)
    return jnp.sum(nll) / jnp.maximum(jnp.sum(scored), 1).astype(jnp.float32)


def token_entropy(logits: ArrayLike) -> jax.Array:
    """The entropy (nats) of each position's distribution, float32 ``[..., T]``."""
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


#: ``logits_fn(weights, hidden)``: a head's logits ``[B, t, V]`` of hidden states ``[B, t, E]``.
LogitsFn = Callable[[Any, jax.Array], jax.Array]


def chunk_layout(rows: int, steps: int, chunk_tokens: int | None) -> tuple[int, int] | None:
    """``(chunks, positions per chunk)`` that split ``rows x steps`` tokens into chunks of at most about
    ``chunk_tokens`` (every row, a share of its positions); None when one chunk holds them all (or
    ``chunk_tokens`` is 0 or None). Chunk ``k`` holds positions ``k, k + chunks, k + 2 chunks, ...``:
    a sequence split into contiguous blocks over devices stays split the same way in every chunk."""
    if not chunk_tokens or rows * steps <= chunk_tokens:
        return None
    chunks = -(-steps // max(1, chunk_tokens // rows))
    return chunks, -(-steps // chunks)


def _to_chunks(x: jax.Array, layout: tuple[int, int], fill: Any) -> jax.Array:
    """``[B, T, ...]`` -> ``[chunks, B, per_chunk, ...]``, the positions past ``T`` set to ``fill``."""
    chunks, per_chunk = layout
    pad = [(0, 0), (0, chunks * per_chunk - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    x = jnp.pad(x, pad, constant_values=fill)
    return jnp.moveaxis(x.reshape(x.shape[0], per_chunk, chunks, *x.shape[2:]), 2, 0)


def _from_chunks(x: jax.Array, steps: int) -> jax.Array:
    """The inverse of :func:`_to_chunks`: ``[chunks, B, per_chunk, ...]`` -> ``[B, steps, ...]``."""
    chunks, rows, per_chunk = x.shape[:3]
    return jnp.moveaxis(x, 0, 2).reshape(rows, chunks * per_chunk, *x.shape[3:])[:, :steps]


def _scored_targets(targets: ArrayLike, mask: ArrayLike | None) -> jax.Array:
    """``targets`` with every position that is not scored set to :data:`IGNORED`."""
    targets = jnp.asarray(targets, jnp.int32)
    return jnp.where(scored_positions(targets, mask), targets, IGNORED)


def chunked_token_logps(
    logits_fn: LogitsFn,
    weights: Any,
    hidden: jax.Array,
    targets: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    chunk_tokens: int | None,
    entropy: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """``(token_logps, token_entropy or None)`` of ``logits_fn(weights, hidden)``, ``[B, T]`` each, one
    chunk of logits at a time; the backward pass computes each chunk's logits again."""
    targets = _scored_targets(targets, mask)

    def scores(w: Any, h: jax.Array, t: jax.Array) -> tuple[jax.Array, ...]:
        logits = logits_fn(w, h)
        return (token_logps(logits, t), token_entropy(logits)) if entropy else (token_logps(logits, t),)

    layout = chunk_layout(hidden.shape[0], hidden.shape[1], chunk_tokens)
    if layout is None:
        found = scores(weights, hidden, targets)
    else:
        # the weights enter the loop in float32 and are cast back inside each chunk, so the loop sums the
        # chunks' weight gradients in float32 (a bf16 head's gradient is rounded once, not once per chunk)
        dtypes = jax.tree.map(lambda w: w.dtype, weights)
        wide = jax.tree.map(lambda w: w.astype(jnp.float32) if jnp.issubdtype(w.dtype, jnp.floating) else w, weights)

        def chunk(w: Any, h: jax.Array, t: jax.Array) -> tuple[jax.Array, ...]:
            return scores(jax.tree.map(lambda a, dtype: a.astype(dtype), w, dtypes), h, t)

        body = jax.checkpoint(chunk, prevent_cse=False)
        chunked = (_to_chunks(hidden, layout, 0), _to_chunks(targets, layout, IGNORED))
        found = tuple(_from_chunks(x, hidden.shape[1]) for x in jax.lax.map(lambda c: body(wide, *c), chunked))
    return found[0], (found[1] if entropy else None)


def chunked_nll(
    logits_fn: LogitsFn,
    weights: Any,
    hidden: jax.Array,
    targets: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    chunk_tokens: int | None,
) -> jax.Array:
    """The sum of ``-log p(target)`` over the scored positions (float32), one chunk of logits at a time.
    Differentiated, each chunk's gradient is taken while its logits exist (nothing is computed twice)
    and the backward pass only scales what the forward pass kept."""
    targets = _scored_targets(targets, mask)
    layout = chunk_layout(hidden.shape[0], hidden.shape[1], chunk_tokens)
    if layout is None:
        return _nll(logits_fn, weights, hidden, targets)
    return _chunked_nll(logits_fn, layout, weights, hidden, targets)


def chunked_cross_entropy(
    logits_fn: LogitsFn,
    weights: Any,
    hidden: jax.Array,
    targets: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    chunk_tokens: int | None,
) -> jax.Array:
    """:func:`cross_entropy` of ``logits_fn(weights, hidden)`` by :func:`chunked_nll`."""
    count = jnp.sum(scored_positions(targets, mask))
    total = chunked_nll(logits_fn, weights, hidden, targets, mask, chunk_tokens=chunk_tokens)
    return total / jnp.maximum(count, 1).astype(jnp.float32)


def _nll(logits_fn: LogitsFn, weights: Any, hidden: jax.Array, targets: jax.Array) -> jax.Array:
    return -jnp.sum(token_logps(logits_fn(weights, hidden), targets))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _chunked_nll(
    logits_fn: LogitsFn, layout: tuple[int, int], weights: Any, hidden: jax.Array, targets: jax.Array
) -> jax.Array:
    chunked = (_to_chunks(hidden, layout, 0), _to_chunks(targets, layout, IGNORED))
    return jnp.sum(jax.lax.map(lambda c: _nll(logits_fn, weights, *c), chunked))


def _chunked_nll_fwd(
    logits_fn: LogitsFn, layout: tuple[int, int], weights: Any, hidden: jax.Array, targets: jax.Array
) -> tuple[jax.Array, tuple[Any, jax.Array]]:
    """The sum and its gradient (for a cotangent of 1), accumulated over the chunks."""
    grad = jax.value_and_grad(functools.partial(_nll, logits_fn), argnums=(0, 1))

    def body(total: Any, chunk: tuple[jax.Array, jax.Array]) -> tuple[Any, tuple[jax.Array, jax.Array]]:
        value, (d_weights, d_hidden) = grad(weights, *chunk)
        return jax.tree.map(lambda acc, d: acc + d.astype(jnp.float32), total, d_weights), (value, d_hidden)

    # zeros that depend on every input, so that inside shard_map they vary over the mesh axes that each
    # chunk's gradient varies over (the loop's carry keeps one type)
    anchor = sum(jnp.sum(jnp.ravel(x)[:0]).astype(jnp.float32) for x in (*jax.tree.leaves(weights), hidden, targets))
    zeros = jax.tree.map(lambda w: jnp.zeros(jnp.shape(w), jnp.float32) + anchor, weights)
    chunked = (_to_chunks(hidden, layout, 0), _to_chunks(targets, layout, IGNORED))
    d_weights, (values, d_hidden) = jax.lax.scan(body, zeros, chunked)
    d_weights = jax.tree.map(lambda d, w: d.astype(jnp.result_type(w)), d_weights, weights)
    return jnp.sum(values), (d_weights, _from_chunks(d_hidden, hidden.shape[1]))


def _chunked_nll_bwd(
    logits_fn: LogitsFn, layout: tuple[int, int], saved: tuple[Any, jax.Array], cotangent: jax.Array
) -> tuple[Any, jax.Array, None]:
    d_weights, d_hidden = saved
    scale = lambda d: (d * cotangent).astype(d.dtype)  # noqa: E731
    return jax.tree.map(scale, d_weights), scale(d_hidden), None


_chunked_nll.defvjp(_chunked_nll_fwd, _chunked_nll_bwd)


__all__ = [
    "IGNORED",
    "LogitsFn",
    "chunk_layout",
    "chunked_cross_entropy",
    "chunked_nll",
    "chunked_token_logps",
    "cross_entropy",
    "scored_positions",
    "sequence_logps",
    "token_entropy",
    "token_logps",
]

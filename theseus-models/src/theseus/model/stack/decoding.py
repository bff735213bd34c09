"""Incremental decoding with a KV cache, for every ``TransformerLM``.

The cache is Flax's ``cache`` collection: per layer ``key``/``value`` ``[B, kv_heads, L, head_dim]``
(activation dtype; heads-major, so a step's attention reads it without a transposed copy), ``mask``
``[B, L]`` (which slots hold real tokens) and ``index`` (next slot), plus the model's ``length``
``[B]`` (real tokens seen per row, which gives the positions). A layer with a fixed attention window
shorter than ``L`` keeps a ring buffer of ``window`` slots instead
(see :class:`~theseus.model.layers.attention.CausalSelfAttention`).

    cache = init_cache(model, batch_size, max_len)             # zeros; max_len <= block_size
    logits, cache = decode_step(model, params, cache, ids, padding_mask)   # prefill [B, P]
    next_token = logits[:, -1].argmax(-1)
    logits, cache = decode_step(model, params, cache, next_token[:, None])    # one step [B, 1]

``params`` is the ``params`` collection (boxed or unboxed). Batched prompts of different lengths
are padded on the LEFT with ``padding_mask`` False there, so every row's last column is its last
real token; padded slots are never attended to and do not advance positions. Each call writes its
tokens at the next ``T`` slots; writing past ``max_len`` is not checked inside the jitted step
(``theseus.model.generation.decode.generate_tokens``, the decoder, checks it). ``decode_step``
donates the cache it is given: use the returned one. The decoder's jitted loop runs the same step
unjitted (:func:`cached_step`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from theseus.checkpoint.layers import per_layer
from theseus.errors import ConfigError
from theseus.model.stack.transformer import TransformerLM

Cache = Any


def init_cache(model: TransformerLM, batch_size: int, max_len: int) -> Cache:
    """An empty KV cache for ``batch_size`` rows of up to ``max_len`` tokens (prompt + generated)."""
    block_size = model.architecture.block_size
    if not 1 <= max_len <= block_size:
        raise ConfigError(
            f"a KV cache of {max_len} tokens does not fit architecture/block_size={block_size}; "
            "shorten the prompt or max_new_tokens, or train with a larger block_size"
        )
    tokens = jnp.zeros((batch_size, max_len), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens, deterministic=True, decode=True)["cache"])
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def unrolled(model: TransformerLM, params: Any) -> tuple[TransformerLM, Any]:
    """``model`` with its layers unrolled and ``params`` in that layout, for a decoding loop; a model
    whose layers are not scanned comes back as it is.

    A scanned model keeps its KV cache stacked ``[n_layers, ...]`` and its scan slices each layer's
    cache out and writes it back whole, at every layer of every token: on a TPU v5e, a 24-layer model
    at batch 64 copied 1 GB of cache per generated token and decoded at 7 % of the memory roofline
    (``benchmarks/tpu_rollout.py``). Unrolled, each layer's cache is its own buffer, which a step
    updates in place. Inside a jitted loop the per-layer parameters are slices of the stacked ones."""
    if not model.stacked_layers:
        return model, params
    return model.clone(scan_layers=False), per_layer(params, model.stacked_layers)


def cached_step(
    model: TransformerLM, params: Any, cache: Cache, tokens: jax.Array, padding_mask: jax.Array | None = None
) -> tuple[jax.Array, Cache]:
    """The KV-cache step of :func:`decode_step`, not jitted: for a caller's own jitted loop (the decoder's,
    :func:`theseus.model.generation.decode.generate_tokens`)."""
    (logits, _), mutated = model.apply(
        {"params": params, "cache": cache},
        tokens,
        padding_mask=padding_mask,
        deterministic=True,
        decode=True,
        mutable=["cache"],
    )
    return logits, mutated["cache"]


_jitted_step = jax.jit(cached_step, static_argnums=(0,), donate_argnums=(2,))


def decode_step(
    model: TransformerLM,
    params: Any,
    cache: Cache,
    tokens: ArrayLike,
    padding_mask: ArrayLike | None = None,
) -> tuple[jax.Array, Cache]:
    """Run ``tokens`` ``[B, T]`` through the model against ``cache``; returns float32 logits
    ``[B, T, vocab]`` and the updated cache (jitted; compiled once per ``T``)."""
    ids = jnp.asarray(tokens, jnp.int32)
    mask = None if padding_mask is None else jnp.asarray(padding_mask, jnp.bool_)
    return _jitted_step(model, params, cache, ids, mask)

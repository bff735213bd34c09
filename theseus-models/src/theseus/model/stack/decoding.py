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
unjitted (:func:`cached_step`), or, for a scanned model of alike layers, with the layers in a loop
(:func:`looped_step`).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from theseus.checkpoint.layers import per_layer
from theseus.errors import ConfigError
from theseus.model.layers.attention import CausalSelfAttention
from theseus.model.layers.cache_view import cache_layer
from theseus.model.stack.block import Block, detached_child
from theseus.model.stack.scan import LAYERS
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
    return unrolled_model(model), per_layer(params, model.stacked_layers)


def unrolled_model(model: TransformerLM) -> TransformerLM:
    """The model :func:`unrolled` returns: ``model`` with its layers unrolled, or itself if they are not scanned."""
    return model.clone(scan_layers=False) if model.stacked_layers else model


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


#: What each layer of a :func:`looped_step` keeps in its cache: its attention's keys, values, mask and index.
LOOPED_CACHE = {"attn": {"index", "key", "mask", "value"}}


def loops_layers(model: TransformerLM, max_len: int | None = None) -> bool:
    """Whether :func:`looped_step` can run ``model`` with a cache of ``max_len`` tokens (default: the
    block size): its layers scanned as one stack of alike layers (``model/scan_layers``, no
    ``layer_types``) whose step is the plain one (:class:`TransformerLM`'s forward pass, :class:`Block`'s
    attention branch, :class:`CausalSelfAttention`'s cache), each layer's cache only :data:`LOOPED_CACHE`
    (no ring buffer of a window shorter than the cache)."""
    kind, block = type(model), model.BLOCK
    if model.stacked_layers != (LAYERS,) or model.architecture.layer_types is not None:
        return False
    plain: list[tuple[Any, type, tuple[str, ...]]] = [
        (kind, TransformerLM, ("__call__", "hidden", "_layers")),
        (block, Block, ("__call__", "forward", "attention")),
        (getattr(block, "ATTENTION", None), CausalSelfAttention, ("_attend", "_cached", "_ring")),
    ]
    if any(getattr(cls, name, None) is not getattr(base, name) for cls, base, names in plain for name in names):
        return False
    return _layer_cache(model, max_len or model.architecture.block_size) == LOOPED_CACHE


@functools.lru_cache(maxsize=32)
def _layer_cache(model: TransformerLM, max_len: int) -> dict[str, set[str]]:
    """The entries of each of a scanned model's layers' cache, by submodule, for ``max_len`` tokens."""
    layers = jax.eval_shape(lambda: init_cache(model, 1, max_len)).get(LAYERS, {})
    return {name: set(entries) for name, entries in layers.items()}


def looped_step(
    model: TransformerLM, params: Any, cache: Cache, tokens: jax.Array, padding_mask: jax.Array | None = None
) -> tuple[jax.Array, Cache]:
    """:func:`cached_step` of a model that :func:`loops_layers`, its layers run by one ``fori_loop``: the
    program holds one layer, not ``n_layers``. Each iteration reads its layer's parameters from the stack
    and writes and reads its layer's entry of the stacked cache (``blocks/...`` ``[n_layers, ...]``, as
    :func:`init_cache` makes it) in place (:func:`~theseus.model.layers.cache_view.cache_layer`)."""
    stacked = nn.meta.unbox(params[LAYERS])
    rest = {name: value for name, value in params.items() if name != LAYERS}

    def step(module: TransformerLM, layers: Any) -> tuple[jax.Array, Any]:
        h, call, _, _ = module._embedded(tokens, padding_mask, True, True)
        arch = module.architecture
        block = detached_child(module, module.BLOCK, architecture=arch, **module._layer_options(0))

        def layer(i: jax.Array, carry: tuple[jax.Array, Any]) -> tuple[jax.Array, Any]:
            h, layers = carry
            own = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), stacked)
            with cache_layer(i):
                h, mutated = block.apply({"params": own, "cache": layers}, h, *call, mutable=["cache"])
            return h, mutated["cache"]

        h, layers = jax.lax.fori_loop(0, arch.n_layers, layer, (h, layers))
        return module.logits_and_loss(module.final_norm(h), None, padding_mask)[0], layers

    own = {name: value for name, value in cache.items() if name != LAYERS}
    (logits, layers), mutated = model.apply(
        {"params": rest, "cache": own}, cache[LAYERS], method=step, mutable=["cache"]
    )
    return logits, {**mutated["cache"], LAYERS: layers}


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
